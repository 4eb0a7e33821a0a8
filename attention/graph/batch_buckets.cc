#include "attention/graph/batch_buckets.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace attnmeta {
namespace {

std::vector<int64_t> DefaultSizes() {
  std::vector<int64_t> sizes = {1, 2, 4};
  for (int64_t b = 8; b <= 256; b += 8) sizes.push_back(b);
  return sizes;
}

}  // namespace

BatchSizeBuckets BatchSizeBuckets::Default() { return BatchSizeBuckets(DefaultSizes()); }

absl::StatusOr<BatchSizeBuckets> BatchSizeBuckets::Create(std::vector<int64_t> sizes) {
  if (sizes.empty()) return absl::InvalidArgumentError("batch-size buckets: none given");
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 1 || (i > 0 && sizes[i] <= sizes[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch-size buckets: entry ", i, " = ", sizes[i], ", need strictly increasing sizes >= 1"));
    }
  }
  return BatchSizeBuckets(std::move(sizes));
}

BatchSizeBuckets BatchSizeBuckets::ForConfig(const BackendConfig& config) {
  std::vector<int64_t> sizes(config.capture_batch_sizes().begin(),
                             config.capture_batch_sizes().end());
  if (sizes.empty()) {
    for (int64_t b : DefaultSizes()) {
      if (b <= config.max_batch_size()) sizes.push_back(b);
    }
    // Every batch the config allows gets a graph.
    if (sizes.empty() || sizes.back() < config.max_batch_size()) {
      sizes.push_back(config.max_batch_size());
    }
  }
  return BatchSizeBuckets(std::move(sizes));
}

absl::StatusOr<BucketChoice> BatchSizeBuckets::Choose(int64_t batch_size) const {
  if (batch_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat("batch size ", batch_size, " is negative"));
  }
  auto it = std::lower_bound(sizes_.begin(), sizes_.end(), batch_size);
  if (it == sizes_.end()) return BucketChoice{true, 0};
  return BucketChoice{false, *it};
}

}  // namespace attnmeta
