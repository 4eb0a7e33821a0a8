#include "attention/kernels/fused_metadata_grid.h"

#include <algorithm>

#include "glog/logging.h"

namespace attnmeta {
namespace {
// Passes per block where the grid fills a wave or more (see the header).
constexpr int64_t kPassesPerBlock = 4;
}  // namespace

int32_t FusedMetadataRowBlocks(int64_t rows, int32_t passes, int32_t wave_blocks) {
  CHECK_GE(rows, 1);
  CHECK_GE(passes, 1);
  CHECK_GE(wave_blocks, 1);
  // A grid smaller than one wave leaves multiprocessors idle: split further, up to one wave.
  const int64_t row_blocks =
      std::max<int64_t>((passes + kPassesPerBlock - 1) / kPassesPerBlock, wave_blocks / rows);
  // The kernel's shares are ceil(passes / row_blocks) passes (at least one): the fewest blocks
  // that give the same share.
  const int64_t share = (passes + row_blocks - 1) / row_blocks;
  return static_cast<int32_t>((passes + share - 1) / share);
}

}  // namespace attnmeta
