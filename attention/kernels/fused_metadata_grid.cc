#include "attention/kernels/fused_metadata_grid.h"

#include "glog/logging.h"

namespace attnmeta {
namespace {
// A block's start and its sum of the lengths before its row cost 1.25 passes plus a pass per
// kRowsPerPass rows: kBlockStart / kRowsPerPass passes, then rows / kRowsPerPass (fitted to
// same-run A/Bs; see the header).
constexpr int64_t kRowsPerPass = 512;
constexpr int64_t kBlockStart = 640;
}  // namespace

int32_t FusedMetadataRowBlocks(int64_t rows, int32_t passes, int32_t wave_blocks) {
  CHECK_GE(rows, 1);
  CHECK_GE(passes, 1);
  CHECK_GE(wave_blocks, 1);
  // Only the smallest row_blocks of each passes-per-block count can be best (fewer blocks,
  // a smaller cost): O(sqrt(passes)) candidates.
  // The cost scaled by kRowsPerPass * wave_blocks, in double: the product overflows int64 for
  // absurd inputs (billions of rows), and only the order matters (exact below 2^53).
  int32_t best = 1;
  double best_cost = -1;
  for (int64_t y = 1; y <= passes;) {
    const int64_t per_block = (passes + y - 1) / y;
    const double cost = static_cast<double>(kRowsPerPass * per_block + kBlockStart + rows) *
                        static_cast<double>(rows * y + wave_blocks);
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
