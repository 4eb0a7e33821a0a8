// FusedMetadataRowBlocks: the grid of the fused decode-metadata launch
// (BuildDecodeMetadataOnDevice, metadata_launchers.h). Host code only, no GPU runtime: CPU
// tests check the choice on every commit.

#ifndef ATTNMETA_ATTENTION_KERNELS_FUSED_METADATA_GRID_H_
#define ATTNMETA_ATTENTION_KERNELS_FUSED_METADATA_GRID_H_

#include <cstdint>

namespace attnmeta {

// The launch is a grid of [rows][row_blocks] blocks. `passes` is the launch's longest row in
// passes: the larger of its token passes (1024 tokens) and, with a page table, its column
// passes (512 columns). The row_blocks blocks of a row copy its tokens in contiguous shares of
// ceil(its token passes / row_blocks) (with a power-of-two page size the page-table entries of
// those tokens come from the same loads) and write its other page-table columns grid-stride,
// and each block first sums the lengths of the rows before its own. Blocks run in waves of
// `wave_blocks` (multiprocessors times the blocks that fit on one). Returns ceil(passes / 4) row
// blocks (shares of at most 4 passes), or more where the grid would then hold fewer than one wave
// of blocks: as many as fit one wave, at most one per pass. Then the fewest row blocks that give
// the same share of `passes` (no block without passes in the longest row).
//
// Measured in same-run A/Bs of fixed row_blocks on an H100 (8 tokens per thread, 132
// multiprocessors x 8 blocks; docs/gpu_metadata_kernels.md, "Shares of four passes"): at bs
// 1024 x 32k (32 passes) 8 row blocks read 96.1-96.2% of the copy against 95.1-95.2% for the 4
// that session 51's cost model chose, and 91.0-91.3% against 89.3-89.5% with rows at every
// alignment (12 blocks, shares of 3, read 0.4-0.8 points more there, but shares of 3 split the
// 4-pass rows that one block copies fastest); at page size 1 (64 column passes) 16 read
// 94.6-94.7% against 93.4%. The test names the choices measured.
//
// REQUIRES: rows >= 1, passes >= 1, wave_blocks >= 1.
int32_t FusedMetadataRowBlocks(int64_t rows, int32_t passes, int32_t wave_blocks);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_FUSED_METADATA_GRID_H_
