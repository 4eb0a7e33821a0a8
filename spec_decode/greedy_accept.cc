#include "spec_decode/greedy_accept.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace attnmeta {

absl::StatusOr<AcceptResult> AcceptGreedy(const AcceptInputs& in) {
  if (in.tree == nullptr) return absl::InvalidArgumentError("greedy acceptance: no tree");
  const VerifyTree& tree = *in.tree;
  const int64_t n = tree.num_draft_tokens.value();
  const int64_t bs = tree.batch_size();
  // Before anything is sized by n: an empty batch passes every size check below.
  if (n < 1 || n > kMaxVerifyTreeTokens) {
    return absl::InvalidArgumentError(absl::StrCat("greedy acceptance: a tree of ", n,
                                                   " tokens per request, outside [1, ",
                                                   kMaxVerifyTreeTokens, "]"));
  }
  // keep_indptr's offsets are int32.
  if (bs * n > std::numeric_limits<int32_t>::max()) {
    return absl::OutOfRangeError(absl::StrCat("greedy acceptance: ", bs, " requests of ", n,
                                              " tokens: more tree tokens than int32"));
  }
  const size_t want = static_cast<size_t>(bs * n);
  if (in.draft_tokens.size() != want || in.target_predict.size() != want ||
      in.tree_slots.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "greedy acceptance: draft_tokens, target_predict and tree_slots have ",
        in.draft_tokens.size(), ", ", in.target_predict.size(), " and ", in.tree_slots.size(),
        " entries; the tree has ", bs, " requests of ", n, " tokens"));
  }
  // The tree is a public aggregate: its links are checked before the walk follows them.
  if (tree.next_token.size() != want || tree.next_sibling.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "greedy acceptance: a tree of ", bs, " requests of ", n, " tokens with ",
        tree.next_token.size(), " next_token and ", tree.next_sibling.size(),
        " next_sibling entries"));
  }
  for (size_t i = 0; i < want; ++i) {
    for (int32_t link : {tree.next_token[i], tree.next_sibling[i]}) {
      if (link != -1 && (link < 1 || link >= n)) {
        return absl::InvalidArgumentError(
            absl::StrCat("greedy acceptance: tree link ", link, " at entry ", i,
                         " is neither -1 nor a non-root token of [1, ", n, ")"));
      }
    }
  }
  AcceptResult r;
  r.accept_index.assign(want, -1);
  r.accept_count.assign(static_cast<size_t>(bs), TokenLength(0));
  r.bonus_token.assign(static_cast<size_t>(bs), 0);
  r.keep_indptr.push_back(TokenOffset(0));
  std::vector<uint8_t> on_path(static_cast<size_t>(n));
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t base = b * n;
    std::fill(on_path.begin(), on_path.end(), 0);
    int32_t cur = 0;
    int32_t count = 0;
    r.accept_index[base] = 0;
    on_path[0] = 1;
    for (;;) {
      int32_t child = tree.next_token[base + cur];
      // A list of n - 1 siblings at most: a longer walk went round a cycle.
      for (int64_t hops = 0; child != -1 && in.draft_tokens[base + child] !=
                                                in.target_predict[base + cur];
           ++hops) {
        if (hops >= n) {
          return absl::InvalidArgumentError(absl::StrCat(
              "greedy acceptance: request ", b, ": token ", cur, "'s children form a cycle"));
        }
        child = tree.next_sibling[base + child];
      }
      if (child == -1) break;
      if (on_path[child] != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "greedy acceptance: request ", b, ": the accepted path returns to token ", child));
      }
      cur = child;
      on_path[cur] = 1;
      r.accept_index[base + ++count] = cur;
    }
    r.accept_count[b] = TokenLength(count);
    r.bonus_token[b] = in.target_predict[base + cur];
    for (int32_t k = 0; k <= count; ++k) {
      r.keep_slots.push_back(in.tree_slots[base + r.accept_index[base + k]]);
    }
    r.keep_indptr.push_back(TokenOffset(static_cast<int32_t>(r.keep_slots.size())));
    for (int64_t t = 0; t < n; ++t) {
      if (on_path[t] == 0) r.free_slots.push_back(in.tree_slots[base + t]);
    }
  }
  return r;
}

}  // namespace attnmeta
