#include "attention/metadata/custom_mask.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

// Two sequences: 3 query rows over 5 KV tokens (prefix 2), then 2 rows over 2 (no prefix).
// Tree of the first: row 0 the root, rows 1 and 2 its children; of the second: a chain.
class TwoTrees : public ::testing::Test {
 protected:
  std::vector<TokenLength> q_lens = {TokenLength(3), TokenLength(2)};
  std::vector<TokenLength> kv_lens = {TokenLength(5), TokenLength(2)};
  std::vector<uint8_t> tree = {1, 0, 0,  //
                               1, 1, 0,  //
                               1, 0, 1,  //
                               1, 0,     //
                               1, 1};

  std::vector<int64_t> Indptr(MaskLayout layout) {
    std::vector<int64_t> indptr(3);
    EXPECT_TRUE(BuildMaskIndptr(layout, q_lens, kv_lens, absl::MakeSpan(indptr)).ok());
    return indptr;
  }
};

TEST_F(TwoTrees, FullLayoutHasPrefixColumnsAndTreeRows) {
  std::vector<int64_t> indptr = Indptr(MaskLayout::kFull);
  EXPECT_EQ(indptr, (std::vector<int64_t>{0, 15, 19}));
  std::vector<uint8_t> out(21, 7);
  ASSERT_TRUE(BuildCustomMask(MaskLayout::kFull, tree, q_lens, kv_lens, indptr,
                              absl::MakeSpan(out))
                  .ok());
  EXPECT_EQ(out, (std::vector<uint8_t>{1, 1, 1, 0, 0,  //
                                       1, 1, 1, 1, 0,  //
                                       1, 1, 1, 0, 1,  //
                                       1, 0,           //
                                       1, 1,           //
                                       7, 7}));        // past mask_indptr[bs]: untouched
  CustomMaskView view{MaskLayout::kFull, out, indptr};
  EXPECT_TRUE(MaskSees(view, 0, 3, 5, 1, 2, 1));   // prefix
  EXPECT_FALSE(MaskSees(view, 0, 3, 5, 1, 2, 3));  // sibling
  EXPECT_TRUE(MaskSees(view, 1, 2, 2, 1, 1, 0));
}

TEST_F(TwoTrees, QLenOnlyAndBitPackedAgreeWithFull) {
  std::vector<int64_t> full_indptr = Indptr(MaskLayout::kFull);
  std::vector<uint8_t> full(full_indptr.back());
  ASSERT_TRUE(BuildCustomMask(MaskLayout::kFull, tree, q_lens, kv_lens, full_indptr,
                              absl::MakeSpan(full))
                  .ok());
  std::vector<int64_t> qlen_indptr = Indptr(MaskLayout::kQLenOnly);
  EXPECT_EQ(qlen_indptr, (std::vector<int64_t>{0, 9, 13}));
  std::vector<uint8_t> qlen(qlen_indptr.back());
  ASSERT_TRUE(BuildCustomMask(MaskLayout::kQLenOnly, tree, q_lens, kv_lens, qlen_indptr,
                              absl::MakeSpan(qlen))
                  .ok());
  EXPECT_EQ(qlen, tree);
  std::vector<int64_t> bit_indptr = Indptr(MaskLayout::kBitPacked);
  EXPECT_EQ(bit_indptr, (std::vector<int64_t>{0, 3, 5}));
  std::vector<uint8_t> bits(bit_indptr.back());
  ASSERT_TRUE(BuildCustomMask(MaskLayout::kBitPacked, tree, q_lens, kv_lens, bit_indptr,
                              absl::MakeSpan(bits))
                  .ok());
  EXPECT_EQ(bits, (std::vector<uint8_t>{0b001, 0b011, 0b101, 0b01, 0b11}));
  const CustomMaskView views[] = {{MaskLayout::kFull, full, full_indptr},
                                  {MaskLayout::kQLenOnly, qlen, qlen_indptr},
                                  {MaskLayout::kBitPacked, bits, bit_indptr}};
  for (int i = 0; i < 2; ++i) {
    const int64_t q = q_lens[i].value(), kv = kv_lens[i].value();
    for (int64_t r = 0; r < q; ++r) {
      for (int64_t c = 0; c < kv; ++c) {
        const bool want = MaskSees(views[0], i, q, kv, 1, r, c);
        EXPECT_EQ(MaskSees(views[1], i, q, kv, 1, r, c), want) << i << " " << r << " " << c;
        EXPECT_EQ(MaskSees(views[2], i, q, kv, 1, r, c), want) << i << " " << r << " " << c;
      }
    }
  }
}

TEST(MaskWordBytesTest, WordSizesFollowTheRowCount) {
  EXPECT_EQ(MaskWordBytes(TokenCount(1)), 1);
  EXPECT_EQ(MaskWordBytes(TokenCount(8)), 1);
  EXPECT_EQ(MaskWordBytes(TokenCount(9)), 2);
  EXPECT_EQ(MaskWordBytes(TokenCount(16)), 2);
  EXPECT_EQ(MaskWordBytes(TokenCount(17)), 4);
  EXPECT_EQ(MaskWordBytes(TokenCount(32)), 4);
  EXPECT_EQ(MaskWordBytes(TokenCount(33)), 0);
}

TEST_F(TwoTrees, BadInputIsRefusedAndWritesNothing) {
  std::vector<int64_t> indptr = Indptr(MaskLayout::kFull);
  std::vector<uint8_t> out(19, 7);
  const std::vector<uint8_t> untouched = out;
  // Tree rows of the wrong size, a byte that is not 0/1, a short output, a foreign indptr.
  std::vector<uint8_t> short_tree(tree.begin(), tree.end() - 1);
  EXPECT_EQ(BuildCustomMask(MaskLayout::kFull, short_tree, q_lens, kv_lens, indptr,
                            absl::MakeSpan(out))
                .code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> bad_byte = tree;
  bad_byte[4] = 2;
  EXPECT_EQ(BuildCustomMask(MaskLayout::kFull, bad_byte, q_lens, kv_lens, indptr,
                            absl::MakeSpan(out))
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildCustomMask(MaskLayout::kFull, tree, q_lens, kv_lens, indptr,
                            absl::MakeSpan(out).subspan(0, 18))
                .code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int64_t> qlen_indptr = Indptr(MaskLayout::kQLenOnly);
  EXPECT_EQ(BuildCustomMask(MaskLayout::kFull, tree, q_lens, kv_lens, qlen_indptr,
                            absl::MakeSpan(out))
                .code(),
            absl::StatusCode::kInvalidArgument);
  // An entry whose difference from its predecessor overflows (UBSan's CI run sees it).
  std::vector<int64_t> wrapping = indptr;
  wrapping.back() = INT64_MIN;
  EXPECT_EQ(BuildCustomMask(MaskLayout::kFull, tree, q_lens, kv_lens, wrapping,
                            absl::MakeSpan(out))
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The batch's steps starting at 2 instead of 0 (the output would hold them).
  const std::vector<int64_t> shifted = {2, 17, 21};
  std::vector<uint8_t> wide(21, 7);
  const absl::Status s =
      BuildCustomMask(MaskLayout::kFull, tree, q_lens, kv_lens, shifted, absl::MakeSpan(wide));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(wide, std::vector<uint8_t>(21, 7));
  EXPECT_EQ(out, untouched);
  // A layout cast from an integer: no block size, so no mask at all, were it let through.
  const absl::Status unknown = BuildCustomMask(static_cast<MaskLayout>(7), tree, q_lens, kv_lens,
                                               indptr, absl::MakeSpan(out));
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.message(), "mask layout 7 is not a mask layout");
  EXPECT_EQ(out, untouched);
  // Layout none or unknown, q_len > kv_len, too many rows to bit-pack, a wrong-size indptr.
  std::vector<int64_t> three(3, 7);  // 7: no entry of these indptrs
  EXPECT_EQ(BuildMaskIndptr(MaskLayout::kNone, q_lens, kv_lens, absl::MakeSpan(three)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      BuildMaskIndptr(static_cast<MaskLayout>(7), q_lens, kv_lens, absl::MakeSpan(three)).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(three, std::vector<int64_t>(3, 7));
  std::vector<TokenLength> long_q = {TokenLength(6), TokenLength(2)};
  EXPECT_EQ(BuildMaskIndptr(MaskLayout::kFull, long_q, kv_lens, absl::MakeSpan(three)).code(),
            absl::StatusCode::kInvalidArgument);
  // A negative query length (its block would make the indptr decrease).
  std::vector<TokenLength> negative_q = {TokenLength(-1), TokenLength(2)};
  const absl::Status negative =
      BuildMaskIndptr(MaskLayout::kFull, negative_q, kv_lens, absl::MakeSpan(three));
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument) << negative;
  EXPECT_NE(negative.message().find("sequence 0 has q_len -1"), absl::string_view::npos)
      << negative;
  EXPECT_EQ(three, std::vector<int64_t>(3, 7));
  std::vector<TokenLength> q33 = {TokenLength(33)};
  std::vector<TokenLength> kv33 = {TokenLength(40)};
  std::vector<int64_t> two(2);
  EXPECT_EQ(BuildMaskIndptr(MaskLayout::kBitPacked, q33, kv33, absl::MakeSpan(two)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(BuildMaskIndptr(MaskLayout::kFull, q33, kv33, absl::MakeSpan(two)).ok());
  EXPECT_EQ(BuildMaskIndptr(MaskLayout::kFull, q_lens, kv_lens, absl::MakeSpan(two)).code(),
            absl::StatusCode::kInvalidArgument);
}

// Both CheckTreeRows forms check the bytes they are given against the blocks they are told
// of before they read one: a short or empty array, a negative count, a long array.
TEST_F(TwoTrees, CheckTreeRowsTakesOnlyTheBytesOfItsBlocks) {
  EXPECT_TRUE(CheckTreeRows(tree, q_lens, false).ok());
  const std::vector<uint8_t> short_tree(tree.begin(), tree.end() - 1);
  EXPECT_EQ(CheckTreeRows(short_tree, q_lens, false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckTreeRows({}, q_lens, false).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<uint8_t> chains(2 * 3 * 3, 1);
  EXPECT_TRUE(CheckTreeRows(chains, 2, TokenLength(3), false).ok());
  EXPECT_EQ(CheckTreeRows({}, 1, TokenLength(4), false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckTreeRows(chains, -1, TokenLength(3), false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckTreeRows(chains, 3, TokenLength(3), false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckTreeRows(chains, 1, TokenLength(3), false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckTreeRows(chains, 2, TokenLength(-3), false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckTreeRows({}, 5, TokenLength(0), false).ok());
}

// Every row sees itself; a draft tree's rows also see the root. BuildCustomMask asks the first
// (an extend's custom mask need not see the first query row) and writes nothing when refused.
TEST_F(TwoTrees, TreeRowsSeeThemselvesAndDraftTreesTheRoot) {
  EXPECT_TRUE(CheckTreeRows(tree, q_lens, /*draft_tree=*/true).ok());
  std::vector<uint8_t> rootless = tree;
  rootless[3 * 3 + 1 * 2] = 0;  // the second tree's row 1 drops its root
  rootless[3 * 3 + 1 * 2 + 1] = 1;
  EXPECT_TRUE(CheckTreeRows(rootless, q_lens, /*draft_tree=*/false).ok());
  const absl::Status no_root = CheckTreeRows(rootless, q_lens, /*draft_tree=*/true);
  EXPECT_EQ(no_root.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(no_root.message(),
            "custom mask: row 1 of sequence 1 does not see the root (tree row byte 11; a draft "
            "tree's rows see the root)");
  std::vector<uint8_t> selfless = tree;
  selfless[2 * 3 + 2] = 0;  // the first tree's row 2 sees only the root
  for (bool draft_tree : {false, true}) {
    const absl::Status no_self = CheckTreeRows(selfless, q_lens, draft_tree);
    EXPECT_EQ(no_self.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(no_self.message(),
              "custom mask: row 2 of sequence 0 does not see itself (tree row "
              "byte 8)");
  }
  std::vector<uint8_t> bad_byte = tree;
  bad_byte[10] = 2;
  EXPECT_EQ(CheckTreeRows(bad_byte, q_lens, false).message(),
            "custom mask: tree row byte 10 (sequence 1, row 0) = 2, want 0 or 1");
  std::vector<int64_t> indptr = Indptr(MaskLayout::kFull);
  std::vector<uint8_t> out(19, 7);
  EXPECT_EQ(
      BuildCustomMask(MaskLayout::kFull, selfless, q_lens, kv_lens, indptr, absl::MakeSpan(out))
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out, std::vector<uint8_t>(19, 7));
  EXPECT_TRUE(
      BuildCustomMask(MaskLayout::kFull, rootless, q_lens, kv_lens, indptr, absl::MakeSpan(out))
          .ok());
}

// Block sizes are products of lengths: a batch whose lengths sum past INT32_MAX could wrap the
// int64 offsets back into a small buffer, so it is refused before any sum is taken.
TEST(CustomMaskBatchTest, LengthsSummingPastInt32AreRefusedBeforeAnyBlockIsSized) {
  const std::vector<TokenLength> huge(16, TokenLength(1 << 30));
  std::vector<int64_t> indptr(17, -5);
  const std::vector<int64_t> untouched = indptr;
  absl::Status s = BuildMaskIndptr(MaskLayout::kQLenOnly, huge, huge, absl::MakeSpan(indptr));
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_EQ(s.message(), "custom mask: the batch's query rows sum past INT32_MAX");
  EXPECT_EQ(indptr, untouched);
  // The wrapped indptr such a batch would get (every step 2^60, the total 0) and no bytes.
  std::vector<int64_t> wrapped(17);
  for (int i = 1; i <= 16; ++i) {
    wrapped[i] = static_cast<int64_t>(static_cast<uint64_t>(wrapped[i - 1]) + (uint64_t{1} << 60));
  }
  ASSERT_EQ(wrapped[16], 0);
  s = BuildCustomMask(MaskLayout::kQLenOnly, {}, huge, huge, wrapped, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  // KV tokens alone past INT32_MAX.
  const std::vector<TokenLength> q = {TokenLength(1), TokenLength(1)};
  const std::vector<TokenLength> kv = {TokenLength(INT32_MAX), TokenLength(1)};
  std::vector<int64_t> three(3);
  s = BuildMaskIndptr(MaskLayout::kFull, q, kv, absl::MakeSpan(three));
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_EQ(s.message(), "custom mask: the batch's KV tokens sum past INT32_MAX");
  // The tree rows' size check on its own: a negative q_len, and q_lens past INT32_MAX.
  EXPECT_EQ(CheckTreeRowsSize({}, {TokenLength(-1)}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckTreeRowsSize({}, {TokenLength(INT32_MAX), TokenLength(1)}).code(),
            absl::StatusCode::kOutOfRange);
}

TEST(CustomMaskBatchTest, LengthsSummingToInt32MaxAreSized) {
  const std::vector<TokenLength> q = {TokenLength(INT32_MAX - 1), TokenLength(1)};
  std::vector<int64_t> indptr(3);
  ASSERT_TRUE(BuildMaskIndptr(MaskLayout::kFull, q, q, absl::MakeSpan(indptr)).ok());
  EXPECT_EQ(indptr[1], int64_t{INT32_MAX - 1} * (INT32_MAX - 1));
  EXPECT_EQ(indptr[2], indptr[1] + 1);
}

}  // namespace
}  // namespace attnmeta
