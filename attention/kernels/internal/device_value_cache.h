// DeviceValueCache: answers of the GPU runtime that do not change while a process runs (a
// device's multiprocessor count, a kernel's blocks per multiprocessor), kept per device and key
// so that a launcher which needs them on every call asks the runtime once. Host code only, no
// GPU runtime: CPU tests check it on every commit.

#ifndef ATTNMETA_ATTENTION_KERNELS_INTERNAL_DEVICE_VALUE_CACHE_H_
#define ATTNMETA_ATTENTION_KERNELS_INTERNAL_DEVICE_VALUE_CACHE_H_

#include <cstdint>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace attnmeta {
namespace internal {

// Thread-safe. A failed read is returned and not kept: the next Get asks again.
class DeviceValueCache {
 public:
  // The value of `key` on `device`: the kept one, else read()'s, kept when it succeeds. Two
  // threads that miss at once may both read; both get the value kept first.
  absl::StatusOr<int32_t> Get(int device, int64_t key,
                              absl::FunctionRef<absl::StatusOr<int32_t>()> read);

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::pair<int, int64_t>, int32_t> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace internal
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_INTERNAL_DEVICE_VALUE_CACHE_H_
