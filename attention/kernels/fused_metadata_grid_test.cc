#include "attention/kernels/fused_metadata_grid.h"

#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace attnmeta {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

TEST(FusedMetadataRowBlocksTest, OneBlockPerPassWhenTheWholeGridFitsOneWave) {
  EXPECT_EQ(FusedMetadataRowBlocks(8, 8, 1584), 8);
  EXPECT_EQ(FusedMetadataRowBlocks(1, 256, 1584), 256);
  EXPECT_EQ(FusedMetadataRowBlocks(198, 8, 1584), 8);
}

TEST(FusedMetadataRowBlocksTest, ExtremeInputsStayInRange) {
  constexpr int32_t kMax32 = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(FusedMetadataRowBlocks(std::numeric_limits<int64_t>::max(), kMax32, kMax32),
            CeilDiv(kMax32, 4));
  EXPECT_EQ(FusedMetadataRowBlocks(1, kMax32, kMax32), kMax32);
  EXPECT_EQ(FusedMetadataRowBlocks(1, 1, kMax32), 1);
  // Rows past int32: the wave's share of them is 0 blocks, not a quotient of truncated rows.
  EXPECT_EQ(FusedMetadataRowBlocks((int64_t{1} << 32) + 1, 32, 1056), 8);
  EXPECT_EQ(FusedMetadataRowBlocks(int64_t{1} << 32, 32, 1056), 8);
}

// The rule stated as a search, for every candidate: among the row blocks that leave no block
// without passes, whose share is at most 4 passes, and for which any smaller share would take
// more than one wave of blocks, the one with the largest share.
TEST(FusedMetadataRowBlocksTest, IsTheLargestShareOfAtMostFourPassesThatNoWaveCouldSplitFurther) {
  for (int64_t rows : {1, 2, 7, 8, 63, 64, 65, 255, 256, 257, 1000, 1024, 1056, 4096, 100000}) {
    for (int32_t passes : {1, 2, 3, 4, 5, 7, 8, 9, 31, 32, 33, 63, 64, 100, 128, 129, 256, 1000}) {
      for (int32_t wave : {1, 2, 132, 528, 792, 1056, 1584}) {
        int32_t want = 0;
        for (int32_t y = 1; y <= passes; ++y) {
          const int64_t share = CeilDiv(passes, y);
          if (CeilDiv(passes, share) != y || share > 4) continue;
          if (share > 1 && rows * CeilDiv(passes, share - 1) <= wave) continue;
          if (want == 0 || share > CeilDiv(passes, want)) want = y;
        }
        ASSERT_EQ(FusedMetadataRowBlocks(rows, passes, wave), want)
            << "rows " << rows << " passes " << passes << " wave " << wave;
      }
    }
  }
}

// The wave of the fused kernel on an H100 or H200 since session 35: 132 multiprocessors x 8
// blocks of 128 threads, passes of 1024 tokens (the page table's: 512 columns). Each choice was
// measured against the others named (sessions 51 and 56, same-run A/Bs on H100s), but for
// bs 64 x 128k at page size 16, whose 32 lies between two measured grids.
TEST(FusedMetadataRowBlocksTest, RowBlocksMeasuredAtTheEightTokenPasses) {
  // bs 1024 x 32k (32 passes): 8 blocks per row, 96.1-96.2% of the copy against 4's 95.1-95.2%
  // and 16's 95.3-95.7% (12: 96.1%); with rows at every alignment 91.0-91.3% against 4's
  // 89.3-89.5% (12: 91.8-91.9%). Session 51: 4 took 99.0 us against one's 103.1.
  EXPECT_EQ(FusedMetadataRowBlocks(1024, 32, 1056), 8);
  // At page size 1 (64 passes, the page table's): 16, 94.6-94.7% against 4's 93.4% and 8's
  // 94.0-94.2%.
  EXPECT_EQ(FusedMetadataRowBlocks(1024, 64, 1056), 16);
  // bs 1024 x 4k (4 passes): one block per row, 14.9 us against two's 15.6 and three's 15.9.
  EXPECT_EQ(FusedMetadataRowBlocks(1024, 4, 1056), 1);
  // At page size 1 (8 passes): two, 21.2 us against one's 21.6; 22.3 against 24.0 at 4095.
  EXPECT_EQ(FusedMetadataRowBlocks(1024, 8, 1056), 2);
  // bs 256 x 4k (4 passes): four blocks per row, one pass each, 6.2-6.4 us against 6.7-7.9.
  EXPECT_EQ(FusedMetadataRowBlocks(256, 4, 1056), 4);
  // bs 64 x 128k at page size 1 (256 passes): 64, 38.3 us against 16's 40.7. At page size 16
  // (128 passes) 43 took 27.4 us and 16 27.7; the rule's 32 lies between them (not measured).
  EXPECT_EQ(FusedMetadataRowBlocks(64, 256, 1056), 64);
  EXPECT_EQ(FusedMetadataRowBlocks(64, 128, 1056), 32);
  // bs 8 x 128k at page size 1 (256 passes): 128 blocks per row of two passes, 6.8 us; 256 of
  // one pass took 8.1.
  EXPECT_EQ(FusedMetadataRowBlocks(8, 256, 1056), 128);
}

}  // namespace
}  // namespace attnmeta
