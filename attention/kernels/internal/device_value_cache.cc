#include "attention/kernels/internal/device_value_cache.h"

namespace attnmeta {
namespace internal {

absl::StatusOr<int32_t> DeviceValueCache::Get(int device, int64_t key,
                                              absl::FunctionRef<absl::StatusOr<int32_t>()> read) {
  const std::pair<int, int64_t> k(device, key);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = values_.find(k); it != values_.end()) return it->second;
  }
  // The runtime is asked outside the lock: a query of one device does not wait for another's.
  absl::StatusOr<int32_t> value = read();
  if (!value.ok()) return value.status();
  absl::MutexLock lock(&mu_);
  return values_.try_emplace(k, *value).first->second;
}

}  // namespace internal
}  // namespace attnmeta
