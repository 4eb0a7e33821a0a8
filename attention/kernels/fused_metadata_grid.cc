#include "attention/kernels/fused_metadata_grid.h"

#include "glog/logging.h"

namespace attnmeta {
namespace {
// A block's sum of the lengths before its row costs about a pass plus a pass per this many
// rows (fitted to same-run A/Bs on the H200; see the header).
constexpr int64_t kRowsPerPass = 512;
}  // namespace

int32_t FusedMetadataRowBlocks(int64_t rows, int32_t passes, int32_t wave_blocks) {
  CHECK_GE(rows, 1);
  CHECK_GE(passes, 1);
  CHECK_GE(wave_blocks, 1);
  // Only the smallest row_blocks of each passes-per-block count can be best (fewer blocks,
  // fewer waves): O(sqrt(passes)) candidates.
  // Costs in double: waves * (...) overflows int64 for absurd inputs (a wave of one block and
  // billions of rows), and only their order matters.
  int32_t best = 1;
  double best_cost = -1;
  for (int64_t y = 1; y <= passes;) {
    const int64_t per_block = (passes + y - 1) / y;
    const int64_t waves = (rows * y + wave_blocks - 1) / wave_blocks;
    const double cost =
        static_cast<double>(waves) * static_cast<double>(kRowsPerPass * (per_block + 1) + rows);
    if (best_cost < 0 || cost < best_cost) {
      best = static_cast<int32_t>(y);
      best_cost = cost;
    }
    if (per_block == 1) break;
    y = (passes + per_block - 2) / (per_block - 1);  // the first y with one pass fewer per block
  }
  return best;
}

}  // namespace attnmeta
