// The warp-level attention step on the tensor cores that the decode kernel and the varlen
// kernel's short-query path share: 8 x kHalves query vectors (kHalves 1: rows 0-7 of the score
// MMA, the rest zero; 2: all 16 rows; 4: two m-tiles of the score MMA, which use every K and V
// fragment twice) against steps of kStep KV positions, K and V read from
// the pool straight into fragment registers, online softmax in fp32 (log2 domain), and the
// combination of a block's warps through shared memory. Device code only: include it from
// .hip.cc sources.
//
// Fragment layout (MmaM16N8K16 in hip_port.h; lane = 4 g + t):
//   S = Q K^T: m = query vectors g and g + 8 (zero when kHalves is 1), n = 8 positions,
//     k = 16 dims. Lane (g, t) loads position g's dims [32j + 8t, + 8) of each 32-dim block j
//     and uses them as the k-columns 2t..2t+1 and 2t+8..2t+9 of k-steps 2j and 2j + 1; Q's
//     fragments use the same order, and a dot product does not depend on the order of its
//     terms.
//   O^T += V^T P^T: m = 16 dims, n = 8 query vectors (one product per half), k = 16 positions.
//     S's accumulator lane holds P(vector g [+ 8], positions 2t..2t+1) of each 8 positions,
//     which is the B fragment as it stands; for A, lane (g, t) loads positions 2t, 2t+1, 2t+8
//     and 2t+9 at dims [kW g, + kW) and [8 kW + kW g, + kW) (kW = head_dim / 16), so that
//     m-tile i's rows g and g + 8 are dims kW g + i and 8 kW + kW g + i: StoreWarpState puts
//     them back in place.

#ifndef ATTNMETA_ATTENTION_KERNELS_INTERNAL_MMA_ATTENTION_H_
#define ATTNMETA_ATTENTION_KERNELS_INTERNAL_MMA_ATTENTION_H_

#include <cstdint>

#include "attention/kernels/hip_port.h"
#include "attention/kernels/internal/element_types.h"
#include "attention/kernels/internal/kv_source.h"

namespace attnmeta {
namespace kernels {
namespace internal {

// 2-byte elements of a word array: element e of `w` is the low (e even) or high half of word
// e / 2. Packs element e of x (low half) with element e of y (high half) into one word: the
// pair of positions an MMA fragment register holds.
template <int kWords>
__device__ inline uint32_t PairOf(const uint32_t (&x)[kWords], const uint32_t (&y)[kWords], int e) {
  return HalvesOf(x[e / 2], y[e / 2], /*high=*/e % 2 != 0);
}

// kWords 32-bit words (2 * kWords elements) at element offset `offset` of `base`, in 8- or
// 16-byte loads; kReadOnce: the 16-byte loads are LoadReadOnceGlobal16's.
template <int kWords, bool kReadOnce = false>
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
      uint4 x;
      if constexpr (kReadOnce) {
        x = LoadReadOnceGlobal16(reinterpret_cast<const uint4*>(src) + i);
      } else {
        x = __ldg(reinterpret_cast<const uint4*>(src) + i);
      }
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

// The shapes of one warp's work, from the head dim and the step (kStep positions).
template <int kHeadDim, int kStep>
struct WarpShape {
  static constexpr int kKSteps = kHeadDim / 16;  // k-steps of S = Q K^T
  static constexpr int kKLoads = kHeadDim / 32;  // 16-byte K loads per position and lane
  static constexpr int kW = kHeadDim / 16;       // m-tiles of O^T, and V dims per chunk and lane
  static constexpr int kVWords = kW / 2;
  static constexpr int kNTiles = kStep / 8;      // 8-position tiles of S per step
  static constexpr int kPvSteps = kStep / 16;    // 16-position k-steps of O^T per step
  static constexpr int kIdx =
      kStep > kLaneGroup ? kStep / kLaneGroup : 1;  // index entries per lane and step
  static_assert(kHeadDim % 64 == 0 && kStep % 16 == 0 &&
                    (kStep <= kLaneGroup || kStep % kLaneGroup == 0),
                "fragment shapes");
};

// One step's K and V fragments as loaded (zero for a position that is skipped).
template <int kHeadDim, int kStep>
struct StepLoads {
  using S = WarpShape<kHeadDim, kStep>;
  uint32_t kb[S::kNTiles][S::kKLoads][4];  // position 8 nt + g, dims 32j + 8t
  // Positions 16 kk + 2t + {0, 1, 8, 9}, dims [kW g, + kW) (chunk 0) and [8 kW + kW g, + kW).
  uint32_t vw[S::kPvSteps][4][2][S::kVWords];
  bool valid[S::kPvSteps][4];
};

// What a lane reads: the sequence's KV positions [lo, lo + n), through the KV source of the
// kernel's params (kv_source.h), in the pool rows of one KV head.
struct LaneView {
  int lane, g, t;
  int32_t seq;
  int64_t index_base;  // KvLength's, for the sequence
  int32_t lo;
  int32_t n;
  int64_t row;   // elements per pool slot
  int64_t head;  // elements from a slot's start to the KV head
};

// The index entries of the step at `base` (lane i: position lo + base + i + kLaneGroup r), 0 past
// the range.
template <int kHeadDim, int kStep, typename Params>
__device__ __forceinline__ void LoadStepIndices(const Params& p, const LaneView& lv, int32_t base,
                                                int32_t (&raw)[WarpShape<kHeadDim, kStep>::kIdx]) {
#pragma unroll
  for (int r = 0; r < WarpShape<kHeadDim, kStep>::kIdx; ++r) {
    const int32_t pos = base + lv.lane + kLaneGroup * r;
    raw[r] = lv.lane + kLaneGroup * r < kStep && pos < lv.n
                 ? LoadKvEntry(p, lv.seq, lv.index_base, lv.lo + pos)
                 : 0;
  }
}

// The slots of the step at `base` from its index entries: -1 for a position past the range or
// outside the pool (recorded).
template <int kHeadDim, int kStep, typename Params>
__device__ __forceinline__ void ResolveSlots(const Params& p, const LaneView& lv, int32_t base,
                                             const int32_t (&raw)[WarpShape<kHeadDim, kStep>::kIdx],
                                             int32_t (&slot)[WarpShape<kHeadDim, kStep>::kIdx]) {
#pragma unroll
  for (int r = 0; r < WarpShape<kHeadDim, kStep>::kIdx; ++r) {
    const int32_t pos = base + lv.lane + kLaneGroup * r;
    slot[r] = lv.lane + kLaneGroup * r < kStep && pos < lv.n
                  ? static_cast<int32_t>(
                        SlotFromEntry(p, lv.seq, lv.index_base, raw[r], lv.lo + pos, true))
                  : -1;
  }
}

// Issues the K and V loads of a step whose slots are `slot`. Forced inline, as AttendStep: a
// call would pass the register arrays through local memory. kAllLoaded: every position of the
// step has a slot (the common case), so no fragment needs zeros and no load a predicate.
// kReadOnce: the 16-byte loads are LoadReadOnceGlobal16's (hip_port.h).
template <int kHeadDim, int kStep, bool kAllLoaded, bool kReadOnce>
__device__ __forceinline__ void IssueStep(const void* k_pool, const void* v_pool,
                                          const LaneView& lv,
                                          const int32_t (&slot)[WarpShape<kHeadDim, kStep>::kIdx],
                                          StepLoads<kHeadDim, kStep>& L) {
  using S = WarpShape<kHeadDim, kStep>;
  // A row's address is one wide multiply-add of its slot onto the lane's column: the lane's
  // dims of K ([8t, + 8) of each 32) and of V ([kW g, + kW) of each half). A slot's bytes fit
  // int32 (the launchers' CheckAttentionBuffers).
  const int32_t row_bytes = static_cast<int32_t>(2 * lv.row);
  const uint16_t* k_lane = static_cast<const uint16_t*>(k_pool) + lv.head + 8 * lv.t;
  const uint16_t* v_lane = static_cast<const uint16_t*>(v_pool) + lv.head + S::kW * lv.g;
  // A skipped position (slot -1, not loaded) gets slot 0's address: no pointer before the pool.
  const auto row_of = [row_bytes](const uint16_t* lane, int32_t s) {
    return reinterpret_cast<const uint16_t*>(reinterpret_cast<const unsigned char*>(lane) +
                                             MulWide(kAllLoaded || s > 0 ? s : 0, row_bytes));
  };
#pragma unroll
  for (int nt = 0; nt < S::kNTiles; ++nt) {
    const int32_t s = ATTNMETA_SHFL_IDX32(slot[8 * nt / kLaneGroup], 8 * nt % kLaneGroup + lv.g);
    const uint16_t* k = row_of(k_lane, s);
#pragma unroll
    for (int j = 0; j < S::kKLoads; ++j) {
      if (!kAllLoaded) L.kb[nt][j][0] = L.kb[nt][j][1] = L.kb[nt][j][2] = L.kb[nt][j][3] = 0;
      if (kAllLoaded || s >= 0) LoadWords<4, kReadOnce>(k, 32 * j, L.kb[nt][j]);
    }
  }
#pragma unroll
  for (int kk = 0; kk < S::kPvSteps; ++kk) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int32_t s = ATTNMETA_SHFL_IDX32(slot[16 * kk / kLaneGroup],
                                            16 * kk % kLaneGroup + 2 * lv.t + e % 2 + 8 * (e / 2));
      const uint16_t* v = row_of(v_lane, s);
      L.valid[kk][e] = kAllLoaded || s >= 0;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        if (!kAllLoaded) {
#pragma unroll
          for (int i = 0; i < S::kVWords; ++i) L.vw[kk][e][c][i] = 0;
        }
        if (kAllLoaded || s >= 0) {
          LoadWords<S::kVWords, kReadOnce>(v, 8 * S::kW * c, L.vw[kk][e][c]);
        }
      }
    }
  }
}

// Whether every position of a step has a slot: lanes [0, kStep) of slot[0], and every lane of
// slot[1..] (ResolveSlots gives -1 past kStep).
template <int kHeadDim, int kStep>
__device__ __forceinline__ bool StepAllLoaded(
    const int32_t (&slot)[WarpShape<kHeadDim, kStep>::kIdx]) {
  constexpr uint32_t kFirst = kStep >= 32 ? 0xffffffffu : (1u << kStep) - 1;
  bool all = (ATTNMETA_BALLOT32(slot[0] >= 0) & kFirst) == kFirst;
#pragma unroll
  for (int r = 1; r < WarpShape<kHeadDim, kStep>::kIdx; ++r) {
    all = all && ATTNMETA_BALLOT32(slot[r] >= 0) == 0xffffffffu;
  }
  return all;
}

// Q's A fragments of query vectors g and g + 8 from their rows of head_dim elements at element
// offsets `offset[h]` of q (negative: the vector does not exist, zeros): words 0, 1 of its 16
// bytes at dims 32j + 8t for k-step 2j, words 2, 3 for k-step 2j + 1: qa[h][k] holds the A
// fragment's words of row g + 8h (a[0], a[2] for h = 0; a[1], a[3] for h = 1).
template <int kHeadDim, int kHalves>
struct QFragments {
  uint32_t qa[kHalves][kHeadDim / 16][2];
  // For AttendWarpSteps: nothing to prepare; qa[h][k] as AttendStep reads it.
  __device__ void Prepare() const {}
  __device__ uint2 Words(int h, int k) const { return make_uint2(qa[h][k][0], qa[h][k][1]); }
};

// The same words in shared memory, one copy for the block, reread at every step
// (LoadSharedInPlace), for a kernel whose registers are short: at head dim 256 Q's 32 words per
// lane are what a step's loads need (the decode kernel spilled 212-264 bytes per thread with
// Q in registers). Prepare, which every thread of the block calls, stores `source` (the
// fragments of the warp whose `stores` is true) and waits at a block barrier.
template <int kHeadDim, int kHalves>
struct SharedQFragments {
  using Storage = uint2[kHalves][kHeadDim / 16][kLaneGroup];  // [half][k-step][lane]
  Storage* words;
  const QFragments<kHeadDim, kHalves>* source;
  int lane;
  bool stores;
  __device__ void Prepare() const {
    if (stores) {
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
#pragma unroll
        for (int k = 0; k < kHeadDim / 16; ++k) (*words)[h][k][lane] = source->Words(h, k);
      }
    }
    __syncthreads();
  }
  __device__ uint2 Words(int h, int k) const { return LoadSharedInPlace(&(*words)[h][k][lane]); }
};

template <int kHeadDim, int kHalves>
__device__ __forceinline__ void LoadQFragments(const void* q, const int64_t (&offset)[kHalves], int t,
                                               QFragments<kHeadDim, kHalves>& f) {
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
#pragma unroll
    for (int j = 0; j < kHeadDim / 32; ++j) {
      uint32_t words[4] = {0, 0, 0, 0};
      if (offset[h] >= 0) LoadWords(q, offset[h] + 32 * j + 8 * t, words);
      f.qa[h][2 * j][0] = words[0];
      f.qa[h][2 * j][1] = words[1];
      f.qa[h][2 * j + 1][0] = words[2];
      f.qa[h][2 * j + 1][1] = words[3];
    }
  }
}

// A warp's online softmax in the log2 domain: lane (g, t) keeps vector g + 8h's running max and
// its part of the running sum, and O^T's m-tiles of half h (rows kW g + i and 8 kW + kW g + i,
// columns vectors 8h + 2t and 8h + 2t + 1).
template <int kHeadDim, int kHalves>
struct WarpSoftmax {
  float m[kHalves];
  float l[kHalves];
  float o[kHalves][kHeadDim / 16][4];
  __device__ WarpSoftmax() {
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      m[h] = NegInf();
      l[h] = 0.0f;
#pragma unroll
      for (int i = 0; i < kHeadDim / 16; ++i) o[h][i][0] = o[h][i][1] = o[h][i][2] = o[h][i][3] = 0.0f;
    }
  }
};

// Adds one step's positions: S = Q K^T on the tensor cores, the softmax update, O^T += V^T P^T.
// A score counts when its position was loaded and `sees(h, nt, e)`: whether vector g + 8h sees
// position 8 nt + 2t + e of the step; kChecked false: every score counts (the caller knows that
// every position was loaded and is seen by every vector). Q: QFragments or SharedQFragments of
// kHeadDim, kHalves.
template <typename Dtype, int kHeadDim, int kStep, int kHalves, bool kPortableMma, bool kChecked,
          typename Q, typename Sees>
__device__ __forceinline__ void AttendStep(const Q& q, float scale, int t,
                                           const StepLoads<kHeadDim, kStep>& L, const Sees& sees,
                                           WarpSoftmax<kHeadDim, kHalves>& sm) {
  using S = WarpShape<kHeadDim, kStep>;
  static_assert(kHalves == 1 || kHalves == 2 || kHalves == 4, "one or two m-tiles of S");
  // S's m-tile mt holds halves 2 mt and 2 mt + 1 (rows past kHalves zero).
  constexpr int kMTiles = (kHalves + 1) / 2;
  // S: sc[mt][nt][2 (h % 2) + e] = (vector g + 8h, position 8 nt + 2t + e), mt = h / 2. Each of
  // Q's k-steps is read once per step; every sc[mt][nt] still sums its k-steps in order.
  float sc[kMTiles][S::kNTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < S::kNTiles; ++nt) {
      sc[mt][nt][0] = sc[mt][nt][1] = sc[mt][nt][2] = sc[mt][nt][3] = 0.0f;
    }
  }
#pragma unroll
  for (int k = 0; k < S::kKSteps; ++k) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      const uint2 lo = q.Words(2 * mt, k);
      const uint2 hi = 2 * mt + 1 < kHalves ? q.Words(2 * mt + 1, k) : make_uint2(0u, 0u);
      const uint32_t a[4] = {lo.x, hi.x, lo.y, hi.y};
#pragma unroll
      for (int nt = 0; nt < S::kNTiles; ++nt) {
        const uint32_t b[2] = {L.kb[nt][k / 2][2 * (k % 2)], L.kb[nt][k / 2][2 * (k % 2) + 1]};
        Mma<Dtype, kPortableMma>(sc[mt][nt], a, b);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    float mx = sm.m[h];
#pragma unroll
    for (int nt = 0; nt < S::kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        // Position 8 nt + 2t + e is V's position e + 2 (nt % 2) of k-step nt / 2.
        float& x = sc[h / 2][nt][2 * (h % 2) + e];
        x = !kChecked || (L.valid[nt / 2][e + 2 * (nt % 2)] && sees(h, nt, e)) ? x * scale
                                                                                : NegInf();
        mx = fmaxf(mx, x);
      }
    }
    mx = fmaxf(mx, ATTNMETA_SHFL_XOR(mx, 1));
    mx = fmaxf(mx, ATTNMETA_SHFL_XOR(mx, 2));
    // Until the vector has seen a position, mx is -inf and nothing changes.
    const bool seen = mx != NegInf();
    const float alpha = seen ? Exp2FlushToZero(sm.m[h] - mx) : 1.0f;
    sm.m[h] = mx;
    sm.l[h] *= alpha;
#pragma unroll
    for (int nt = 0; nt < S::kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = sc[h / 2][nt][2 * (h % 2) + e];
        x = seen ? Exp2FlushToZero(x - mx) : 0.0f;
        sm.l[h] += x;
      }
    }
    // Once the maxima settle, most steps change none of them: skip the rescale then.
    if (ATTNMETA_BALLOT32(alpha != 1.0f) != 0) {
      // This lane's columns of half h are vectors 8h + 2t and 8h + 2t + 1, whose alphas lanes
      // 8t and 8t + 4 hold.
      const float alpha0 = ATTNMETA_SHFL_IDX32(alpha, 8 * t);
      const float alpha1 = ATTNMETA_SHFL_IDX32(alpha, 8 * t + 4);
#pragma unroll
      for (int i = 0; i < S::kW; ++i) {
        sm.o[h][i][0] *= alpha0;
        sm.o[h][i][1] *= alpha1;
        sm.o[h][i][2] *= alpha0;
        sm.o[h][i][3] *= alpha1;
      }
    }
  }
#pragma unroll
  for (int kk = 0; kk < S::kPvSteps; ++kk) {
    uint32_t b[kHalves][2];
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      const float (&s0)[4] = sc[h / 2][2 * kk];
      const float (&s1)[4] = sc[h / 2][2 * kk + 1];
      b[h][0] = Pack2<Dtype>(s0[2 * (h % 2)], s0[2 * (h % 2) + 1]);
      b[h][1] = Pack2<Dtype>(s1[2 * (h % 2)], s1[2 * (h % 2) + 1]);
    }
#pragma unroll
    for (int i = 0; i < S::kW; ++i) {
      const uint32_t a[4] = {PairOf(L.vw[kk][0][0], L.vw[kk][1][0], i),
                             PairOf(L.vw[kk][0][1], L.vw[kk][1][1], i),
                             PairOf(L.vw[kk][2][0], L.vw[kk][3][0], i),
                             PairOf(L.vw[kk][2][1], L.vw[kk][3][1], i)};
#pragma unroll
      for (int h = 0; h < kHalves; ++h) Mma<Dtype, kPortableMma>(sm.o[h][i], a, b[h]);
    }
  }
}

// Warp `warp` of kWarps attends to its steps of the positions in lv: steps warp, warp + kWarps,
// ... of kStep positions, the first step's index entries in `raw` (LoadStepIndices, issued by
// the caller). Per step: lane i resolves position i's slot (checked against the pool; -1 skips
// the position) and loads the next step's index entries; the K and V loads of the whole step
// are issued before the first MMA. q.Prepare() comes first, so that a barrier in it waits while
// the first step's index loads are in flight. `sees(base, h, nt, e)`: whether vector g + 8h
// sees position base + 8 nt + 2t + e (AttendStep's, at the step starting at base);
// `sees_all(base)`: whether every vector of the warp sees every position of the step at base,
// so that a step whose positions all have slots needs no per-score check (a warp-uniform
// value; a constant false leaves only the checked step). kReadOnceKv: K and V through
// LoadReadOnceGlobal16 (IssueStep).
template <typename Dtype, int kHeadDim, int kStep, int kHalves, int kWarps, bool kPortableMma,
          bool kReadOnceKv, typename Params, typename Q, typename Sees, typename SeesAll>
__device__ __forceinline__ void AttendWarpSteps(const Params& p, const LaneView& lv, int warp,
                                                const Q& q,
                                                int32_t (&raw)[WarpShape<kHeadDim, kStep>::kIdx],
                                                float scale, const Sees& sees,
                                                const SeesAll& sees_all,
                                                WarpSoftmax<kHeadDim, kHalves>& sm) {
  using S = WarpShape<kHeadDim, kStep>;
  const int32_t first = warp * kStep;
  const int32_t stride = kWarps * kStep;
  q.Prepare();
  for (int32_t base = first; base < lv.n; base += stride) {
    int32_t slot[S::kIdx];
    ResolveSlots<kHeadDim, kStep>(p, lv, base, raw, slot);
    LoadStepIndices<kHeadDim, kStep>(p, lv, base + stride, raw);
    StepLoads<kHeadDim, kStep> loads;
    const bool all_loaded = StepAllLoaded<kHeadDim, kStep>(slot);
    if (all_loaded) {
      IssueStep<kHeadDim, kStep, true, kReadOnceKv>(p.k_pool, p.v_pool, lv, slot, loads);
    } else {
      IssueStep<kHeadDim, kStep, false, kReadOnceKv>(p.k_pool, p.v_pool, lv, slot, loads);
    }
    const auto step_sees = [&](int h, int nt, int e) { return sees(base, h, nt, e); };
    if (all_loaded && sees_all(base)) {
      AttendStep<Dtype, kHeadDim, kStep, kHalves, kPortableMma, false>(q, scale, lv.t, loads,
                                                                       step_sees, sm);
    } else {
      AttendStep<Dtype, kHeadDim, kStep, kHalves, kPortableMma, true>(q, scale, lv.t, loads,
                                                                      step_sees, sm);
    }
  }
}

// The first step's index entries (LoadStepIndices), then before_q(), then Q's fragments of the
// query vectors at `q_offset` (LoadQFragments), then AttendWarpSteps with them: Q in registers,
// or at head dim 256 and for 4 halves in shared memory (SharedQFragments, loaded by warp 0),
// where in registers they spilled the step's loads (decode 212-264 bytes per thread, the varlen
// short-query path 788 at head dim 256). So before before_q() the warp has read only the
// metadata (p's KV source: kv_indices or the page table), and its K and V come after: a
// launch that overlaps the kernel ahead of it waits for that kernel in before_q (the decode
// kernel). Every thread of the block calls it: the shared form has a barrier.
template <typename Dtype, int kHeadDim, int kStep, int kHalves, int kWarps, bool kPortableMma,
          bool kReadOnceKv, typename Params, typename Sees, typename SeesAll, typename BeforeQ>
__device__ __forceinline__ void AttendWarpStepsWithQ(const Params& p, const LaneView& lv, int warp,
                                                     const int64_t (&q_offset)[kHalves],
                                                     float scale, const Sees& sees,
                                                     const SeesAll& sees_all,
                                                     WarpSoftmax<kHeadDim, kHalves>& sm,
                                                     const BeforeQ& before_q) {
  int32_t raw[WarpShape<kHeadDim, kStep>::kIdx];
  LoadStepIndices<kHeadDim, kStep>(p, lv, warp * kStep, raw);
  before_q();
  // Q's address and every K/V row's (through the lane's head offset) come from values opaque
  // until here, so that no load of them moves above before_q (OpaqueAfter, hip_port.h).
  const void* const q = OpaqueAfter(p.q);
  LaneView after = lv;
  after.head = OpaqueAfter(lv.head);
  QFragments<kHeadDim, kHalves> qf;
  if constexpr (kHeadDim > 128 || kHalves > 2) {
    __shared__ typename SharedQFragments<kHeadDim, kHalves>::Storage q_words;
    if (warp == 0) LoadQFragments<kHeadDim, kHalves>(q, q_offset, lv.t, qf);
    const SharedQFragments<kHeadDim, kHalves> qs{&q_words, &qf, lv.lane, warp == 0};
    AttendWarpSteps<Dtype, kHeadDim, kStep, kHalves, kWarps, kPortableMma, kReadOnceKv>(
        p, after, warp, qs, raw, scale, sees, sees_all, sm);
  } else {
    LoadQFragments<kHeadDim, kHalves>(q, q_offset, lv.t, qf);
    AttendWarpSteps<Dtype, kHeadDim, kStep, kHalves, kWarps, kPortableMma, kReadOnceKv>(
        p, after, warp, qf, raw, scale, sees, sees_all, sm);
  }
}

// The softmax states of a block's warps, for kVecs query vectors, in shared memory.
template <int kWarps, int kVecs, int kHeadDim>
struct WarpStates {
  static_assert(sizeof(float) * kWarps * kVecs * (kHeadDim + 2) <= 48 * 1024,
                "static shared memory");
  float acc[kWarps][kVecs][kHeadDim];
  float max[kWarps][kVecs];
  float sum[kWarps][kVecs];
};

// Warp `warp`'s state into `st`, its O^T dims put back in order.
template <int kWarps, int kVecs, int kHeadDim, int kHalves>
__device__ __forceinline__ void StoreWarpState(WarpStates<kWarps, kVecs, kHeadDim>& st, int warp,
                                               int g, int t,
                                               const WarpSoftmax<kHeadDim, kHalves>& sm) {
  constexpr int kW = kHeadDim / 16;
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    float l_sum = sm.l[h];
    l_sum += ATTNMETA_SHFL_XOR(l_sum, 1);
    l_sum += ATTNMETA_SHFL_XOR(l_sum, 2);
    if (t == 0 && 8 * h + g < kVecs) {
      st.max[warp][8 * h + g] = sm.m[h];
      st.sum[warp][8 * h + g] = l_sum;
    }
#pragma unroll
    for (int i = 0; i < kW; ++i) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int v = 8 * h + 2 * t + hh;
        if (v < kVecs) {
          st.acc[warp][v][kW * g + i] = sm.o[h][i][hh];
          st.acc[warp][v][8 * kW + kW * g + i] = sm.o[h][i][2 + hh];
        }
      }
    }
  }
}

// After a __syncthreads() that follows every warp's StoreWarpState: thread c of kThreads
// merges the warps' states of vector c / (head_dim / 8), dims [8 (c % (head_dim / 8)), + 8),
// and hands them to write(vector, d0, out[8], lse) (out normalised, lse natural log; a vector
// that saw nothing gets zeros and -inf).
template <int kWarps, int kVecs, int kHeadDim, int kThreads, typename Write>
__device__ __forceinline__ void CombineWarpStates(const WarpStates<kWarps, kVecs, kHeadDim>& st,
                                                  const Write& write) {
  constexpr int kLanes = kHeadDim / 8;
  for (int c = threadIdx.x; c < kVecs * kLanes; c += kThreads) {
    const int h = c / kLanes;
    const int d0 = c % kLanes * 8;
    float mx = NegInf();
    for (int q = 0; q < kWarps; ++q) mx = fmaxf(mx, st.max[q][h]);
    float total = 0.0f;
    float out[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (mx != NegInf()) {
      for (int q = 0; q < kWarps; ++q) {
        if (st.max[q][h] == NegInf()) continue;
        const float weight = Exp2FlushToZero(st.max[q][h] - mx);
        total += weight * st.sum[q][h];
#pragma unroll
        for (int e = 0; e < 8; ++e) out[e] = fmaf(weight, st.acc[q][h][d0 + e], out[e]);
      }
    }
    // total >= 1 once a position was seen (the largest score's own weight is 1).
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    const float lse = total > 0.0f ? (mx + log2f(total)) * kLn2 : NegInf();
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] *= inv;
    write(h, d0, out, lse);
  }
}

}  // namespace internal
}  // namespace kernels
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_INTERNAL_MMA_ATTENTION_H_
