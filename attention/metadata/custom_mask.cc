#include "attention/metadata/custom_mask.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace attnmeta {

absl::string_view MaskLayoutName(MaskLayout layout) {
  switch (layout) {
    case MaskLayout::kNone:
      return "none";
    case MaskLayout::kFull:
      return "full";
    case MaskLayout::kQLenOnly:
      return "qlen_only";
    case MaskLayout::kBitPacked:
      return "bit_packed";
  }
  return "unknown";
}

absl::Status CheckKnownMaskLayout(MaskLayout layout) {
  if (MaskLayoutName(layout) != "unknown") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("mask layout ", static_cast<int>(layout), " is not a mask layout"));
}

absl::StatusOr<MaskLayout> ParseMaskLayout(absl::string_view name) {
  if (name.empty()) return MaskLayout::kNone;
  for (MaskLayout l : {MaskLayout::kNone, MaskLayout::kFull, MaskLayout::kQLenOnly,
                       MaskLayout::kBitPacked}) {
    if (MaskLayoutName(l) == name) return l;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown mask layout \"", name,
                                                 "\" (none, full, qlen_only, bit_packed)"));
}

int32_t MaskWordBytes(TokenCount max_q_len) {
  if (max_q_len.value() <= 8) return 1;
  if (max_q_len.value() <= 16) return 2;
  if (max_q_len.value() <= kMaxBitPackedRows) return 4;
  return 0;
}

int64_t MaskBlockBytes(MaskLayout layout, TokenCount q_len, TokenCount kv_len, int32_t word_bytes) {
  switch (layout) {
    case MaskLayout::kNone:
      return 0;
    case MaskLayout::kFull:
      return q_len.value() * kv_len.value();
    case MaskLayout::kQLenOnly:
      return q_len.value() * q_len.value();
    case MaskLayout::kBitPacked:
      return q_len.value() * word_bytes;
  }
  return 0;
}

namespace {

// OutOfRange when `lens` sum past INT32_MAX. REQUIRES: every entry >= 0 (each is an int32, so
// the running sum stops before it could overflow).
absl::Status CheckSumWithinInt32(absl::Span<const TokenLength> lens, absl::string_view what) {
  int64_t sum = 0;
  for (TokenLength n : lens) {
    sum += n.value();
    if (sum > std::numeric_limits<int32_t>::max()) {
      return absl::OutOfRangeError(
          absl::StrCat("custom mask: the batch's ", what, " sum past INT32_MAX"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckQueryLengths(absl::Span<const TokenLength> q_lens) {
  for (size_t i = 0; i < q_lens.size(); ++i) {
    if (q_lens[i].value() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("custom mask: sequence ", i, " has q_len ", q_lens[i].value()));
    }
  }
  return CheckSumWithinInt32(q_lens, "query rows");
}

// The shared checks of the two builders; sets *word_bytes.
absl::Status CheckBatch(MaskLayout layout, absl::Span<const TokenLength> q_lens,
                        absl::Span<const TokenLength> kv_lens, int32_t* word_bytes) {
  if (absl::Status s = CheckKnownMaskLayout(layout); !s.ok()) return s;
  if (layout == MaskLayout::kNone) {
    return absl::InvalidArgumentError("custom mask: layout none has no mask to build");
  }
  if (q_lens.size() != kv_lens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("custom mask: ", q_lens.size(), " q_lens but ",
                                                   kv_lens.size(), " kv_lens"));
  }
  TokenCount max_q;
  for (size_t i = 0; i < q_lens.size(); ++i) {
    if (q_lens[i].value() < 0 || q_lens[i] > kv_lens[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("custom mask: sequence ", i, " has q_len ", q_lens[i].value(),
                       " and kv_len ", kv_lens[i].value(), " (want 0 <= q_len <= kv_len)"));
    }
    max_q = std::max(max_q, q_lens[i].count());
  }
  // The query rows' bound keeps sum(q_len * kv_len) and sum(q_len^2) under 2^62 (every kv_len
  // is an int32): no block sum overflows. The KV tokens are bounded as an int32 kv_indptr
  // bounds them.
  if (absl::Status s = CheckSumWithinInt32(q_lens, "query rows"); !s.ok()) return s;
  if (absl::Status s = CheckSumWithinInt32(kv_lens, "KV tokens"); !s.ok()) return s;
  *word_bytes = MaskWordBytes(max_q);
  if (layout == MaskLayout::kBitPacked && *word_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("custom mask: a bit-packed row holds at most ",
                                                   kMaxBitPackedRows, " query rows, max_q_len is ",
                                                   max_q.value()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BuildMaskIndptr(MaskLayout layout, absl::Span<const TokenLength> q_lens,
                             absl::Span<const TokenLength> kv_lens, absl::Span<int64_t> out) {
  int32_t word_bytes = 0;
  if (absl::Status s = CheckBatch(layout, q_lens, kv_lens, &word_bytes); !s.ok()) return s;
  if (out.size() != q_lens.size() + 1) {
    return absl::InvalidArgumentError(absl::StrCat("mask_indptr: has ", out.size(),
                                                   " entries, want batch_size + 1 = ",
                                                   q_lens.size() + 1));
  }
  out[0] = 0;
  for (size_t i = 0; i < q_lens.size(); ++i) {
    out[i + 1] = out[i] + MaskBlockBytes(layout, q_lens[i].count(), kv_lens[i].count(), word_bytes);
  }
  return absl::OkStatus();
}

int64_t TreeRowsBytes(absl::Span<const TokenLength> q_lens) {
  int64_t bytes = 0;
  for (TokenLength q : q_lens) bytes += int64_t{q.value()} * q.value();
  return bytes;
}

absl::Status CheckTreeRowsSize(absl::Span<const uint8_t> tree_rows,
                               absl::Span<const TokenLength> q_lens) {
  if (absl::Status s = CheckQueryLengths(q_lens); !s.ok()) return s;
  const int64_t tree_bytes = TreeRowsBytes(q_lens);
  if (static_cast<int64_t>(tree_rows.size()) != tree_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("custom mask: tree rows hold ",
                                                   tree_rows.size(), " bytes, the batch's q_lens need ",
                                                   tree_bytes));
  }
  return absl::OkStatus();
}

namespace {

// CheckTreeRows over `blocks` blocks, block i of q_of(i) rows.
template <typename QOf>
absl::Status CheckTreeRowBlocks(absl::Span<const uint8_t> tree_rows, size_t blocks, const QOf& q_of,
                                bool draft_tree) {
  int64_t at = 0;  // where block i starts
  for (size_t i = 0; i < blocks; ++i) {
    const int64_t q = q_of(i);
    const uint8_t* block = tree_rows.data() + at;
    for (int64_t k = 0; k < q * q; ++k) {
      if (block[k] > 1) {
        return absl::InvalidArgumentError(absl::StrCat("custom mask: tree row byte ", at + k,
                                                       " (sequence ", i, ", row ", k / q,
                                                       ") = ", block[k], ", want 0 or 1"));
      }
    }
    for (int64_t r = 0; r < q; ++r) {
      if (block[r * q + r] == 0) {
        return absl::InvalidArgumentError(absl::StrCat("custom mask: row ", r, " of sequence ", i,
                                                       " does not see itself (tree row byte ",
                                                       at + r * q + r, ")"));
      }
      if (draft_tree && block[r * q] == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "custom mask: row ", r, " of sequence ", i, " does not see the root (tree row byte ",
            at + r * q, "; a draft tree's rows see the root)"));
      }
    }
    at += q * q;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckTreeRows(absl::Span<const uint8_t> tree_rows,
                           absl::Span<const TokenLength> q_lens, bool draft_tree) {
  if (absl::Status s = CheckTreeRowsSize(tree_rows, q_lens); !s.ok()) return s;
  return CheckTreeRowBlocks(
      tree_rows, q_lens.size(), [&](size_t i) { return int64_t{q_lens[i].value()}; }, draft_tree);
}

absl::Status CheckTreeRows(absl::Span<const uint8_t> tree_rows, int64_t blocks, TokenLength q,
                           bool draft_tree) {
  // q <= INT32_MAX: q * q fits int64; blocks * q * q is compared by division.
  const int64_t per_block = int64_t{q.value()} * q.value();
  const int64_t size = static_cast<int64_t>(tree_rows.size());
  if (blocks < 0 || q.value() < 0 ||
      (per_block == 0 ? size != 0 : size % per_block != 0 || size / per_block != blocks)) {
    return absl::InvalidArgumentError(absl::StrCat("custom mask: tree rows hold ", size,
                                                   " bytes, not ", blocks, " blocks of ", q.value(),
                                                   " x ", q.value()));
  }
  return CheckTreeRowBlocks(
      tree_rows, static_cast<size_t>(blocks), [&](size_t) { return int64_t{q.value()}; },
      draft_tree);
}

absl::Status BuildCustomMask(MaskLayout layout, absl::Span<const uint8_t> tree_rows,
                             absl::Span<const TokenLength> q_lens,
                             absl::Span<const TokenLength> kv_lens,
                             absl::Span<const int64_t> mask_indptr, absl::Span<uint8_t> out) {
  int32_t word_bytes = 0;
  if (absl::Status s = CheckBatch(layout, q_lens, kv_lens, &word_bytes); !s.ok()) return s;
  const size_t bs = q_lens.size();
  if (absl::Status s = CheckTreeRows(tree_rows, q_lens, /*draft_tree=*/false); !s.ok()) return s;
  if (mask_indptr.size() != bs + 1 || mask_indptr[0] != 0) {
    return absl::InvalidArgumentError("custom mask: mask_indptr is not the batch's");
  }
  for (size_t i = 0; i < bs; ++i) {
    // A sum of checked values: the caller's entry minus its predecessor could overflow.
    if (mask_indptr[i + 1] != mask_indptr[i] + MaskBlockBytes(layout, q_lens[i].count(),
                                                              kv_lens[i].count(), word_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat("custom mask: mask_indptr step ", i,
                                                     " disagrees with the ", MaskLayoutName(layout),
                                                     " layout"));
    }
  }
  if (static_cast<int64_t>(out.size()) < mask_indptr[bs]) {
    return absl::InvalidArgumentError(absl::StrCat("custom mask: out holds ", out.size(),
                                                   " bytes, the mask needs ", mask_indptr[bs]));
  }
  const uint8_t* tree = tree_rows.data();
  for (size_t i = 0; i < bs; ++i) {
    const int64_t q = q_lens[i].value();
    const int64_t kv = kv_lens[i].value();
    uint8_t* block = out.data() + mask_indptr[i];
    for (int64_t r = 0; r < q; ++r) {
      const uint8_t* sees = tree + r * q;
      switch (layout) {
        case MaskLayout::kFull: {
          uint8_t* row = block + r * kv;
          std::fill(row, row + (kv - q), uint8_t{1});
          std::copy(sees, sees + q, row + (kv - q));
          break;
        }
        case MaskLayout::kQLenOnly:
          std::copy(sees, sees + q, block + r * q);
          break;
        case MaskLayout::kBitPacked: {
          uint32_t word = 0;
          for (int64_t c = 0; c < q; ++c) word |= uint32_t{sees[c]} << c;
          for (int32_t b = 0; b < word_bytes; ++b) {
            block[r * word_bytes + b] = static_cast<uint8_t>(word >> (8 * b));
          }
          break;
        }
        case MaskLayout::kNone:
          break;
      }
    }
    tree += q * q;
  }
  return absl::OkStatus();
}

}  // namespace attnmeta
