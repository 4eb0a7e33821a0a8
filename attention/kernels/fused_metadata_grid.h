// FusedMetadataRowBlocks: the grid of the fused decode-metadata launch
// (BuildDecodeMetadataOnDevice, metadata_launchers.h). Host code only, no GPU runtime: CPU
// tests check the choice on every commit.

#ifndef ATTNMETA_ATTENTION_KERNELS_FUSED_METADATA_GRID_H_
#define ATTNMETA_ATTENTION_KERNELS_FUSED_METADATA_GRID_H_

#include <cstdint>

namespace attnmeta {

// The launch is a grid of [rows][row_blocks] blocks; the row_blocks blocks of a row share its
// `passes` passes (contiguous shares), and each block first sums the lengths of the rows before
// its own. Blocks run in waves of `wave_blocks` (multiprocessors times the blocks that fit on
// one). Returns the row_blocks in [1, passes] that minimizes
// waves * (passes per block + 1 + rows / 512), the smallest on a tie. The last two terms are
// a block's start, its sum of the lengths before its row, fitted to same-run A/Bs on the H200
// with 256-thread blocks (docs/gpu_metadata_kernels.md): at bs 1024 x 32k (32 passes, a wave
// of 792 blocks) one block per row, 1.3 waves of 32-pass blocks, took 89 us and three per row
// 80 us; at bs 1024 x 4k (4 passes) one block per row took 15.7 us and two per row 16.4 us.
// With 128-thread blocks (twice the passes and the wave) a block's start measured the same
// with rows / 256 as with rows / 512. Fitted at 4 tokens per thread per pass; the kernel's
// 8 since session 35 (passes of twice the tokens) were measured with it as it is, not refitted.
// REQUIRES: rows >= 1, passes >= 1, wave_blocks >= 1.
int32_t FusedMetadataRowBlocks(int64_t rows, int32_t passes, int32_t wave_blocks);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_FUSED_METADATA_GRID_H_
