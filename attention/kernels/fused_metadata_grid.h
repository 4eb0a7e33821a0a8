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
// one), and a block of a later wave starts as one ends. Returns the row_blocks y in [1,
// passes] that minimizes (passes per block + 1.25 + rows / 512) * (rows * y / wave_blocks + 1),
// the smallest on a tie: a block's time (its passes, its start, its sum of the lengths before
// its row) times the waves of blocks plus one block's time for the last wave's tail.
// Fitted to same-run A/Bs of fixed row_blocks on an H100 (session 51, 8 tokens per thread,
// 132 multiprocessors x 8 blocks; docs/gpu_metadata_kernels.md, "The fused launch's grid,
// refitted"): at bs 1024 x 32k (32 passes) one block per row, what the earlier model (whole
// waves times a block's time) chose, took 103.1 us and four per row 99.0 (115.6 and 105.3 with
// rows at every alignment). Six per row measured 0.3-1.2% faster than four there: the model
// ranks six lower and overstates what splitting gains (21% predicted, 4-9% measured). The
// test names every measured choice.
// REQUIRES: rows >= 1, passes >= 1, wave_blocks >= 1.
int32_t FusedMetadataRowBlocks(int64_t rows, int32_t passes, int32_t wave_blocks);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_FUSED_METADATA_GRID_H_
