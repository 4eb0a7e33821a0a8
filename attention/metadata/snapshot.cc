#include "attention/metadata/snapshot.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "attention/metadata/internal/slot_range.h"
#include "attention/metadata/validator.h"
#include "google/protobuf/text_format.h"

namespace attnmeta {
namespace {

template <typename T, typename Field>
void Append(absl::Span<const T> values, Field* field) {
  for (const T& v : values) field->Add(v.value());
}

template <typename T, typename Field>
std::vector<T> Typed(const Field& field) {
  std::vector<T> out;
  out.reserve(field.size());
  for (int32_t v : field) out.push_back(T(v));
  return out;
}

// The first index where the recorded and rebuilt arrays differ, as an error naming `array`.
template <typename T>
absl::Status Compare(absl::string_view array, absl::Span<const T> recorded,
                     absl::Span<const T> rebuilt) {
  for (size_t i = 0; i < std::min(recorded.size(), rebuilt.size()); ++i) {
    if (recorded[i] != rebuilt[i]) {
      return absl::InvalidArgumentError(absl::StrCat(array, "[", i, "]: recorded ",
                                                     recorded[i].value(), ", rebuilt ",
                                                     rebuilt[i].value()));
    }
  }
  if (recorded.size() != rebuilt.size()) {
    return absl::InvalidArgumentError(absl::StrCat(array, ": recorded ", recorded.size(),
                                                   " entries, rebuilt ", rebuilt.size()));
  }
  return absl::OkStatus();
}

absl::Status Wrap(absl::string_view stage, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(stage, ": ", s.message()));
}

// The largest req_to_token table CheckSnapshot rebuilds (1 GiB): a corrupt file must not make
// metadata_check allocate without bound.
constexpr int64_t kMaxCheckedEntries = int64_t{1} << 28;


// A snapshot's inputs, rebuilt: the recorded req_to_token rows (renumbered densely) and the
// batch over them.
struct RecordedInputs {
  PageSize page_size;
  ReqToTokenPool pool;
  ForwardMode mode;
  std::vector<ReqPoolIndex> req_rows;
  std::vector<TokenLength> kv_lens;
  std::vector<TokenLength> q_lens;
  std::vector<TokenPosition> starts;
  MaskLayout mask_layout = MaskLayout::kNone;
  std::vector<uint8_t> tree_mask;

  ForwardBatch batch() const {
    return ForwardBatch{mode, req_rows, kv_lens, q_lens, starts, tree_mask};
  }
};

absl::Status RowOutside(absl::string_view array, int64_t i, int64_t row, int32_t max_reqs) {
  return absl::OutOfRangeError(absl::StrCat(array, "[", i, "] = row ", row, " outside [0, max_reqs = ",
                                            max_reqs, ")"));
}

// Every size and bound the rebuild depends on is checked against the recorded arrays first,
// so that what is allocated is bounded by the file itself: the rebuilt table has one row per
// recorded row and is as wide as the longest one; a request may read only positions its
// recorded row holds.
absl::StatusOr<RecordedInputs> LoadInputs(const MetadataSnapshot& s) {
  absl::StatusOr<PageSize> ps = PageSize::Create(s.page_size());
  if (!ps.ok()) return Wrap("page_size", ps.status());
  if (!internal::PoolSlotsAddressable(s.pool_slots())) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool_slots: ", s.pool_slots(), " outside [0, 2^31]"));
  }
  if (s.max_reqs() < 1 || s.max_context_len() < 1 ||
      s.max_context_len() > ReqToTokenPool::kMaxEntries / s.max_reqs()) {
    return absl::InvalidArgumentError(
        absl::StrCat("req_to_token: max_reqs ", s.max_reqs(), " and max_context_len ",
                     s.max_context_len(), " are not a table of 1 to 2^31 entries"));
  }
  absl::StatusOr<ForwardMode> mode = ParseForwardMode(s.mode());
  if (!mode.ok()) return Wrap("mode", mode.status());
  absl::StatusOr<MaskLayout> mask_layout = ParseMaskLayout(s.mask_layout());
  if (!mask_layout.ok()) return Wrap("mask_layout", mask_layout.status());
  absl::flat_hash_map<int32_t, int32_t> dense_row;
  int64_t widest = 1;
  for (int k = 0; k < s.req_to_token_size(); ++k) {
    const ReqToTokenRow& r = s.req_to_token(k);
    if (r.row() < 0 || r.row() >= s.max_reqs()) {
      return RowOutside("req_to_token", k, r.row(), s.max_reqs());
    }
    if (r.slots_size() > s.max_context_len()) {
      return absl::OutOfRangeError(absl::StrCat("req_to_token row ", r.row(), ": ",
                                                r.slots_size(), " slots, max_context_len ",
                                                s.max_context_len()));
    }
    if (!dense_row.emplace(r.row(), static_cast<int32_t>(dense_row.size())).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("req_to_token: row ", r.row(), " is recorded twice"));
    }
    widest = std::max<int64_t>(widest, r.slots_size());
  }
  const int bs = s.req_rows_size();
  for (const auto& [name, size] : {std::pair<const char*, int>{"kv_lens", s.kv_lens_size()},
                                   {"q_lens", s.q_lens_size()},
                                   {"kv_start_idx", s.kv_start_idx_size()}}) {
    if (size != bs && !(size == 0 && absl::string_view(name) == "kv_start_idx")) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ", size, " entries for ", bs, " requests (req_rows)"));
    }
  }
  const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(dense_row.size()));
  if (widest > kMaxCheckedEntries / rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("req_to_token: ", rows, " rows of up to ", widest,
                     " slots are more than metadata_check rebuilds (", kMaxCheckedEntries,
                     " entries)"));
  }
  absl::StatusOr<ReqToTokenPool> pool =
      ReqToTokenPool::Create(static_cast<int32_t>(rows), TokenCount(widest));
  if (!pool.ok()) return Wrap("req_to_token", pool.status());
  RecordedInputs in{*ps, *std::move(pool), *mode, {}, {}, {}, {}, *mask_layout,
                    std::vector<uint8_t>(s.tree_mask().begin(), s.tree_mask().end())};
  for (const ReqToTokenRow& r : s.req_to_token()) {
    const ReqPoolIndex row(dense_row.at(r.row()));
    if (absl::Status st = in.pool.AllocateRow(row); !st.ok()) return Wrap("req_to_token", st);
    const std::vector<TokenSlot> slots = Typed<TokenSlot>(r.slots());
    if (absl::Status st = in.pool.Write(row, TokenCount(0), slots); !st.ok()) {
      return Wrap(absl::StrCat("req_to_token row ", r.row()), st);
    }
  }
  for (int i = 0; i < bs; ++i) {
    const int32_t row = s.req_rows(i);
    if (row < 0 || row >= s.max_reqs()) return RowOutside("req_rows", i, row, s.max_reqs());
    auto it = dense_row.find(row);
    if (it == dense_row.end()) {
      return absl::InvalidArgumentError(absl::StrCat("req_rows: row ", row, " of request ", i,
                                                     " has no recorded req_to_token row"));
    }
    const int64_t start = s.kv_start_idx_size() == 0 ? 0 : s.kv_start_idx(i);
    const int64_t held = s.req_to_token(it->second).slots_size();
    if (start < 0 || s.kv_lens(i) < 0 || start + s.kv_lens(i) > held) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv_lens: request ", i, " reads positions [", start, ", ", start + s.kv_lens(i),
          ") but its recorded req_to_token row ", row, " holds ", held, " slots"));
    }
    in.req_rows.push_back(ReqPoolIndex(it->second));
  }
  in.kv_lens = Typed<TokenLength>(s.kv_lens());
  in.q_lens = Typed<TokenLength>(s.q_lens());
  in.starts = Typed<TokenPosition>(s.kv_start_idx());
  return in;
}

TokenCount QueryRows(absl::Span<const TokenLength> q_lens) {
  int64_t rows = 0;
  for (TokenLength q : q_lens) rows += q.value();
  return TokenCount(rows);
}

// The metadata the builders make from the recorded inputs, validated against the recorded
// pool (slot ownership included).
absl::StatusOr<ForwardMetadata> Rebuild(const MetadataSnapshot& s, const RecordedInputs& in) {
  BuildOptions options;
  options.page_table = s.page_table_enabled();
  options.mask_layout = in.mask_layout;
  options.check = MetadataCheck{TokenCount(s.pool_slots()), QueryRows(in.q_lens)};
  absl::StatusOr<ForwardMetadata> m =
      BuildForwardMetadata(in.batch(), in.pool, in.page_size, options);
  if (!m.ok()) return Wrap("rebuilding from the recorded inputs", m.status());
  return m;
}

// Replaces the recorded metadata arrays of `s` with `m`.
void RecordMetadata(const ForwardMetadata& m, MetadataSnapshot& s) {
  s.clear_kv_indptr();
  s.clear_kv_indices();
  s.clear_qo_indptr();
  s.clear_kv_last_page_len();
  s.clear_page_table();
  Append<TokenOffset>(m.kv_indptr, s.mutable_kv_indptr());
  Append<TokenSlot>(m.kv_indices, s.mutable_kv_indices());
  Append<TokenOffset>(m.qo_indptr, s.mutable_qo_indptr());
  Append<TokenLength>(m.kv_last_page_len, s.mutable_kv_last_page_len());
  s.set_page_table_rows(m.page_table.rows());
  s.set_page_table_cols(m.page_table.cols().value());
  Append(m.page_table.span().entries(), s.mutable_page_table());
  s.set_max_q_len(m.max_q_len.value());
  s.set_max_kv_len(m.max_kv_len.value());
  s.set_custom_mask(std::string(m.custom_mask.begin(), m.custom_mask.end()));
  s.clear_mask_indptr();
  for (int64_t v : m.mask_indptr) s.add_mask_indptr(v);
}

}  // namespace

absl::StatusOr<MetadataSnapshot> MakeSnapshot(const ForwardBatch& batch,
                                              const ReqToTokenPool& pool, PageSize page_size,
                                              TokenCount pool_slots, const ForwardMetadata& m) {
  const size_t bs = batch.req_rows.size();
  if (batch.kv_lens.size() != bs || batch.q_lens.size() != bs ||
      (!batch.kv_start_idx.empty() && batch.kv_start_idx.size() != bs)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "snapshot: ", bs, " req_rows, ", batch.kv_lens.size(), " kv_lens, ",
        batch.q_lens.size(), " q_lens and ", batch.kv_start_idx.size(), " kv_start_idx"));
  }
  MetadataSnapshot s;
  s.set_page_size(page_size.tokens());
  s.set_pool_slots(pool_slots.value());
  s.set_max_reqs(pool.max_reqs());
  s.set_max_context_len(pool.max_context_len().value());
  s.set_mode(std::string(ForwardModeName(batch.mode)));
  Append(batch.req_rows, s.mutable_req_rows());
  Append(batch.kv_lens, s.mutable_kv_lens());
  Append(batch.q_lens, s.mutable_q_lens());
  Append(batch.kv_start_idx, s.mutable_kv_start_idx());
  s.set_page_table_enabled(m.page_table.rows() > 0 || m.page_table.cols() > PageCount(0));
  if (m.mask_layout != MaskLayout::kNone) {
    s.set_mask_layout(std::string(MaskLayoutName(m.mask_layout)));
  }
  s.set_tree_mask(std::string(batch.tree_mask.begin(), batch.tree_mask.end()));
  for (size_t i = 0; i < batch.req_rows.size(); ++i) {
    // kv_start_idx: empty or one per request (checked above).
    const int64_t start = batch.kv_start_idx.empty() ? 0 : batch.kv_start_idx[i].value();
    auto row = pool.Read(batch.req_rows[i], TokenCount(0),
                         TokenCount(start + batch.kv_lens[i].value()));
    if (!row.ok()) return Wrap(absl::StrCat("request ", i), row.status());
    ReqToTokenRow* r = s.add_req_to_token();
    r->set_row(batch.req_rows[i].value());
    Append(*row, r->mutable_slots());
  }
  RecordMetadata(m, s);
  return s;
}

std::string SnapshotToText(const MetadataSnapshot& snapshot) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(snapshot, &text);
  return text;
}

absl::StatusOr<MetadataSnapshot> SnapshotFromText(absl::string_view text) {
  MetadataSnapshot s;
  if (!google::protobuf::TextFormat::ParseFromString(std::string(text), &s)) {
    return absl::InvalidArgumentError("not a MetadataSnapshot in text format");
  }
  return s;
}


absl::StatusOr<MetadataSnapshot> RewriteSnapshot(const MetadataSnapshot& s) {
  absl::StatusOr<RecordedInputs> in = LoadInputs(s);
  if (!in.ok()) return in.status();
  absl::StatusOr<ForwardMetadata> rebuilt = Rebuild(s, *in);
  if (!rebuilt.ok()) return rebuilt.status();
  MetadataSnapshot out = s;
  RecordMetadata(*rebuilt, out);
  return out;
}

absl::Status CheckSnapshot(const MetadataSnapshot& s) {
  absl::StatusOr<RecordedInputs> in = LoadInputs(s);
  if (!in.ok()) return in.status();
  absl::StatusOr<ForwardMetadata> rebuilt = Rebuild(s, *in);
  if (!rebuilt.ok()) return rebuilt.status();

  // The recorded arrays: valid on their own, then equal to the rebuilt ones.
  const std::vector<TokenOffset> kv_indptr = Typed<TokenOffset>(s.kv_indptr());
  const std::vector<TokenSlot> kv_indices = Typed<TokenSlot>(s.kv_indices());
  const std::vector<TokenOffset> qo_indptr = Typed<TokenOffset>(s.qo_indptr());
  const std::vector<TokenLength> last_page = Typed<TokenLength>(s.kv_last_page_len());
  const std::vector<PageId> page_table = Typed<PageId>(s.page_table());
  absl::StatusOr<PageTableSpan<const PageId>> pt = PageTableSpan<const PageId>::Create(
      page_table, s.page_table_rows(), PageCount(s.page_table_cols()));
  if (!pt.ok()) return Wrap("page_table", pt.status());
  if (static_cast<int64_t>(page_table.size()) != s.page_table_rows() * s.page_table_cols()) {
    return absl::InvalidArgumentError(absl::StrCat("page_table: ", page_table.size(),
                                                   " entries for [", s.page_table_rows(), "][",
                                                   s.page_table_cols(), "]"));
  }
  ForwardMetadataView recorded;
  recorded.mode = in->mode;
  recorded.kv_indptr = kv_indptr;
  recorded.kv_indices = kv_indices;
  recorded.qo_indptr = qo_indptr;
  recorded.kv_lens = in->kv_lens;
  recorded.kv_last_page_len = last_page;
  recorded.page_table = *pt;
  recorded.max_q_len = TokenCount(s.max_q_len());
  recorded.max_kv_len = TokenCount(s.max_kv_len());
  const std::vector<uint8_t> custom_mask(s.custom_mask().begin(), s.custom_mask().end());
  const std::vector<int64_t> mask_indptr(s.mask_indptr().begin(), s.mask_indptr().end());
  recorded.custom_mask = CustomMaskView{in->mask_layout, custom_mask, mask_indptr};
  // Ownership needs no second check: the rebuilt metadata passed it, and the recorded arrays
  // must equal the rebuilt ones.
  const ValidationContext ctx{TokenCount(s.pool_slots()), in->page_size, QueryRows(in->q_lens)};
  if (absl::Status st = ValidateForwardMetadata(recorded, ctx); !st.ok()) return st;

  const ForwardMetadataView built = rebuilt->view();
  if (absl::Status st = Compare<TokenOffset>("kv_indptr", kv_indptr, built.kv_indptr); !st.ok()) return st;
  if (absl::Status st = Compare<TokenSlot>("kv_indices", kv_indices, built.kv_indices); !st.ok()) return st;
  if (absl::Status st = Compare<TokenOffset>("qo_indptr", qo_indptr, built.qo_indptr); !st.ok()) return st;
  if (absl::Status st = Compare<TokenLength>("kv_last_page_len", last_page, built.kv_last_page_len);
      !st.ok()) {
    return st;
  }
  if (pt->rows() != built.page_table.rows() || pt->cols() != built.page_table.cols()) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_table: recorded [", pt->rows(), "][", pt->cols().value(), "], rebuilt [",
                     built.page_table.rows(), "][", built.page_table.cols().value(), "]"));
  }
  if (absl::Status st = Compare<PageId>("page_table", pt->entries(), built.page_table.entries());
      !st.ok()) {
    return st;
  }
  if (mask_indptr != rebuilt->mask_indptr) {
    return absl::InvalidArgumentError("mask_indptr: the recorded array differs from the rebuilt one");
  }
  if (custom_mask != rebuilt->custom_mask) {
    size_t k = 0;
    while (k < custom_mask.size() && k < rebuilt->custom_mask.size() &&
           custom_mask[k] == rebuilt->custom_mask[k]) {
      ++k;
    }
    return absl::InvalidArgumentError(absl::StrCat("custom_mask: recorded and rebuilt differ at byte ", k,
                                                   " (", custom_mask.size(), " and ",
                                                   rebuilt->custom_mask.size(), " bytes)"));
  }
  if (recorded.max_q_len != built.max_q_len || recorded.max_kv_len != built.max_kv_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        recorded.max_q_len != built.max_q_len ? "max_q_len" : "max_kv_len", ": recorded ",
        recorded.max_q_len != built.max_q_len ? recorded.max_q_len.value() : recorded.max_kv_len.value(),
        ", rebuilt ",
        recorded.max_q_len != built.max_q_len ? built.max_q_len.value() : built.max_kv_len.value()));
  }
  return absl::OkStatus();
}

}  // namespace attnmeta
