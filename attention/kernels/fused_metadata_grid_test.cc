#include "attention/kernels/fused_metadata_grid.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace attnmeta {
namespace {

// The cost FusedMetadataRowBlocks minimizes, written out for the brute-force check below:
// (passes per block + 1.25 + rows / 512) * (rows * y / wave + 1), times 512 * wave.
int64_t Cost(int64_t rows, int32_t passes, int32_t wave, int32_t y) {
  return (512 * ((passes + y - 1) / y) + 640 + rows) * (rows * y + wave);
}

TEST(FusedMetadataRowBlocksTest, OneBlockPerPassWhenTheWholeGridFitsOneWave) {
  EXPECT_EQ(FusedMetadataRowBlocks(8, 8, 1584), 8);
  EXPECT_EQ(FusedMetadataRowBlocks(1, 256, 1584), 256);
  EXPECT_EQ(FusedMetadataRowBlocks(198, 8, 1584), 8);
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

// The wave of the fused kernel on an H100 or H200 since session 35: 132 multiprocessors x 8
// blocks of 128 threads, passes of 1024 tokens (the page table's: 512 columns). Each choice was
// measured against the others named (session 51, same-run A/Bs on an H100).
TEST(FusedMetadataRowBlocksTest, RowBlocksMeasuredAtTheEightTokenPasses) {
  // bs 1024 x 32k (32 passes): four blocks per row, 99.0 us, against one (103.1), two (101.3)
  // and three (99.3); with rows at every alignment 105.3 against 115.6 for one. Six measured
  // 98.6-98.8 (104.0-104.1 at every alignment), which the model does not reproduce.
  EXPECT_EQ(FusedMetadataRowBlocks(1024, 32, 1056), 4);
  // At page size 1 (64 passes, the page table's): four, 144.9 us against one's 149.2.
  EXPECT_EQ(FusedMetadataRowBlocks(1024, 64, 1056), 4);
  // bs 1024 x 4k (4 passes): one block per row, 14.9 us against two's 15.6 and three's 15.9.
  EXPECT_EQ(FusedMetadataRowBlocks(1024, 4, 1056), 1);
  // At page size 1 (8 passes): two, 21.2 us against one's 21.6; 22.3 against 24.0 at 4095.
  EXPECT_EQ(FusedMetadataRowBlocks(1024, 8, 1056), 2);
  // bs 256 x 4k (4 passes): four blocks per row, one pass each.
  EXPECT_EQ(FusedMetadataRowBlocks(256, 4, 1056), 4);
  // bs 64 x 128k (128 passes): 43 blocks per row, 27.4 us against 16's 27.7 and 6's 32.0;
  // at page size 1 (256 passes) 64, 38.3 us against 16's 40.7.
  EXPECT_EQ(FusedMetadataRowBlocks(64, 128, 1056), 43);
  EXPECT_EQ(FusedMetadataRowBlocks(64, 256, 1056), 64);
  // bs 8 x 128k at page size 1 (256 passes): 128 blocks per row of two passes, 6.8 us; 256 of
  // one pass took 8.1.
  EXPECT_EQ(FusedMetadataRowBlocks(8, 256, 1056), 128);
}

}  // namespace
}  // namespace attnmeta
