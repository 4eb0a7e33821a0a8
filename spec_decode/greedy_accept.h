// Greedy acceptance of a verify tree: walk each request's tree from the root, at every token
// following the child whose draft token is what the target model predicted after it, and stop
// where no child matches. The target's prediction at the last accepted token is the bonus
// token. The KV slots of the accepted path (root included) are kept; every other tree slot is
// handed back (to PagedTokenAllocator::Free).

#ifndef ATTNMETA_SPEC_DECODE_GREEDY_ACCEPT_H_
#define ATTNMETA_SPEC_DECODE_GREEDY_ACCEPT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvcache/units.h"
#include "spec_decode/verify_tree.h"

namespace attnmeta {

struct AcceptInputs {
  const VerifyTree* tree = nullptr;
  absl::Span<const int32_t> draft_tokens;    // [bs * n] token id of each tree token
  absl::Span<const int32_t> target_predict;  // [bs * n] the target's token after each tree token
  absl::Span<const TokenSlot> tree_slots;    // [bs * n] the KV slot each tree token was written to
};

struct AcceptResult {
  // [bs * n]: request b's accepted path in tree-local indices, root first, at b * n; -1 past
  // its 1 + accept_count[b] entries.
  std::vector<int32_t> accept_index;
  std::vector<TokenLength> accept_count;  // [bs] accepted draft tokens (the root not counted)
  std::vector<int32_t> bonus_token;   // [bs] target_predict at the last accepted token
  std::vector<TokenSlot> keep_slots;  // the accepted paths' slots, request by request
  std::vector<TokenOffset> keep_indptr;  // [bs + 1] into keep_slots
  // [bs * n - keep_indptr[bs]] every other tree slot: request b's n - 1 - accept_count[b] in
  // tree order, request by request (they are handed back together).
  std::vector<TokenSlot> free_slots;
};

// InvalidArgument: no tree, n outside [1, kMaxVerifyTreeTokens], arrays whose sizes are not
// bs * n, or a tree whose links (next_token, next_sibling) are not -1 or a non-root token, or
// go round a cycle; OutOfRange: bs * n beyond INT32_MAX (keep_indptr is int32).
absl::StatusOr<AcceptResult> AcceptGreedy(const AcceptInputs& in);

}  // namespace attnmeta

#endif  // ATTNMETA_SPEC_DECODE_GREEDY_ACCEPT_H_
