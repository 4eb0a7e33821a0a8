// Read-only kernels, the ceilings a memory-bound kernel that only reads is compared with in the
// same run (a copy also writes, and a copy captured in a graph may run on a copy engine): a
// stream over a buffer, every 16-byte word read once with eight loads in flight per thread;
// and the reads of the decode attention kernel alone.

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

// Reads K and V rows the way the paged decode attention kernel's blocks do, with nothing else:
// the ceiling of a kernel with that grid and those reads. Pools laid out [slot][kv_heads][128
// bf16] (256-byte rows); token t of sequence i is slot token_slots[i * ctx + t]
// (token_slots: [seqs * ctx], every entry a slot of both pools). One block of 4 warps per
// (sequence, chunk, KV head), `seqs` sequences of `ctx` tokens each cut into `chunks` equal
// chunks; blocks_per_multiprocessor blocks on each of `multiprocessors` (fewer if fewer are
// resident at once), each looping over units blockIdx.x, blockIdx.x + gridDim.x, ... (the
// attention kernel's waves); each warp loads a step's 32 slots (a lane each), then reads those
// tokens' K and V rows of its KV head, every row load of the step in flight (16 KB a warp).
hipError_t LaunchHeadRowsRead(const void* k_pool, const void* v_pool, const int32_t* token_slots,
                              int32_t seqs, int64_t ctx, int32_t chunks, int32_t kv_heads,
                              int32_t multiprocessors, int32_t blocks_per_multiprocessor,
                              uint32_t* sink, hipStream_t stream);

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_TESTING_STREAM_READ_H_
