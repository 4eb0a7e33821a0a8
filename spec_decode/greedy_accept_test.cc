#include "spec_decode/greedy_accept.h"

#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kvcache/paged_token_allocator.h"

namespace attnmeta {
namespace {

// The verify tree of verify_tree_test's golden case: request 0 is 0 -> {1, 2}, 1 -> 3 -> 5,
// 2 -> 4; request 1 is 0 -> 1 -> {2, 3}, with token 4 lost (its parent was not selected) and
// token 5 under it.
VerifyTree GoldenTree() {
  const std::vector<int64_t> parent_list = {-1, 0, 1, 2, 99, -1, 1, 1, 42, 6};
  const std::vector<int64_t> selected = {0, 1, 2, 4, 7, 1, 3, 5, 6, 8};
  const std::vector<TokenLength> seq_lens = {TokenLength(5), TokenLength(9)};
  return *BuildVerifyTree(parent_list, selected, seq_lens, 2, 3, TokenLength(6));
}

// Worked by hand. Request 0: the target predicts 12 after the root (token 1 is 11, its
// sibling token 2 is 12: accepted), 14 after token 2 (token 4: accepted), 77 after token 4
// (no child): path 0, 2, 4, bonus 77. Request 1: 21 after the root (token 1), 23 after token
// 1 (token 2 is 22, token 3 is 23: accepted), 99 after token 3 (no child): path 0, 1, 3,
// bonus 99. Then the root of request 1 predicts 24, the draft of its lost token 4 (parent 42,
// not in the tree): token 4 is no child of the root, so only the root is kept, bonus 24.
TEST(GreedyAcceptTest, WalksTheTreeAndSplitsTheSlots) {
  const VerifyTree tree = GoldenTree();
  const std::vector<int32_t> draft = {100, 11, 12, 13, 14, 15, 200, 21, 22, 23, 24, 25};
  const std::vector<int32_t> predict = {12, 0, 14, 0, 77, 0, 21, 23, 0, 99, 0, 0};
  // The tree tokens' slots come from the real allocator: six per request.
  PagedTokenAllocator alloc = *PagedTokenAllocator::Create(
      PageCount(16), *PageSize::Create(4), FreePagePolicy::Shuffled(3));
  auto slots = alloc.AllocateExtend({{TokenCount(0), TokenCount(6), TokenSlot(0)},
                                     {TokenCount(0), TokenCount(6), TokenSlot(0)}});
  ASSERT_TRUE(slots.ok());
  auto r = AcceptGreedy(AcceptInputs{&tree, draft, predict, *slots});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->accept_index, (std::vector<int32_t>{0, 2, 4, -1, -1, -1, 0, 1, 3, -1, -1, -1}));
  EXPECT_EQ(r->accept_count, (std::vector<TokenLength>{TokenLength(2), TokenLength(2)}));
  EXPECT_EQ(r->bonus_token, (std::vector<int32_t>{77, 99}));
  const std::vector<TokenSlot>& s = *slots;
  EXPECT_EQ(r->keep_slots, (std::vector<TokenSlot>{s[0], s[2], s[4], s[6], s[7], s[9]}));
  EXPECT_EQ(r->keep_indptr, (std::vector<TokenOffset>{TokenOffset(0), TokenOffset(3), TokenOffset(6)}));
  EXPECT_EQ(r->free_slots, (std::vector<TokenSlot>{s[1], s[3], s[5], s[8], s[10], s[11]}));
  // The rejected slots go back to the allocator, freed together at the end of the step.
  ASSERT_TRUE(alloc.BeginFreeGroup().ok());
  ASSERT_TRUE(alloc.Free(r->free_slots).ok());
  ASSERT_TRUE(alloc.EndFreeGroup().ok());
  EXPECT_EQ(alloc.live_tokens(), TokenCount(6));
  for (TokenSlot kept : r->keep_slots) EXPECT_TRUE(alloc.IsLive(kept));
  for (TokenSlot freed : r->free_slots) EXPECT_FALSE(alloc.IsLive(freed));

  std::vector<int32_t> names_the_lost = predict;
  names_the_lost[6] = 24;
  auto lost = AcceptGreedy(AcceptInputs{&tree, draft, names_the_lost, *slots});
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_EQ(lost->accept_index, (std::vector<int32_t>{0, 2, 4, -1, -1, -1, 0, -1, -1, -1, -1, -1}));
  EXPECT_EQ(lost->accept_count, (std::vector<TokenLength>{TokenLength(2), TokenLength(0)}));
  EXPECT_EQ(lost->bonus_token, (std::vector<int32_t>{77, 24}));
}

// A chain (top-k 1) whose every draft token is right: all accepted, the bonus after the last.
TEST(GreedyAcceptTest, AChainAcceptedWhole) {
  const std::vector<int32_t> parents = {-1, 0, 1, 2};
  const std::vector<TokenLength> lens = {TokenLength(7)};
  const VerifyTree tree = *BuildVerifyTreeFromParents(parents, lens, TokenLength(4));
  const std::vector<int32_t> draft = {5, 6, 7, 8};
  const std::vector<int32_t> predict = {6, 7, 8, 9};
  const std::vector<TokenSlot> slots = {TokenSlot(40), TokenSlot(41), TokenSlot(42), TokenSlot(43)};
  auto r = AcceptGreedy(AcceptInputs{&tree, draft, predict, slots});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->accept_count, std::vector<TokenLength>{TokenLength(3)});
  EXPECT_EQ(r->bonus_token, std::vector<int32_t>{9});
  EXPECT_EQ(r->keep_slots, slots);
  EXPECT_TRUE(r->free_slots.empty());
}

TEST(GreedyAcceptTest, WrongSizesAreRefused) {
  const VerifyTree tree = GoldenTree();
  const std::vector<int32_t> twelve(12, 0);
  const std::vector<int32_t> eleven(11, 0);
  const std::vector<TokenSlot> slots(12, TokenSlot(4));
  EXPECT_EQ(AcceptGreedy(AcceptInputs{&tree, eleven, twelve, slots}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AcceptGreedy(AcceptInputs{&tree, twelve, eleven, slots}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AcceptGreedy(AcceptInputs{&tree, twelve, twelve, {}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AcceptGreedy(AcceptInputs{nullptr, twelve, twelve, slots}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // keep_indptr is int32: a tree of 2^25 requests of 64 tokens (2^31 tree tokens) is refused
  // before its arrays are looked at.
  VerifyTree huge;
  huge.num_draft_tokens = TokenLength(kMaxVerifyTreeTokens);
  huge.seq_lens.resize(size_t{1} << 25);
  EXPECT_EQ(AcceptGreedy(AcceptInputs{&huge, {}, {}, {}}).status().code(),
            absl::StatusCode::kOutOfRange);
}

// A tree is a public aggregate: one whose links are missing, out of range or cyclic is
// refused before the walk follows them.
TEST(GreedyAcceptTest, MalformedTreesAreRefused) {
  const std::vector<int32_t> twelve(12, 0);
  const std::vector<TokenSlot> slots(12, TokenSlot(4));
  auto code = [&](const VerifyTree& t) {
    return AcceptGreedy(AcceptInputs{&t, twelve, twelve, slots}).status().code();
  };
  const auto bad = absl::StatusCode::kInvalidArgument;
  {  // No draft tokens at all: nothing to walk.
    VerifyTree t;
    t.seq_lens = {TokenLength(3)};
    const std::vector<int32_t> none;
    EXPECT_EQ(AcceptGreedy(AcceptInputs{&t, none, none, {}}).status().code(), bad);
  }
  {  // More tokens per request than a tree holds, in an empty batch that every size check
     // passes: refused before a per-token array is sized (n = INT32_MAX would take 2 GiB).
    VerifyTree t;
    t.num_draft_tokens = TokenLength(std::numeric_limits<int32_t>::max());
    const std::vector<int32_t> none;
    const absl::Status s = AcceptGreedy(AcceptInputs{&t, none, none, {}}).status();
    EXPECT_EQ(s.code(), bad);
    EXPECT_EQ(s.message(),
              "greedy acceptance: a tree of 2147483647 tokens per request, outside [1, 64]");
    t.num_draft_tokens = TokenLength(65);
    EXPECT_EQ(AcceptGreedy(AcceptInputs{&t, none, none, {}}).status().code(), bad);
    t.num_draft_tokens = TokenLength(64);
    EXPECT_TRUE(AcceptGreedy(AcceptInputs{&t, none, none, {}}).ok());
  }
  {  // Links missing for the second request: its next tokens, or its next siblings.
    VerifyTree t = GoldenTree();
    t.next_token.resize(6);
    EXPECT_EQ(code(t), bad);
    t = GoldenTree();
    t.next_sibling.resize(6);
    EXPECT_EQ(code(t), bad);
  }
  {  // A link past the request's tokens, and one naming the root.
    VerifyTree t = GoldenTree();
    t.next_token[0] = 6;
    EXPECT_EQ(code(t), bad);
    t = GoldenTree();
    t.next_sibling[1] = 0;
    EXPECT_EQ(code(t), bad);
  }
  {  // Siblings in a cycle that never matches: predict 9 after the root, tokens 1 and 2
     // name each other as siblings.
    VerifyTree t = GoldenTree();
    t.next_sibling[1] = 2;
    t.next_sibling[2] = 1;
    std::vector<int32_t> predict = twelve;
    predict[0] = 9;
    EXPECT_EQ(AcceptGreedy(AcceptInputs{&t, twelve, predict, slots}).status().code(), bad);
  }
  {  // A path that returns to itself: token 1 is its own first child and every draft token
     // matches every prediction (all zero).
    VerifyTree t = GoldenTree();
    t.next_token[1] = 1;
    EXPECT_EQ(code(t), bad);
  }
  // The golden tree itself passes with the same inputs.
  const VerifyTree golden = GoldenTree();
  EXPECT_TRUE(AcceptGreedy(AcceptInputs{&golden, twelve, twelve, slots}).ok());
}

}  // namespace
}  // namespace attnmeta
