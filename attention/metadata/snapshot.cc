#include "attention/metadata/snapshot.h"

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
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

}  // namespace

absl::StatusOr<MetadataSnapshot> MakeSnapshot(const ForwardBatch& batch,
                                              const ReqToTokenPool& pool, PageSize page_size,
                                              TokenCount pool_slots, const ForwardMetadata& m) {
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
  s.set_page_table_enabled(m.page_table.rows() > 0 || m.page_table.cols() > 0);
  for (size_t i = 0; i < batch.req_rows.size(); ++i) {
    const int64_t start = batch.kv_start_idx.empty() ? 0 : batch.kv_start_idx[i].value();
    auto row = pool.Read(batch.req_rows[i], TokenCount(0),
                         TokenCount(start + batch.kv_lens[i].value()));
    if (!row.ok()) return Wrap(absl::StrCat("request ", i), row.status());
    ReqToTokenRow* r = s.add_req_to_token();
    r->set_row(batch.req_rows[i].value());
    Append(*row, r->mutable_slots());
  }
  Append<TokenOffset>(m.kv_indptr, s.mutable_kv_indptr());
  Append<TokenSlot>(m.kv_indices, s.mutable_kv_indices());
  Append<TokenOffset>(m.qo_indptr, s.mutable_qo_indptr());
  Append<TokenLength>(m.kv_last_page_len, s.mutable_kv_last_page_len());
  s.set_page_table_rows(m.page_table.rows());
  s.set_page_table_cols(m.page_table.cols());
  Append(m.page_table.span().entries(), s.mutable_page_table());
  s.set_max_q_len(m.max_q_len.value());
  s.set_max_kv_len(m.max_kv_len.value());
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

absl::Status CheckSnapshot(const MetadataSnapshot& s) {
  // Inputs: rebuild the rows the batch reads. Row ids are renumbered densely, so the table
  // is as large as the recorded rows, not as the engine's whole pool.
  absl::StatusOr<PageSize> ps = PageSize::Create(s.page_size());
  if (!ps.ok()) return Wrap("page_size", ps.status());
  absl::flat_hash_map<int32_t, int32_t> dense_row;
  for (const ReqToTokenRow& r : s.req_to_token()) {
    if (!dense_row.emplace(r.row(), static_cast<int32_t>(dense_row.size())).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("req_to_token: row ", r.row(), " is recorded twice"));
    }
  }
  const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(dense_row.size()));
  if (s.max_context_len() < 1 || s.max_context_len() > kMaxCheckedEntries / rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "req_to_token: ", rows, " rows of max_context_len ", s.max_context_len(),
        " are outside what metadata_check rebuilds (1 to ", kMaxCheckedEntries, " entries)"));
  }
  absl::StatusOr<ReqToTokenPool> pool =
      ReqToTokenPool::Create(static_cast<int32_t>(rows), TokenCount(s.max_context_len()));
  if (!pool.ok()) return Wrap("req_to_token", pool.status());
  for (const ReqToTokenRow& r : s.req_to_token()) {
    const ReqPoolIndex row(dense_row.at(r.row()));
    if (absl::Status st = pool->AllocateRow(row); !st.ok()) return Wrap("req_to_token", st);
    const std::vector<TokenSlot> slots = Typed<TokenSlot>(r.slots());
    if (absl::Status st = pool->Write(row, TokenCount(0), slots); !st.ok()) {
      return Wrap(absl::StrCat("req_to_token row ", r.row()), st);
    }
  }
  std::vector<ReqPoolIndex> req_rows;
  for (int i = 0; i < s.req_rows_size(); ++i) {
    auto it = dense_row.find(s.req_rows(i));
    if (it == dense_row.end()) {
      return absl::InvalidArgumentError(absl::StrCat("req_rows: row ", s.req_rows(i),
                                                     " of request ", i,
                                                     " has no recorded req_to_token row"));
    }
    req_rows.push_back(ReqPoolIndex(it->second));
  }
  absl::StatusOr<ForwardMode> mode = ParseForwardMode(s.mode());
  if (!mode.ok()) return Wrap("mode", mode.status());
  const std::vector<TokenLength> kv_lens = Typed<TokenLength>(s.kv_lens());
  const std::vector<TokenLength> q_lens = Typed<TokenLength>(s.q_lens());
  const std::vector<TokenPosition> starts = Typed<TokenPosition>(s.kv_start_idx());
  ForwardBatch batch{*mode, req_rows, kv_lens, q_lens, starts};
  BuildOptions options;
  options.page_table = s.page_table_enabled();
  absl::StatusOr<ForwardMetadata> rebuilt = BuildForwardMetadata(batch, *pool, *ps, options);
  if (!rebuilt.ok()) return Wrap("rebuilding from the recorded inputs", rebuilt.status());

  // The recorded arrays: valid on their own, then equal to the rebuilt ones.
  const std::vector<TokenOffset> kv_indptr = Typed<TokenOffset>(s.kv_indptr());
  const std::vector<TokenSlot> kv_indices = Typed<TokenSlot>(s.kv_indices());
  const std::vector<TokenOffset> qo_indptr = Typed<TokenOffset>(s.qo_indptr());
  const std::vector<TokenLength> last_page = Typed<TokenLength>(s.kv_last_page_len());
  const std::vector<PageId> page_table = Typed<PageId>(s.page_table());
  absl::StatusOr<PageTableSpan<const PageId>> pt = PageTableSpan<const PageId>::Create(
      page_table, s.page_table_rows(), s.page_table_cols());
  if (!pt.ok()) return Wrap("page_table", pt.status());
  if (static_cast<int64_t>(page_table.size()) != s.page_table_rows() * s.page_table_cols()) {
    return absl::InvalidArgumentError(absl::StrCat("page_table: ", page_table.size(),
                                                   " entries for [", s.page_table_rows(), "][",
                                                   s.page_table_cols(), "]"));
  }
  ForwardMetadataView recorded;
  recorded.mode = *mode;
  recorded.kv_indptr = kv_indptr;
  recorded.kv_indices = kv_indices;
  recorded.qo_indptr = qo_indptr;
  recorded.kv_lens = kv_lens;
  recorded.kv_last_page_len = last_page;
  recorded.page_table = *pt;
  recorded.max_q_len = TokenCount(s.max_q_len());
  recorded.max_kv_len = TokenCount(s.max_kv_len());
  int64_t query_rows = 0;
  for (TokenLength q : q_lens) query_rows += q.value();
  const ValidationContext ctx{TokenCount(s.pool_slots()), *ps, TokenCount(query_rows)};
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
    return absl::InvalidArgumentError(absl::StrCat(
        "page_table: recorded [", pt->rows(), "][", pt->cols(), "], rebuilt [",
        built.page_table.rows(), "][", built.page_table.cols(), "]"));
  }
  if (absl::Status st = Compare<PageId>("page_table", pt->entries(), built.page_table.entries());
      !st.ok()) {
    return st;
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
