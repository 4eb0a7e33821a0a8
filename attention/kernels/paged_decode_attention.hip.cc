#include "attention/kernels/paged_decode_attention_launch.h"

#include "attention/kernels/internal/element_types.h"
#include "attention/kernels/internal/kv_source.h"
#include "attention/kernels/internal/mma_attention.h"
#include "attention/kernels/internal/violation_recorder.h"

namespace attnmeta {
namespace kernels {
namespace {

constexpr int32_t kInt32Max = 2147483647;
// The merge: query heads (warps) per block, and the partial floats whose loads a lane keeps in
// flight (MergeHead's chunk: 32 partials at head dim 64 and 128, 16 at 256).
constexpr int kMergeWarps = 4;
constexpr int kMergeFloatsInFlight = 128;

using internal::Bf16;
using internal::Fp16;
using internal::kLog2e;
using internal::NegInf;
using internal::Pack2;

// What one block works on, resolved from its work item and the sequence's device-resident
// lengths, clamped (violations held by thread 0).
struct BlockWork {
  int32_t sequence;
  int32_t lo, hi;        // token positions [lo, hi) of the sequence, lo <= hi
  int32_t partial_slot;  // < 0: the final output
  int64_t index_base;    // token-level: where the sequence's tokens start in kv_indices
};

// False when the item names no row of the batch or no partial slot that exists: the block has
// nothing it may write. Reads only the work item and the sequence's length, and writes nothing:
// thread 0 holds what it finds in `held` for the caller to record (a launch that overlaps the
// kernel ahead of it calls this before WaitForPrecedingGrid).
__device__ inline bool ResolveWork(const PagedDecodeParams& p, int32_t item, BlockWork& w,
                                   HeldViolation& held) {
  const bool report = threadIdx.x == 0;
  const auto hold = [&](ViolationKind kind, int64_t index, int64_t value, int64_t bound) {
    if (report) held.Hold(kind, index, value, bound);
  };
  int64_t kv_begin = 0, kv_end = kInt32Max;
  w.sequence = item;
  w.partial_slot = -1;
  if (p.work != nullptr) {
    const DecodeWorkItem it = p.work[item];
    w.sequence = it.sequence;
    w.partial_slot = it.partial_slot;
    kv_begin = it.kv_begin;
    kv_end = it.kv_end;
    if (it.sequence < 0 || it.sequence >= p.batch_size) {
      hold(kWorkItemSequence, item, it.sequence, p.batch_size);
      return false;
    }
    if (it.partial_slot >= p.partial_capacity) {
      hold(kWorkItemPartialSlot, item, it.partial_slot, p.partial_capacity);
      return false;
    }
    if (kv_begin < 0) {
      hold(kWorkItemKvBeginNegative, item, kv_begin, 0);
      kv_begin = 0;
    }
  }
  const int32_t len = internal::KvLength(p, w.sequence, hold, &w.index_base);
  if (p.work != nullptr && kv_end > len) hold(kWorkItemKvEndPastLength, item, kv_end, len);
  if (kv_end < kv_begin) hold(kWorkItemKvEndBeforeBegin, item, kv_end, kv_begin);
  w.hi = static_cast<int32_t>(kv_end < len ? kv_end : len);
  w.lo = static_cast<int32_t>(kv_begin < w.hi ? kv_begin : w.hi);
  // An item that writes the output must attend to the whole sequence; less is a plan made for
  // other lengths (a stale copy), whose output would be silently partial.
  if (p.work != nullptr && w.partial_slot < 0 && (w.lo != 0 || w.hi != len)) {
    hold(kWorkItemShortOfSequence, item, w.hi - w.lo, len);
  }
  return true;
}

// False (recorded) when a reduce item names no row of the batch or partial slots outside the
// buffers: nothing of it may be read or written.
__device__ inline bool ReduceItemFits(const DecodeReduceItem& it, int32_t r, int32_t batch_size,
                                      int32_t partial_capacity, DeviceViolation* v) {
  if (it.sequence < 0 || it.sequence >= batch_size) {
    RecordViolation(v, kReduceItemSequence, r, it.sequence, batch_size);
    return false;
  }
  if (it.partial_begin < 0) {
    RecordViolation(v, kReduceItemPartialBeginNegative, r, it.partial_begin, 0);
    return false;
  }
  if (it.partial_end < it.partial_begin) {
    RecordViolation(v, kReduceItemPartialEndBeforeBegin, r, it.partial_end, it.partial_begin);
    return false;
  }
  if (it.partial_end > partial_capacity) {
    RecordViolation(v, kReduceItemPartialEndPastBuffers, r, it.partial_end, partial_capacity);
    return false;
  }
  return true;
}

// A lane's kDims (2, 4 or 8) floats of one partial row, from x (8- or 16-byte aligned).
template <int kDims>
__device__ __forceinline__ void LoadLaneDims(const float* x, float (&xs)[kDims]) {
  if constexpr (kDims == 2) {
    const float2 y = *reinterpret_cast<const float2*>(x);
    xs[0] = y.x;
    xs[1] = y.y;
  } else {
#pragma unroll
    for (int i = 0; i < kDims / 4; ++i) {
      const float4 y = reinterpret_cast<const float4*>(x)[i];
      xs[4 * i] = y.x;
      xs[4 * i + 1] = y.y;
      xs[4 * i + 2] = y.z;
      xs[4 * i + 3] = y.w;
    }
  }
}

// The lane's kDims floats of partials c + k, k < n (zeros past n), into xs, and partial c +
// lane's lse (-inf past n) as the result: one round of loads, issued together.
template <int kDims, int kChunk>
__device__ __forceinline__ float LoadPartialChunk(const float* part, int64_t stride,
                                                  const float* lse_of_head, int64_t heads,
                                                  int32_t c, int32_t n, int lane,
                                                  float (&xs)[kChunk][kDims]) {
  const float my_lse = lane < n ? lse_of_head[(c + lane) * heads] : NegInf();
#pragma unroll
  for (int k = 0; k < kChunk; ++k) {
    if (k < n) {
      LoadLaneDims(part + (c + k) * stride, xs[k]);
    } else {
#pragma unroll
      for (int d = 0; d < kDims; ++d) xs[k][d] = 0.0f;
    }
  }
  return my_lse;
}

// The maximum and the sum of v over the warp's lanes.
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int m = 16; m > 0; m /= 2) v = fmaxf(v, ATTNMETA_SHFL_XOR(v, m));
  return v;
}
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m /= 2) v += ATTNMETA_SHFL_XOR(v, m);
  return v;
}

// acc += w(k) * xs[k] over the chunk, w(k) being lane k's weight.
template <int kDims, int kChunk>
__device__ __forceinline__ void AccumulateChunk(float w, const float (&xs)[kChunk][kDims],
                                                float (&acc)[kDims]) {
#pragma unroll
  for (int k = 0; k < kChunk; ++k) {
    const float wk = ATTNMETA_SHFL_IDX32(w, k);
#pragma unroll
    for (int d = 0; d < kDims; ++d) acc[d] = fmaf(wk, xs[k][d], acc[d]);
  }
}

// acc += weight(k) * the lane's kDims floats of partial k, for k in [k_begin, k_end) (rows
// `stride` floats apart), kUnroll partials' loads in flight.
template <int kUnroll, int kDims, typename Weight>
__device__ __forceinline__ void AccumulatePartials(const float* part, int64_t stride,
                                                   int32_t k_begin, int32_t k_end,
                                                   const Weight& weight, float (&acc)[kDims]) {
#pragma unroll kUnroll
  for (int32_t k = k_begin; k < k_end; ++k) {
    const float wk = weight(k);
    float xs[kDims];
    LoadLaneDims(part + k * stride, xs);
#pragma unroll
    for (int d = 0; d < kDims; ++d) acc[d] = fmaf(wk, xs[d], acc[d]);
  }
}

// One warp: out and lse of query head h of reduce item `it` (checked) from its partials. An
// item of at most kChunk partials (bs 1 x 16k's 32 on the H200 at head dim 128) takes one
// round of loads (LoadPartialChunk: lane j loads partial j's lse while every lane loads its
// kHeadDim / kLaneGroup dims of each partial); the weights exp(lse - max) are computed by their
// lanes and shuffled to the others. A longer item takes two: the lanes load the partials' lse by
// turns for the max and the sum of the weights, then each lane sums its dims over all the
// partials (AccumulatePartials), kChunk partials' loads in flight. (On the H200 at bs 1 x 16k
// the merging block took 4,130 cycles with two rounds and 2,630 with one. A loop of one-round
// chunks over a longer item was 1-4% slower than the two rounds in the attention launch, at
// bs 1 x 32k and with 8/1 heads, though faster in the merge kernel;
// docs/paged_decode_attention.md.) Plain loads: the partials may have been written by other
// blocks of the same launch.
template <typename Dtype, int kHeadDim>
__device__ __forceinline__ void MergeHead(const float* partial_out, const float* partial_lse,
                                          int32_t num_q_heads, int32_t h, const DecodeReduceItem& it,
                                          void* out, float* lse) {
  constexpr int kDims = kHeadDim / kLaneGroup;  // per lane: 2, 4 or 8
  constexpr int kChunk =
      kMergeFloatsInFlight / kDims < kLaneGroup ? kMergeFloatsInFlight / kDims : kLaneGroup;
  const int lane = static_cast<int>(threadIdx.x) % kLaneGroup;
  const int64_t heads = num_q_heads;
  const int64_t stride = heads * kHeadDim;
  const float* part = partial_out + h * int64_t{kHeadDim} + kDims * lane;
  const float* lse_of_head = partial_lse + h;
  float mx = NegInf();  // the largest lse; -inf when no partial saw a token
  float sum = 0.0f;     // sum of exp(lse - mx)
  float acc[kDims] = {};
  const int32_t total = it.partial_end - it.partial_begin;
  if (total <= kChunk) {
    float xs[kChunk][kDims];
    const float my_lse = LoadPartialChunk<kDims, kChunk>(part, stride, lse_of_head, heads,
                                                         it.partial_begin, total, lane, xs);
    mx = WarpMax(my_lse);
    // A partial that saw no token (lse -inf) has weight 0.
    const float w = my_lse == NegInf() ? 0.0f : __expf(my_lse - mx);
    sum = WarpSum(w);
    AccumulateChunk<kDims, kChunk>(w, xs, acc);
  } else {
    for (int32_t k = it.partial_begin + lane; k < it.partial_end; k += kLaneGroup) {
      mx = fmaxf(mx, lse_of_head[k * heads]);
    }
    mx = WarpMax(mx);
    auto weight = [&](int32_t k) {
      const float x = lse_of_head[k * heads];
      return x == NegInf() ? 0.0f : __expf(x - mx);
    };
    for (int32_t k = it.partial_begin + lane; k < it.partial_end; k += kLaneGroup) sum += weight(k);
    sum = WarpSum(sum);
    AccumulatePartials<kChunk>(part, stride, it.partial_begin, it.partial_end, weight, acc);
  }
  // Every partial without a token: output 0, lse -inf.
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  uint32_t packed[kDims / 2];
#pragma unroll
  for (int d = 0; d < kDims / 2; ++d) {
    packed[d] = Pack2<Dtype>(acc[2 * d] * inv, acc[2 * d + 1] * inv);
  }
  const int64_t head_row = int64_t{it.sequence} * heads + h;
  uint32_t* dst = reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(out) + head_row * kHeadDim +
                                              kDims * lane);
#pragma unroll
  for (int d = 0; d < kDims / 2; ++d) dst[d] = packed[d];
  if (lane == 0) lse[head_row] = sum > 0.0f ? mx + __logf(sum) : NegInf();
}

// The reduce item whose partial slots hold `slot`, searched by one warp kLaneGroup items a step
// (every lane gets it); -1 when none does.
__device__ inline int32_t FindReduceItem(const PagedDecodeParams& p, int32_t slot) {
  const int lane = static_cast<int>(threadIdx.x) % kLaneGroup;
  int32_t found = -1;
  for (int32_t r0 = 0; r0 < p.num_reduce && found < 0; r0 += kLaneGroup) {
    const int32_t r = r0 + lane;
    bool hit = false;
    if (r < p.num_reduce) hit = p.reduce[r].partial_begin <= slot && slot < p.reduce[r].partial_end;
    const uint32_t hits = ATTNMETA_BALLOT32(hit);
    if (hits != 0) found = r0 + __ffs(static_cast<int>(hits)) - 1;
  }
  return found;
}

// Split-KV without a merge launch (merge_counters set): the block that completes a reduce item,
// the last of the item's blocks for this KV head and query-head chunk (`head_group`) to count
// itself, merges the item's partials for the chunk's query heads, a warp per head. `found`
// (FindReduceItem's, valid in the block's last warp) is the reduce item of the block's partial
// slot. The block's partial stores reach the last warp's lane 0 through the barrier; it counts
// the block with one acquire-release increment at device scope (it wraps to zero at the item's
// count, so that a launch leaves every counter it used at zero), which releases them and, in
// the merging block, acquires the other blocks' partials; the second barrier passes them on to
// its warps.
template <typename Dtype, int kHeadDim, int kHeads, int kWarps>
__device__ __forceinline__ void MergeIfLast(const PagedDecodeParams& p, int32_t item, int32_t slot,
                                            int32_t found, int32_t head_group, int32_t head_groups,
                                            int32_t q_head0) {
  // The reduce item this block merges (sequence -1: none), as the counting thread read it: a
  // load after the acquiring count would miss L1 and wait on L2 once more.
  __shared__ DecodeReduceItem merge_item;
  const int warp = static_cast<int>(threadIdx.x) / kLaneGroup;
  __syncthreads();
  if (threadIdx.x == (kWarps - 1) * kLaneGroup) {
    merge_item.sequence = -1;
    if (found < 0) {
      RecordViolation(p.violation, kPartialSlotUnmerged, item, slot, p.num_reduce);
    } else {
      const DecodeReduceItem it = p.reduce[found];
      if (ReduceItemFits(it, found, p.batch_size, p.partial_capacity, p.violation)) {
        const uint32_t last = static_cast<uint32_t>(it.partial_end - it.partial_begin) - 1;
        if (AtomicIncAcqRelDevice(p.merge_counters + int64_t{found} * head_groups + head_group,
                                  last) == last) {
          merge_item = it;
        }
      }
    }
  }
  __syncthreads();
  const DecodeReduceItem it = merge_item;
  if (it.sequence < 0) return;  // the same for every thread of the block
  for (int h = warp; h < kHeads; h += kWarps) {
    MergeHead<Dtype, kHeadDim>(p.partial_out, p.partial_lse, p.num_q_heads, q_head0 + h, it, p.out,
                               p.lse);
  }
}

// PagedDecodeParams::warm_l2_before_wait: before the wait, block `block` brings into L2 the
// lines it reads first after it: its work item, its sequence's kv_indptr entry (token-level),
// and for each warp the first step's index entries or page-table entries (one position per
// lane) and the K and V rows of their slots. (Not the page table's kv_lens entry: prefetching
// it made the page-table launches 0.2-0.5 us slower on an H100, docs/paged_decode_attention.md.)
// The kernel ahead may still be writing any of these, so the values loaded here only choose lines
// (LoadThroughL2: none left in L1): every address is clamped into its buffer, nothing is recorded,
// and the block reads all of it again after the wait.
template <int kHeadDim, int kHeads, int kStep>
__device__ inline void WarmL2ForFirstStep(const PagedDecodeParams& p, int32_t block) {
  if (p.batch_size <= 0) return;  // no sequence to clamp to (the launcher launches no block)
  const int32_t per_item = static_cast<int32_t>(DecodeBlocksPerItem(p.num_q_heads, kHeads));
  const int32_t item = block / per_item;
  const int32_t kv_head = block % per_item * kHeads / (p.num_q_heads / p.num_kv_heads);
  int32_t seq = item;
  int64_t lo = 0;
  if (p.work != nullptr) {
    seq = LoadThroughL2(&p.work[item].sequence);
    lo = LoadThroughL2(&p.work[item].kv_begin);
  }
  seq = seq < 0 ? 0 : (seq >= p.batch_size ? p.batch_size - 1 : seq);
  const int lane = static_cast<int>(threadIdx.x) % kLaneGroup;
  if (lane >= kStep) return;
  const int64_t pos = (lo < 0 ? 0 : lo) + static_cast<int>(threadIdx.x) / kLaneGroup * kStep + lane;
  int64_t slot;
  if (p.kv.page_level == 0) {
    const int64_t e = int64_t{LoadThroughL2(p.kv.kv_indptr + seq)} + pos;
    if (e < 0 || e >= p.kv.kv_indices_capacity) return;
    slot = LoadThroughL2(p.kv.kv_indices + e);
  } else {
    const int64_t col = pos / p.kv.page_size;
    if (col >= p.kv.page_table_cols) return;
    slot = int64_t{LoadThroughL2(p.kv.page_table + int64_t{seq} * p.kv.page_table_cols + col)} *
               p.kv.page_size +
           pos % p.kv.page_size;
  }
  if (slot < 0 || slot >= p.kv.pool_slots) return;
  // 2-byte elements: bf16 or fp16.
  const int64_t row = (slot * p.num_kv_heads + kv_head) * kHeadDim * 2;
#pragma unroll
  for (int b = 0; b < kHeadDim * 2; b += 128) {
    PrefetchToL2(static_cast<const char*>(p.k_pool) + row + b);
    PrefetchToL2(static_cast<const char*>(p.v_pool) + row + b);
  }
}

// One block: one (work item, KV head, chunk of kHeads query heads of its group), kWarps warps.
// Warp w takes steps w, w + kWarps, ... of kStep tokens of the block's range on the tensor
// cores (internal/mma_attention.h: the query heads are the vectors). Each step: lane i
// resolves token i's slot (checked against the pool; -1 skips the token) and loads the next
// step's index entries; K and V loads of the whole step are issued before the first MMA.
// (Measured slower on the H200: issuing the next step's K/V loads before computing on the
// current one, which doubles the registers and halves the warps per multiprocessor, and
// prefetching into L2 the rows of the step one or two ahead; docs/paged_decode_attention.md.)
// The warps' softmax states are combined through shared memory at the end. kReadOnceKv: K and
// V through LoadReadOnceGlobal16 (hip_port.h), for split launches (ByLoads).
template <typename Dtype, int kHeadDim, int kHeads, int kWarps, int kStep, bool kPortableMma,
          bool kReadOnceKv>
__global__ void ATTNMETA_LAUNCH_BOUNDS((kWarps * kLaneGroup), 1)
    PagedDecodeKernel(PagedDecodeParams p) {
  constexpr int kThreads = kWarps * kLaneGroup;
  static_assert(kHeads <= 8, "one n-tile of query heads");
  __shared__ internal::WarpStates<kWarps, kHeads, kHeadDim> states;

  // Launched to overlap the kernel ahead (PagedDecodeArgs::overlap), the block waits for it
  // here (first warming L2 with p.warm_l2_before_wait), or with p.metadata_before_wait reads
  // its metadata under that kernel's tail (the plan's item, the length, the first step's index
  // entries) and waits before Q, K and V and before any write. Every address the block reads
  // through its steps derives from `block`: after the wait it is opaque, so that no read-only load
  // can be moved above the wait. (What a block reads after its steps, the reduce items and partials
  // of a merge, follows atomics and plain loads that the wait orders anyway.)
  int32_t block = static_cast<int32_t>(blockIdx.x);
  if (!p.metadata_before_wait) {
    if (p.warm_l2_before_wait) WarmL2ForFirstStep<kHeadDim, kHeads, kStep>(p, block);
    WaitForPrecedingGrid();
    block = static_cast<int32_t>(OpaqueAfter(int64_t{block}));
  }
  const int32_t per_item = static_cast<int32_t>(DecodeBlocksPerItem(p.num_q_heads, kHeads));
  const int32_t item = block / per_item;
  const int32_t head_group = block % per_item;
  const int32_t q_head0 = head_group * kHeads;
  const int32_t kv_head = q_head0 / (p.num_q_heads / p.num_kv_heads);
  BlockWork w;
  HeldViolation held;
  const auto wait_for_the_kernel_ahead = [&] {
    WaitForPrecedingGrid();
    held.Record(p.violation);
  };
  if (!ResolveWork(p, item, w, held)) {  // the same for every thread of the block
    // Waits even with nothing held: the block must not end before the kernel ahead, or a
    // kernel after this one could start before that one ended.
    wait_for_the_kernel_ahead();
    return;
  }
  const int lane = static_cast<int>(threadIdx.x) % kLaneGroup;
  const int warp = static_cast<int>(threadIdx.x) / kLaneGroup;
  const internal::LaneView lv{lane,         lane / 4,     lane % 4,
                              w.sequence,   w.index_base, w.lo,
                              w.hi - w.lo,  int64_t{p.num_kv_heads} * kHeadDim,
                              int64_t{kv_head} * kHeadDim};

  // Vector g: query head q_head0 + g.
  const int64_t q_offset[1] = {
      lv.g < kHeads ? (int64_t{w.sequence} * p.num_q_heads + q_head0 + lv.g) * kHeadDim : -1};
  internal::WarpSoftmax<kHeadDim, 1> sm;
  const float scale = p.softmax_scale * kLog2e;
  internal::AttendWarpStepsWithQ<Dtype, kHeadDim, kStep, 1, kWarps, kPortableMma, kReadOnceKv>(
      p, lv, warp, q_offset, scale, [](int32_t, int, int, int) { return true; },
      [](int32_t) { return false; }, sm, wait_for_the_kernel_ahead);

  // The block has read its K and V: the next kernel's blocks may start under its combine and
  // merge (if that kernel was launched to overlap this one).
  AllowDependentGridLaunch();
  internal::StoreWarpState(states, warp, lv.g, lv.t, sm);
  __syncthreads();
  // The reduce item of the block's partial, found by the last warp. CombineWarpStates takes
  // head_dim / 8 threads per query head, so with 4 query heads of head dim up to 128 in 4 or more
  // warps the last warp has no share of it and the search overlaps it; otherwise the search
  // comes before that warp's share.
  const bool merges = p.merge_counters != nullptr && w.partial_slot >= 0;
  const int32_t found = merges && warp == kWarps - 1 ? FindReduceItem(p, w.partial_slot) : -1;
  internal::CombineWarpStates<kWarps, kHeads, kHeadDim, kThreads>(
      states, [&](int h, int d0, const float (&out)[8], float lse) {
        const int64_t head_row =
            (w.partial_slot < 0 ? int64_t{w.sequence} : int64_t{w.partial_slot}) * p.num_q_heads +
            q_head0 + h;
        if (w.partial_slot < 0) {
          *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + head_row * kHeadDim + d0) =
              make_uint4(Pack2<Dtype>(out[0], out[1]), Pack2<Dtype>(out[2], out[3]),
                         Pack2<Dtype>(out[4], out[5]), Pack2<Dtype>(out[6], out[7]));
          if (d0 == 0) p.lse[head_row] = lse;
        } else {
          float4* dst = reinterpret_cast<float4*>(p.partial_out + head_row * kHeadDim + d0);
          dst[0] = make_float4(out[0], out[1], out[2], out[3]);
          dst[1] = make_float4(out[4], out[5], out[6], out[7]);
          if (d0 == 0) p.partial_lse[head_row] = lse;
        }
      });
  if (merges) {
    MergeIfLast<Dtype, kHeadDim, kHeads, kWarps>(p, item, w.partial_slot, found, head_group,
                                                 per_item, q_head0);
  }
}

// One warp per (reduce item, query head), kMergeWarps heads per block: no block barrier on
// the path (MergeHead). Launched to overlap the attention kernel, it waits for it first; every
// address it reads derives from `r`, opaque after the wait (as in PagedDecodeKernel). Then it
// lets the next kernel's blocks start under it, as the metadata kernels do: a kernel launched
// to overlap waits for this one's end before it writes anything or reads what this one writes.
template <typename Dtype, int kHeadDim>
__global__ void __launch_bounds__((kMergeWarps * kLaneGroup))
    DecodeMergeKernel(DecodeMergeParams p) {
  WaitForPrecedingGrid();
  AllowDependentGridLaunch();
  const int32_t r = static_cast<int32_t>(OpaqueAfter(int64_t{blockIdx.x}));
  const int lane = static_cast<int>(threadIdx.x) % kLaneGroup;
  const int32_t h = static_cast<int32_t>(blockIdx.y) * kMergeWarps +
                    static_cast<int32_t>(threadIdx.x) / kLaneGroup;
  if (h >= p.num_q_heads) return;
  const DecodeReduceItem it = p.reduce[r];
  DeviceViolation* v = lane == 0 && h == 0 ? p.violation : nullptr;
  if (!ReduceItemFits(it, r, p.batch_size, p.partial_capacity, v)) return;
  MergeHead<Dtype, kHeadDim>(p.partial_out, p.partial_lse, p.num_q_heads, h, it, p.out, p.lse);
}

// The attention kernel of one compiled shape, for what the dispatch below does with it.
template <typename Dtype, int kHeadDim, int kHeads, int kVariant, bool kReadOnceKv>
struct DecodeKernelOf {
  static constexpr DecodeVariant kV = kDecodeVariants[kVariant];
  static constexpr int kStep = DecodeStepTokens(kV, kHeadDim);
  static constexpr int kThreads = kV.warps * kLaneGroup;
  static constexpr int kHeadsPerBlock = kHeads;
  static constexpr auto kKernel = PagedDecodeKernel<Dtype, kHeadDim, kHeads, kV.warps, kStep,
                                                    kV.portable_mma != 0, kReadOnceKv>;
};

// Launches the kernel over the params' work items; a split launch (partial slots) runs the
// read-once kernel.
struct LaunchOnStream {
  bool overlap_preceding;
  hipStream_t stream;
  bool ReadOnceKv(const PagedDecodeParams& p) const { return p.partial_capacity > 0; }
  template <typename K>
  hipError_t Run(const PagedDecodeParams& p) const {
    const int64_t blocks = p.num_work * DecodeBlocksPerItem(p.num_q_heads, K::kHeadsPerBlock);
    return LaunchKernelAfterPreceding(overlap_preceding, K::kKernel,
                                      dim3(static_cast<uint32_t>(blocks)), dim3(K::kThreads), 0,
                                      stream, p);
  }
};

// The kernel's blocks that fit on one multiprocessor of the current device, into *blocks: the
// read-once kernel, which the split launches that this count sizes run.
struct CountBlocksPerMultiprocessor {
  int32_t* blocks;
  bool ReadOnceKv(const PagedDecodeParams&) const { return true; }
  template <typename K>
  hipError_t Run(const PagedDecodeParams&) const {
    int n = 0;
    const hipError_t err =
        hipOccupancyMaxActiveBlocksPerMultiprocessor(&n, K::kKernel, K::kThreads, 0);
    if (err == hipSuccess) *blocks = n;
    return err;
  }
};

// Op::Run<DecodeKernelOf<...>>(p) for variant kVariant's kernel of p's dtype, head dim and
// query heads per block, the one that reads K and V with LoadReadOnceGlobal16 when
// op.ReadOnceKv(p) (split launches: only they measured faster with it).
template <typename Dtype, int kHeadDim, int kHeads, int kVariant, typename Op>
hipError_t ByLoads(const PagedDecodeParams& p, const Op& op) {
  return op.ReadOnceKv(p)
             ? op.template Run<DecodeKernelOf<Dtype, kHeadDim, kHeads, kVariant, true>>(p)
             : op.template Run<DecodeKernelOf<Dtype, kHeadDim, kHeads, kVariant, false>>(p);
}

// ByLoads for p's variant; hipErrorInvalidValue for a shape that is not compiled.
template <typename Dtype, int kHeadDim, int kHeads, typename Op>
hipError_t ByVariant(const PagedDecodeParams& p, const Op& op) {
  if constexpr (kHeadDim == kVariantHeadDim && kHeads == kVariantQueryHeads) {
    static_assert(kNumDecodeVariants == 5, "one case per variant");
    switch (p.variant) {
      case 0:
        return ByLoads<Dtype, kHeadDim, kHeads, 0>(p, op);
      case 1:
        return ByLoads<Dtype, kHeadDim, kHeads, 1>(p, op);
      case 2:
        return ByLoads<Dtype, kHeadDim, kHeads, 2>(p, op);
      case 3:
        return ByLoads<Dtype, kHeadDim, kHeads, 3>(p, op);
      case 4:
        return ByLoads<Dtype, kHeadDim, kHeads, 4>(p, op);
    }
    return hipErrorInvalidValue;
  } else {
    return p.variant == 0 ? ByLoads<Dtype, kHeadDim, kHeads, 0>(p, op) : hipErrorInvalidValue;
  }
}

template <typename Dtype, int kHeadDim, typename Op>
hipError_t ByHeads(const PagedDecodeParams& p, const Op& op) {
  switch (p.heads_per_block) {
    case 1:
      return ByVariant<Dtype, kHeadDim, 1>(p, op);
    case 2:
      return ByVariant<Dtype, kHeadDim, 2>(p, op);
    case 4:
      return ByVariant<Dtype, kHeadDim, 4>(p, op);
    case 8:
      return ByVariant<Dtype, kHeadDim, 8>(p, op);
  }
  return hipErrorInvalidValue;
}

template <typename Dtype, typename Op>
hipError_t ByHeadDim(const PagedDecodeParams& p, const Op& op) {
  switch (p.head_dim) {
    case 64:
      return ByHeads<Dtype, 64>(p, op);
    case 128:
      return ByHeads<Dtype, 128>(p, op);
    case 256:
      return ByHeads<Dtype, 256>(p, op);
  }
  return hipErrorInvalidValue;
}

template <typename Op>
hipError_t ByDtype(const PagedDecodeParams& p, const Op& op) {
  switch (p.dtype) {
    case kElementBf16:
      return ByHeadDim<Bf16>(p, op);
    case kElementFp16:
      return ByHeadDim<Fp16>(p, op);
  }
  return hipErrorInvalidValue;
}

}  // namespace

hipError_t LaunchPagedDecodeKernel(const PagedDecodeParams& p, bool overlap_preceding,
                                   hipStream_t stream) {
  return ByDtype(p, LaunchOnStream{overlap_preceding, stream});
}

hipError_t PagedDecodeBlocksPerMultiprocessor(const PagedDecodeParams& p, int32_t* blocks) {
  return ByDtype(p, CountBlocksPerMultiprocessor{blocks});
}

template <typename Dtype>
hipError_t LaunchMerge(const DecodeMergeParams& p, bool overlap_preceding, hipStream_t stream) {
  const dim3 grid(p.num_reduce, (p.num_q_heads + kMergeWarps - 1) / kMergeWarps);
  const dim3 block(kMergeWarps * kLaneGroup);
  switch (p.head_dim) {
    case 64:
      return LaunchKernelAfterPreceding(overlap_preceding, DecodeMergeKernel<Dtype, 64>, grid,
                                        block, 0, stream, p);
    case 128:
      return LaunchKernelAfterPreceding(overlap_preceding, DecodeMergeKernel<Dtype, 128>, grid,
                                        block, 0, stream, p);
    case 256:
      return LaunchKernelAfterPreceding(overlap_preceding, DecodeMergeKernel<Dtype, 256>, grid,
                                        block, 0, stream, p);
  }
  return hipErrorInvalidValue;
}

hipError_t LaunchDecodeMergeKernel(const DecodeMergeParams& p, bool overlap_preceding,
                                   hipStream_t stream) {
  switch (p.dtype) {
    case kElementBf16:
      return LaunchMerge<Bf16>(p, overlap_preceding, stream);
    case kElementFp16:
      return LaunchMerge<Fp16>(p, overlap_preceding, stream);
  }
  return hipErrorInvalidValue;
}

}  // namespace kernels
}  // namespace attnmeta
