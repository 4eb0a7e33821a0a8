#include "attention/kernels/varlen_attention_launch.h"

#include <atomic>
#include <cstdint>

#include "attention/kernels/internal/element_types.h"
#include "attention/kernels/internal/kv_source.h"
#include "attention/kernels/internal/mma_attention.h"
#include "attention/kernels/internal/violation_recorder.h"

namespace attnmeta {
namespace kernels {
namespace {

// Threads of a block of the tiled kernel on CUDA cores (VarlenAttentionKernel).
constexpr int kCudaCoreThreads = 128;
// Warps of a short-query block (VarlenMmaKernel) of 8 kHalves query vectors: 2 for 32 vectors
// or at head dim 256, whose states of 4 warps would not fit the 48 KB of static shared memory;
// else 4.
template <int kHeadDim, int kHalves>
inline constexpr int kMmaBlockWarps = kHalves > 2 || kHeadDim > 128 ? 2 : 4;
// Blocks of 8 kHalves query vectors per (sequence, KV head): vector_chunks counts 16.
template <int kHalves>
__device__ __host__ constexpr int32_t MmaChunksOf(int32_t vector_chunks) {
  return kHalves > 2 ? (vector_chunks + 1) / 2 : vector_chunks;
}
template <int kHalves>
__device__ __host__ inline int32_t MmaChunks(const VarlenAttentionParams& p) {
  return MmaChunksOf<kHalves>(p.vector_chunks);
}

// The grid the launcher checked (VarlenShortQueryBlocks) is the one Launch starts and the
// kernel decodes: kHalves 4 exactly where VarlenChunksPerBlock gives two chunks a block.
constexpr bool ShortQueryGridsAgree() {
  for (int32_t head_dim = 64; head_dim <= 256; head_dim *= 2) {
    for (int32_t chunks = 1; chunks <= kVarlenMaxVectorChunks; ++chunks) {
      const int32_t launched = head_dim <= 128 && VarlenChunksPerBlock(head_dim, chunks) == 2
                                   ? MmaChunksOf<4>(chunks)
                                   : MmaChunksOf<2>(chunks);
      if (launched != VarlenShortQueryBlocks(head_dim, chunks)) return false;
    }
  }
  return true;
}
static_assert(ShortQueryGridsAgree(), "the short-query grid differs from the launcher's");

using internal::Bf16;
using internal::Fp16;
using internal::kLn2;
using internal::kLog2e;
using internal::NegInf;
using internal::Pack2;

// A 16-byte word of 2-byte elements at element offset `offset` of `base`.
__device__ inline uint4 Load16(const void* base, int64_t offset) {
  return __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + offset));
}

// The block's tiling at one head dim. A block of kCudaCoreThreads threads holds kM query vectors and
// stages kN KV positions per tile (K and V of a tile are 16 KB together at every head dim).
//  - Scores: thread (tm, tn) = (tid / 8, tid % 8) computes query vectors tm + 16 i (i < kTM)
//    against positions tn + 8 j (j < kTN), 8 dims at a time from 16-byte shared-memory words:
//    the 8 threads of a quarter-wave share tm (one broadcast Q word) and read 8 different K
//    rows, which the padding of each row by one word puts in 8 different bank groups.
//  - Values: thread (g, c) = (tid / kChunks, tid % kChunks) accumulates query vectors
//    g * kRO + i (i < kRO) over dims [8 c, 8 c + 8): consecutive threads read consecutive
//    words of a V row, and the kRO weights of a position are one or two 16-byte words.
template <int kHeadDim>
struct Tiling {
  static constexpr int kM = VarlenQueryVectors(kHeadDim, false);  // 64, 64, 32
  static constexpr int kN = 4096 / kHeadDim;               // 64, 32, 16
  static constexpr int kChunks = kHeadDim / 8;              // 16-byte words of a row
  static constexpr int kRowWords = kChunks + 1;             // padded row in shared memory
  static constexpr int kTM = kM / 16;
  static constexpr int kTN = kN / 8;
  static constexpr int kRO = kM * kChunks / kCudaCoreThreads;
  static constexpr int kKvLoads = kN * kChunks / kCudaCoreThreads;  // words of K (and of V) per thread
  static constexpr int kQLoads = kM * kChunks / kCudaCoreThreads;
  static constexpr int kScoreStride = kM + 4;               // floats per row of the score tile
  static_assert(kM * kN == 16 * 8 * kTM * kTN && kRO % 4 == 0 && kKvLoads >= 1 && kQLoads >= 1,
                "the thread tiles cover the block tile");
};

// One sequence as the block sees it, resolved from the device metadata and clamped
// (violations recorded by the reporting thread).
struct Sequence {
  int32_t q_begin;  // its first row in q, out and lse
  int32_t q_len;
  int32_t kv_len;
  int64_t index_base;       // token-level: where its positions start in kv_indices
  const uint8_t* mask;      // its custom-mask block (null without a custom mask)
  bool blind;               // its metadata cannot be trusted: every row sees nothing
};

// Bytes of a mask block, as MaskBlockBytes (custom_mask.h) gives them.
__device__ inline int64_t MaskBlockBytes(const VarlenAttentionParams& p, int64_t q_len,
                                         int64_t kv_len) {
  switch (p.mask_layout) {
    case kVarlenMaskFull:
      return q_len * kv_len;
    case kVarlenMaskQLenOnly:
      return q_len * q_len;
    case kVarlenMaskBitPacked:
      return q_len * p.mask_word_bytes;
  }
  return 0;
}

__device__ inline Sequence ResolveSequence(const VarlenAttentionParams& p, int32_t seq, bool report) {
  DeviceViolation* v = report ? p.violation : nullptr;
  Sequence s;
  int64_t q_begin = p.qo_indptr[seq];
  int64_t q_end = p.qo_indptr[seq + 1];
  if (q_begin < 0) {
    RecordViolation(v, kQueryIndptrNegative, seq, q_begin, 0);
    q_begin = 0;
  }
  if (q_end < q_begin) {
    RecordViolation(v, kQueryIndptrDecreasing, seq + 1, q_end, q_begin);
    q_end = q_begin;
  }
  if (q_end > p.q_rows) {
    RecordViolation(v, kQueryRowsPastCapacity, seq + 1, q_end, p.q_rows);
    q_end = p.q_rows;
    if (q_begin > q_end) q_begin = q_end;
  }
  s.q_begin = static_cast<int32_t>(q_begin);
  s.q_len = static_cast<int32_t>(q_end - q_begin);
  s.kv_len = internal::KvLength(
      p, seq,
      [v](ViolationKind kind, int64_t index, int64_t value, int64_t bound) {
        RecordViolation(v, kind, index, value, bound);
      },
      &s.index_base);
  s.mask = nullptr;
  s.blind = false;
  if (s.q_len > s.kv_len) {
    RecordViolation(v, kQueryPastKv, seq, s.q_len, s.kv_len);
    s.blind = true;
  } else if (s.q_len > p.max_q_len) {
    RecordViolation(v, kQueryPastMaxQLen, seq, s.q_len, p.max_q_len);
    s.blind = true;
  } else if (p.mask_layout != kVarlenCausal) {
    // With q_len <= max_q_len, a bit-packed row's bits (c - prefix < q_len) lie in its word.
    const int64_t start = p.mask_indptr[seq];
    if (start < 0 || start > p.mask_capacity - MaskBlockBytes(p, s.q_len, s.kv_len)) {
      RecordViolation(v, kMaskOutsideBuffer, seq, start, p.mask_capacity);
      s.blind = true;
    } else {
      s.mask = p.mask + start;
    }
  }
  return s;
}

// qo_indptr[0] == 0 and qo_indptr[bs] == q_rows, else rows no sequence claims are not written
// (kQueryRowsMismatch), except the tail that zero_unclaimed_rows declares (ZeroUnclaimedRows).
// Run by one thread of the launch. A negative qo_indptr[0] or a qo_indptr[bs] past q_rows is
// left to ResolveSequence, which records it (kQueryIndptrNegative, kQueryRowsPastCapacity) and
// clamps, and so is an entry below the one before it (kQueryIndptrDecreasing): recording it
// here too would race with that record.
__device__ inline void CheckQueryRows(const VarlenAttentionParams& p) {
  // REQUIRES (the launcher's): batch_size >= 1.
  const int64_t first = p.qo_indptr[0];
  const int64_t last = p.qo_indptr[p.batch_size];
  if (first > 0 && first <= p.qo_indptr[1]) {
    RecordViolation(p.violation, kQueryRowsMismatch, 0, first, 0);
  } else if (p.zero_unclaimed_rows == 0 && last >= 0 && last < p.q_rows &&
             last >= p.qo_indptr[p.batch_size - 1]) {
    RecordViolation(p.violation, kQueryRowsMismatch, p.batch_size, last, p.q_rows);
  }
}

// With zero_unclaimed_rows: rows [qo_indptr[bs], q_rows), which no sequence claims, are written
// as rows that see nothing, each block a grid-stride share of them (every thread of every
// block, after the wait and before any return). Only where qo_indptr[bs] is in [0, q_rows] and
// not below qo_indptr[bs - 1]: else it is recorded (ResolveSequence) and the last sequence's
// rows could lie past it. Rows are whole 16-byte words: head_dim is a multiple of 8 elements.
__device__ inline void ZeroUnclaimedRows(const VarlenAttentionParams& p, int32_t block) {
  if (p.zero_unclaimed_rows == 0) return;
  const int64_t first = p.qo_indptr[p.batch_size];
  if (first < 0 || first > p.q_rows || first < p.qo_indptr[p.batch_size - 1]) return;
  const int64_t head_rows = (p.q_rows - first) * p.num_q_heads;
  const int64_t words = head_rows * (p.head_dim / 8);
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t start = int64_t{block} * blockDim.x + threadIdx.x;
  uint4* out =
      reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + first * p.num_q_heads * p.head_dim);
  for (int64_t w = start; w < words; w += stride) out[w] = make_uint4(0, 0, 0, 0);
  float* lse = p.lse + first * p.num_q_heads;
  for (int64_t e = start; e < head_rows; e += stride) lse[e] = NegInf();
}

// Whether row r of the sequence sees position c: MaskSees (custom_mask.h), on the block that
// ResolveSequence checked. REQUIRES: 0 <= r < q_len, 0 <= c < kv_len, the sequence not blind.
__device__ inline bool Sees(const VarlenAttentionParams& p, const Sequence& s, int32_t r, int32_t c) {
  const int32_t prefix = s.kv_len - s.q_len;
  switch (p.mask_layout) {
    case kVarlenCausal:
      return c <= prefix + r;
    case kVarlenMaskFull:
      return s.mask[int64_t{r} * s.kv_len + c] != 0;
    case kVarlenMaskQLenOnly:
      return c < prefix || s.mask[int64_t{r} * s.q_len + (c - prefix)] != 0;
    case kVarlenMaskBitPacked: {
      if (c < prefix) return true;
      const int32_t bit = c - prefix;
      return (s.mask[int64_t{r} * p.mask_word_bytes + bit / 8] >> (bit % 8) & 1) != 0;
    }
  }
  return false;
}

// The steps (the short-query path) or tiles (the tiled kernel) of kStep positions that every
// row of a block sees whole under a FULL mask, found once per block before it attends: bit k
// of `holes` is set when some row does not see some position of step k (positions [k kStep,
// (k + 1) kStep)). A warp of the short-query path that read a step's mask bytes when it reached
// the step waited for them, after its K and V loads, with too few registers left to keep more
// than one in flight (docs/varlen_attention.md). Steps from kMaxSteps on are not in the map and
// take the per-score check.
template <int kStep>
struct FullMaskSteps {
  static constexpr int32_t kMaxSteps = 8192;  // 1 KB of shared memory
  uint32_t holes[kMaxSteps / 32];

  // Whether every row sees step k whole. REQUIRES: 0 <= k < ceil(kv_len / kStep).
  __device__ bool Whole(int32_t k) const { return k < kMaxSteps && (holes[k / 32] >> (k % 32) & 1u) == 0; }
};

// Whether any byte of the 16 is zero.
__device__ inline bool HasZeroByte(const uint4& w) {
  const auto zero = [](uint32_t x) { return ((x - 0x01010101u) & ~x & 0x80808080u) != 0; };
  return zero(w.x) || zero(w.y) || zero(w.z) || zero(w.w);
}

// Fills `st` from rows [first_row, first_row + rows) of the sequence's FULL mask, positions
// below kv_len and kMaxSteps steps: each row's bytes in 16-byte loads where they are aligned
// (kUnroll loads in flight per thread) and one by one at its two ends. Called by every thread
// of the block (barriers); `st` is ready when it returns.
// REQUIRES: the rows lie in the sequence's mask block; 1 <= rows <= 128.
template <int kStep, int kThreads>
__device__ inline void BuildFullMaskSteps(const Sequence& s, int32_t first_row, int32_t rows,
                                          FullMaskSteps<kStep>& st) {
  constexpr int32_t kMaxSteps = FullMaskSteps<kStep>::kMaxSteps;
  constexpr int kUnroll = 8;
  const int tid = static_cast<int>(threadIdx.x);
  const int32_t positions = min(s.kv_len, kMaxSteps * kStep);
  for (int i = tid; i < (positions + 32 * kStep - 1) / (32 * kStep); i += kThreads) st.holes[i] = 0;
  __syncthreads();
  const auto mark = [&](int32_t c) { atomicOr(&st.holes[c / kStep / 32], 1u << (c / kStep % 32)); };
  const auto row_bytes = [&](int32_t r) { return s.mask + int64_t{first_row + r} * s.kv_len; };
  // Row r: bytes [0, head) one by one, then aligned 16-byte loads, then the rest one by one.
  const auto head_of = [&](int32_t r) {
    return min(positions, static_cast<int32_t>(-reinterpret_cast<uintptr_t>(row_bytes(r)) & 15));
  };
  const int32_t per_row = positions / 16 + 1;  // >= the words of any row
  const int32_t total = rows * per_row;         // < 2^31: rows <= 128, kStep <= 128
  for (int32_t i0 = tid; i0 < total; i0 += kUnroll * kThreads) {
    uint4 w[kUnroll];
    int32_t col[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t i = i0 + u * kThreads;
      const int32_t r = i / per_row;
      const int32_t head = i < total ? head_of(r) : 0;
      col[u] = head + 16 * (i % per_row);
      w[u] = i < total && col[u] + 16 <= positions
                 ? __ldg(reinterpret_cast<const uint4*>(row_bytes(r) + col[u]))
                 : make_uint4(~0u, ~0u, ~0u, ~0u);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (!HasZeroByte(w[u])) continue;
      const uint32_t x[4] = {w[u].x, w[u].y, w[u].z, w[u].w};
      for (int b = 0; b < 16; ++b) {
        if ((x[b / 4] >> (8 * (b % 4)) & 0xffu) == 0) mark(col[u] + b);
      }
    }
  }
  // The ends: lane j < 16 of row r's 32 takes head byte j, lane 16 + j tail byte j.
  for (int32_t i = tid; i < rows * 32; i += kThreads) {
    const int32_t r = i / 32;
    const int32_t j = i % 32;
    const int32_t head = head_of(r);
    const int32_t c = j < 16 ? j : head + 16 * ((positions - head) / 16) + (j - 16);
    if ((j < 16 ? c < head : c < positions) && row_bytes(r)[c] == 0) mark(c);
  }
  __syncthreads();
}

// What a block of a tiled kernel works on: kM query vectors = (kM / heads_per_block query rows
// of one sequence) x (heads_per_block query heads of one KV head's group).
struct TileBlock {
  int32_t seq, kv_head;
  int32_t q_head0;  // the block's first query head
  int32_t row0;     // the block's first row of the sequence
  int32_t rows;     // of them in the sequence, >= 1
  int32_t kv_end;   // positions any row of the block sees are below it
  Sequence s;
};

// Every kernel here may be launched to overlap the kernel ahead (LaunchKernelAfterPreceding):
// it waits for that kernel before it reads anything, since the metadata, Q and the KV pool
// are what kernels ahead write, and lets the kernel after it start. Its read-only loads
// (__ldg, in Load16 and kv_source.h) take their addresses from the block index this returns,
// opaque after the wait (hip_port.h), so that none can move above it.
__device__ inline int32_t BlockAfterTheKernelAhead() {
  WaitForPrecedingGrid();
  AllowDependentGridLaunch();
  return static_cast<int32_t>(OpaqueAfter(int64_t{blockIdx.x}));
}

// False when the block has no row of its sequence (the same for every thread of the block).
// The tiles of one (sequence, head chunk) are neighbours in launch order (they read the same
// K/V, which then comes from the L2), the last rows first: causal rows see the most.
__device__ inline bool ResolveTileBlock(const VarlenAttentionParams& p, int32_t block,
                                        int32_t vectors, TileBlock& b) {
  const int32_t heads = p.heads_per_block;
  const int32_t group = p.num_q_heads / p.num_kv_heads;
  const int32_t chunks = group / heads;
  int32_t x = block;
  const int32_t tile = p.q_tiles - 1 - x % p.q_tiles;
  x /= p.q_tiles;
  const int32_t chunk = x % chunks;
  x /= chunks;
  b.kv_head = x % p.num_kv_heads;
  b.seq = x / p.num_kv_heads;
  b.q_head0 = b.kv_head * group + chunk * heads;
  const int32_t rows_per_block = vectors / heads;
  ZeroUnclaimedRows(p, block);
  if (block == 0 && threadIdx.x == 0) CheckQueryRows(p);
  b.s = ResolveSequence(p, b.seq, threadIdx.x == 0);
  b.row0 = tile * rows_per_block;
  if (b.row0 >= b.s.q_len) return false;
  b.rows = min(rows_per_block, b.s.q_len - b.row0);
  // Positions any row of the block sees: causal rows stop at their own position.
  b.kv_end = b.s.kv_len;
  if (b.s.blind) {
    b.kv_end = 0;
  } else if (p.mask_layout == kVarlenCausal) {
    b.kv_end = min(b.kv_end, b.s.kv_len - b.s.q_len + b.row0 + b.rows);
  }
  return true;
}

// The slot of position c of the sequence, or -1 (recorded when `report`) when it lies outside
// the pool.
__device__ inline int64_t SlotOf(const VarlenAttentionParams& p, int32_t seq, const Sequence& s,
                                 int32_t c, bool report) {
  return internal::SlotFromEntry(p, seq, s.index_base, internal::LoadKvEntry(p, seq, s.index_base, c),
                                 c, report);
}

// One thread's share of a KV tile: kKvLoads words of K and of V (zero where the position is
// past the range or skipped), loaded into registers while the block computes on the tile
// before, then stored to shared memory.
template <int kLoads>
struct TileWords {
  uint4 k[kLoads];
  uint4 v[kLoads];
  bool valid[kLoads];
};

// Issues the loads of the tile of positions [base, base + kN): word e = tid + l * kCudaCoreThreads of
// the tile is word e % kChunks of position base + e / kChunks.
template <int kHeadDim>
__device__ __forceinline__ void FetchTile(const VarlenAttentionParams& p, int32_t seq,
                                          const Sequence& s, int32_t kv_head, int32_t base,
                                          int32_t kv_end, TileWords<Tiling<kHeadDim>::kKvLoads>& w) {
  using T = Tiling<kHeadDim>;
  const int64_t row = int64_t{p.num_kv_heads} * kHeadDim;
#pragma unroll
  for (int l = 0; l < T::kKvLoads; ++l) {
    const int e = threadIdx.x + l * kCudaCoreThreads;
    const int32_t c = base + e / T::kChunks;
    const int chunk = e % T::kChunks;
    w.k[l] = w.v[l] = make_uint4(0, 0, 0, 0);
    w.valid[l] = false;
    if (c < kv_end) {
      const int64_t slot = SlotOf(p, seq, s, c, chunk == 0);
      if (slot >= 0) {
        const int64_t offset = slot * row + int64_t{kv_head} * kHeadDim + chunk * 8;
        w.k[l] = Load16(p.k_pool, offset);
        w.v[l] = Load16(p.v_pool, offset);
        w.valid[l] = true;
      }
    }
  }
}

// One block: kM query vectors = (kM / heads_per_block query rows of one sequence) x
// (heads_per_block query heads of one KV head's group). It walks the KV positions the rows can
// see in tiles of kN: each tile's K and V are loaded once (16-byte words, the next tile's loads
// in flight while the block computes) into shared memory and used by every query vector; the
// scores go through shared memory to one thread per query vector, which keeps its running max
// and sum (online softmax, fp32, log2 domain) and hands the weights and the rescale factor to
// the value phase.
template <typename Dtype, int kHeadDim>
__global__ void ATTNMETA_LAUNCH_BOUNDS(kCudaCoreThreads, 1) VarlenAttentionKernel(VarlenAttentionParams p) {
  using T = Tiling<kHeadDim>;
  constexpr int kM = T::kM;
  constexpr int kN = T::kN;
  __shared__ uint4 q_s[kM][T::kRowWords];
  __shared__ uint4 k_s[kN][T::kRowWords];
  __shared__ uint4 v_s[kN][T::kRowWords];
  // Scores of a tile, then their weights, position-major so that the value phase reads the
  // weights of its query vectors as 16-byte words.
  __shared__ float4 w_s[kN][T::kScoreStride / 4];
  __shared__ int32_t valid_s[kN];
  __shared__ float alpha_s[kM];  // the rescale of each query vector's accumulator this tile
  __shared__ float sum_s[kM];    // the final sum of weights

  const int tid = static_cast<int>(threadIdx.x);
  TileBlock b;
  // The same for every thread of the block:
  if (!ResolveTileBlock(p, BlockAfterTheKernelAhead(), kM, b)) return;
  const Sequence& s = b.s;
  const int32_t heads = p.heads_per_block;
  const int32_t seq = b.seq, kv_head = b.kv_head, q_head0 = b.q_head0;
  const int32_t row0 = b.row0, rows = b.rows, kv_end = b.kv_end;

  // Query vector m is row row0 + m / heads, head q_head0 + m % heads; rows past the sequence
  // are zero and never written.
#pragma unroll
  for (int l = 0; l < T::kQLoads; ++l) {
    const int e = tid + l * kCudaCoreThreads;
    const int m = e / T::kChunks;
    const int word = e % T::kChunks;
    const int32_t r = m / heads;
    q_s[m][word] = r < rows ? Load16(p.q, (int64_t{s.q_begin + row0 + r} * p.num_q_heads +
                                           q_head0 + m % heads) * kHeadDim + word * 8)
                            : make_uint4(0, 0, 0, 0);
  }

  const int tm = tid / 8;
  const int tn = tid % 8;
  const int vg = tid / T::kChunks;
  const int vc = tid % T::kChunks;
  const float scale = p.softmax_scale * kLog2e;
  float run_max = NegInf();  // thread tid < kM: query vector tid's running max and sum
  float run_sum = 0.0f;
  float acc[T::kRO][8];
#pragma unroll
  for (int i = 0; i < T::kRO; ++i) {
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[i][e] = 0.0f;
  }

  TileWords<T::kKvLoads> words;
  if (kv_end > 0) FetchTile<kHeadDim>(p, seq, s, kv_head, 0, kv_end, words);
  for (int32_t base = 0; base < kv_end; base += kN) {
#pragma unroll
    for (int l = 0; l < T::kKvLoads; ++l) {
      const int e = tid + l * kCudaCoreThreads;
      k_s[e / T::kChunks][e % T::kChunks] = words.k[l];
      v_s[e / T::kChunks][e % T::kChunks] = words.v[l];
      if (e % T::kChunks == 0) valid_s[e / T::kChunks] = words.valid[l];
    }
    __syncthreads();
    if (base + kN < kv_end) FetchTile<kHeadDim>(p, seq, s, kv_head, base + kN, kv_end, words);

    float score[T::kTM][T::kTN];
#pragma unroll
    for (int i = 0; i < T::kTM; ++i) {
#pragma unroll
      for (int j = 0; j < T::kTN; ++j) score[i][j] = 0.0f;
    }
#pragma unroll 2
    for (int word = 0; word < T::kChunks; ++word) {
      float q[T::kTM][8];
#pragma unroll
      for (int i = 0; i < T::kTM; ++i) Dtype::ToFloat(q_s[tm + 16 * i][word], q[i]);
#pragma unroll
      for (int j = 0; j < T::kTN; ++j) {
        float k[8];
        Dtype::ToFloat(k_s[tn + 8 * j][word], k);
#pragma unroll
        for (int i = 0; i < T::kTM; ++i) {
#pragma unroll
          for (int e = 0; e < 8; ++e) score[i][j] = fmaf(q[i][e], k[e], score[i][j]);
        }
      }
    }
    float* w_flat = reinterpret_cast<float*>(w_s);
#pragma unroll
    for (int i = 0; i < T::kTM; ++i) {
      const int m = tm + 16 * i;
      const int32_t r = m / heads;
#pragma unroll
      for (int j = 0; j < T::kTN; ++j) {
        const int n = tn + 8 * j;
        const bool sees = r < rows && valid_s[n] != 0 && Sees(p, s, row0 + r, base + n);
        w_flat[n * T::kScoreStride + m] = sees ? score[i][j] * scale : NegInf();
      }
    }
    __syncthreads();

    if (tid < kM) {
      float mx = run_max;
#pragma unroll 8
      for (int n = 0; n < kN; ++n) mx = fmaxf(mx, w_flat[n * T::kScoreStride + tid]);
      // Until the query vector has seen a position, mx is -inf and nothing changes.
      const bool seen = mx != NegInf();
      const float alpha = seen ? Exp2FlushToZero(run_max - mx) : 1.0f;
      float sum = 0.0f;
#pragma unroll 8
      for (int n = 0; n < kN; ++n) {
        float& w = w_flat[n * T::kScoreStride + tid];
        w = seen ? Exp2FlushToZero(w - mx) : 0.0f;
        sum += w;
      }
      run_sum = run_sum * alpha + sum;
      run_max = mx;
      alpha_s[tid] = alpha;
    }
    __syncthreads();

#pragma unroll
    for (int i = 0; i < T::kRO; ++i) {
      const float alpha = alpha_s[vg * T::kRO + i];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[i][e] *= alpha;
    }
#pragma unroll 4
    for (int n = 0; n < kN; ++n) {
      float v[8];
      Dtype::ToFloat(v_s[n][vc], v);
      float w[T::kRO];
#pragma unroll
      for (int i = 0; i < T::kRO / 4; ++i) {
        const float4 w4 = w_s[n][vg * T::kRO / 4 + i];
        w[4 * i] = w4.x;
        w[4 * i + 1] = w4.y;
        w[4 * i + 2] = w4.z;
        w[4 * i + 3] = w4.w;
      }
#pragma unroll
      for (int i = 0; i < T::kRO; ++i) {
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[i][e] = fmaf(w[i], v[e], acc[i][e]);
      }
    }
    __syncthreads();  // the next tile overwrites k_s, v_s and w_s
  }

  // The sum is >= 1 once a position was seen (the largest score's own weight is 1).
  if (tid < kM) {
    sum_s[tid] = run_sum;
    const int32_t r = tid / heads;
    if (r < rows) {
      p.lse[int64_t{s.q_begin + row0 + r} * p.num_q_heads + q_head0 + tid % heads] =
          run_sum > 0.0f ? (run_max + log2f(run_sum)) * kLn2 : NegInf();
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < T::kRO; ++i) {
    const int m = vg * T::kRO + i;
    const int32_t r = m / heads;
    if (r >= rows) continue;
    const float inv = sum_s[m] > 0.0f ? 1.0f / sum_s[m] : 0.0f;
    const int64_t head_row = int64_t{s.q_begin + row0 + r} * p.num_q_heads + q_head0 + m % heads;
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + head_row * kHeadDim + vc * 8) =
        make_uint4(Pack2<Dtype>(acc[i][0] * inv, acc[i][1] * inv),
                   Pack2<Dtype>(acc[i][2] * inv, acc[i][3] * inv),
                   Pack2<Dtype>(acc[i][4] * inv, acc[i][5] * inv),
                   Pack2<Dtype>(acc[i][6] * inv, acc[i][7] * inv));
  }
}

// The tiled path on the tensor cores (VarlenTiledMmaKernel): blocks like the tiled kernel's
// (kM query vectors of one sequence and KV head's group, the grid in the same order; kM is
// VarlenQueryVectors(head_dim, true)), FlashAttention-style: warp w computes query vectors
// [16 w, 16 w + 16) as the rows of the MMAs, against tiles of kN positions that the block
// stages in shared memory, the next tile's K and V copies in flight while it computes.
//  - S = Q K^T (m = 16 vectors, n = 8 positions, k = 16 dims): Q's fragments stay in registers
//    (at head dim 256 in shared memory: MmaTiling::kSharedQKSteps) in the dim
//    order of mma_attention.h (lane t takes dims [32 j + 8 t, + 8) of each 32-dim
//    block j as the k-columns of two k-steps), so that a lane's B fragments of both k-steps are
//    one 16-byte word of a K row (row n: position n of the tile). K rows are padded by 16
//    words, which puts the words that rows g and g + 1 of a quarter-wave read in different
//    banks.
//  - O += P V (m = 16 vectors, n = 8 dims, k = 16 positions): S's accumulators of n-tiles 2 kk
//    and 2 kk + 1 are P's A fragments of k-step kk as they stand; V rows are staged as they
//    are (position-major) and read transposed into B fragments, two dim tiles per
//    LoadSharedMatrices8x8x4Trans.
//  - The tiles are copied into shared memory asynchronously (CopyGlobalToShared16: no
//    registers hold them on the way), on NVIDIA three stages deep at head dims up to 128 and
//    two at 256 (MmaTiling::kStages).
template <int kHeadDim>
struct MmaTiling {
  static constexpr int kM = VarlenQueryVectors(kHeadDim, true);  // 128, 128, 64
  static constexpr int kWarps = kM / 16;
  static constexpr int kThreads = kWarps * kLaneGroup;
  // Tiles staged at once, K and V words each, in dynamic shared memory. On NVIDIA the next
  // tile's copies are in flight while the block computes: three stages at head dims up to 128,
  // so that one block barrier per tile orders both the landing of a tile and the reuse of a
  // stage (12-14% faster on the H200 than two stages with two barriers per tile); two at head
  // dim 256, where three beside all of Q left one block per multiprocessor instead of two and
  // ran 60% slower (docs/varlen_attention.md). One on AMD, where a copy is a load and a store
  // where it stands (kSharedCopyStages).
  static constexpr int kStages = kSharedCopyStages == 1 ? 1 : kHeadDim > 128 ? 2 : 3;
  // Positions per tile: 128, 64, and 32 at head dim 256 with two stages (16 with one: AMD's
  // 64 KB of LDS would not hold 32-position tiles beside all of Q). On the H200 at head dim 256,
  // 32 positions and all of Q in shared memory ran 8-10% faster than 16 and 12 of Q's k-steps
  // (docs/varlen_attention.md).
  static constexpr int kN = kHeadDim > 128 ? (kStages > 1 ? 32 : 16) : 8192 / kHeadDim;
  static constexpr int kChunks = kHeadDim / 8;              // 16-byte words of a K/V row
  static constexpr int kKPitch = kHeadDim / 2 + 16;         // words per staged K row
  // Words per staged V row: the 8 rows of one matrix that LoadSharedMatrices8x8x4Trans reads
  // fall 4 words apart mod 32, in different banks.
  static constexpr int kVPitch = kHeadDim / 2 + 4;
  static constexpr int kNTiles = kN / 8;
  // Q's k-steps kept in shared memory instead of registers, at head dim 256: all 16 with
  // 32-position tiles, the last 12 with 16 (ptxas, sm_90, two stages: no spills either way;
  // 32 positions with 12 spilled 36 bytes per thread).
  static constexpr int kSharedQKSteps = kHeadDim > 128 ? (kN > 16 ? 16 : 12) : 0;
  static constexpr int kPvSteps = kN / 16;
  static constexpr int kDimTiles = kHeadDim / 8;
  static constexpr int kCopies = kN * kChunks / kThreads;  // 16-byte words of K (and of V) per thread
  static constexpr int kStageWords = kN * (kKPitch + kVPitch);
  static constexpr int kSharedBytes = kStages * kStageWords * 4;
  static_assert(kCopies >= 1 && kN * kChunks % kThreads == 0 && kThreads >= kN,
                "the threads cover a tile exactly");
  static_assert(kVPitch % 32 == 4 && kKPitch % 32 == 16, "conflict-free fragment loads");
};

// The slot of position c of the block's range, or -1 past kv_end or outside the pool
// (recorded).
__device__ inline int32_t TileSlot(const VarlenAttentionParams& p, const TileBlock& b, int32_t c) {
  return c < b.kv_end ? static_cast<int32_t>(SlotOf(p, b.seq, b.s, c, true)) : -1;
}

// Copies the tile whose slots are `slots` (-1: not read, zeros) into stage `k_s`/`v_s`, the K
// and V rows of position n at row n of each. Thread tid copies word e % kChunks of position e /
// kChunks of both, e = tid + l * kThreads.
template <int kHeadDim>
__device__ __forceinline__ void CopyMmaTile(const VarlenAttentionParams& p, const int32_t* slots,
                                            int32_t pool_row, int64_t head, uint32_t* k_s,
                                            uint32_t* v_s) {
  using T = MmaTiling<kHeadDim>;
  const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int l = 0; l < T::kCopies; ++l) {
    const int e = tid + l * T::kThreads;
    const int n = e / T::kChunks;
    const int c = e % T::kChunks;
    const int32_t slot = slots[n];
    const int64_t at = slot >= 0 ? MulWide(slot, pool_row) + head + 8 * c : 0;
    CopyGlobalToShared16(&k_s[n * T::kKPitch + 4 * c], static_cast<const uint16_t*>(p.k_pool) + at,
                         slot >= 0);
    CopyGlobalToShared16(&v_s[n * T::kVPitch + 4 * c], static_cast<const uint16_t*>(p.v_pool) + at,
                         slot >= 0);
  }
  CommitSharedCopies();
}

// kFullMask: the launch's mask is FULL (its whole tiles come from the block's FullMaskSteps).
template <typename Dtype, int kHeadDim, bool kFullMask>
__global__ void ATTNMETA_LAUNCH_BOUNDS(MmaTiling<kHeadDim>::kThreads, 1)
    VarlenTiledMmaKernel(VarlenAttentionParams p) {
  using T = MmaTiling<kHeadDim>;
  constexpr int kN = T::kN;
  // Stage i % kStages: tile i's K rows (kN x kKPitch words) and then its V rows (kN x kVPitch).
  extern __shared__ __align__(16) uint32_t stages[];
  __shared__ int32_t slot_s[4][kN];  // tile i's position n: slot_s[i % 4][n], -1: not read

  TileBlock b;
  // The same for every thread of the block:
  if (!ResolveTileBlock(p, BlockAfterTheKernelAhead(), T::kM, b)) return;
  const Sequence& s = b.s;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kLaneGroup;
  const int g = lane / 4;
  const int t = lane % 4;
  const int32_t heads = p.heads_per_block;
  // The lane's vectors 16 w + g and 16 w + 8 + g: rows past the sequence are zero and never
  // written.
  int32_t row[2];
  int64_t head_row[2];  // of q, out and lse; -1 past the sequence
  int64_t q_offset[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int32_t m = 16 * (tid / kLaneGroup) + 8 * h + g;
    row[h] = m / heads;
    head_row[h] = row[h] < b.rows
                      ? int64_t{s.q_begin + b.row0 + row[h]} * p.num_q_heads + b.q_head0 + m % heads
                      : -1;
    q_offset[h] = head_row[h] >= 0 ? head_row[h] * kHeadDim : -1;
  }
  internal::QFragments<kHeadDim, 2> qf;
  internal::LoadQFragments<kHeadDim, 2>(p.q, q_offset, t, qf);
  // Q's k-steps past kRegK wait in shared memory (the warp's own rows, stored by the warp, so a
  // warp barrier orders them), reread at each tile (LoadSharedInPlace).
  constexpr int kSharedK = T::kSharedQKSteps;
  constexpr int kRegK = kHeadDim / 16 - kSharedK;
  __shared__ uint2 q_s[kSharedK > 0 ? T::kWarps : 1][2][kSharedK > 0 ? kSharedK : 1][kLaneGroup];
  if constexpr (kSharedK > 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int k = 0; k < kSharedK; ++k) {
        q_s[tid / kLaneGroup][h][k][lane] =
            make_uint2(qf.qa[h][kRegK + k][0], qf.qa[h][kRegK + k][1]);
      }
    }
    ATTNMETA_SYNC_WARP();
  }
  // Q's A-fragment words of half h at k-step k (a[0], a[2] of half 0; a[1], a[3] of half 1).
  const auto q_words = [&](int h, int k) {
    if (kSharedK > 0 && k >= kRegK)
      return LoadSharedInPlace(&q_s[tid / kLaneGroup][h][k - kRegK][lane]);
    return make_uint2(qf.qa[h][k][0], qf.qa[h][k][1]);
  };

  const float scale = p.softmax_scale * kLog2e;
  const int32_t prefix = s.kv_len - s.q_len;
  const int64_t pool_row = int64_t{p.num_kv_heads} * kHeadDim;
  // The lane's row of a V fragment load: matrix m = lane / 8 of a pair of dim tiles is k rows
  // 8 (m % 2) + lane % 8 of the P V step (8 rows 4 words apart mod 32: distinct banks) and
  // dims 8 (m / 2) of the pair.
  const int v_row = 8 * (lane / 8 % 2) + lane % 8;
  const int v_word = 4 * (lane / 16);
  const int64_t head = int64_t{b.kv_head} * kHeadDim;
  float run_max[2] = {NegInf(), NegInf()};
  float run_sum[2] = {0.0f, 0.0f};  // the lane's part of the row's sum
  float o[T::kDimTiles][4];
#pragma unroll
  for (int i = 0; i < T::kDimTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  // A tile whose positions every row of the block sees skips the per-score check. Causal: a
  // tile that ends at or before the block's first row's position; QLEN_ONLY and bit-packed:
  // inside the prefix; FULL: no hole in the block's rows (full_tiles).
  const int32_t seen_end = p.mask_layout == kVarlenCausal ? prefix + b.row0 + 1 : prefix;
  __shared__ FullMaskSteps<kFullMask ? kN : 16> full_tiles;  // kFullMask only
  if constexpr (kFullMask) {
    if (!s.blind) BuildFullMaskSteps<kN, T::kThreads>(s, b.row0, b.rows, full_tiles);
  }

  const int32_t row_elems = static_cast<int32_t>(pool_row);
  const auto k_stage = [&](int32_t i) { return stages + i % T::kStages * T::kStageWords; };
  const auto v_stage = [&](int32_t i) { return k_stage(i) + kN * T::kKPitch; };
  // Computes tile i (positions [base, base + kN), slots `slots`) from stage i % kStages.
  const auto compute_tile = [&](int32_t i, int32_t base, const int32_t* slots, bool whole) {
    const uint32_t* k_s = k_stage(i);
    const uint32_t* v_s = v_stage(i);

    float sc[T::kNTiles][4];
#pragma unroll
    for (int j = 0; j < T::kNTiles; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
    for (int kb = 0; kb < kHeadDim / 32; ++kb) {
      const uint2 lo0 = q_words(0, 2 * kb), hi0 = q_words(1, 2 * kb);
      const uint2 lo1 = q_words(0, 2 * kb + 1), hi1 = q_words(1, 2 * kb + 1);
      const uint32_t a0[4] = {lo0.x, hi0.x, lo0.y, hi0.y};
      const uint32_t a1[4] = {lo1.x, hi1.x, lo1.y, hi1.y};
#pragma unroll
      for (int j = 0; j < T::kNTiles; ++j) {
        const uint4 w = *reinterpret_cast<const uint4*>(&k_s[(8 * j + g) * T::kKPitch + 16 * kb + 4 * t]);
        const uint32_t b0[2] = {w.x, w.y};
        const uint32_t b1[2] = {w.z, w.w};
        MmaM16N8K16<Dtype::kIsBf16>(sc[j], a0, b0);
        MmaM16N8K16<Dtype::kIsBf16>(sc[j], a1, b1);
      }
    }
    // -inf where the row does not see the position (no check on a whole tile).
    if (!whole) {
#pragma unroll
      for (int j = 0; j < T::kNTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2;
          const int n = 8 * j + 2 * t + e % 2;
          if (slots[n] < 0 || q_offset[h] < 0 || !Sees(p, s, b.row0 + row[h], base + n)) {
            sc[j][e] = NegInf();
          }
        }
      }
    }
    // The online softmax in the log2 domain: the running maximum is of the scaled scores
    // (scale > 0), and a weight is exp2(score * scale - maximum).
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = NegInf();
#pragma unroll
      for (int j = 0; j < T::kNTiles; ++j) mx = fmaxf(mx, fmaxf(sc[j][2 * h], sc[j][2 * h + 1]));
      mx = fmaxf(mx, ATTNMETA_SHFL_XOR(mx, 1));
      mx = fmaxf(mx, ATTNMETA_SHFL_XOR(mx, 2));
      mx = fmaxf(run_max[h], mx * scale);
      // Until the row has seen a position, mx is -inf and nothing changes.
      const bool seen = mx != NegInf();
      alpha[h] = seen ? Exp2FlushToZero(run_max[h] - mx) : 1.0f;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < T::kNTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = sc[j][2 * h + e];
          x = seen ? Exp2FlushToZero(fmaf(x, scale, -mx)) : 0.0f;
          sum += x;
        }
      }
      run_sum[h] = run_sum[h] * alpha[h] + sum;
      run_max[h] = mx;
    }
    // After the first tiles a row's maximum rarely moves: skip the rescale when no lane's did.
    if (ATTNMETA_BALLOT32(alpha[0] != 1.0f || alpha[1] != 1.0f) != 0) {
#pragma unroll
      for (int i = 0; i < T::kDimTiles; ++i) {
        o[i][0] *= alpha[0];
        o[i][1] *= alpha[0];
        o[i][2] *= alpha[1];
        o[i][3] *= alpha[1];
      }
    }
#pragma unroll
    for (int kk = 0; kk < T::kPvSteps; ++kk) {
      const uint32_t pa[4] = {Pack2<Dtype>(sc[2 * kk][0], sc[2 * kk][1]),
                              Pack2<Dtype>(sc[2 * kk][2], sc[2 * kk][3]),
                              Pack2<Dtype>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              Pack2<Dtype>(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int i = 0; i < T::kDimTiles; i += 2) {
        const uint4 w = LoadSharedMatrices8x8x4Trans(&v_s[(16 * kk + v_row) * T::kVPitch + 4 * i + v_word]);
        const uint32_t b0[2] = {w.x, w.y};
        const uint32_t b1[2] = {w.z, w.w};
        MmaM16N8K16<Dtype::kIsBf16>(o[i], pa, b0);
        MmaM16N8K16<Dtype::kIsBf16>(o[i + 1], pa, b1);
      }
    }
  };
  if constexpr (T::kStages == 3) {
    // Three stages, one block barrier per tile (B_i). Before B_i each thread issues tile i + 1's
    // copies into stage (i + 1) % 3, which held tile i - 2: every thread was done with that tile
    // when it reached B_(i - 1). Once its own copies of tile i have landed, it stores its
    // position of tile i + 2 into slot_s[(i + 2) % 4] (last read by tile i - 2's checks, also
    // done before B_(i - 1)). B_i then makes tile i's stage and tile i + 2's slots visible to
    // every thread, and tells them whether tile i + 1 has a position that is not read.
    int32_t next1 = tid < kN ? TileSlot(p, b, kN + tid) : -1;  // this thread's of tile i + 1
    if (tid < kN) {
      slot_s[0][tid] = TileSlot(p, b, tid);
      slot_s[1][tid] = next1;
    }
    // Whether the tile to compute next has a position that is not read (past kv_end or outside
    // the pool).
    bool holes = __syncthreads_or(tid < kN && slot_s[0][tid] < 0) != 0;
    if (b.kv_end > 0) CopyMmaTile<kHeadDim>(p, slot_s[0], row_elems, head, k_stage(0), v_stage(0));
    int32_t next2 = tid < kN ? TileSlot(p, b, 2 * kN + tid) : -1;  // of tile i + 2
    for (int32_t base = 0, i = 0; base < b.kv_end; base += kN, ++i) {
      // Every position of the tile read and seen by every row: no score needs a check.
      const bool whole = !holes && (kFullMask ? full_tiles.Whole(i) : base + kN <= seen_end);
      if (base + kN < b.kv_end) {
        CopyMmaTile<kHeadDim>(p, slot_s[(i + 1) % 4], row_elems, head, k_stage(i + 1), v_stage(i + 1));
      } else {
        CommitSharedCopies();  // an empty group, so that the wait below is for tile i
      }
      WaitSharedCopies<1>();
      if (tid < kN) slot_s[(i + 2) % 4][tid] = next2;
      holes = __syncthreads_or(tid < kN && next1 < 0) != 0;
      next1 = next2;
      // TileSlot is -1 past kv_end.
      next2 = tid < kN ? TileSlot(p, b, base + 3 * kN + tid) : -1;
      compute_tile(i, base, slot_s[i % 4], whole);
    }
  } else {
    // Two stages or one, two block barriers per tile. With two, tile i + 1's copies and tile
    // i + 2's slots are in flight while the block computes on tile i; with one, the copies of
    // tile i come first. Tile i's slots go to slot_s[i % 3] at the top of iteration i - 1
    // (tile 0's before the loop), ahead of its first barrier; the tile's copies read them after
    // that barrier (two stages) or after iteration i's first barrier (one stage), its checks in
    // iteration i; slot_s[i % 3] is written again at the top of iteration i + 2, when every
    // thread is past iteration i.
    if (tid < kN) slot_s[0][tid] = TileSlot(p, b, tid);
    // Whether the tile to compute next has a position that is not read (past kv_end or outside
    // the pool).
    bool holes = __syncthreads_or(tid < kN && slot_s[0][tid] < 0) != 0;
    if (T::kStages > 1 && b.kv_end > 0) {
      CopyMmaTile<kHeadDim>(p, slot_s[0], row_elems, head, k_stage(0), v_stage(0));
    }
    int32_t next_slot = tid < kN ? TileSlot(p, b, kN + tid) : -1;
    for (int32_t base = 0, i = 0; base < b.kv_end; base += kN, ++i) {
      const int32_t* slots = slot_s[i % 3];
      // Every position of the tile read and seen by every row: no score needs a check.
      const bool whole = !holes && (kFullMask ? full_tiles.Whole(i) : base + kN <= seen_end);
      if (tid < kN) slot_s[(i + 1) % 3][tid] = next_slot;
      // Also: every thread is done with tile i - 1, whose stage the copies below overwrite.
      holes = __syncthreads_or(tid < kN && next_slot < 0) != 0;
      if constexpr (T::kStages > 1) {
        if (base + kN < b.kv_end) {
          CopyMmaTile<kHeadDim>(p, slot_s[(i + 1) % 3], row_elems, head, k_stage(i + 1),
                                v_stage(i + 1));
        } else {
          CommitSharedCopies();  // an empty group, so that the wait below is for tile i
        }
        WaitSharedCopies<1>();
      } else {
        CopyMmaTile<kHeadDim>(p, slots, row_elems, head, k_stage(i), v_stage(i));
        WaitSharedCopies<0>();
      }
      // TileSlot is -1 past kv_end.
      next_slot = tid < kN ? TileSlot(p, b, base + 2 * kN + tid) : -1;
      __syncthreads();  // every thread's copies of tile i have landed
      compute_tile(i, base, slots, whole);
    }
  }

  // The sum is >= 1 once a position was seen (the largest score's own weight is 1).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = run_sum[h];
    sum += ATTNMETA_SHFL_XOR(sum, 1);
    sum += ATTNMETA_SHFL_XOR(sum, 2);
    if (q_offset[h] < 0) continue;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    uint16_t* dst = static_cast<uint16_t*>(p.out) + q_offset[h] + 2 * t;
#pragma unroll
    for (int i = 0; i < T::kDimTiles; ++i) {
      *reinterpret_cast<uint32_t*>(dst + 8 * i) = Pack2<Dtype>(o[i][2 * h] * inv, o[i][2 * h + 1] * inv);
    }
    if (t == 0) {
      p.lse[head_row[h]] = sum > 0.0f ? (run_max[h] + log2f(sum)) * kLn2 : NegInf();
    }
  }
}

// The short-query path on the tensor cores (internal/mma_attention.h): a block of
// kMmaBlockWarps warps per (sequence, KV head, chunk of 8 kHalves query vectors), vector v of
// chunk c being query row (8 kHalves c + v) / group and head kv_head * group + (8 kHalves c +
// v) % group of the sequence, so that a row's query heads share the K and V rows they read;
// vectors v + 8h are half h of the score MMA's rows (m-tile h / 2). Chunks of 32 vectors (two
// m-tiles, Q in shared memory) at head dims up to 128 when a sequence has more than 16 vectors:
// each K and V fragment a warp loads then feeds twice the MMAs, where chunks of 16 would read
// the sequence's K and V twice. The warps split the positions the chunk's rows can see, in
// steps of kStep; each score counts when Sees says so, except in a step that every row sees
// whole (the prefix without a FULL mask, or where the FULL mask's bytes admit it): a check per
// score took most of a verify step's instructions (docs/varlen_attention.md). The chunks of
// one (sequence, KV head) are neighbours in launch order: they read the same K and V, which
// the L2 then serves.
template <typename Dtype, int kHeadDim, bool kPortableMma, int kHalves, bool kFullMask>
__global__ void ATTNMETA_LAUNCH_BOUNDS((kMmaBlockWarps<kHeadDim, kHalves> * kLaneGroup), 1)
    VarlenMmaKernel(VarlenAttentionParams p) {
  // Steps of 16 positions from head dim 128 up: the second half's accumulators and the
  // sequence and mask state take the registers that 32 would need.
  constexpr int kStep = kHeadDim >= 128 ? 16 : 32;
  constexpr int kWarps = kMmaBlockWarps<kHeadDim, kHalves>;
  constexpr int kVecs = 8 * kHalves;
  __shared__ internal::WarpStates<kWarps, kVecs, kHeadDim> states;

  const int32_t group = p.num_q_heads / p.num_kv_heads;
  const int32_t chunks = MmaChunks<kHalves>(p);
  const int32_t block = BlockAfterTheKernelAhead();
  int32_t x = block;
  const int32_t chunk = x % chunks;
  x /= chunks;
  const int32_t kv_head = x % p.num_kv_heads;
  const int32_t seq = x / p.num_kv_heads;
  const int tid = static_cast<int>(threadIdx.x);
  ZeroUnclaimedRows(p, block);
  if (block == 0 && tid == 0) CheckQueryRows(p);
  const Sequence s = ResolveSequence(p, seq, tid == 0);
  const int32_t vec0 = chunk * kVecs;
  const int64_t vectors = int64_t{s.q_len} * group;
  if (vec0 >= vectors) return;  // the same for every thread of the block
  // Positions any row of the chunk sees: causal rows stop at their own position.
  const int64_t last_row = (min(vectors, int64_t{vec0} + kVecs) - 1) / group;
  int32_t kv_end = s.kv_len;
  if (s.blind) {
    kv_end = 0;
  } else if (p.mask_layout == kVarlenCausal) {
    kv_end = static_cast<int32_t>(min(int64_t{kv_end}, s.kv_len - s.q_len + last_row + 1));
  }
  const int lane = tid % kLaneGroup;
  const int warp = tid / kLaneGroup;
  const internal::LaneView lv{lane,         lane / 4,       lane % 4,
                              seq,          s.index_base,   0,
                              kv_end,       int64_t{p.num_kv_heads} * kHeadDim,
                              int64_t{kv_head} * kHeadDim};
  // Vectors g + 8h of the chunk.
  int32_t row[kHalves];
  int64_t q_offset[kHalves];
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    const int32_t vec = vec0 + lv.g + 8 * h;
    row[h] = vec / group;
    q_offset[h] = row[h] < s.q_len
                      ? (int64_t{s.q_begin + row[h]} * p.num_q_heads + kv_head * group + vec % group) *
                            kHeadDim
                      : -1;
  }
  internal::WarpSoftmax<kHeadDim, kHalves> sm;
  const float scale = p.softmax_scale * kLog2e;
  const int32_t prefix = s.kv_len - s.q_len;
  const int32_t first_row = vec0 / group;
  const int32_t rows = static_cast<int32_t>(last_row) - first_row + 1;
  __shared__ FullMaskSteps<kFullMask ? kStep : 16> full_steps;  // kFullMask only
  if constexpr (kFullMask) {
    if (!s.blind) BuildFullMaskSteps<kStep, kWarps * kLaneGroup>(s, first_row, rows, full_steps);
  }
  // A loaded position is < kv_end <= kv_len, and the sequence is not blind (kv_end > 0).
  internal::AttendWarpStepsWithQ<Dtype, kHeadDim, kStep, kHalves, kWarps, kPortableMma, false>(
      p, lv, warp, q_offset, scale,
      [&](int32_t base, int h, int nt, int e) {
        return row[h] < s.q_len && Sees(p, s, row[h], base + 8 * nt + 2 * lv.t + e);
      },
      // A vector past the sequence's rows then gets scores too; its state is never written.
      [&](int32_t base) {
        if constexpr (kFullMask) {
          return full_steps.Whole(base / kStep);
        } else {
          return base + kStep <= prefix;  // every row sees the whole prefix
        }
      },
      sm, [] {});

  internal::StoreWarpState(states, warp, lv.g, lv.t, sm);
  __syncthreads();
  internal::CombineWarpStates<kWarps, kVecs, kHeadDim, kWarps * kLaneGroup>(
      states, [&](int v, int d0, const float(&out)[8], float lse) {
        const int32_t r = (vec0 + v) / group;
        if (r >= s.q_len) return;
        const int64_t head_row =
            int64_t{s.q_begin + r} * p.num_q_heads + kv_head * group + (vec0 + v) % group;
        *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + head_row * kHeadDim + d0) =
            make_uint4(Pack2<Dtype>(out[0], out[1]), Pack2<Dtype>(out[2], out[3]),
                       Pack2<Dtype>(out[4], out[5]), Pack2<Dtype>(out[6], out[7]));
        if (d0 == 0) p.lse[head_row] = lse;
      });
}

// Lets kKernel take `bytes` of dynamic shared memory (past the 48 KB a kernel gets without
// asking) on the current device, asking the runtime once per device: the call waits for copies
// in flight, so not on every launch.
template <auto kKernel>
hipError_t AllowDynamicSharedMemory(int bytes) {
  static std::atomic<uint64_t> allowed{0};  // bit d: asked on device d (< 64)
  int device = 0;
  hipError_t err = hipGetDevice(&device);
  if (err != hipSuccess) return err;
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t{1} << device : 0;
  if ((allowed.load(std::memory_order_acquire) & bit) != 0) return hipSuccess;
  err = hipFuncSetAttribute(reinterpret_cast<const void*>(kKernel),
                            hipFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == hipSuccess) allowed.fetch_or(bit, std::memory_order_acq_rel);
  return err;
}

// The FULL-mask kernel apart: its step predicate reads mask bytes, and compiled into one kernel
// with the others' it made them 25-35% slower on verify (docs/varlen_attention.md).
template <typename Dtype, int kHeadDim, int kHalves>
hipError_t LaunchShortQueries(const VarlenAttentionParams& p, bool overlap_preceding,
                              hipStream_t stream) {
  const dim3 blocks(
      static_cast<uint32_t>(int64_t{p.batch_size} * p.num_kv_heads * MmaChunks<kHalves>(p)));
  const dim3 threads(kMmaBlockWarps<kHeadDim, kHalves> * kLaneGroup);
  constexpr auto kFull =
      VarlenMmaKernel<Dtype, kHeadDim, /*kPortableMma=*/false, kHalves, /*kFullMask=*/true>;
  constexpr auto kOther =
      VarlenMmaKernel<Dtype, kHeadDim, /*kPortableMma=*/false, kHalves, /*kFullMask=*/false>;
  return LaunchKernelAfterPreceding(overlap_preceding,
                                    p.mask_layout == kVarlenMaskFull ? kFull : kOther, blocks,
                                    threads, 0, stream, p);
}

template <typename Dtype, int kHeadDim>
hipError_t Launch(const VarlenAttentionParams& p, bool overlap_preceding, hipStream_t stream) {
  if (p.vector_chunks > 0) {
    // Two chunks a block as VarlenChunksPerBlock says (the grid the launcher checked); the
    // two-chunk kernel is not compiled for head dim 256.
    if constexpr (kHeadDim <= 128) {
      if (VarlenChunksPerBlock(kHeadDim, p.vector_chunks) == 2) {
        return LaunchShortQueries<Dtype, kHeadDim, 4>(p, overlap_preceding, stream);
      }
    }
    return LaunchShortQueries<Dtype, kHeadDim, 2>(p, overlap_preceding, stream);
  }
  const dim3 blocks(static_cast<uint32_t>(int64_t{p.batch_size} * p.q_tiles *
                                          (p.num_q_heads / p.heads_per_block)));
  if (p.tiled_tensor_cores != 0) {
    // The FULL-mask kernel apart, as on the short-query path: its bitmap of whole tiles cost
    // causal extend 1-3% compiled into the kernel that runs it (docs/varlen_attention.md).
    using T = MmaTiling<kHeadDim>;
    constexpr auto kFull = VarlenTiledMmaKernel<Dtype, kHeadDim, /*kFullMask=*/true>;
    constexpr auto kOther = VarlenTiledMmaKernel<Dtype, kHeadDim, /*kFullMask=*/false>;
    const bool full = p.mask_layout == kVarlenMaskFull;
    const hipError_t err = full ? AllowDynamicSharedMemory<kFull>(T::kSharedBytes)
                                : AllowDynamicSharedMemory<kOther>(T::kSharedBytes);
    if (err != hipSuccess) return err;
    return LaunchKernelAfterPreceding(overlap_preceding, full ? kFull : kOther, blocks,
                                      dim3(T::kThreads), T::kSharedBytes, stream, p);
  }
  return LaunchKernelAfterPreceding(overlap_preceding, VarlenAttentionKernel<Dtype, kHeadDim>,
                                    blocks, dim3(kCudaCoreThreads), 0, stream, p);
}

template <typename Dtype>
hipError_t ByHeadDim(const VarlenAttentionParams& p, bool overlap_preceding, hipStream_t stream) {
  switch (p.head_dim) {
    case 64:
      return Launch<Dtype, 64>(p, overlap_preceding, stream);
    case 128:
      return Launch<Dtype, 128>(p, overlap_preceding, stream);
    case 256:
      return Launch<Dtype, 256>(p, overlap_preceding, stream);
  }
  return hipErrorInvalidValue;
}

}  // namespace

hipError_t LaunchVarlenAttentionKernel(const VarlenAttentionParams& p, bool overlap_preceding,
                                       hipStream_t stream) {
  switch (p.dtype) {
    case kElementBf16:
      return ByHeadDim<Bf16>(p, overlap_preceding, stream);
    case kElementFp16:
      return ByHeadDim<Fp16>(p, overlap_preceding, stream);
  }
  return hipErrorInvalidValue;
}

}  // namespace kernels
}  // namespace attnmeta
