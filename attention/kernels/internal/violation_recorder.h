// The device side of DeviceViolation (device_violation.h): how a kernel records the first
// violation it meets. Device code only: include it from .hip.cc sources.

#ifndef ATTNMETA_ATTENTION_KERNELS_INTERNAL_VIOLATION_RECORDER_H_
#define ATTNMETA_ATTENTION_KERNELS_INTERNAL_VIOLATION_RECORDER_H_

#include <cstdint>

#include "attention/kernels/device_violation.h"
#include "attention/kernels/hip_port.h"

namespace attnmeta {
namespace kernels {

// Records the first violation only; later ones leave it as it is. `v` may be null.
__device__ inline void RecordViolation(DeviceViolation* v, ViolationKind kind, int64_t index,
                                       int64_t value, int64_t bound) {
  if (v == nullptr) return;
  if (atomicCAS(&v->recorded, 0, 1) == 0) {
    v->kind = kind;
    v->index = index;
    v->value = value;
    v->bound = bound;
  }
}

// The first violation a kernel finds before it may write (before WaitForPrecedingGrid in a
// launch that overlaps the kernel ahead of it, which may still be writing the same word), kept
// in registers and recorded by Record after the wait.
struct HeldViolation {
  ViolationKind kind = kNoViolation;
  int64_t index = 0;
  int64_t value = 0;
  int64_t bound = 0;

  __device__ void Hold(ViolationKind k, int64_t at, int64_t found, int64_t limit) {
    if (kind != kNoViolation) return;
    kind = k;
    index = at;
    value = found;
    bound = limit;
  }
  __device__ void Record(DeviceViolation* v) const {
    if (kind != kNoViolation) RecordViolation(v, kind, index, value, bound);
  }
};

}  // namespace kernels
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_INTERNAL_VIOLATION_RECORDER_H_
