#include "attention/metadata/validator.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/strings/str_cat.h"
#include "attention/metadata/custom_mask.h"
#include "attention/metadata/internal/indptr.h"
#include "attention/metadata/internal/slot_range.h"
#include "attention/metadata/lengths.h"
#include "attention/metadata/mode_rules.h"

namespace attnmeta {
namespace {

absl::Status Invalid(absl::string_view array, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(array, ": ", what));
}

// indptr has bs + 1 entries, starts at 0 and never decreases.
absl::Status CheckIndptr(absl::string_view name, absl::Span<const TokenOffset> indptr,
                         int64_t bs) {
  if (static_cast<int64_t>(indptr.size()) != bs + 1) {
    return Invalid(name, absl::StrCat("has ", indptr.size(), " entries, want batch_size + 1 = ",
                                      bs + 1));
  }
  return internal::CheckIndptr(name, indptr);
}

// kv_indices[k] must lie in [first_allowed, pool).
absl::Status SlotError(int64_t k, int64_t s, int64_t first_allowed, int64_t pool) {
  return Invalid("kv_indices", absl::StrCat("entry ", k, " = slot ", s, " outside [", first_allowed,
                                            ", ", pool, ")",
                                            s >= 0 && s < first_allowed ? " (padding page)" : ""));
}

// Every slot in [first_allowed, pool); the offending entry is searched only on error.
absl::Status CheckSlotRange(absl::Span<const TokenSlot> slots, int64_t first_allowed,
                            int64_t pool) {
  if (internal::AllSlotsIn(slots, first_allowed, pool)) return absl::OkStatus();
  for (size_t k = 0; k < slots.size(); ++k) {
    const int64_t v = slots[k].value();
    if (v < first_allowed || v >= pool) {
      return SlotError(static_cast<int64_t>(k), v, first_allowed, pool);
    }
  }
  return absl::OkStatus();
}

// Nonzero unless slots[k] == first + k for every k < len. Eight independent lanes, so the
// compiler can keep them in one vector register; inlined, since page_size 1 calls it per token.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline int32_t PageMismatch(const TokenSlot* slots, int32_t first,
                                                         int32_t len) {
  constexpr int kLanes = 8;
  if (len < kLanes) {
    int32_t d = 0;
    for (int32_t k = 0; k < len; ++k) d |= slots[k].value() ^ (first + k);
    return d;
  }
  int32_t d[kLanes] = {};
  int32_t k = 0;
  for (; k + kLanes <= len; k += kLanes) {
    for (int l = 0; l < kLanes; ++l) d[l] |= slots[k + l].value() ^ (first + k + l);
  }
  for (; k < len; ++k) d[0] |= slots[k].value() ^ (first + k);
  int32_t all = 0;
  for (int l = 0; l < kLanes; ++l) all |= d[l];
  return all;
}

// True when every token t < n of a sequence sits at offset t % page_size of page
// row[t / page_size] and those pages lie in [first_page, end_page). The fast path of the
// page-table check: branch-free loops over independent lanes; errors are explained by the
// slow loop in ValidateForwardMetadata.
// REQUIRES: 0 <= first_page, end_page <= 2^31.
bool RowMatchesSlots(absl::Span<const PageId> row, const TokenSlot* slots, int64_t n,
                     PageSize page_size, int64_t first_page, int64_t end_page) {
  end_page = std::max(end_page, first_page);  // a pool smaller than a page holds no page
  constexpr int kLanes = 8;
  const int64_t ps = page_size.tokens();
  const int64_t pages = PagesForTokensCeil(TokenCount(n), page_size).value();
  const int log2 = page_size.log2();
  // Unsigned arithmetic: an out-of-range page only sets the flag, it never shifts a negative.
  const uint32_t page_span = static_cast<uint32_t>(end_page - first_page);
  if (log2 >= 0 && ps < kLanes) {
    // Small power-of-two pages (1, 2, 4): token by token, with shifts, in one pass.
    const uint32_t mask = static_cast<uint32_t>(ps - 1);
    uint32_t bad = 0;
    for (int64_t t = 0; t < n; ++t) {
      const uint32_t page = static_cast<uint32_t>(row[t >> log2].value());
      const uint32_t want = (page << log2) | (static_cast<uint32_t>(t) & mask);
      bad |= static_cast<uint32_t>(page - static_cast<uint32_t>(first_page) >= page_span) |
             (static_cast<uint32_t>(slots[t].value()) ^ want);
    }
    return bad == 0;
  }
  int32_t out_of_range = 0;
  for (int64_t j = 0; j < pages; ++j) {
    out_of_range |= (row[j].value() < first_page) | (row[j].value() >= end_page);
  }
  if (out_of_range != 0) return false;
  int32_t all = 0;
  for (int64_t j = 0, t = 0; t < n; ++j, t += ps) {
    all |= PageMismatch(slots + t, FirstSlotOf(row[j], page_size).value(),
                        static_cast<int32_t>(std::min(ps, n - t)));
  }
  return all == 0;
}

// Ownership: the slots written this step (positions [kv_len - q_len, kv_len) of each
// sequence) are used by no other token of the batch. Written slots are sorted (duplicates
// among them are adjacent); every cached token is then probed against a bit filter of the
// written slots, branch-free in blocks, and only a block with a hit is searched. A sequence
// whose every slot is below `shared_end` (the padding page: a captured graph's padded row;
// CheckPaddingRows keeps every other sequence off that page) writes slots that belong to no
// one.
// REQUIRES: the view passed the shape checks (indptrs consistent, q_len <= kv_len) and, with
// shared_end > 0, CheckPaddingRows.
absl::Status CheckSlotOwnership(const ForwardMetadataView& m, int64_t pool_slots,
                                int64_t shared_end) {
  struct Written {
    int32_t slot;
    int32_t sequence;
    int32_t position;
  };
  const int64_t bs = m.batch_size();
  std::vector<Written> written;
  written.reserve(static_cast<size_t>(m.qo_indptr[bs].value()));
  for (int64_t i = 0; i < bs; ++i) {
    const int64_t kv_len = m.kv_lens[i].value();
    const int64_t q_len = (m.qo_indptr[i + 1] - m.qo_indptr[i]).value();
    const TokenSlot* slots = m.kv_indices.data() + m.kv_indptr[i].value();
    // CheckPaddingRows ran first: a sequence with a slot there has all of them there.
    if (kv_len > 0 && slots[0].value() < shared_end) continue;
    for (int64_t t = kv_len - q_len; t < kv_len; ++t) {
      written.push_back(Written{slots[t].value(), static_cast<int32_t>(i), static_cast<int32_t>(t)});
    }
  }
  if (written.empty()) return absl::OkStatus();
  std::sort(written.begin(), written.end(),
            [](const Written& a, const Written& b) {
              return std::tie(a.slot, a.sequence, a.position) <
                     std::tie(b.slot, b.sequence, b.position);
            });
  for (size_t k = 1; k < written.size(); ++k) {
    if (written[k].slot == written[k - 1].slot) {
      return Invalid("kv_indices",
                     absl::StrCat("slot ", written[k].slot, " is written this step by sequence ",
                                  written[k - 1].sequence, " position ", written[k - 1].position,
                                  " and by sequence ", written[k].sequence, " position ",
                                  written[k].position, " (a slot handed out twice)"));
    }
  }
  // The filter indexes slots by their low bits. It is as large as the pool when that costs
  // at most 64 bits per KV token checked (then a probe is exact and only a real conflict
  // hits), else 64 bits per token (a false hit costs one binary search); at most 2^26 bits.
  const int64_t total_kv = m.kv_indptr[bs].value();
  const int64_t want = std::min<int64_t>(m.kv_indices.empty() ? 0 : pool_slots,
                                         std::max<int64_t>(4096, 64 * total_kv));
  uint64_t bits = 4096;
  while (bits < static_cast<uint64_t>(std::min<int64_t>(want, int64_t{1} << 26))) bits <<= 1;
  const uint32_t mask = static_cast<uint32_t>(bits - 1);
  std::vector<uint64_t> filter(bits / 64, 0);
  for (const Written& w : written) {
    const uint32_t b = static_cast<uint32_t>(w.slot) & mask;
    filter[b >> 6] |= uint64_t{1} << (b & 63);
  }
  auto probe = [&](TokenSlot slot) {
    const uint32_t b = static_cast<uint32_t>(slot.value()) & mask;
    return filter[b >> 6] >> (b & 63) & 1;
  };
  for (int64_t i = 0; i < bs; ++i) {
    const int64_t cached =
        m.kv_lens[i].value() - (m.qo_indptr[i + 1] - m.qo_indptr[i]).value();
    const TokenSlot* slots = m.kv_indices.data() + m.kv_indptr[i].value();
    // Blocks of 32 tokens are probed without a branch; a block with a hit is searched.
    constexpr int64_t kBlock = 32;
    for (int64_t t0 = 0; t0 < cached; t0 += kBlock) {
      const int64_t t1 = std::min(cached, t0 + kBlock);
      uint64_t hit = 0;
      for (int64_t t = t0; t < t1; ++t) hit |= probe(slots[t]);
      if (hit != 0) {
        for (int64_t t = t0; t < t1; ++t) {
          if (probe(slots[t]) == 0) continue;
          auto it = std::lower_bound(
              written.begin(), written.end(), slots[t].value(),
              [](const Written& w, int32_t slot) { return w.slot < slot; });
          if (it != written.end() && it->slot == slots[t].value()) {
            return Invalid("kv_indices",
                           absl::StrCat("slot ", it->slot, " is written this step by sequence ",
                                        it->sequence, " position ", it->position,
                                        " but also holds cached token ", t, " of sequence ", i,
                                        " (a slot handed out twice)"));
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

// With the padding page allowed: a sequence reads it only as a padded row does, every one of
// its slots there; a real sequence that reached it would share slots with the padded rows.
// REQUIRES: the view passed ValidateLayout.
absl::Status CheckPaddingRows(const ForwardMetadataView& m, int64_t padding_end) {
  for (int64_t i = 0; i < m.batch_size(); ++i) {
    const TokenSlot* slots = m.kv_indices.data() + m.kv_indptr[i].value();
    const int64_t kv_len = m.kv_lens[i].value();
    const int64_t on_padding =
        std::count_if(slots, slots + kv_len, [&](TokenSlot s) { return s.value() < padding_end; });
    if (on_padding == 0 || on_padding == kv_len) continue;
    const TokenSlot* at =
        std::find_if(slots, slots + kv_len, [&](TokenSlot s) { return s.value() < padding_end; });
    return Invalid("kv_indices",
                   absl::StrCat("sequence ", i, " token ", at - slots, " is in slot ", at->value(),
                                " of the padding page, and other tokens of it are not: only a "
                                "padded row, all of whose slots are there, reads that page"));
  }
  return absl::OkStatus();
}

// Everything but ownership.
absl::Status ValidateLayout(const ForwardMetadataView& m, const ValidationContext& ctx) {
  if (!internal::PoolSlotsAddressable(ctx.pool_slots.value())) {
    return Invalid("pool_slots", absl::StrCat(ctx.pool_slots.value(),
                                              " outside [0, 2^31] (slots are int32)"));
  }
  const int64_t bs = m.batch_size();
  if (absl::Status s = CheckModeBatchSize(m.mode, bs); !s.ok()) return Invalid("mode", s.message());
  if (absl::Status s = CheckIndptr("kv_indptr", m.kv_indptr, bs); !s.ok()) return s;
  if (absl::Status s = CheckIndptr("qo_indptr", m.qo_indptr, bs); !s.ok()) return s;
  if (static_cast<int64_t>(m.kv_last_page_len.size()) != bs) {
    return Invalid("kv_last_page_len", absl::StrCat("has ", m.kv_last_page_len.size(),
                                                    " entries, want batch_size = ", bs));
  }
  const int64_t total_kv = m.kv_indptr[bs].value();
  if (static_cast<int64_t>(m.kv_indices.size()) < total_kv) {
    return Invalid("kv_indices", absl::StrCat("holds ", m.kv_indices.size(),
                                              " entries, kv_indptr[bs] = ", total_kv));
  }
  for (int64_t i = 0; i < bs; ++i) {
    const TokenCount step = m.kv_indptr[i + 1] - m.kv_indptr[i];
    if (step != m.kv_lens[i].count()) {
      return Invalid("kv_indptr", absl::StrCat("step ", i, " = ", step.value(),
                                               " differs from kv_lens[", i,
                                               "] = ", m.kv_lens[i].value()));
    }
  }
  const int64_t claimed_rows = m.qo_indptr[bs].value();
  // Only the variable-row form of extend and draft-extend leaves a tail; any other mode's rows
  // are all claimed, whatever the context allows.
  const bool tail_allowed = ctx.allow_unclaimed_rows &&
                            (m.mode == ForwardMode::kExtend || m.mode == ForwardMode::kDraftExtend);
  if (claimed_rows > ctx.num_query_rows.value() ||
      (claimed_rows < ctx.num_query_rows.value() && !tail_allowed)) {
    return Invalid("qo_indptr",
                   absl::StrCat("qo_indptr[bs] = ", claimed_rows, " but the query tensor has ",
                                ctx.num_query_rows.value(), " rows"));
  }
  TokenCount max_q;
  for (int64_t i = 0; i < bs; ++i) {
    const TokenCount q_len = m.qo_indptr[i + 1] - m.qo_indptr[i];
    if (absl::Status s = CheckModeSequence(m.mode, i, q_len, m.kv_lens[i].count()); !s.ok()) {
      return Invalid("qo_indptr", s.message());
    }
    if (q_len > max_q) max_q = q_len;
  }
  const int64_t pool = ctx.pool_slots.value();
  const int64_t first_allowed = ctx.allow_padding_page ? 0 : ctx.page_size.tokens();
  if (m.max_q_len != max_q) {
    return Invalid("max_q_len", absl::StrCat("is ", m.max_q_len.value(),
                                             ", the largest q_len is ", max_q.value()));
  }
  const TokenCount max_kv = MaxLength(m.kv_lens);
  if (m.max_kv_len != max_kv) {
    return Invalid("max_kv_len", absl::StrCat("is ", m.max_kv_len.value(),
                                              ", the largest kv_len is ", max_kv.value()));
  }
  const int64_t ps = ctx.page_size.tokens();
  for (int64_t i = 0; i < bs; ++i) {
    const TokenLength want = LastPageLen(m.kv_lens[i], ctx.page_size);
    if (m.kv_last_page_len[i] != want) {
      return Invalid("kv_last_page_len",
                     absl::StrCat("entry ", i, " = ", m.kv_last_page_len[i].value(), ", want ",
                                  want.value(), " for kv_len ", m.kv_lens[i].value(),
                                  " and page_size ", ps));
    }
  }
  const PageTableSpan<const PageId>& pt = m.page_table;
  if (pt.rows() == 0 && pt.cols() == PageCount(0)) {
    // No page-level consumer: check the slots alone.
    return CheckSlotRange(m.kv_indices.subspan(0, total_kv), first_allowed, pool);
  }
  // With a page table, the token-by-token check below also proves every slot in range: each
  // slot equals an offset within a page checked to lie in the pool.
  const PageCount need_cols = PagesForTokensCeil(max_kv, ctx.page_size);
  if (pt.rows() < bs || pt.cols() < need_cols) {
    return Invalid("page_table",
                   absl::StrCat("is [", pt.rows(), "][", pt.cols().value(), "], the batch needs [",
                                bs, "][", need_cols.value(), "]"));
  }
  for (int64_t i = 0; i < bs; ++i) {
    absl::Span<const PageId> row = pt.row(i);
    const TokenSlot* slots = m.kv_indices.data() + m.kv_indptr[i].value();
    const int64_t n = m.kv_lens[i].value();
    // Token t must sit at offset t % page_size of page row[t / page_size].
    if (!RowMatchesSlots(row, slots, n, ctx.page_size, first_allowed / ps, pool / ps)) {
      // Find and explain the first offending page or token.
      for (int64_t j = 0, t = 0; t < n; ++j) {
        if (row[j].value() < first_allowed / ps || row[j].value() >= pool / ps) {
          return Invalid("page_table", absl::StrCat("[", i, "][", j, "] = page ", row[j].value(),
                                                    " outside the allocatable pages [",
                                                    first_allowed / ps, ", ", pool / ps, ")"));
        }
        const int32_t first = FirstSlotOf(row[j], ctx.page_size).value();
        const int32_t len = static_cast<int32_t>(std::min(ps, n - t));
        const int32_t diff = PageMismatch(slots + t, first, len);
        if (diff != 0) {
          int64_t bad = t;
          while (slots[bad].value() == first + (bad - t)) ++bad;
          const int64_t slot = slots[bad].value();
          if (slot < first_allowed || slot >= pool) {
            return SlotError(m.kv_indptr[i].value() + bad, slot, first_allowed, pool);
          }
          return Invalid("page_table",
                         absl::StrCat("[", i, "][", j, "] = page ", row[j].value(),
                                      " disagrees with kv_indices: token ", bad, " of sequence ", i,
                                      " is in slot ", slots[bad].value(), " (page ",
                                      PageOf(slots[bad], ctx.page_size).value(), ", offset ",
                                      OffsetInPage(slots[bad], ctx.page_size).value(), ")"));
        }
        t += len;
      }
      // Unreachable: the fast check failed, so the loop above found an offending token.
      return absl::InternalError(absl::StrCat("validator: page-table check of sequence ", i,
                                              " failed without an offending token"));
    }
    for (int64_t j = PagesForTokensCeil(TokenCount(n), ctx.page_size).value();
         j < pt.cols().value(); ++j) {
      if (row[j] != kPaddingPage) {
        return Invalid("page_table", absl::StrCat("[", i, "][", j, "] = page ", row[j].value(),
                                                  " past the sequence's pages, want the padding "
                                                  "page"));
      }
    }
  }
  return absl::OkStatus();
}

// A draft tree's rows (DESIGN.md 2b): every row sees the root (query row 0's position) and,
// in a FULL block, every committed position before it; the QLEN_ONLY and bit-packed layouts
// hold no prefix columns (the kernel takes them as seen). A cleared prefix column would
// silently drop a committed token from the verify.
// REQUIRES: the mask passed CheckCustomMask's size checks.
absl::Status CheckTreeMaskRows(const ForwardMetadataView& m, int32_t word_bytes) {
  const CustomMaskView& mask = m.custom_mask;
  for (int64_t i = 0; i < m.batch_size(); ++i) {
    const int64_t q_len = (m.qo_indptr[i + 1] - m.qo_indptr[i]).value();
    const int64_t kv_len = m.kv_lens[i].value();
    const int64_t root = kv_len - q_len;
    const int64_t seen_before = mask.layout == MaskLayout::kFull ? 0 : root;
    for (int64_t r = 0; r < q_len; ++r) {
      for (int64_t c = seen_before; c <= root; ++c) {
        if (!MaskSees(mask, i, q_len, kv_len, word_bytes, r, c)) {
          return Invalid("custom_mask",
                         absl::StrCat("row ", r, " of sequence ", i, " does not see ",
                                      c == root ? "the root, position " : "committed position ", c,
                                      " (a draft tree's rows see the root and the prefix)"));
        }
      }
    }
  }
  return absl::OkStatus();
}

// The custom mask: allowed by the mode, mask_indptr the batch's for its layout, the mask
// long enough, 0/1 bytes, and every row seeing its own position (a row that sees nothing
// has no softmax).
// REQUIRES: ValidateLayout passed.
absl::Status CheckCustomMask(const ForwardMetadataView& m) {
  const CustomMaskView& mask = m.custom_mask;
  if (absl::Status s = CheckModeMask(m.mode, mask.layout); !s.ok()) {
    return Invalid("custom_mask", s.message());
  }
  const int64_t bs = m.batch_size();
  if (mask.layout == MaskLayout::kNone) {
    if (!mask.mask.empty() || !mask.mask_indptr.empty()) {
      return Invalid("custom_mask", "layout none with mask bytes or a mask_indptr");
    }
    return absl::OkStatus();
  }
  const int32_t word_bytes = MaskWordBytes(m.max_q_len);
  if (mask.layout == MaskLayout::kBitPacked && word_bytes == 0) {
    return Invalid("custom_mask", absl::StrCat("bit-packed rows hold at most ", kMaxBitPackedRows,
                                               " query rows, max_q_len is ", m.max_q_len.value()));
  }
  if (static_cast<int64_t>(mask.mask_indptr.size()) != bs + 1 || mask.mask_indptr[0] != 0) {
    return Invalid("mask_indptr", absl::StrCat("has ", mask.mask_indptr.size(),
                                               " entries, want batch_size + 1 = ", bs + 1,
                                               " starting at 0"));
  }
  for (int64_t i = 0; i < bs; ++i) {
    const TokenCount q_len = m.qo_indptr[i + 1] - m.qo_indptr[i];
    const int64_t want = MaskBlockBytes(mask.layout, q_len, m.kv_lens[i].count(), word_bytes);
    // Compared as a sum of checked values: the caller's entry minus its predecessor could
    // overflow.
    if (mask.mask_indptr[i + 1] != mask.mask_indptr[i] + want) {
      return Invalid("mask_indptr",
                     absl::StrCat("entry ", i + 1, " = ", mask.mask_indptr[i + 1], ", want ",
                                  mask.mask_indptr[i], " + the ", MaskLayoutName(mask.layout),
                                  " block of q_len ", q_len.value(), " over kv_len ",
                                  m.kv_lens[i].value(), " (", want, " bytes)"));
    }
  }
  if (static_cast<int64_t>(mask.mask.size()) < mask.mask_indptr[bs]) {
    return Invalid("custom_mask", absl::StrCat("holds ", mask.mask.size(),
                                               " bytes, mask_indptr[bs] = ", mask.mask_indptr[bs]));
  }
  if (mask.layout != MaskLayout::kBitPacked) {
    for (int64_t k = 0; k < mask.mask_indptr[bs]; ++k) {
      if (mask.mask[k] > 1) {
        return Invalid("custom_mask", absl::StrCat("byte ", k, " = ", mask.mask[k], ", want 0 or 1"));
      }
    }
  }
  for (int64_t i = 0; i < bs; ++i) {
    const int64_t q_len = (m.qo_indptr[i + 1] - m.qo_indptr[i]).value();
    const int64_t kv_len = m.kv_lens[i].value();
    for (int64_t r = 0; r < q_len; ++r) {
      if (!MaskSees(mask, i, q_len, kv_len, word_bytes, r, kv_len - q_len + r)) {
        return Invalid("custom_mask", absl::StrCat("row ", r, " of sequence ", i,
                                                   " does not see its own position ",
                                                   kv_len - q_len + r));
      }
    }
  }
  if (m.mode == ForwardMode::kTargetVerify) return CheckTreeMaskRows(m, word_bytes);
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateForwardMetadata(const ForwardMetadataView& m, const ValidationContext& ctx) {
  if (absl::Status s = ValidateLayout(m, ctx); !s.ok()) return s;
  if (absl::Status s = CheckCustomMask(m); !s.ok()) return s;
  if (ctx.allow_padding_page) {
    if (absl::Status s = CheckPaddingRows(m, ctx.page_size.tokens()); !s.ok()) return s;
  }
  if (!ctx.check_slot_ownership) return absl::OkStatus();
  return CheckSlotOwnership(m, ctx.pool_slots.value(),
                            ctx.allow_padding_page ? ctx.page_size.tokens() : 0);
}

}  // namespace attnmeta
