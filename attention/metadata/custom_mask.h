// The custom attention mask of a batch whose query rows form a tree (EAGLE target-verify),
// in the three layouts kernels read (DESIGN.md section 2b), and the one place that says which
// KV position a masked query row sees.
//
// A sequence with q_len query rows over kv_len KV tokens: its query rows sit at positions
// [kv_len - q_len, kv_len) (the prefix before them is committed), and row r sees position c
// when the mask says so. Layouts, per sequence i, a block starting at byte mask_indptr[i]:
//   kFull:      [q_len][kv_len] bytes, row-major, byte (r, c) = row r sees position c;
//   kQLenOnly:  [q_len][q_len] bytes over the query positions; every prefix position is seen;
//   kBitPacked: q_len little-endian words of MaskWordBytes(max_q_len) bytes, bit c = query
//               position c; every prefix position is seen.
// mask_indptr is int64 because a FULL mask of a large batch passes 2^31 bytes.

#ifndef ATTNMETA_ATTENTION_METADATA_CUSTOM_MASK_H_
#define ATTNMETA_ATTENTION_METADATA_CUSTOM_MASK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvcache/units.h"

namespace attnmeta {

enum class MaskLayout { kNone, kFull, kQLenOnly, kBitPacked };

absl::string_view MaskLayoutName(MaskLayout layout);
// InvalidArgument for a value outside the enumerators (a layout cast from an integer).
absl::Status CheckKnownMaskLayout(MaskLayout layout);
// The layout named `name` ("" is kNone). InvalidArgument for an unknown name.
absl::StatusOr<MaskLayout> ParseMaskLayout(absl::string_view name);

// The largest q_len a bit-packed mask holds.
inline constexpr int64_t kMaxBitPackedRows = 32;

// Bytes of one bit-packed row: 1 for max_q_len <= 8, 2 for <= 16, 4 for <= 32; 0 beyond.
int32_t MaskWordBytes(TokenCount max_q_len);

struct CustomMaskView {
  MaskLayout layout = MaskLayout::kNone;
  // [mask_indptr[bs]] bytes (more allowed: a fixed buffer's tail is not read).
  absl::Span<const uint8_t> mask;
  // [bs + 1] when layout != kNone, else empty; mask_indptr[0] == 0, step i == MaskBlockBytes.
  absl::Span<const int64_t> mask_indptr;
};

// Bytes of one sequence's block. REQUIRES: 0 <= q_len <= kv_len <= INT32_MAX; word_bytes > 0
// for kBitPacked.
int64_t MaskBlockBytes(MaskLayout layout, TokenCount q_len, TokenCount kv_len, int32_t word_bytes);

// mask_indptr of a batch: [0] + cumsum(MaskBlockBytes). InvalidArgument: layout kNone, sizes
// that disagree (out [bs + 1]), a negative length or q_len > kv_len, kBitPacked with a q_len
// above kMaxBitPackedRows; OutOfRange: the batch's query rows or KV tokens sum past INT32_MAX
// (as an int32 indptr would; it bounds every mask below 2^62 bytes).
absl::Status BuildMaskIndptr(MaskLayout layout, absl::Span<const TokenLength> q_lens,
                             absl::Span<const TokenLength> kv_lens, absl::Span<int64_t> out);

// The bytes of a batch's tree rows: sum(q_len^2), one [q_len][q_len] block per sequence.
// REQUIRES: every q_len >= 0, sum(q_lens) <= INT32_MAX.
int64_t TreeRowsBytes(absl::Span<const TokenLength> q_lens);

// InvalidArgument unless tree_rows holds TreeRowsBytes(q_lens) bytes (BuildCustomMask's first
// check, for a caller that sizes the mask before calling it); InvalidArgument for a negative
// q_len, OutOfRange when the q_lens sum past INT32_MAX.
absl::Status CheckTreeRowsSize(absl::Span<const uint8_t> tree_rows,
                               absl::Span<const TokenLength> q_lens);

// InvalidArgument unless every byte of tree_rows (per sequence a [q_len][q_len] block, blocks
// back to back) is 0 or 1 and every row sees itself (byte (r, r)): a row that sees nothing has
// no softmax. With `draft_tree` (target-verify, DESIGN.md 2b) also unless every row sees row 0,
// the tree's root. The message names the sequence, the row and the byte. First CheckTreeRowsSize:
// InvalidArgument (OutOfRange) unless tree_rows holds TreeRowsBytes(q_lens) bytes.
absl::Status CheckTreeRows(absl::Span<const uint8_t> tree_rows,
                           absl::Span<const TokenLength> q_lens, bool draft_tree);
// The same over `blocks` blocks of q rows each (a target-verify batch, q draft tokens per
// request); InvalidArgument for blocks < 0, q < 0 or tree_rows not blocks * q * q bytes.
absl::Status CheckTreeRows(absl::Span<const uint8_t> tree_rows, int64_t blocks, TokenLength q,
                           bool draft_tree);

// Writes the mask of `layout` from tree rows: per sequence a [q_len][q_len] block of 0/1
// bytes (byte (r, c) = query row r sees query row c), blocks back to back, in any layout
// (sequences of unequal q_len too: each block starts at its mask_indptr entry).
// `mask_indptr` as BuildMaskIndptr wrote it. Writes
// bytes [0, mask_indptr[bs]) of `out` and nothing else. InvalidArgument: tree_rows not
// sum(q_len^2) bytes, tree rows CheckTreeRows refuses (draft_tree false), mask_indptr not the
// batch's, out shorter than mask_indptr[bs]; OutOfRange as BuildMaskIndptr.
absl::Status BuildCustomMask(MaskLayout layout, absl::Span<const uint8_t> tree_rows,
                             absl::Span<const TokenLength> q_lens,
                             absl::Span<const TokenLength> kv_lens,
                             absl::Span<const int64_t> mask_indptr, absl::Span<uint8_t> out);

// Whether row r of sequence i (q_len rows over kv_len tokens) sees KV position c.
// REQUIRES: the mask validated (validator.h) for this batch; 0 <= r < q_len, 0 <= c < kv_len.
inline bool MaskSees(const CustomMaskView& m, int64_t i, int64_t q_len, int64_t kv_len,
                     int32_t word_bytes, int64_t r, int64_t c) {
  const int64_t prefix = kv_len - q_len;
  if (m.layout == MaskLayout::kNone) return c <= prefix + r;
  const uint8_t* block = m.mask.data() + m.mask_indptr[i];
  switch (m.layout) {
    case MaskLayout::kNone:
      return c <= prefix + r;
    case MaskLayout::kFull:
      return block[r * kv_len + c] != 0;
    case MaskLayout::kQLenOnly:
      return c < prefix || block[r * q_len + (c - prefix)] != 0;
    case MaskLayout::kBitPacked: {
      if (c < prefix) return true;
      const int64_t bit = c - prefix;
      return (block[r * word_bytes + bit / 8] >> (bit % 8) & 1) != 0;
    }
  }
  return false;
}

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_CUSTOM_MASK_H_
