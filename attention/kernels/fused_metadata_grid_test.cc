#include "attention/kernels/fused_metadata_grid.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace attnmeta {
namespace {

// The cost FusedMetadataRowBlocks minimizes, written out for the brute-force check below.
int64_t Cost(int64_t rows, int32_t passes, int32_t wave, int32_t y) {
  const int64_t waves = (rows * y + wave - 1) / wave;
  return waves * (512 * ((passes + y - 1) / y + 1) + rows);
}

TEST(FusedMetadataRowBlocksTest, OneBlockPerPassWhenTheWholeGridFitsOneWave) {
  EXPECT_EQ(FusedMetadataRowBlocks(8, 8, 1584), 8);
  EXPECT_EQ(FusedMetadataRowBlocks(1, 256, 1584), 256);
  EXPECT_EQ(FusedMetadataRowBlocks(198, 8, 1584), 8);
}

// The H200's wave of the fused kernel before session 35: 132 multiprocessors x 10 blocks of
// 128 threads, passes of 512 tokens.
TEST(FusedMetadataRowBlocksTest, SplitsRowsWhenWholeRowsLeaveAPartialWave) {
  // bs 1024 x 32k tokens (64 passes): one block per row is a wave of 64-pass blocks with a
  // fifth of the multiprocessors' blocks idle; five per row are four waves of 13.
  EXPECT_EQ(FusedMetadataRowBlocks(1024, 64, 1320), 5);
  // bs 1024 x 4k (8 passes): a second block per row would pay another sum over the rows
  // before it and a second wave.
  EXPECT_EQ(FusedMetadataRowBlocks(1024, 8, 1320), 1);
  // bs 64 x 128k: 20 blocks per row fill one wave.
  EXPECT_EQ(FusedMetadataRowBlocks(64, 256, 1320), 20);
  // More rows than one wave holds, one pass each: nothing to split.
  EXPECT_EQ(FusedMetadataRowBlocks(5000, 1, 1320), 1);
}

TEST(FusedMetadataRowBlocksTest, IsTheSmallestMinimumOfTheCostOverEveryCandidate) {
  for (int64_t rows : {1, 2, 7, 64, 255, 256, 257, 1000, 1024, 4096}) {
    for (int32_t passes : {1, 2, 3, 4, 5, 31, 32, 33, 100, 128, 1000}) {
      for (int32_t wave : {1, 132, 528, 792, 1056, 1584}) {
        const int32_t got = FusedMetadataRowBlocks(rows, passes, wave);
        ASSERT_GE(got, 1);
        ASSERT_LE(got, passes);
        int32_t want = 1;
        for (int32_t y = 2; y <= passes; ++y) {
          if (Cost(rows, passes, wave, y) < Cost(rows, passes, wave, want)) want = y;
        }
        ASSERT_EQ(got, want) << "rows " << rows << " passes " << passes << " wave " << wave;
      }
    }
  }
}

// The H200's wave of the fused kernel since session 35: 132 multiprocessors x 8 blocks of 128
// threads, passes of 1024 tokens.
TEST(FusedMetadataRowBlocksTest, RowBlocksAtTheEightTokenPasses) {
  // bs 1024 x 32k (32 passes): one block per row, 1024 blocks, is one wave of 1056.
  EXPECT_EQ(FusedMetadataRowBlocks(1024, 32, 1056), 1);
  // bs 64 x 128k (128 passes): 16 blocks per row fill one wave (1024 blocks).
  EXPECT_EQ(FusedMetadataRowBlocks(64, 128, 1056), 16);
  // bs 256 x 4k (4 passes): four blocks per row, one pass each, still one wave.
  EXPECT_EQ(FusedMetadataRowBlocks(256, 4, 1056), 4);
  // bs 1024 x 4k (4 passes): a second block per row would be a second wave.
  EXPECT_EQ(FusedMetadataRowBlocks(1024, 4, 1056), 1);
}

}  // namespace
}  // namespace attnmeta
