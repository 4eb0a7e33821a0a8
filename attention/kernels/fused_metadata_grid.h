// FusedMetadataRowBlocks: the grid of the fused decode-metadata launch
// (BuildDecodeMetadataOnDevice, metadata_launchers.h). Host code only, no GPU runtime: CPU
// tests check the choice on every commit.

#ifndef ATTNMETA_ATTENTION_KERNELS_FUSED_METADATA_GRID_H_
#define ATTNMETA_ATTENTION_KERNELS_FUSED_METADATA_GRID_H_

#include <cstdint>

namespace attnmeta {

// The launch is a grid of [rows][row_blocks] blocks; the row_blocks blocks of a row share its
// `passes` passes in contiguous shares of ceil(passes / row_blocks), and each block first sums
// the lengths of the rows before its own. Blocks run in waves of `wave_blocks`
// (multiprocessors times the blocks that fit on one). Returns ceil(passes / 4) row blocks
// (shares of at most 4 passes: 4096 tokens or 2048 page-table columns), or more where the grid
// would then hold fewer than one wave of blocks: as many as fit one wave, at most one per pass.
// Then the fewest row blocks that give the same share (no block without passes).
//
// Measured in same-run A/Bs of fixed row_blocks on H100s (8 tokens per thread, 132
// multiprocessors x 8 blocks; docs/gpu_metadata_kernels.md, "Shares of four passes"): at bs
// 1024 x 32k (32 passes) 8 row blocks read 96.1-96.2% of the copy against 95.1-95.2% for the 4
// that session 51's cost model chose, and 91.0-91.3% against 89.3-89.5% with rows at every
// alignment; at page size 1 (64 passes) 16 read 94.6-94.7% against 93.4%. The test names every
// measured choice.
//
// REQUIRES: rows >= 1, passes >= 1, wave_blocks >= 1.
int32_t FusedMetadataRowBlocks(int64_t rows, int32_t passes, int32_t wave_blocks);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_FUSED_METADATA_GRID_H_
