#include "attention/kernels/paged_decode_attention.h"

namespace attnmeta {
namespace kernels {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int32_t kInt32Max = 2147483647;
// Enough threads that a reduce item's partials are summed in few rounds of loads (a 16k
// sequence split for a large GPU has ~128 partials): 8 partial sums per chunk at head dim 128.
constexpr int kMergeThreads = 256;

__device__ inline float NegInf() { return __int_as_float(0xff800000); }

// Eight 2-byte elements of a 16-byte word to floats, and back (round to nearest even).
struct Bf16 {
  __device__ static void ToFloat(const uint4& w, float (&f)[8]) {
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(words[i] << 16);
      f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
  __device__ static uint32_t FromFloat(float x) {
    const uint32_t b = __float_as_uint(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;  // a NaN stays a NaN
    return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
  }
};

struct Fp16 {
  __device__ static void ToFloat(const uint4& w, float (&f)[8]) {
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = HalfBitsToFloat(static_cast<uint16_t>(words[i] & 0xffffu));
      f[2 * i + 1] = HalfBitsToFloat(static_cast<uint16_t>(words[i] >> 16));
    }
  }
  __device__ static uint32_t FromFloat(float x) { return FloatToHalfBits(x); }
};

template <typename Dtype>
__device__ inline uint32_t Pack2(float lo, float hi) {
  return Dtype::FromFloat(lo) | (Dtype::FromFloat(hi) << 16);
}

// A 16-byte word of 2-byte elements at element offset `offset` of `base`.
__device__ inline uint4 Load16(const void* base, int64_t offset) {
  return __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + offset));
}

// What one block works on, resolved from its work item and the sequence's device-resident
// lengths, clamped (violations recorded by thread 0).
struct BlockWork {
  int32_t sequence;
  int32_t lo, hi;        // token positions [lo, hi) of the sequence, lo <= hi
  int32_t partial_slot;  // < 0: the final output
  int64_t index_base;    // token-level: where the sequence's tokens start in kv_indices
};

// The sequence's KV length as the device metadata gives it, clamped to what can be read.
__device__ inline int32_t SequenceLength(const PagedDecodeParams& p, int32_t seq, bool report,
                                         int64_t* index_base) {
  DeviceViolation* v = report ? p.violation : nullptr;
  if (p.page_level == 0) {
    int64_t begin = p.kv_indptr[seq];
    int64_t end = p.kv_indptr[seq + 1];
    if (begin < 0) {
      RecordViolation(v, kOffsetNegative, seq, begin, 0);
      begin = 0;
    }
    if (end < begin) {
      RecordViolation(v, kIndptrDecreasing, seq + 1, end, begin);
      end = begin;
    }
    if (end > p.kv_indices_capacity) {
      RecordViolation(v, kTotalPastCapacity, seq, end, p.kv_indices_capacity);
      end = p.kv_indices_capacity;
      if (begin > end) begin = end;
    }
    *index_base = begin;
    return static_cast<int32_t>(end - begin);
  }
  *index_base = 0;
  int64_t len = p.kv_lens[seq];
  if (len < 0) {
    RecordViolation(v, kLengthNegative, seq, len, 0);
    len = 0;
  }
  const int64_t table_tokens = int64_t{p.page_table_cols} * p.page_size;
  if (len > table_tokens) {
    RecordViolation(v, kPagesPastTable, seq, (len + p.page_size - 1) / p.page_size,
                    p.page_table_cols);
    len = table_tokens;
  }
  return static_cast<int32_t>(len);
}

// False (recorded) when the item names no row of the batch or no partial slot that exists:
// the block has nothing it may write.
__device__ inline bool ResolveWork(const PagedDecodeParams& p, int32_t item, BlockWork& w) {
  const bool report = threadIdx.x == 0;
  DeviceViolation* v = report ? p.violation : nullptr;
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
      RecordViolation(v, kRowOutsideTable, item, it.sequence, p.batch_size);
      return false;
    }
    if (it.partial_slot >= p.partial_capacity) {
      RecordViolation(v, kTotalPastCapacity, item, int64_t{it.partial_slot} + 1, p.partial_capacity);
      return false;
    }
    if (kv_begin < 0) {
      RecordViolation(v, kLengthNegative, item, kv_begin, 0);
      kv_begin = 0;
    }
  }
  const int32_t len = SequenceLength(p, w.sequence, report, &w.index_base);
  if (p.work != nullptr && kv_end > len) {
    RecordViolation(v, kLengthPastRow, item, kv_end, len);
  }
  if (kv_end < kv_begin) RecordViolation(v, kIndptrDecreasing, item, kv_end, kv_begin);
  w.hi = static_cast<int32_t>(kv_end < len ? kv_end : len);
  w.lo = static_cast<int32_t>(kv_begin < w.hi ? kv_begin : w.hi);
  return true;
}

// The raw entry behind token t of the sequence: its slot (token-level) or its page (page
// table). Loaded a step ahead of its use.
__device__ inline int32_t LoadIndex(const PagedDecodeParams& p, const BlockWork& w, int32_t t) {
  if (p.page_level == 0) return __ldg(p.kv_indices + w.index_base + t);
  const int32_t col = p.page_size_log2 >= 0 ? t >> p.page_size_log2 : t / p.page_size;
  return __ldg(p.page_table + int64_t{w.sequence} * p.page_table_cols + col);
}

// The slot of token t from its raw entry, or -1 (recorded by the group's first lane) when it
// lies outside the pool.
__device__ inline int64_t SlotOf(const PagedDecodeParams& p, const BlockWork& w, int32_t raw,
                                 int32_t t, bool report) {
  int64_t slot = raw;
  int64_t entry = w.index_base + t;
  if (p.page_level != 0) {
    const int32_t col = p.page_size_log2 >= 0 ? t >> p.page_size_log2 : t / p.page_size;
    const int32_t offset = p.page_size_log2 >= 0 ? t & (p.page_size - 1) : t % p.page_size;
    slot = int64_t{raw} * p.page_size + offset;
    entry = int64_t{w.sequence} * p.page_table_cols + col;
  }
  // One unsigned compare catches negative slots too.
  if (static_cast<uint64_t>(slot) >= static_cast<uint64_t>(p.pool_slots)) {
    if (report) RecordViolation(p.violation, kSlotOutsidePool, entry, slot, p.pool_slots);
    return -1;
  }
  return slot;
}

// The K and V words of one step of a lane group's tokens (zero for tokens it skips).
template <int kTokens>
struct StepWords {
  uint4 k[kTokens];
  uint4 v[kTokens];
  bool valid[kTokens];
};

// Where a thread reads: its lane group's tokens base + grp + u * kGroups of a step, dims
// [8 * lane, + 8) of its KV head.
struct LaneView {
  int32_t grp;
  int32_t lane;
  int32_t n;            // tokens of the block's range
  int64_t row;          // elements per pool slot
  int64_t head_offset;  // elements from a slot's start to the lane's 8 dims
};

// Issues the K and V loads of the step at `base` from the index entries in `raw`, then the
// index loads of the step after it into `raw`. Forced inline, as AttendStep: a call would pass
// the register arrays through scratch memory (clang does not inline them on its own).
template <int kTokens, int kGroups>
__device__ __forceinline__ void IssueStep(const PagedDecodeParams& p, const BlockWork& w, const LaneView& lv,
                                 int32_t base, int32_t (&raw)[kTokens], StepWords<kTokens>& words) {
#pragma unroll
  for (int u = 0; u < kTokens; ++u) {
    const int32_t t = base + lv.grp + u * kGroups;
    words.k[u] = words.v[u] = make_uint4(0, 0, 0, 0);
    words.valid[u] = false;
    if (t < lv.n) {
      const int64_t slot = SlotOf(p, w, raw[u], w.lo + t, lv.lane == 0);
      if (slot >= 0) {
        words.valid[u] = true;
        words.k[u] = Load16(p.k_pool, slot * lv.row + lv.head_offset);
        words.v[u] = Load16(p.v_pool, slot * lv.row + lv.head_offset);
      }
    }
  }
#pragma unroll
  for (int u = 0; u < kTokens; ++u) {
    const int32_t t = base + kGroups * kTokens + lv.grp + u * kGroups;
    if (t < lv.n) raw[u] = LoadIndex(p, w, w.lo + t);
  }
}

// A lane group's online softmax over kHeads query heads, in fp32 registers, in the log2
// domain: m the running max of the scores, l the running sum of exp2(score - m), acc this
// lane's 8 dims of the running sum of exp2(score - m) * V.
template <int kHeads>
struct Softmax {
  float m[kHeads];
  float l[kHeads];
  float acc[kHeads][8];
};

// Adds one step's tokens to the softmax. Scores are reduced across the kLanes lanes of the
// group by xor shuffles, so that every lane ends with the same sum.
template <typename Dtype, int kHeads, int kTokens, int kLanes>
__device__ __forceinline__ void AttendStep(const float (&q)[kHeads][8], const StepWords<kTokens>& words,
                                  Softmax<kHeads>& sm) {
  float s[kTokens][kHeads];  // scores, then their weights exp2(score - m)
#pragma unroll
  for (int u = 0; u < kTokens; ++u) {
    float k[8];
    Dtype::ToFloat(words.k[u], k);
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) dot = fmaf(q[h][e], k[e], dot);
      s[u][h] = dot;
    }
  }
#pragma unroll
  for (int mask = kLanes / 2; mask > 0; mask /= 2) {
#pragma unroll
    for (int u = 0; u < kTokens; ++u) {
#pragma unroll
      for (int h = 0; h < kHeads; ++h) s[u][h] += ATTNMETA_SHFL_XOR(s[u][h], mask);
    }
  }
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    float mx = sm.m[h];
#pragma unroll
    for (int u = 0; u < kTokens; ++u) {
      if (!words.valid[u]) s[u][h] = NegInf();
      mx = fmaxf(mx, s[u][h]);
    }
    // Until the group has seen a token, mx is -inf and nothing changes.
    const bool seen = mx != NegInf();
    const float alpha = seen ? exp2f(sm.m[h] - mx) : 1.0f;
    sm.m[h] = mx;
    sm.l[h] *= alpha;
#pragma unroll
    for (int e = 0; e < 8; ++e) sm.acc[h][e] *= alpha;
#pragma unroll
    for (int u = 0; u < kTokens; ++u) {
      s[u][h] = seen ? exp2f(s[u][h] - mx) : 0.0f;
      sm.l[h] += s[u][h];
    }
  }
#pragma unroll
  for (int u = 0; u < kTokens; ++u) {
    float v[8];
    Dtype::ToFloat(words.v[u], v);
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
#pragma unroll
      for (int e = 0; e < 8; ++e) sm.acc[h][e] = fmaf(s[u][h], v[e], sm.acc[h][e]);
    }
  }
}

// One block: one (work item, KV head, chunk of kHeads query heads of its group). Lane group g
// (kLanes = kHeadDim / 8 consecutive threads, each owning 8 dims) takes tokens
// g + u * kGroups (u < kTokens) of every step of kStep tokens: it issues all of its K and V
// loads of a step, then the next step's index loads, and only then uses the K/V words, so that
// each thread keeps 2 * kTokens 16-byte loads in flight; with kStages == 2 it also issues the
// next step's K/V loads before it computes on the current one (twice the registers, loads in
// flight while it computes). The groups' softmax states are combined through shared memory at
// the end.
template <typename Dtype, int kHeadDim, int kHeads, int kThreads, int kTokens, int kMinBlocks,
          int kStages>
__global__ void ATTNMETA_LAUNCH_BOUNDS(kThreads, kMinBlocks) PagedDecodeKernel(PagedDecodeParams p) {
  constexpr int kLanes = kHeadDim / 8;
  constexpr int kGroups = kThreads / kLanes;
  constexpr int kStep = kGroups * kTokens;
  static_assert(kHeadDim % 64 == 0 && kLanes <= 32 && kThreads % kLanes == 0,
                "a lane group lies within one wave");
  static_assert(sizeof(float) * kGroups * kHeads * (kHeadDim + 2) <= 48 * 1024,
                "static shared memory");
  static_assert(kStages == 1 || kStages == 2, "one or two steps of loads in flight");
  __shared__ float sm_acc[kGroups][kHeads][kHeadDim];
  __shared__ float sm_max[kGroups][kHeads];
  __shared__ float sm_sum[kGroups][kHeads];

  const int32_t group = p.num_q_heads / p.num_kv_heads;
  const int32_t chunks = group / kHeads;
  const int32_t per_item = p.num_kv_heads * chunks;
  const int32_t item = static_cast<int32_t>(blockIdx.x) / per_item;
  const int32_t kv_head = static_cast<int32_t>(blockIdx.x) % per_item / chunks;
  const int32_t q_head0 = kv_head * group + static_cast<int32_t>(blockIdx.x) % chunks * kHeads;
  BlockWork w;
  if (!ResolveWork(p, item, w)) return;  // the same for every thread of the block
  const int32_t lane = threadIdx.x % kLanes;
  const int32_t grp = threadIdx.x / kLanes;
  const LaneView lv{grp, lane, w.hi - w.lo, int64_t{p.num_kv_heads} * kHeadDim,
                    int64_t{kv_head} * kHeadDim + lane * 8};

  float q[kHeads][8];
  const float q_scale = p.softmax_scale * kLog2e;
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    Dtype::ToFloat(
        Load16(p.q, (int64_t{w.sequence} * p.num_q_heads + q_head0 + h) * kHeadDim + lane * 8),
        q[h]);
#pragma unroll
    for (int e = 0; e < 8; ++e) q[h][e] *= q_scale;
  }
  Softmax<kHeads> sm;
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    sm.m[h] = NegInf();
    sm.l[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) sm.acc[h][e] = 0.0f;
  }

  int32_t raw[kTokens];  // the index entries of the next step to load
#pragma unroll
  for (int u = 0; u < kTokens; ++u) {
    const int32_t t = grp + u * kGroups;
    raw[u] = t < lv.n ? LoadIndex(p, w, w.lo + t) : 0;
  }
  if constexpr (kStages == 1) {
    for (int32_t base = 0; base < lv.n; base += kStep) {
      StepWords<kTokens> words;
      IssueStep<kTokens, kGroups>(p, w, lv, base, raw, words);
      AttendStep<Dtype, kHeads, kTokens, kLanes>(q, words, sm);
    }
  } else {
    StepWords<kTokens> words;
    IssueStep<kTokens, kGroups>(p, w, lv, 0, raw, words);
    for (int32_t base = 0; base < lv.n; base += kStep) {
      StepWords<kTokens> next;
      IssueStep<kTokens, kGroups>(p, w, lv, base + kStep, raw, next);
      AttendStep<Dtype, kHeads, kTokens, kLanes>(q, words, sm);
      words = next;
    }
  }

#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    if (lane == 0) {
      sm_max[grp][h] = sm.m[h];
      sm_sum[grp][h] = sm.l[h];
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) sm_acc[grp][h][lane * 8 + e] = sm.acc[h][e];
  }
  __syncthreads();
  // Thread c writes dims [8 * (c % kLanes), + 8) of query head q_head0 + c / kLanes.
  for (int c = threadIdx.x; c < kHeads * kLanes; c += kThreads) {
    const int h = c / kLanes;
    const int d0 = c % kLanes * 8;
    float mx = NegInf();
    for (int g = 0; g < kGroups; ++g) mx = fmaxf(mx, sm_max[g][h]);
    float total = 0.0f;
    float o[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (mx != NegInf()) {
      for (int g = 0; g < kGroups; ++g) {
        if (sm_max[g][h] == NegInf()) continue;
        const float weight = exp2f(sm_max[g][h] - mx);
        total += weight * sm_sum[g][h];
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = fmaf(weight, sm_acc[g][h][d0 + e], o[e]);
      }
    }
    // total >= 1 once a token was seen (the largest score's own weight is 1).
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    const float lse = total > 0.0f ? (mx + log2f(total)) * kLn2 : NegInf();
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] *= inv;
    const int64_t head_row = (w.partial_slot < 0 ? int64_t{w.sequence} : int64_t{w.partial_slot}) *
                                 p.num_q_heads + q_head0 + h;
    if (w.partial_slot < 0) {
      *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + head_row * kHeadDim + d0) =
          make_uint4(Pack2<Dtype>(o[0], o[1]), Pack2<Dtype>(o[2], o[3]), Pack2<Dtype>(o[4], o[5]),
                     Pack2<Dtype>(o[6], o[7]));
      if (d0 == 0) p.lse[head_row] = lse;
    } else {
      float4* dst = reinterpret_cast<float4*>(p.partial_out + head_row * kHeadDim + d0);
      dst[0] = make_float4(o[0], o[1], o[2], o[3]);
      dst[1] = make_float4(o[4], o[5], o[6], o[7]);
      if (d0 == 0) p.partial_lse[head_row] = lse;
    }
  }
}

// A block-wide max (is_max) or sum of every thread's value, returned to every thread.
__device__ inline float BlockReduce(float value, bool is_max, float* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kMergeThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) {
      const float other = scratch[threadIdx.x + stride];
      scratch[threadIdx.x] = is_max ? fmaxf(scratch[threadIdx.x], other) : scratch[threadIdx.x] + other;
    }
    __syncthreads();
  }
  const float result = scratch[0];
  __syncthreads();  // scratch is reused at once
  return result;
}

// One block per (reduce item, query head): weights exp(lse_p - max) over the item's partials,
// then thread (part, chunk) sums partials part, part + parts, ... of dims [4 chunk, + 4).
template <typename Dtype>
__global__ void __launch_bounds__(kMergeThreads) DecodeMergeKernel(DecodeMergeParams p) {
  __shared__ float scratch[kMergeThreads];
  __shared__ float4 sm_acc[kMergeThreads];
  const int32_t r = blockIdx.x;
  const int32_t h = blockIdx.y;
  const DecodeReduceItem it = p.reduce[r];
  DeviceViolation* v = threadIdx.x == 0 && h == 0 ? p.violation : nullptr;
  if (it.sequence < 0 || it.sequence >= p.batch_size) {
    RecordViolation(v, kRowOutsideTable, r, it.sequence, p.batch_size);
    return;
  }
  if (it.partial_begin < 0 || it.partial_end > p.partial_capacity ||
      it.partial_begin > it.partial_end) {
    RecordViolation(v, kTotalPastCapacity, r, it.partial_end, p.partial_capacity);
    return;
  }
  const int64_t heads = p.num_q_heads;
  float mx = NegInf();
  for (int32_t k = it.partial_begin + threadIdx.x; k < it.partial_end; k += kMergeThreads) {
    mx = fmaxf(mx, p.partial_lse[k * heads + h]);
  }
  mx = BlockReduce(mx, /*is_max=*/true, scratch);
  // A partial that saw no token (lse -inf) has weight 0; all of them: output 0, lse -inf.
  auto weight = [&](int32_t k) {
    const float x = p.partial_lse[k * heads + h];
    return x == NegInf() ? 0.0f : __expf(x - mx);
  };
  float sum = 0.0f;
  for (int32_t k = it.partial_begin + threadIdx.x; k < it.partial_end; k += kMergeThreads) {
    sum += weight(k);
  }
  sum = BlockReduce(sum, /*is_max=*/false, scratch);

  const int32_t chunks = p.head_dim / 4;
  const int32_t chunk = threadIdx.x % chunks;
  const int32_t part = threadIdx.x / chunks;
  const int32_t parts = kMergeThreads / chunks;
  float4 acc = make_float4(0, 0, 0, 0);
#pragma unroll 4
  for (int32_t k = it.partial_begin + part; k < it.partial_end; k += parts) {
    const float wk = weight(k);
    const float4 x = __ldg(reinterpret_cast<const float4*>(p.partial_out + (k * heads + h) * p.head_dim) +
                           chunk);
    acc.x = fmaf(wk, x.x, acc.x);
    acc.y = fmaf(wk, x.y, acc.y);
    acc.z = fmaf(wk, x.z, acc.z);
    acc.w = fmaf(wk, x.w, acc.w);
  }
  sm_acc[threadIdx.x] = acc;
  __syncthreads();
  const int64_t head_row = int64_t{it.sequence} * heads + h;
  if (part == 0) {
    for (int32_t k = 1; k < parts; ++k) {
      const float4 x = sm_acc[k * chunks + chunk];
      acc.x += x.x;
      acc.y += x.y;
      acc.z += x.z;
      acc.w += x.w;
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p.out) + head_row * p.head_dim + chunk * 4) =
        make_uint2(Pack2<Dtype>(acc.x * inv, acc.y * inv), Pack2<Dtype>(acc.z * inv, acc.w * inv));
  }
  if (threadIdx.x == 0) p.lse[head_row] = sum > 0.0f ? mx + __logf(sum) : NegInf();
}

template <typename Dtype, int kHeadDim, int kHeads, int kVariant>
hipError_t Launch(const PagedDecodeParams& p, hipStream_t stream) {
  constexpr int kThreads = kDecodeVariants[kVariant].threads;
  constexpr int kTokens = kDecodeVariants[kVariant].tokens_per_group;
  constexpr int kMinBlocks = kDecodeVariants[kVariant].min_blocks;
  constexpr int kStages = kDecodeVariants[kVariant].stages;
  const int32_t blocks = p.num_work * p.num_kv_heads * (p.num_q_heads / p.num_kv_heads / kHeads);
  PagedDecodeKernel<Dtype, kHeadDim, kHeads, kThreads, kTokens, kMinBlocks, kStages>
      <<<blocks, kThreads, 0, stream>>>(p);
  return hipGetLastError();
}

template <typename Dtype, int kHeadDim, int kHeads>
hipError_t ByVariant(const PagedDecodeParams& p, hipStream_t stream) {
  if constexpr (kHeadDim == kVariantHeadDim && kHeads == kVariantQueryHeads) {
    static_assert(kNumDecodeVariants == 8, "one case per variant");
    switch (p.variant) {
      case 0:
        return Launch<Dtype, kHeadDim, kHeads, 0>(p, stream);
      case 1:
        return Launch<Dtype, kHeadDim, kHeads, 1>(p, stream);
      case 2:
        return Launch<Dtype, kHeadDim, kHeads, 2>(p, stream);
      case 3:
        return Launch<Dtype, kHeadDim, kHeads, 3>(p, stream);
      case 4:
        return Launch<Dtype, kHeadDim, kHeads, 4>(p, stream);
      case 5:
        return Launch<Dtype, kHeadDim, kHeads, 5>(p, stream);
      case 6:
        return Launch<Dtype, kHeadDim, kHeads, 6>(p, stream);
      case 7:
        return Launch<Dtype, kHeadDim, kHeads, 7>(p, stream);
    }
    return hipErrorInvalidValue;
  } else {
    return p.variant == 0 ? Launch<Dtype, kHeadDim, kHeads, 0>(p, stream) : hipErrorInvalidValue;
  }
}

template <typename Dtype, int kHeadDim>
hipError_t ByHeads(const PagedDecodeParams& p, hipStream_t stream) {
  switch (p.heads_per_block) {
    case 1:
      return ByVariant<Dtype, kHeadDim, 1>(p, stream);
    case 2:
      return ByVariant<Dtype, kHeadDim, 2>(p, stream);
    case 4:
      return ByVariant<Dtype, kHeadDim, 4>(p, stream);
    case 8:
      return ByVariant<Dtype, kHeadDim, 8>(p, stream);
  }
  return hipErrorInvalidValue;
}

template <typename Dtype>
hipError_t ByHeadDim(const PagedDecodeParams& p, hipStream_t stream) {
  switch (p.head_dim) {
    case 64:
      return ByHeads<Dtype, 64>(p, stream);
    case 128:
      return ByHeads<Dtype, 128>(p, stream);
    case 256:
      return ByHeads<Dtype, 256>(p, stream);
  }
  return hipErrorInvalidValue;
}

}  // namespace

hipError_t LaunchPagedDecodeKernel(const PagedDecodeParams& p, hipStream_t stream) {
  switch (p.dtype) {
    case kDecodeBf16:
      return ByHeadDim<Bf16>(p, stream);
    case kDecodeFp16:
      return ByHeadDim<Fp16>(p, stream);
  }
  return hipErrorInvalidValue;
}

hipError_t LaunchDecodeMergeKernel(const DecodeMergeParams& p, hipStream_t stream) {
  const dim3 grid(p.num_reduce, p.num_q_heads);
  switch (p.dtype) {
    case kDecodeBf16:
      DecodeMergeKernel<Bf16><<<grid, kMergeThreads, 0, stream>>>(p);
      return hipGetLastError();
    case kDecodeFp16:
      DecodeMergeKernel<Fp16><<<grid, kMergeThreads, 0, stream>>>(p);
      return hipGetLastError();
  }
  return hipErrorInvalidValue;
}

}  // namespace kernels
}  // namespace attnmeta
