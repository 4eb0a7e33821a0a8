// Batch-size buckets: the padded batch sizes graphs are captured for, and the choice of the
// bucket that runs a real batch.

#ifndef ATTNMETA_ATTENTION_GRAPH_BATCH_BUCKETS_H_
#define ATTNMETA_ATTENTION_GRAPH_BATCH_BUCKETS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "attention/graph/backend_config.h"

namespace attnmeta {

struct BucketChoice {
  bool eager = false;  // no captured bucket holds the batch: run it eagerly
  int64_t bucket = 0;  // the smallest bucket >= the batch size (when !eager)
};

class BatchSizeBuckets {
 public:
  // 1, 2, 4, 8, then steps of 8 up to 256, as engines capture them.
  static BatchSizeBuckets Default();
  // InvalidArgument unless `sizes` is non-empty, strictly increasing and >= 1.
  static absl::StatusOr<BatchSizeBuckets> Create(std::vector<int64_t> sizes);
  // The config's capture_batch_sizes as given (batches past the last run eagerly), or, when
  // it lists none, the default list cut at max_batch_size with max_batch_size itself as the
  // last bucket (then every batch the config allows has a graph).
  // REQUIRES: ValidateBackendConfig(config).ok().
  static BatchSizeBuckets ForConfig(const BackendConfig& config);

  // The smallest bucket holding `batch_size` requests; eager when the batch is larger than
  // the largest bucket (not an error). InvalidArgument for a negative batch size.
  absl::StatusOr<BucketChoice> Choose(int64_t batch_size) const;

  const std::vector<int64_t>& sizes() const { return sizes_; }
  int64_t largest() const { return sizes_.back(); }

 private:
  explicit BatchSizeBuckets(std::vector<int64_t> sizes) : sizes_(std::move(sizes)) {}
  std::vector<int64_t> sizes_;  // non-empty, strictly increasing, >= 1
};

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_GRAPH_BATCH_BUCKETS_H_
