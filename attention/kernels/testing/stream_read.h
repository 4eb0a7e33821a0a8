// A read-only streaming kernel: every 16-byte word of a buffer read once, eight loads in flight
// per thread. The ceiling a memory-bound kernel that only reads is compared with in the same
// run (a copy also writes, and a copy captured in a graph may run on a copy engine).

#ifndef ATTNMETA_ATTENTION_KERNELS_TESTING_STREAM_READ_H_
#define ATTNMETA_ATTENTION_KERNELS_TESTING_STREAM_READ_H_

#include <cstdint>

#include "attention/kernels/hip_port.h"

namespace attnmeta {
namespace testing {

// Reads words [0, bytes / 16) of `data` (16-byte aligned) with `blocks` blocks of 256 threads;
// `sink` (4 bytes) is written only when the words' xor is a value no test data makes, so
// that the loads cannot be dropped.
hipError_t LaunchStreamRead(const void* data, int64_t bytes, uint32_t* sink, int32_t blocks,
                            hipStream_t stream);

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_TESTING_STREAM_READ_H_
