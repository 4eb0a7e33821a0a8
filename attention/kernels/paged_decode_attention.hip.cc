#include "attention/kernels/paged_decode_attention.h"

#include "attention/kernels/internal/element_types.h"
#include "attention/kernels/internal/kv_source.h"

namespace attnmeta {
namespace kernels {
namespace {

constexpr int32_t kInt32Max = 2147483647;
// Enough threads that a reduce item's partials are summed in few rounds of loads (a 16k
// sequence split for a large GPU has ~128 partials): 8 partial sums per chunk at head dim 128.
constexpr int kMergeThreads = 256;

using internal::Bf16;
using internal::Fp16;
using internal::kLn2;
using internal::kLog2e;
using internal::NegInf;
using internal::Pack2;

// What one block works on, resolved from its work item and the sequence's device-resident
// lengths, clamped (violations recorded by thread 0).
struct BlockWork {
  int32_t sequence;
  int32_t lo, hi;        // token positions [lo, hi) of the sequence, lo <= hi
  int32_t partial_slot;  // < 0: the final output
  int64_t index_base;    // token-level: where the sequence's tokens start in kv_indices
};

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
  const int32_t len = internal::KvLength(p, w.sequence, v, &w.index_base);
  if (p.work != nullptr && kv_end > len) {
    RecordViolation(v, kLengthPastRow, item, kv_end, len);
  }
  if (kv_end < kv_begin) RecordViolation(v, kIndptrDecreasing, item, kv_end, kv_begin);
  w.hi = static_cast<int32_t>(kv_end < len ? kv_end : len);
  w.lo = static_cast<int32_t>(kv_begin < w.hi ? kv_begin : w.hi);
  return true;
}

// The raw entry behind token t of the sequence (internal::LoadKvEntry), loaded a step ahead of
// its use, one token per lane; its slot (internal::SlotFromEntry), or -1 (recorded when
// `report`) when it lies outside the pool.
__device__ inline int32_t LoadIndex(const PagedDecodeParams& p, const BlockWork& w, int32_t t) {
  return internal::LoadKvEntry(p, w.sequence, w.index_base, t);
}

__device__ inline int64_t SlotOf(const PagedDecodeParams& p, const BlockWork& w, int32_t raw,
                                 int32_t t, bool report) {
  return internal::SlotFromEntry(p, w.sequence, w.index_base, raw, t, report);
}

// 2-byte elements of a word array: element e of `w` is the low (e even) or high half of word
// e / 2. Packs element e of x (low half) with element e of y (high half) into one word: the
// pair of tokens an MMA fragment register holds.
template <int kWords>
__device__ inline uint32_t PairOf(const uint32_t (&x)[kWords], const uint32_t (&y)[kWords], int e) {
  const uint32_t a = x[e / 2];
  const uint32_t b = y[e / 2];
  return e % 2 == 0 ? (a & 0xffffu) | (b << 16) : (a >> 16) | (b & 0xffff0000u);
}

// kWords 32-bit words (2 * kWords elements) at element offset `offset` of `base`, in 8- or
// 16-byte loads.
template <int kWords>
__device__ inline void LoadWords(const void* base, int64_t offset, uint32_t (&w)[kWords]) {
  const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
  if constexpr (kWords == 2) {
    const uint2 x = __ldg(reinterpret_cast<const uint2*>(src));
    w[0] = x.x;
    w[1] = x.y;
  } else {
    static_assert(kWords % 4 == 0, "8 bytes or a multiple of 16");
#pragma unroll
    for (int i = 0; i < kWords / 4; ++i) {
      const uint4 x = __ldg(reinterpret_cast<const uint4*>(src) + i);
      w[4 * i] = x.x;
      w[4 * i + 1] = x.y;
      w[4 * i + 2] = x.z;
      w[4 * i + 3] = x.w;
    }
  }
}

template <typename Dtype, bool kPortableMma>
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (kPortableMma) {
    PortableMmaM16N8K16<Dtype::kIsBf16>(d, a, b);
  } else {
    MmaM16N8K16<Dtype::kIsBf16>(d, a, b);
  }
}

// The shapes of one warp's work, from the head dim and the step (kStep tokens).
template <int kHeadDim, int kStep>
struct WarpShape {
  static constexpr int kKSteps = kHeadDim / 16;  // k-steps of S = Q K^T
  static constexpr int kKLoads = kHeadDim / 32;  // 16-byte K loads per token and lane
  static constexpr int kW = kHeadDim / 16;       // m-tiles of O^T, and V dims per chunk and lane
  static constexpr int kVWords = kW / 2;
  static constexpr int kNTiles = kStep / 8;      // 8-token tiles of S per step
  static constexpr int kPvSteps = kStep / 16;    // 16-token k-steps of O^T per step
  static constexpr int kIdx = kStep > 32 ? kStep / 32 : 1;  // index entries per lane and step
  static_assert(kHeadDim % 64 == 0 && kStep % 16 == 0 && (kStep <= 32 || kStep % 32 == 0),
                "fragment shapes");
};

// One step's K and V fragments as loaded (zero for a token that is skipped).
template <int kHeadDim, int kStep>
struct StepLoads {
  using S = WarpShape<kHeadDim, kStep>;
  uint32_t kb[S::kNTiles][S::kKLoads][4];  // token 8 nt + g, dims 32j + 8t
  // Tokens 16 kk + 2t + {0, 1, 8, 9}, dims [kW g, + kW) (chunk 0) and [8 kW + kW g, + kW).
  uint32_t vw[S::kPvSteps][4][2][S::kVWords];
  bool valid[S::kPvSteps][4];
};

// What a lane needs to address the pool.
struct LaneView {
  int lane, g, t;
  int32_t n;     // tokens of the block's range
  int64_t row;   // elements per pool slot
  int64_t head;  // elements from a slot's start to the KV head
};

// The index entries of the step at `base` (lane i: token base + i + 32 r), 0 past the range.
template <int kHeadDim, int kStep>
__device__ __forceinline__ void LoadStepIndices(const PagedDecodeParams& p, const BlockWork& w,
                                                const LaneView& lv, int32_t base,
                                                int32_t (&raw)[WarpShape<kHeadDim, kStep>::kIdx]) {
#pragma unroll
  for (int r = 0; r < WarpShape<kHeadDim, kStep>::kIdx; ++r) {
    const int32_t tok = base + lv.lane + 32 * r;
    raw[r] = lv.lane + 32 * r < kStep && tok < lv.n ? LoadIndex(p, w, w.lo + tok) : 0;
  }
}

// The slots of the step at `base` from its index entries: -1 for a token past the range or
// outside the pool (recorded).
template <int kHeadDim, int kStep>
__device__ __forceinline__ void ResolveSlots(const PagedDecodeParams& p, const BlockWork& w,
                                             const LaneView& lv, int32_t base,
                                             const int32_t (&raw)[WarpShape<kHeadDim, kStep>::kIdx],
                                             int32_t (&slot)[WarpShape<kHeadDim, kStep>::kIdx]) {
#pragma unroll
  for (int r = 0; r < WarpShape<kHeadDim, kStep>::kIdx; ++r) {
    const int32_t tok = base + lv.lane + 32 * r;
    slot[r] = lv.lane + 32 * r < kStep && tok < lv.n
                  ? static_cast<int32_t>(SlotOf(p, w, raw[r], w.lo + tok, true))
                  : -1;
  }
}

// Issues the K and V loads of a step whose slots are `slot`. Forced inline, as AttendStep: a
// call would pass the register arrays through local memory.
template <int kHeadDim, int kStep>
__device__ __forceinline__ void IssueStep(const PagedDecodeParams& p, const LaneView& lv,
                                          const int32_t (&slot)[WarpShape<kHeadDim, kStep>::kIdx],
                                          StepLoads<kHeadDim, kStep>& L) {
  using S = WarpShape<kHeadDim, kStep>;
#pragma unroll
  for (int nt = 0; nt < S::kNTiles; ++nt) {
    const int32_t s = ATTNMETA_SHFL_IDX32(slot[8 * nt / 32], 8 * nt % 32 + lv.g);
#pragma unroll
    for (int j = 0; j < S::kKLoads; ++j) {
      L.kb[nt][j][0] = L.kb[nt][j][1] = L.kb[nt][j][2] = L.kb[nt][j][3] = 0;
      if (s >= 0) LoadWords(p.k_pool, s * lv.row + lv.head + 32 * j + 8 * lv.t, L.kb[nt][j]);
    }
  }
#pragma unroll
  for (int kk = 0; kk < S::kPvSteps; ++kk) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int32_t s = ATTNMETA_SHFL_IDX32(slot[16 * kk / 32],
                                            16 * kk % 32 + 2 * lv.t + e % 2 + 8 * (e / 2));
      L.valid[kk][e] = s >= 0;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
#pragma unroll
        for (int i = 0; i < S::kVWords; ++i) L.vw[kk][e][c][i] = 0;
        if (s >= 0) {
          LoadWords(p.v_pool, s * lv.row + lv.head + 8 * S::kW * c + S::kW * lv.g, L.vw[kk][e][c]);
        }
      }
    }
  }
}

// A warp's online softmax in the log2 domain: lane (g, t) keeps head g's running max and its
// part of the running sum, and O^T's m-tiles (rows kW g + i and 8 kW + kW g + i, columns heads
// 2t and 2t + 1).
template <int kHeadDim>
struct WarpSoftmax {
  float m;
  float l;
  float o[kHeadDim / 16][4];
};

// Adds one step's tokens: S = Q K^T on the tensor cores, the softmax update, O^T += V^T P^T.
template <typename Dtype, int kHeadDim, int kStep, bool kPortableMma>
__device__ __forceinline__ void AttendStep(const uint32_t (&qa)[kHeadDim / 16][2], float scale,
                                           int t, const StepLoads<kHeadDim, kStep>& L,
                                           WarpSoftmax<kHeadDim>& sm) {
  using S = WarpShape<kHeadDim, kStep>;
  float sc[S::kNTiles][4];  // S: sc[nt][0..1] = (head g, tokens 8 nt + 2t..2t+1); [2..3] unused
#pragma unroll
  for (int nt = 0; nt < S::kNTiles; ++nt) {
    sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
    for (int k = 0; k < S::kKSteps; ++k) {
      const uint32_t a[4] = {qa[k][0], 0, qa[k][1], 0};
      const uint32_t b[2] = {L.kb[nt][k / 2][2 * (k % 2)], L.kb[nt][k / 2][2 * (k % 2) + 1]};
      Mma<Dtype, kPortableMma>(sc[nt], a, b);
    }
  }
  float mx = sm.m;
#pragma unroll
  for (int nt = 0; nt < S::kNTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      // Token 8 nt + 2t + e is V's token e + 2 (nt % 2) of k-step nt / 2.
      sc[nt][e] = L.valid[nt / 2][e + 2 * (nt % 2)] ? sc[nt][e] * scale : NegInf();
      mx = fmaxf(mx, sc[nt][e]);
    }
  }
  mx = fmaxf(mx, ATTNMETA_SHFL_XOR(mx, 1));
  mx = fmaxf(mx, ATTNMETA_SHFL_XOR(mx, 2));
  // Until head g has seen a token, mx is -inf and nothing changes.
  const bool seen = mx != NegInf();
  const float alpha = seen ? exp2f(sm.m - mx) : 1.0f;
  sm.m = mx;
  sm.l *= alpha;
#pragma unroll
  for (int nt = 0; nt < S::kNTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      sc[nt][e] = seen ? exp2f(sc[nt][e] - mx) : 0.0f;
      sm.l += sc[nt][e];
    }
  }
  // This lane's columns are heads 2t and 2t + 1, whose alphas lanes 8t and 8t + 4 hold.
  const float alpha0 = ATTNMETA_SHFL_IDX32(alpha, 8 * t);
  const float alpha1 = ATTNMETA_SHFL_IDX32(alpha, 8 * t + 4);
#pragma unroll
  for (int i = 0; i < S::kW; ++i) {
    sm.o[i][0] *= alpha0;
    sm.o[i][1] *= alpha1;
    sm.o[i][2] *= alpha0;
    sm.o[i][3] *= alpha1;
  }
#pragma unroll
  for (int kk = 0; kk < S::kPvSteps; ++kk) {
    const uint32_t b[2] = {Pack2<Dtype>(sc[2 * kk][0], sc[2 * kk][1]),
                           Pack2<Dtype>(sc[2 * kk + 1][0], sc[2 * kk + 1][1])};
#pragma unroll
    for (int i = 0; i < S::kW; ++i) {
      const uint32_t a[4] = {PairOf(L.vw[kk][0][0], L.vw[kk][1][0], i),
                             PairOf(L.vw[kk][0][1], L.vw[kk][1][1], i),
                             PairOf(L.vw[kk][2][0], L.vw[kk][3][0], i),
                             PairOf(L.vw[kk][2][1], L.vw[kk][3][1], i)};
      Mma<Dtype, kPortableMma>(sm.o[i], a, b);
    }
  }
}

// One block: one (work item, KV head, chunk of kHeads query heads of its group), kWarps warps.
// Warp w takes steps w, w + kWarps, ... of kStep tokens of the block's range, and computes on
// the tensor cores (MmaM16N8K16), reading K and V straight from the pool into fragment
// registers with 16-byte loads:
//   S = Q K^T: m = query heads (rows past kHeads are zero), n = 8 tokens, k = 16 dims. Lane
//     (g, t) loads token g's dims [32j + 8t, + 8) of each 32-dim block j and uses them as the
//     k-columns 2t..2t+1 and 2t+8..2t+9 of k-steps 2j and 2j + 1; Q's fragments use the same
//     order, and a dot product does not depend on the order of its terms.
//   O^T += V^T P^T: m = 16 dims, n = 8 query heads, k = 16 tokens. S's accumulator lane holds
//     P(head g, tokens 2t..2t+1) of each 8 tokens, which is the B fragment as it stands; for A,
//     lane (g, t) loads tokens 2t, 2t+1, 2t+8 and 2t+9 at dims [kW g, + kW) and
//     [8 kW + kW g, + kW) (kW = head_dim / 16), so that m-tile i's rows g and g + 8 are dims
//     kW g + i and 8 kW + kW g + i: the output's dims, permuted, are put back in place through
//     shared memory at the end.
// Each step: lane i resolves token i's slot (checked against the pool; -1 skips the token)
// and loads the next step's index entries; K and V loads of the whole step are issued before
// the first MMA. (Measured slower on the H200: issuing the next step's K/V loads before
// computing on the current one, which doubles the registers and halves the warps per
// multiprocessor, and prefetching the next step's rows into L2.) The warps' softmax states are
// combined through shared memory at the end.
template <typename Dtype, int kHeadDim, int kHeads, int kWarps, int kStep, bool kPortableMma>
__global__ void ATTNMETA_LAUNCH_BOUNDS(kWarps * 32, 1) PagedDecodeKernel(PagedDecodeParams p) {
  using S = WarpShape<kHeadDim, kStep>;
  constexpr int kThreads = kWarps * 32;
  constexpr int kLanes = kHeadDim / 8;  // epilogue: threads per head, 8 dims each
  static_assert(kHeads <= 8, "one n-tile of query heads");
  static_assert(sizeof(float) * kWarps * kHeads * (kHeadDim + 2) <= 48 * 1024, "static shared memory");
  __shared__ float sm_acc[kWarps][kHeads][kHeadDim];
  __shared__ float sm_max[kWarps][kHeads];
  __shared__ float sm_sum[kWarps][kHeads];

  const int32_t group = p.num_q_heads / p.num_kv_heads;
  const int32_t chunks = group / kHeads;
  const int32_t per_item = p.num_kv_heads * chunks;
  const int32_t item = static_cast<int32_t>(blockIdx.x) / per_item;
  const int32_t kv_head = static_cast<int32_t>(blockIdx.x) % per_item / chunks;
  const int32_t q_head0 = kv_head * group + static_cast<int32_t>(blockIdx.x) % chunks * kHeads;
  BlockWork w;
  if (!ResolveWork(p, item, w)) return;  // the same for every thread of the block
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const LaneView lv{lane, lane / 4, lane % 4, w.hi - w.lo, int64_t{p.num_kv_heads} * kHeadDim,
                    int64_t{kv_head} * kHeadDim};
  const int g = lv.g;
  const int t = lv.t;

  // Q's A fragments: row g (head q_head0 + g): words 0, 1 of its 16 bytes at dims 32j + 8t for
  // k-step 2j, words 2, 3 for k-step 2j + 1; rows g + 8 are zero.
  uint32_t qa[S::kKSteps][2];
#pragma unroll
  for (int j = 0; j < S::kKLoads; ++j) {
    uint32_t words[4] = {0, 0, 0, 0};
    if (g < kHeads) {
      LoadWords(p.q, (int64_t{w.sequence} * p.num_q_heads + q_head0 + g) * kHeadDim + 32 * j + 8 * t,
                words);
    }
    qa[2 * j][0] = words[0];
    qa[2 * j][1] = words[1];
    qa[2 * j + 1][0] = words[2];
    qa[2 * j + 1][1] = words[3];
  }
  WarpSoftmax<kHeadDim> sm;
  sm.m = NegInf();
  sm.l = 0.0f;
#pragma unroll
  for (int i = 0; i < S::kW; ++i) sm.o[i][0] = sm.o[i][1] = sm.o[i][2] = sm.o[i][3] = 0.0f;
  const float scale = p.softmax_scale * kLog2e;

  int32_t raw[S::kIdx];  // the index entries of the next step to resolve
  const int32_t first = warp * kStep;
  const int32_t stride = kWarps * kStep;
  LoadStepIndices<kHeadDim, kStep>(p, w, lv, first, raw);
  for (int32_t base = first; base < lv.n; base += stride) {
    int32_t slot[S::kIdx];
    ResolveSlots<kHeadDim, kStep>(p, w, lv, base, raw, slot);
    LoadStepIndices<kHeadDim, kStep>(p, w, lv, base + stride, raw);
    StepLoads<kHeadDim, kStep> loads;
    IssueStep<kHeadDim, kStep>(p, lv, slot, loads);
    AttendStep<Dtype, kHeadDim, kStep, kPortableMma>(qa, scale, t, loads, sm);
  }

  float l_sum = sm.l;
  l_sum += ATTNMETA_SHFL_XOR(l_sum, 1);
  l_sum += ATTNMETA_SHFL_XOR(l_sum, 2);
  if (t == 0 && g < kHeads) {
    sm_max[warp][g] = sm.m;
    sm_sum[warp][g] = l_sum;
  }
#pragma unroll
  for (int i = 0; i < S::kW; ++i) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      if (2 * t + hh < kHeads) {
        sm_acc[warp][2 * t + hh][S::kW * g + i] = sm.o[i][hh];
        sm_acc[warp][2 * t + hh][8 * S::kW + S::kW * g + i] = sm.o[i][2 + hh];
      }
    }
  }
  __syncthreads();
  // Thread c writes dims [8 * (c % kLanes), + 8) of query head q_head0 + c / kLanes.
  for (int c = threadIdx.x; c < kHeads * kLanes; c += kThreads) {
    const int h = c / kLanes;
    const int d0 = c % kLanes * 8;
    float mx = NegInf();
    for (int q = 0; q < kWarps; ++q) mx = fmaxf(mx, sm_max[q][h]);
    float total = 0.0f;
    float out[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (mx != NegInf()) {
      for (int q = 0; q < kWarps; ++q) {
        if (sm_max[q][h] == NegInf()) continue;
        const float weight = exp2f(sm_max[q][h] - mx);
        total += weight * sm_sum[q][h];
#pragma unroll
        for (int e = 0; e < 8; ++e) out[e] = fmaf(weight, sm_acc[q][h][d0 + e], out[e]);
      }
    }
    // total >= 1 once a token was seen (the largest score's own weight is 1).
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    const float lse = total > 0.0f ? (mx + log2f(total)) * kLn2 : NegInf();
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] *= inv;
    const int64_t head_row = (w.partial_slot < 0 ? int64_t{w.sequence} : int64_t{w.partial_slot}) *
                                 p.num_q_heads + q_head0 + h;
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
  constexpr DecodeVariant kV = kDecodeVariants[kVariant];
  // Head dim 256 holds twice the registers per token: half the step keeps it from spilling.
  constexpr int kStep = kHeadDim > 128 && kV.step_tokens > 16 ? kV.step_tokens / 2 : kV.step_tokens;
  const int32_t blocks = p.num_work * p.num_kv_heads * (p.num_q_heads / p.num_kv_heads / kHeads);
  PagedDecodeKernel<Dtype, kHeadDim, kHeads, kV.warps, kStep, kV.portable_mma != 0>
      <<<blocks, kV.warps * 32, 0, stream>>>(p);
  return hipGetLastError();
}

template <typename Dtype, int kHeadDim, int kHeads>
hipError_t ByVariant(const PagedDecodeParams& p, hipStream_t stream) {
  if constexpr (kHeadDim == kVariantHeadDim && kHeads == kVariantQueryHeads) {
    static_assert(kNumDecodeVariants == 6, "one case per variant");
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
    case kElementBf16:
      return ByHeadDim<Bf16>(p, stream);
    case kElementFp16:
      return ByHeadDim<Fp16>(p, stream);
  }
  return hipErrorInvalidValue;
}

hipError_t LaunchDecodeMergeKernel(const DecodeMergeParams& p, hipStream_t stream) {
  const dim3 grid(p.num_reduce, p.num_q_heads);
  switch (p.dtype) {
    case kElementBf16:
      DecodeMergeKernel<Bf16><<<grid, kMergeThreads, 0, stream>>>(p);
      return hipGetLastError();
    case kElementFp16:
      DecodeMergeKernel<Fp16><<<grid, kMergeThreads, 0, stream>>>(p);
      return hipGetLastError();
  }
  return hipErrorInvalidValue;
}

}  // namespace kernels
}  // namespace attnmeta
