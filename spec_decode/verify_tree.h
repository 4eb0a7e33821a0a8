// The verify tree of EAGLE target-verify: per request, n draft tokens (token 0 is the root,
// the last verified token) arranged as a tree, its positions, the links a greedy acceptance
// walks, and the custom attention mask in the layouts kernels read (DESIGN.md section 2b).
//
// Two input forms:
//  - the reference system's encoding: per request parent_list (topk * (depth - 1) + 1
//    entries) and selected_index (the n - 1 selected candidates, ascending). The parent of
//    token i >= 1: with p = selected_index[i - 1] / topk, the root when p == 0, else 1 + the
//    position j among the request's own n - 1 entries with selected_index[j] ==
//    parent_list[p]. A token whose parent is not found is left out of the links, and its mask
//    walk stops there (as the reference does); walks are bounded by depth.
//  - plain parent arrays: parents[b * n + t] in [0, n) for t >= 1, -1 for the root.
// Positions: seq_len + depth(t), depth(t) the steps of t's walk. Links: a parent's first child
// is its smallest child index; siblings run in ascending order; -1 ends a list.

#ifndef ATTNMETA_SPEC_DECODE_VERIFY_TREE_H_
#define ATTNMETA_SPEC_DECODE_VERIFY_TREE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "attention/metadata/custom_mask.h"
#include "kvcache/units.h"

namespace attnmeta {

// The most draft tokens (the root included) a verify tree holds, the builders' and greedy
// acceptance's bound (the bit-packed mask layout takes at most kMaxBitPackedRows of them).
inline constexpr int32_t kMaxVerifyTreeTokens = 64;

struct VerifyTree {
  TokenLength num_draft_tokens;               // n, the root included: query rows per request
  std::vector<TokenLength> seq_lens;          // [bs] committed tokens per request
  // Entry b * n + t of each [bs * n] array is token t of request b.
  std::vector<int32_t> parent;  // [bs * n] tree-local (0 .. n - 1); -1 for the root and for a
                                // token whose parent is lost
  std::vector<uint8_t> sees;    // [bs * n * n]: sees[(b * n + t) * n + c], t's mask row
  std::vector<TokenPosition> positions;  // [bs * n] seq_lens[b] + depth(t)
  std::vector<int32_t> retrieve_index;   // [bs * n] b * n + t (batch-global)
  std::vector<int32_t> next_token;       // [bs * n] first child (tree-local), or -1
  std::vector<int32_t> next_sibling;     // [bs * n] next sibling (tree-local), or -1

  int64_t batch_size() const { return static_cast<int64_t>(seq_lens.size()); }
};

// The reference encoding. InvalidArgument: n < 1 or n > 64, topk < 1, depth < 1, array sizes
// that disagree with bs, topk, depth and n, a negative seq_len, a negative selected index, a
// selected index whose parent_list slot p is outside [0, topk * (depth - 1) + 1), or a cycle
// among a request's
// tokens; OutOfRange: a seq_len + n beyond INT32_MAX (the positions are int32), or bs * n
// beyond INT32_MAX (retrieve_index is int32).
absl::StatusOr<VerifyTree> BuildVerifyTree(absl::Span<const int64_t> parent_list,
                                           absl::Span<const int64_t> selected_index,
                                           absl::Span<const TokenLength> seq_lens, int32_t topk,
                                           int32_t depth, TokenLength num_draft_tokens);

// Plain parent arrays. InvalidArgument: sizes, n outside [1, 64], a root (token 0) with a
// parent, a non-root without one (several roots), a parent outside [0, n), or a cycle;
// OutOfRange: a seq_len + n or bs * n beyond INT32_MAX.
absl::StatusOr<VerifyTree> BuildVerifyTreeFromParents(absl::Span<const int32_t> parents,
                                                      absl::Span<const TokenLength> seq_lens,
                                                      TokenLength num_draft_tokens);

// The tree's mask in `layout` (custom_mask.h), as the reference lays it out: request b has n
// query rows over seq_len + n KV tokens, so FULL is a [n][seq_len + n] block at
// n * n * b + n * sum(seq_lens[:b]) with every prefix column 1, QLEN_ONLY the [n][n] block at
// n * n * b, bit-packed n words from word b * n. Writes mask_indptr [bs + 1] (int64 byte
// offsets) and mask bytes [0, mask_indptr[bs]); nothing on error. InvalidArgument: layout
// kNone, n > 32 for bit-packed, mask_indptr not bs + 1 entries, out too small, a hand-built
// tree whose `sees` is not bs * n * n bytes or has rows CheckTreeRows refuses as a draft
// tree's (a byte other than 0/1, a row not seeing itself or the root), a negative seq_len;
// OutOfRange: a request's seq_len + n beyond
// INT32_MAX, or the batch's query rows (bs * n) or KV tokens summing past INT32_MAX.
absl::Status WriteTreeMask(const VerifyTree& tree, MaskLayout layout, absl::Span<uint8_t> out,
                           absl::Span<int64_t> mask_indptr);

}  // namespace attnmeta

#endif  // ATTNMETA_SPEC_DECODE_VERIFY_TREE_H_
