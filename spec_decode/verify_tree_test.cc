#include "spec_decode/verify_tree.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace attnmeta {
namespace {

std::vector<TokenLength> Lens(std::initializer_list<int32_t> v) {
  std::vector<TokenLength> out;
  for (int32_t x : v) out.push_back(TokenLength(x));
  return out;
}

std::vector<int32_t> Positions(const VerifyTree& t) {
  std::vector<int32_t> out;
  for (TokenPosition p : t.positions) out.push_back(p.value());
  return out;
}

// Worked by hand: top-k 2, depth 3, 6 draft tokens (the root included), two requests of
// prefix length 5 and 9.
// Request 0: selected [0, 1, 2, 4, 7] give parent slots s / 2 = [0, 0, 1, 2, 3];
//   parent_list [-, 0, 1, 2, -]: token 3's parent is the token selected as 0 (token 1), token
//   4's the one selected as 1 (token 2), token 5's the one selected as 2 (token 3).
//   Tree: 0 -> {1, 2}, 1 -> 3 -> 5, 2 -> 4.
// Request 1: selected [1, 3, 5, 6, 8], slots [0, 1, 2, 3, 4]; parent_list [-, 1, 1, 42, 6]:
//   tokens 2 and 3 hang under token 1; token 4's parent (42) was not selected: it is left out
//   of the links and its walk stops at itself; token 5 hangs under token 4.
class VerifyTreeGoldenTest : public ::testing::Test {
 protected:
  const std::vector<int64_t> parent_list_ = {-1, 0, 1, 2, 99, -1, 1, 1, 42, 6};
  const std::vector<int64_t> selected_ = {0, 1, 2, 4, 7, 1, 3, 5, 6, 8};
  const std::vector<TokenLength> seq_lens_ = Lens({5, 9});
};

TEST_F(VerifyTreeGoldenTest, PositionsLinksAndEveryMaskLayout) {
  auto tree =
      BuildVerifyTree(parent_list_, selected_, seq_lens_, /*topk=*/2, /*depth=*/3, TokenLength(6));
  ASSERT_TRUE(tree.ok()) << tree.status();
  EXPECT_EQ(tree->parent, (std::vector<int32_t>{-1, 0, 0, 1, 2, 3, -1, 0, 1, 1, -1, 4}));
  EXPECT_EQ(Positions(*tree), (std::vector<int32_t>{5, 6, 6, 7, 7, 8, 9, 10, 11, 11, 10, 11}));
  EXPECT_EQ(tree->retrieve_index, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(tree->next_token, (std::vector<int32_t>{1, 3, 4, 5, -1, -1, 1, 2, -1, -1, 5, -1}));
  EXPECT_EQ(tree->next_sibling, (std::vector<int32_t>{-1, 2, -1, -1, -1, -1, -1, -1, 3, -1, -1, -1}));

  // QLEN_ONLY: the [6][6] blocks, row t = what token t sees.
  const std::vector<uint8_t> qlen = {
      1, 0, 0, 0, 0, 0,  1, 1, 0, 0, 0, 0,  1, 0, 1, 0, 0, 0,  // request 0, tokens 0-2
      1, 1, 0, 1, 0, 0,  1, 0, 1, 0, 1, 0,  1, 1, 0, 1, 0, 1,  // tokens 3-5
      1, 0, 0, 0, 0, 0,  1, 1, 0, 0, 0, 0,  1, 1, 1, 0, 0, 0,  // request 1, tokens 0-2
      1, 1, 0, 1, 0, 0,  1, 0, 0, 0, 1, 0,  1, 0, 0, 0, 1, 1,  // tokens 3-5
  };
  std::vector<uint8_t> q(72 + 4, 7);
  std::vector<int64_t> q_indptr(3);
  ASSERT_TRUE(WriteTreeMask(*tree, MaskLayout::kQLenOnly, absl::MakeSpan(q),
                            absl::MakeSpan(q_indptr))
                  .ok());
  EXPECT_EQ(std::vector<uint8_t>(q.begin(), q.begin() + 72), qlen);
  EXPECT_EQ(q[72], 7) << "nothing written past the batch";
  EXPECT_EQ(q_indptr, (std::vector<int64_t>{0, 36, 72}));

  // Bit-packed: one byte per row (6 <= 8), bit c = column c.
  const std::vector<uint8_t> bits = {0b000001, 0b000011, 0b000101, 0b001011, 0b010101, 0b101011,
                                     0b000001, 0b000011, 0b000111, 0b001011, 0b010001, 0b110001};
  std::vector<uint8_t> packed(12);
  std::vector<int64_t> packed_indptr(3);
  ASSERT_TRUE(WriteTreeMask(*tree, MaskLayout::kBitPacked, absl::MakeSpan(packed),
                            absl::MakeSpan(packed_indptr))
                  .ok());
  EXPECT_EQ(packed, bits);
  EXPECT_EQ(packed_indptr, (std::vector<int64_t>{0, 6, 12}));

  // FULL: request 0 at 0, [6][5 + 6]; request 1 at 6 * 6 * 1 + 6 * 5 = 66, [6][9 + 6].
  std::vector<uint8_t> full(156 + 3, 7);
  std::vector<int64_t> indptr(3);
  ASSERT_TRUE(
      WriteTreeMask(*tree, MaskLayout::kFull, absl::MakeSpan(full), absl::MakeSpan(indptr)).ok());
  EXPECT_EQ(indptr, (std::vector<int64_t>{0, 66, 156}));
  for (int b = 0; b < 2; ++b) {
    const int prefix = seq_lens_[b].value();
    for (int t = 0; t < 6; ++t) {
      for (int c = 0; c < prefix + 6; ++c) {
        const uint8_t want = c < prefix ? 1 : qlen[(b * 6 + t) * 6 + (c - prefix)];
        ASSERT_EQ(full[indptr[b] + t * (prefix + 6) + c], want)
            << "request " << b << " row " << t << " column " << c;
      }
    }
  }
  EXPECT_EQ(full[156], 7) << "nothing written past mask_indptr[bs]";
}

// The plain parent-array form of request 0 gives the same tree.
TEST_F(VerifyTreeGoldenTest, ParentArrayFormAgrees) {
  auto ref = BuildVerifyTree(parent_list_, selected_, seq_lens_, 2, 3, TokenLength(6));
  const std::vector<int32_t> parents = {-1, 0, 0, 1, 2, 3};
  auto plain = BuildVerifyTreeFromParents(parents, Lens({5}), TokenLength(6));
  ASSERT_TRUE(ref.ok() && plain.ok());
  EXPECT_EQ(plain->parent, std::vector<int32_t>(ref->parent.begin(), ref->parent.begin() + 6));
  EXPECT_EQ(plain->sees, std::vector<uint8_t>(ref->sees.begin(), ref->sees.begin() + 36));
  EXPECT_EQ(Positions(*plain), std::vector<int32_t>({5, 6, 6, 7, 7, 8}));
  EXPECT_EQ(plain->next_token, std::vector<int32_t>(ref->next_token.begin(), ref->next_token.begin() + 6));
}

// Top-k 1 gives a chain: token t sees tokens 0..t and sits at seq_len + t.
TEST(VerifyTreeTest, TopK1IsAChain) {
  // selected [0, 1, 2, 3]: slot s / 1 = s; parent_list[s] = s - 1 names the previous token.
  const std::vector<int64_t> parent_list = {-1, 0, 1, 2};
  const std::vector<int64_t> selected = {0, 1, 2, 3};
  auto tree = BuildVerifyTree(parent_list, selected, Lens({20}), 1, 4, TokenLength(5));
  ASSERT_TRUE(tree.ok()) << tree.status();
  EXPECT_EQ(Positions(*tree), (std::vector<int32_t>{20, 21, 22, 23, 24}));
  for (int t = 0; t < 5; ++t) {
    for (int c = 0; c < 5; ++c) EXPECT_EQ(tree->sees[t * 5 + c], c <= t ? 1 : 0) << t << "," << c;
  }
  EXPECT_EQ(tree->next_token, (std::vector<int32_t>{1, 2, 3, 4, -1}));
}

// DESIGN.md 2b: a parent is searched among the request's own n - 1 selected entries only. Here
// request 0's token 2 names candidate 7 as its parent, which only request 1 selected: it is
// left out (no parent; its mask row holds the root and itself), not linked across requests.
TEST(VerifyTreeTest, AParentIsSearchedInItsOwnRequestOnly) {
  // topk 2, depth 3: parent_list has 5 entries per request, selected_index n - 1 = 2.
  // Request 0's token 2: slot 4 / 2 = 2, parent_list[2] = 7, not among its selected {0, 4}.
  const std::vector<int64_t> parent_list = {-1, 0, 7, 0, 0, /*request 1:*/ -1, 0, 0, 0, 0};
  const std::vector<int64_t> selected = {0, 4, /*request 1:*/ 0, 7};
  auto tree = BuildVerifyTree(parent_list, selected, Lens({10, 20}), 2, 3, TokenLength(3));
  ASSERT_TRUE(tree.ok()) << tree.status();
  EXPECT_EQ(std::vector<int32_t>(tree->parent.begin(), tree->parent.begin() + 3),
            (std::vector<int32_t>{-1, 0, -1}));
  // Request 0's token 2 sees the root and itself: its walk stops where its parent is lost.
  EXPECT_EQ(std::vector<uint8_t>(tree->sees.begin() + 6, tree->sees.begin() + 9),
            (std::vector<uint8_t>{1, 0, 1}));
  // Request 1 finds its own candidate 7: token 2's parent is token 1 (0 + 1 with slot 3 -> 0).
  EXPECT_EQ(std::vector<int32_t>(tree->parent.begin() + 3, tree->parent.end()),
            (std::vector<int32_t>{-1, 0, 1}));
  EXPECT_EQ(tree->next_token[0], 1);
  EXPECT_EQ(tree->next_sibling[1], -1);
}

TEST(VerifyTreeTest, MalformedInputIsRefused) {
  auto code = [](absl::StatusOr<VerifyTree> t) { return t.status().code(); };
  const auto bad = absl::StatusCode::kInvalidArgument;
  // Plain parents: a cycle, a second root, a parent outside the request, a root with a parent.
  EXPECT_EQ(
      code(BuildVerifyTreeFromParents(std::vector<int32_t>{-1, 2, 1}, Lens({3}), TokenLength(3))),
      bad);
  EXPECT_EQ(
      code(BuildVerifyTreeFromParents(std::vector<int32_t>{-1, -1, 1}, Lens({3}), TokenLength(3))),
      bad);
  EXPECT_EQ(
      code(BuildVerifyTreeFromParents(std::vector<int32_t>{-1, 3, 1}, Lens({3}), TokenLength(3))),
      bad);
  // Token 1 of request 1 naming token 2 of request 0's row (index 5 of the flat array).
  EXPECT_EQ(code(BuildVerifyTreeFromParents(std::vector<int32_t>{-1, 0, 0, -1, 5, 0}, Lens({3, 3}),
                                            TokenLength(3))),
            bad);
  EXPECT_EQ(
      code(BuildVerifyTreeFromParents(std::vector<int32_t>{0, 0, 1}, Lens({3}), TokenLength(3))),
      bad);
  EXPECT_EQ(
      code(BuildVerifyTreeFromParents(std::vector<int32_t>{-1, 0}, Lens({3}), TokenLength(3))),
      bad);
  EXPECT_EQ(
      code(BuildVerifyTreeFromParents(std::vector<int32_t>{-1, 0, 1}, Lens({-3}), TokenLength(3))),
      bad);
  // 65 tokens, a well-formed star (the root, then 64 children of it): only the size refuses it.
  std::vector<int32_t> star(65, 0);
  star[0] = -1;
  const absl::Status too_many =
      BuildVerifyTreeFromParents(star, Lens({1}), TokenLength(65)).status();
  EXPECT_EQ(too_many.code(), bad);
  EXPECT_EQ(too_many.message(), "num_draft_tokens 65 outside [1, 64]");
  star.pop_back();
  EXPECT_TRUE(BuildVerifyTreeFromParents(star, Lens({1}), TokenLength(64)).ok());
  // Reference encoding: a cycle (tokens 1 and 2 name each other), a slot past parent_list,
  // a negative selection, sizes, top-k or depth 0.
  const absl::Status cycle =
      BuildVerifyTree(std::vector<int64_t>{-1, 2, 1}, std::vector<int64_t>{1, 2}, Lens({4}), 1, 3,
                      TokenLength(3))
          .status();
  EXPECT_EQ(cycle.code(), bad);
  EXPECT_NE(cycle.message().find("cycle"), absl::string_view::npos) << cycle;
  const absl::Status plain_cycle =
      BuildVerifyTreeFromParents(std::vector<int32_t>{-1, 2, 1}, Lens({3}), TokenLength(3))
          .status();
  EXPECT_NE(plain_cycle.message().find("cycle"), absl::string_view::npos) << plain_cycle;
  EXPECT_EQ(code(BuildVerifyTree(std::vector<int64_t>{-1, 0, 1}, std::vector<int64_t>{0, 6},
                                 Lens({4}), 1, 3, TokenLength(3))),
            bad);
  EXPECT_EQ(code(BuildVerifyTree(std::vector<int64_t>{-1, 0, 1}, std::vector<int64_t>{0, -1},
                                 Lens({4}), 1, 3, TokenLength(3))),
            bad);
  // The first slot past request 0's list (request 1's first entry follows it in memory).
  const absl::Status past_list =
      BuildVerifyTree(std::vector<int64_t>{-1, 0, 1, -1, 0, 1}, std::vector<int64_t>{0, 3, 0, 1},
                      Lens({4, 4}), 1, 3, TokenLength(3))
          .status();
  EXPECT_EQ(past_list.code(), bad);
  EXPECT_EQ(past_list.message(),
            "selected_index[0][1] = 3: parent slot 3 outside parent_list's 3 entries");
  EXPECT_EQ(code(BuildVerifyTree(std::vector<int64_t>{-1, 0}, std::vector<int64_t>{0, 1}, Lens({4}),
                                 1, 3, TokenLength(3))),
            bad);
  EXPECT_EQ(code(BuildVerifyTree(std::vector<int64_t>{-1}, std::vector<int64_t>{}, Lens({4}), 0, 1,
                                 TokenLength(1))),
            bad);
  EXPECT_EQ(code(BuildVerifyTree(std::vector<int64_t>{-1}, std::vector<int64_t>{}, Lens({4}), 1, 0,
                                 TokenLength(1))),
            bad);
  // Mask outputs too small, and n past the bit-packed limit.
  auto tree = BuildVerifyTreeFromParents(std::vector<int32_t>{-1, 0, 1}, Lens({2}), TokenLength(3));
  ASSERT_TRUE(tree.ok());
  // Poisoned with 7, a value no mask byte or indptr entry of this tree takes.
  std::vector<uint8_t> small(14, 7);  // FULL needs 3 * (2 + 3) = 15
  std::vector<int64_t> indptr(2, 7);
  EXPECT_EQ(
      WriteTreeMask(*tree, MaskLayout::kFull, absl::MakeSpan(small), absl::MakeSpan(indptr)).code(),
      bad);
  EXPECT_EQ(WriteTreeMask(*tree, MaskLayout::kQLenOnly, absl::MakeSpan(small).subspan(0, 8),
                          absl::MakeSpan(indptr))
                .code(),
            bad);
  EXPECT_EQ(WriteTreeMask(*tree, MaskLayout::kBitPacked, absl::MakeSpan(small).subspan(0, 2),
                          absl::MakeSpan(indptr))
                .code(),
            bad);
  EXPECT_EQ(indptr, (std::vector<int64_t>{7, 7})) << "nothing written on error";
  EXPECT_EQ(small, std::vector<uint8_t>(14, 7)) << "nothing written on error";
  EXPECT_EQ(WriteTreeMask(*tree, MaskLayout::kNone, absl::MakeSpan(small), absl::MakeSpan(indptr))
                .code(),
            bad);
  std::vector<int32_t> chain(40);
  for (int t = 0; t < 40; ++t) chain[t] = t - 1;
  auto big = BuildVerifyTreeFromParents(chain, Lens({1}), TokenLength(40));
  ASSERT_TRUE(big.ok());
  std::vector<uint8_t> words(160);
  EXPECT_EQ(WriteTreeMask(*big, MaskLayout::kBitPacked, absl::MakeSpan(words),
                          absl::MakeSpan(indptr))
                .code(),
            bad);
}

// Sizes whose products pass int64 and positions past int32: refused, not wrapped.
TEST(VerifyTreeTest, OverflowingSizesAndPositionsAreRefused) {
  auto code = [](absl::StatusOr<VerifyTree> t) { return t.status().code(); };
  // topk * (depth - 1) + 1 = 2^60 entries per request: 16 requests would need 2^64, which
  // wraps to the 0 entries given. Each selection names parent slot 1 of its request.
  const int32_t topk = (1 << 30) - 1, depth = (1 << 30) + 2;
  const std::vector<int64_t> selected(16, topk);
  EXPECT_EQ(code(BuildVerifyTree(std::vector<int64_t>{}, selected, std::vector<TokenLength>(16),
                                 topk, depth, TokenLength(2))),
            absl::StatusCode::kInvalidArgument);
  // Positions reach seq_len + n - 1 and the mask's KV seq_len + n: beyond int32 refused.
  const int32_t max = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(
      code(BuildVerifyTreeFromParents(std::vector<int32_t>{-1, 0}, Lens({max}), TokenLength(2))),
      absl::StatusCode::kOutOfRange);
  EXPECT_EQ(code(BuildVerifyTreeFromParents(std::vector<int32_t>{-1, 0}, Lens({max - 1}),
                                            TokenLength(2))),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(code(BuildVerifyTree(std::vector<int64_t>{-1, 0}, std::vector<int64_t>{0},
                                 Lens({max - 1}), 1, 2, TokenLength(2))),
            absl::StatusCode::kOutOfRange);
  auto last =
      BuildVerifyTreeFromParents(std::vector<int32_t>{-1, 0}, Lens({max - 2}), TokenLength(2));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->positions[1].value(), max - 1);
  // retrieve_index (b * n + t) is int32: 2^25 requests of 64 tokens are 2^31 tree tokens,
  // refused before any array is sized (134 MB of lengths, nothing more).
  const std::vector<TokenLength> many(size_t{1} << 25);
  EXPECT_EQ(code(BuildVerifyTreeFromParents({}, many, TokenLength(kMaxVerifyTreeTokens))),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(code(BuildVerifyTree({}, {}, many, 1, kMaxVerifyTreeTokens,
                                 TokenLength(kMaxVerifyTreeTokens))),
            absl::StatusCode::kOutOfRange);
}

// VerifyTree is a plain struct: a tree built by hand, whose mask would need 16 blocks of
// 2^60 bytes (a total that wraps to 0), is refused, and nothing is written.
TEST(VerifyTreeTest, AHandBuiltTreeWhoseMaskWouldWrapIsRefused) {
  VerifyTree tree;
  tree.num_draft_tokens = TokenLength(1 << 30);
  tree.seq_lens.assign(16, TokenLength(0));
  std::vector<int64_t> indptr(17, -1);
  const absl::Status s = WriteTreeMask(tree, MaskLayout::kQLenOnly, {}, absl::MakeSpan(indptr));
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_EQ(indptr, std::vector<int64_t>(17, -1));
}

// A hand-built tree whose row drops the root is refused as BuildTargetVerifyMetadata and graph
// replay refuse it, and nothing is written.
TEST(VerifyTreeTest, AHandBuiltRowWithoutTheRootIsRefused) {
  auto tree = BuildVerifyTreeFromParents(std::vector<int32_t>{-1, 0, 1}, Lens({2}), TokenLength(3));
  ASSERT_TRUE(tree.ok());
  std::vector<uint8_t> mask(15, 7);
  std::vector<int64_t> indptr(2, 7);
  ASSERT_TRUE(
      WriteTreeMask(*tree, MaskLayout::kFull, absl::MakeSpan(mask), absl::MakeSpan(indptr)).ok());
  VerifyTree rootless = *tree;
  rootless.sees[2 * 3 + 0] = 0;  // row 2 sees rows 1 and 2 only
  std::fill(mask.begin(), mask.end(), 7);
  std::fill(indptr.begin(), indptr.end(), 7);
  const absl::Status s =
      WriteTreeMask(rootless, MaskLayout::kFull, absl::MakeSpan(mask), absl::MakeSpan(indptr));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(),
            "custom mask: row 2 of sequence 0 does not see the root (tree row byte 6; a draft "
            "tree's rows see the root)");
  EXPECT_EQ(mask, std::vector<uint8_t>(15, 7));
  EXPECT_EQ(indptr, (std::vector<int64_t>{7, 7}));
}

// Bit-packed word widths: 1 byte up to 8 tokens, 2 up to 16, 4 up to 32, little-endian.
TEST(VerifyTreeTest, BitPackedWordWidths) {
  std::vector<int32_t> chain(12);
  for (int t = 0; t < 12; ++t) chain[t] = t - 1;
  auto tree = BuildVerifyTreeFromParents(chain, Lens({0}), TokenLength(12));
  ASSERT_TRUE(tree.ok());
  std::vector<uint8_t> words(24);
  std::vector<int64_t> indptr(2);
  ASSERT_TRUE(
      WriteTreeMask(*tree, MaskLayout::kBitPacked, absl::MakeSpan(words), absl::MakeSpan(indptr))
          .ok());
  // Row 11 sees columns 0..11: 0x0FFF, low byte first.
  EXPECT_EQ(words[22], 0xFF);
  EXPECT_EQ(words[23], 0x0F);
  // Row 9 sees 0..9: 0x03FF.
  EXPECT_EQ(words[18], 0xFF);
  EXPECT_EQ(words[19], 0x03);
}

}  // namespace
}  // namespace attnmeta
