// The device side of paged decode attention: the argument structs shared by the host launcher
// (paged_decode_launcher.h) and the device source, whose launch functions are in
// paged_decode_attention_launch.h. Plain types only: no Abseil, no glog, no vendor header (the
// launcher's checks fill these structs and are tested without a GPU).
//
// Decode: one query row per sequence. Query head h of sequence i reads K/V head
// h / (num_q_heads / num_kv_heads) (GQA; MHA when the counts are equal). Over the KV tokens t
// of a range [kv_begin, kv_end) of the sequence, with slot(i, t) the pool row of token t:
//   s_t        = softmax_scale * dot(q[i][h], K[slot(i, t)][h / group])
//   out[i][h]  = sum_t exp(s_t) * V[slot(i, t)][h / group] / sum_t exp(s_t)
//   lse[i][h]  = log(sum_t exp(s_t))          (natural log, fp32)
// An empty range (kv_len 0) writes out = 0 and lse = -inf, as the CPU reference does
// (attention/metadata/reference_attention.h). Q, K, V and out are bf16 or fp16; scores, the
// online softmax and the accumulators are fp32.
//
// The slot of token t comes either from token-level indices (kv_indices[kv_indptr[i] + t]) or
// from the page table (page_table[i][t / page_size] * page_size + t % page_size, with the length
// from kv_lens[i]). A split-KV plan's items run over parts of a sequence and write fp32 partial
// output and log-sum-exp; the merge kernel (or, with merge counters, the attention block that
// completes a reduce item) combines each reduce item's partials by log-sum-exp into out and lse.
//
// What lives in device memory is bounds-checked by the kernels, which never read or write
// outside a buffer: they clamp, skip a token whose slot is outside the pool, and record the
// first violation in `violation` (device_violation.h; may be null). The kinds they record:
//   kOffsetNegative / kIndptrDecreasing   kv_indptr entry negative / below the one before it
//   kTotalPastCapacity                    kv_indptr past kv_indices' capacity (index: the
//                                         sequence)
//   kLengthNegative                       a negative kv_lens entry
//   kPagesPastTable                       kv_lens[i] needs more pages than the table's columns
//   kSlotOutsidePool                      a token's slot (from kv_indices or page table) outside
//                                         the pool; the token is skipped
//   kWorkItemSequence, kReduceItemSequence  a work or reduce item's sequence outside the batch
//   kWorkItemPartialSlot                  a work item's partial slot past the partial buffers
//   kWorkItemKvBeginNegative, kWorkItemKvEndPastLength, kWorkItemKvEndBeforeBegin
//                                         a work item's KV range: kv_begin < 0, kv_end past its
//                                         sequence's KV length, kv_end < kv_begin (clamped)
//   kReduceItemPartialBeginNegative, kReduceItemPartialEndBeforeBegin,
//   kReduceItemPartialEndPastBuffers      a reduce item's partial slots: partial_begin < 0,
//                                         partial_end < partial_begin, partial_end past the
//                                         partial buffers
//   kPartialSlotUnmerged                  merging in the attention launch: a work item's partial
//                                         slot that no reduce item merges (bound: num_reduce)
//   kWorkItemShortOfSequence              a work item without a partial slot whose KV range is
//                                         not [0, its sequence's length): a plan made for other
//                                         lengths (one decode step stale); the range is attended

#ifndef ATTNMETA_ATTENTION_KERNELS_PAGED_DECODE_ATTENTION_H_
#define ATTNMETA_ATTENTION_KERNELS_PAGED_DECODE_ATTENTION_H_

#include <cstdint>

#include "attention/kernels/device_kv_source.h"
#include "attention/kernels/device_violation.h"
#include "attention/kernels/element_dtype.h"

namespace attnmeta {
namespace kernels {

// One work item of a split-KV plan as the kernel reads it: the layout of SplitKvWorkItem
// (attention/metadata/split_kv_planner.h; the launcher asserts it), so that a plan's items are
// uploaded as they are.
struct DecodeWorkItem {
  int32_t sequence;
  int32_t q_begin;       // == sequence (decode: query row i is sequence i's)
  int32_t q_end;         // == sequence + 1
  int32_t kv_begin;      // token positions of the sequence, 0 <= kv_begin <= kv_end
  int32_t kv_end;
  int32_t partial_slot;  // < 0: writes out and lse; else partial_out / partial_lse[partial_slot]
};

// One reduce item: partial slots [partial_begin, partial_end) merged into query row
// `sequence`. The layout of SplitKvReduceItem.
struct DecodeReduceItem {
  int32_t sequence;
  int32_t q_begin;  // == sequence
  int32_t q_end;    // == sequence + 1
  int32_t partial_begin;
  int32_t partial_end;
};

// Compile-time shapes of the decode kernel, so that variants can be compared in one benchmark
// run. A block of `warps` warps runs one (work item, KV head, query-head chunk) on the tensor
// cores; each warp takes steps of `step_tokens` tokens (16 or 32; DecodeStepTokens at head dim
// 256), issuing the K and V loads of a whole step before it computes on them.
// `portable_mma` runs the matrix products through PortableMmaM16N8K16 (hip_port.h), the code
// AMD GPUs run, so that an NVIDIA GPU tests that path too.
struct DecodeVariant {
  int32_t warps;
  int32_t step_tokens;
  int32_t portable_mma;  // 0 or 1
};
inline constexpr int32_t kNumDecodeVariants = 5;
inline constexpr DecodeVariant kDecodeVariants[kNumDecodeVariants] = {
    {4, 32, 0}, {2, 32, 0}, {8, 32, 0}, {4, 16, 0}, {4, 32, 1}};
// Variant 0 is compiled for every dtype, head dim and query-head chunk; the others only for
// head_dim kVariantHeadDim with kVariantQueryHeads query heads per block (groups of a
// multiple of it; the benchmark's 32/8 GQA at head dim 128).
inline constexpr int32_t kVariantHeadDim = 128;
inline constexpr int32_t kVariantQueryHeads = 4;

// The tokens of a warp's step at `head_dim` (64, 128 or 256): the variant's step_tokens, halved
// at head dim 256 down to 16 (one k-step of the V product): a 32-token step's K and V would
// take 256 registers per lane there. The kernel's template takes it; the benchmark prints it.
// Measured on the H200 and not kept: a split plan's shortest chunk of a step for each warp
// (8-warp blocks at bs 1 x 1k: 9.67-9.76 us in 4 items of 256 tokens against 8.32-8.36 in 8
// of 128, the planner's default), and doubled steps at head dim 64 (as many bytes in flight
// per warp as at 128, but 2 blocks per multiprocessor instead of 3: bs 64 x 4k 3.86 TB/s
// against 3.54, bs 32 x 4k 3.61 against 3.83).
inline constexpr int32_t DecodeStepTokens(const DecodeVariant& v, int32_t head_dim) {
  return head_dim > 128 && v.step_tokens > 16 ? v.step_tokens / 2 : v.step_tokens;
}

struct PagedDecodeParams {
  const void* q;       // [batch_size][num_q_heads][head_dim] of dtype, 16-byte aligned
  const void* k_pool;  // [kv.pool_slots][num_kv_heads][head_dim] of dtype, 16-byte aligned
  const void* v_pool;  // like k_pool
  // The K/V rows of token t of sequence i (a token whose slot is outside the pool is skipped).
  DeviceKvSource kv;

  // The work: null runs one item per sequence over its whole length, writing out and lse;
  // else work[0, num_work) of a split-KV plan.
  const DecodeWorkItem* work;  // [num_work] or null
  int32_t num_work;            // the grid's items: num_work, or batch_size when work is null
  float* partial_out;          // [partial_capacity][num_q_heads][head_dim], 16-byte aligned
  float* partial_lse;          // [partial_capacity][num_q_heads]
  int32_t partial_capacity;
  // Null: the partials wait for the merge kernel. Else the block that completes a reduce item
  // merges it: merge_counters[r * H + x] counts the blocks of reduce item r done for KV head /
  // query-head chunk x of H = num_kv_heads * group / heads_per_block; zero before the launch,
  // and the launch leaves them zero when the device plan is the one the launcher checked.
  const DecodeReduceItem* reduce;  // [num_reduce], with merge_counters
  int32_t num_reduce;
  uint32_t* merge_counters;        // [num_reduce * H] or null

  void* out;   // [batch_size][num_q_heads][head_dim] of dtype, 16-byte aligned
  float* lse;  // [batch_size][num_q_heads]

  int32_t batch_size;
  int32_t num_q_heads;      // a multiple of num_kv_heads
  int32_t num_kv_heads;
  int32_t head_dim;         // 64, 128 or 256
  int32_t heads_per_block;  // 1, 2, 4 or 8, dividing num_q_heads / num_kv_heads
  int32_t dtype;            // ElementDtype
  int32_t variant;          // [0, kNumDecodeVariants)
  float softmax_scale;
  DeviceViolation* violation;
  // False: a block waits for the kernel ahead (WaitForPrecedingGrid) before it reads anything.
  // True: it reads its metadata first (its work item, its sequence's length from kv.kv_indptr
  // or kv.kv_lens, its warps' first index entries from kv.kv_indices or kv.page_table), then
  // waits. Either way it reads Q, K and V and writes only after the wait. Matters only in a
  // launch that overlaps the kernel ahead (LaunchPagedDecodeKernel's overlap_preceding).
  bool metadata_before_wait;
  // With metadata_before_wait false, in a launch that overlaps the kernel ahead: before the
  // wait the block warms L2 with the lines it reads first after it (DecodeLaunchOverlap::
  // kWarmL2First), from values used for nothing else. Loads only metadata and prefetches
  // lines of the K and V pools, in bounds whatever the metadata holds, and records nothing.
  bool warm_l2_before_wait;
};

// The blocks of one work item: one per KV head and chunk of heads_per_block query heads of its
// group; block x of the item takes query heads [x * heads_per_block, + heads_per_block), all of
// one KV head. The launch's grid is num_work times this; the kernel splits its block index by
// it and the host launcher sizes split plans by it.
inline constexpr int64_t DecodeBlocksPerItem(int32_t num_q_heads, int32_t heads_per_block) {
  return num_q_heads / heads_per_block;
}

struct DecodeMergeParams {
  const DecodeReduceItem* reduce;  // [num_reduce]
  int32_t num_reduce;
  const float* partial_out;  // [partial_capacity][num_q_heads][head_dim]
  const float* partial_lse;  // [partial_capacity][num_q_heads]
  int32_t partial_capacity;
  void* out;   // [batch_size][num_q_heads][head_dim] of dtype, 8-byte aligned
  float* lse;  // [batch_size][num_q_heads]
  int32_t batch_size;
  int32_t num_q_heads;
  int32_t head_dim;  // 64, 128 or 256
  int32_t dtype;     // ElementDtype
  DeviceViolation* violation;
};

}  // namespace kernels
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_PAGED_DECODE_ATTENTION_H_
