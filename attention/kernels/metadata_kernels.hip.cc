#include "attention/kernels/metadata_kernels_launch.h"

#include <algorithm>

#include "attention/kernels/internal/block_reduce.h"
#include "attention/kernels/internal/violation_recorder.h"

namespace attnmeta {
namespace kernels {
namespace {

// Every kernel here starts with WaitForPrecedingGrid (it may be launched to overlap the kernel
// ahead) and reads global memory with plain loads only, which the wait orders. A read-only
// load (__ldg, LoadReadOnceGlobal16) must take its address from an OpaqueAfter value after
// the wait (hip_port.h), or the compiler may move it above the wait.

constexpr int kThreads = kMetadataThreads;
// A pass of a kernel with kTokensPerPass and blocks of kBlock threads: kGroupUnroll groups
// of 4 tokens per thread.
template <int32_t kTokensPerPass, int kBlock>
constexpr int kGroupUnroll = kTokensPerPass / (4 * kBlock);
static_assert(kGroupUnroll<kTokenKvIndicesTokensPerPass, kTokenKvIndicesThreads> >= 1 &&
                  kGroupUnroll<kFusedMetadataTokensPerPass, kFusedMetadataThreads> >= 1,
              "a pass gives every thread whole groups of 4 tokens");
// Page-table columns per thread and pass in the fused kernel.
constexpr int kFusedPageTableUnroll = kFusedMetadataPageTableColumnsPerPass / kFusedMetadataThreads;
constexpr int64_t kInt32Max = 2147483647;
constexpr int kIndptrThreads = 1024;
constexpr int kGatherThreads = 128;
constexpr int kPageTableUnroll = kPageTableColumnsPerPass / kPageTableThreads;
// A launch's rows are blocks along the grid's x dimension (metadata_kernels.h).
static_assert(kMaxMetadataRows * std::max({kThreads, kTokenKvIndicesThreads, kFusedMetadataThreads,
                                           kPageTableThreads}) <=
                  (int64_t{1} << 31),
              "a grid of kMaxMetadataRows rows stays within 2^31 threads along x");

__device__ inline int64_t Clamp(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// A request's row, checked: the row's first slot, or null for a padded row (where the
// kernel's batch may hold one) and for a row outside the table (recorded).
__device__ inline const int32_t* RowSlots(const SlotSource& s, int32_t row, int64_t request,
                                          DeviceViolation* v, bool padded_allowed = true) {
  if (row == kPaddedRow && padded_allowed) return nullptr;
  if (row < 0 || row >= s.max_reqs) {
    RecordViolation(v, kRowOutsideTable, request, row, s.max_reqs);
    return nullptr;
  }
  return s.req_to_token + row * s.stride;
}

// A KV length clamped to [0, limit], recording what was clamped.
__device__ inline int64_t CheckedLength(int64_t len, int64_t limit, int64_t request,
                                        DeviceViolation* v) {
  if (len < 0) {
    RecordViolation(v, kLengthNegative, request, len, 0);
    return 0;
  }
  if (len > limit) {
    RecordViolation(v, kLengthPastRow, request, len, limit);
    return limit;
  }
  return len;
}

// A slot read from a row, checked against the pool: itself, or (recorded) the padding page's
// slot of token t.
__device__ inline int32_t CheckedSlot(const SlotSource& s, int32_t slot, int32_t t, int64_t request,
                                      DeviceViolation* v) {
  // One unsigned compare catches negative slots too (pool_slots <= 2^31).
  if (s.pool_slots > 0 && static_cast<uint32_t>(slot) >= static_cast<uint64_t>(s.pool_slots)) {
    RecordViolation(v, kSlotOutsidePool, request, slot, s.pool_slots);
    return t % s.page_size;
  }
  return slot;
}

// A row's tokens as the copy loads them: `head` tokens (< 4) until the source is 16-byte
// aligned, then `groups` groups of 4 tokens, each one 16-byte load, then the tail (< 4
// tokens). The head and tail tokens are copied one by one by the first pass (of blockIdx.y 0).
// Aligning the loads to the source, not the destination, lets the fused kernel issue its first
// pass's loads before it knows where the row lands in kv_indices.
struct RowFrame {
  int32_t n;       // tokens of the row read (loads stay below it)
  int32_t head;    // <= n
  int32_t groups;  // (n - head) / 4
};

// The frame of n tokens at src (4-byte aligned; null: computed padding slots, no head).
__device__ inline RowFrame FrameOf(const int32_t* src, int32_t n) {
  const int32_t misaligned = static_cast<int32_t>(reinterpret_cast<uintptr_t>(src) >> 2) & 3;
  const int32_t head = (4 - misaligned) & 3;
  const int32_t h = head < n ? head : n;
  return {n, h, (n - h) >> 2};
}

// The passes of kUnroll groups per thread of kBlock threads that cover a row's frame (pass 0
// also takes its head and tail).
template <int kUnroll, int kBlock>
__device__ inline int32_t RowPasses(const RowFrame& f) {
  return f.groups > 0 ? (f.groups + kUnroll * kBlock - 1) / (kUnroll * kBlock) : 1;
}

// One pass of a row's groups, loaded before any is checked or stored: thread x of pass k
// takes groups (k * kUnroll + u) * kBlock + x, u < kUnroll, and in pass 0 also one
// head or tail token. 32-bit indices: a row holds fewer than 2^31 slots.
template <int kUnroll, int kBlock>
struct Pass {
  int32_t g0;      // the thread's first group
  int32_t edge_t;  // its head or tail token, or -1
  int32_t slot[kUnroll][4];
  int32_t edge_slot;
};

template <int kUnroll, int kBlock>
__device__ inline Pass<kUnroll, kBlock> BeginPass(const RowFrame& f, int32_t pass_index) {
  Pass<kUnroll, kBlock> pass;
  pass.g0 = pass_index * kUnroll * kBlock + static_cast<int32_t>(threadIdx.x);
  pass.edge_t = -1;
  if (pass_index == 0) {
    const int32_t x = static_cast<int32_t>(threadIdx.x);
    const int32_t tail_begin = f.head + 4 * f.groups;
    if (x < f.head) {
      pass.edge_t = x;
    } else if (x - f.head < f.n - tail_begin) {
      pass.edge_t = tail_begin + x - f.head;
    }
  }
  return pass;
}

// Loads the pass's slots (the row's, or the padding page's for a null row).
template <int kUnroll, int kBlock>
__device__ inline void LoadPass(const SlotSource& s, const int32_t* src, const RowFrame& f,
                                Pass<kUnroll, kBlock>& pass) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int32_t g = pass.g0 + u * kBlock;
    if (g >= f.groups) continue;
    const int32_t t0 = f.head + 4 * g;
    if (src != nullptr) {
      const int4 x = *reinterpret_cast<const int4*>(src + t0);
      pass.slot[u][0] = x.x;
      pass.slot[u][1] = x.y;
      pass.slot[u][2] = x.z;
      pass.slot[u][3] = x.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) pass.slot[u][j] = (t0 + j) % s.page_size;
    }
  }
  if (pass.edge_t >= 0) {
    pass.edge_slot = src != nullptr ? src[pass.edge_t] : pass.edge_t % s.page_size;
  }
}

// Four slots to dst[0..3] with the widest stores dst's alignment allows.
__device__ inline void StoreGroup(int32_t* dst, const int32_t (&x)[4]) {
  switch ((reinterpret_cast<uintptr_t>(dst) >> 2) & 3) {
    case 0:
      *reinterpret_cast<int4*>(dst) = make_int4(x[0], x[1], x[2], x[3]);
      break;
    case 2:
      reinterpret_cast<int2*>(dst)[0] = make_int2(x[0], x[1]);
      reinterpret_cast<int2*>(dst)[1] = make_int2(x[2], x[3]);
      break;
    default:  // dst + 1 is 8-byte aligned
      dst[0] = x[0];
      *reinterpret_cast<int2*>(dst + 1) = make_int2(x[1], x[2]);
      dst[3] = x[3];
  }
}

// Token t's slot, checked against the pool for a real row.
__device__ inline int32_t CheckedToken(const SlotSource& s, bool real_row, int32_t slot, int32_t t,
                                       int64_t request, DeviceViolation* v) {
  return real_row ? CheckedSlot(s, slot, t, request, v) : slot;
}

// The page-table entry of token t when it starts a page below pages_below (power-of-two page
// sizes): its page, or the padding page for a padded row.
__device__ inline void StorePageOf(const SlotSource& s, bool real_row, int32_t slot, int32_t t,
                                   int32_t* pages, int32_t pages_below) {
  if (t < pages_below && (t & (s.page_size - 1)) == 0) {
    pages[t >> s.page_size_log2] = real_row ? slot >> s.page_size_log2 : 0;
  }
}

// Stores the pass's tokens below n (<= f.n): dst[t] = the checked slot, and the page-table
// entries of the tokens below pages_below (StorePageOf); with page size 1 a group's entries
// are its slots, stored as one group (scattered 4-byte stores ran the fused kernel at 60% of
// the copy instead of 93% on the H200). A whole group of slots inside the pool, the common
// case, takes one branch (four unsigned compares; their maximum instead cost the fused kernel
// a spill), and with page sizes of 4 or more at most one of its tokens starts a page; the
// per-token path is for the rest.
template <int kUnroll, int kBlock>
__device__ inline void StorePass(const SlotSource& s, bool real_row, Pass<kUnroll, kBlock>& pass,
                                 const RowFrame& f, int32_t n, int32_t* dst, int32_t* pages,
                                 int32_t pages_below, int64_t request, DeviceViolation* v) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int32_t g = pass.g0 + u * kBlock;
    if (g >= f.groups) continue;
    const int32_t t0 = f.head + 4 * g;
    if (t0 >= n) continue;
    int32_t(&x)[4] = pass.slot[u];
    const bool whole = t0 + 4 <= n;
    // Unsigned compares catch negative slots too (pool_slots <= 2^31).
    const uint32_t pool = static_cast<uint32_t>(s.pool_slots);
    const bool in_pool =
        !real_row || s.pool_slots == 0 ||
        (static_cast<uint32_t>(x[0]) < pool && static_cast<uint32_t>(x[1]) < pool &&
         static_cast<uint32_t>(x[2]) < pool && static_cast<uint32_t>(x[3]) < pool);
    if (!whole || !in_pool) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (t0 + j < n) x[j] = CheckedToken(s, real_row, x[j], t0 + j, request, v);
      }
    }
    if (whole) {
      StoreGroup(dst + t0, x);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (t0 + j < n) dst[t0 + j] = x[j];
      }
    }
    if (t0 >= pages_below) continue;
    if (s.page_size == 1 && t0 + 4 <= pages_below) {
      if (real_row) {
        StoreGroup(pages + t0, x);
      } else {
        StoreGroup(pages + t0, {0, 0, 0, 0});
      }
    } else if (s.page_size >= 4) {
      // The group's first token at a page start (pages_below > 0 only for power-of-two page
      // sizes), if it has one.
      const int32_t t = (t0 + s.page_size - 1) & -s.page_size;
      if (t < t0 + 4 && t < pages_below) {
        const int32_t j = t - t0;
        const int32_t slot = j == 0 ? x[0] : (j == 1 ? x[1] : (j == 2 ? x[2] : x[3]));
        pages[t >> s.page_size_log2] = real_row ? slot >> s.page_size_log2 : 0;
      }
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) StorePageOf(s, real_row, x[j], t0 + j, pages, pages_below);
    }
  }
  if (pass.edge_t >= 0 && pass.edge_t < n) {
    const int32_t slot = CheckedToken(s, real_row, pass.edge_slot, pass.edge_t, request, v);
    dst[pass.edge_t] = slot;
    StorePageOf(s, real_row, slot, pass.edge_t, pages, pages_below);
  }
}

// dst[t] = slot of token t of src for t < n (<= f.n) for this block's passes k, k + k_step,
// ... below k_end (<= RowPasses), the first of which `pass` holds loaded (BeginPass,
// LoadPass); page-table entries from the same loads below pages_below (see StorePass).
// kLoadAhead issues the next pass's loads before this one's stores, two loads in flight per
// thread for a kernel whose blocks loop over many passes (the fused kernel), at the cost of
// the registers that hold them. (Two passes ahead, at 48 registers and 10 blocks per
// multiprocessor, was no better on the H200: 1024 x 32768 page size 1 113.6 against 116.2
// us, 64 x 131072 24.0 against 23.3, the rest within 2%.)
template <int kUnroll, int kBlock, bool kLoadAhead>
__device__ inline void CopySlots(const SlotSource& s, const int32_t* src, const RowFrame& f,
                                 Pass<kUnroll, kBlock> pass, int32_t k, int32_t k_end,
                                 int32_t k_step, int32_t* dst, int32_t n, int32_t* pages,
                                 int32_t pages_below, int64_t request, DeviceViolation* v) {
  for (;;) {
    const int32_t next = k + k_step;
    const bool more = next < k_end;
    Pass<kUnroll, kBlock> ahead;
    if (kLoadAhead && more) {
      ahead = BeginPass<kUnroll, kBlock>(f, next);
      LoadPass(s, src, f, ahead);
    }
    StorePass(s, src != nullptr, pass, f, n, dst, pages, pages_below, request, v);
    if (!more) return;
    if (kLoadAhead) {
      pass = ahead;
    } else {
      pass = BeginPass<kUnroll, kBlock>(f, next);
      LoadPass(s, src, f, pass);
    }
    k = next;
  }
}

// 32-bit page arithmetic (a row holds fewer than 2^31 tokens), with shifts for power-of-two
// page sizes: 64-bit division costs more instructions than a metadata kernel's per-token work.
__device__ inline int32_t PagesCeil(int32_t tokens, const SlotSource& s) {
  return s.page_size_log2 >= 0 ? (tokens + s.page_size - 1) >> s.page_size_log2
                               : (tokens + s.page_size - 1) / s.page_size;
}

__device__ inline int32_t LastPageLen(int32_t len, const SlotSource& s) {
  if (len == 0) return 0;
  return (s.page_size_log2 >= 0 ? (len - 1) & (s.page_size - 1) : (len - 1) % s.page_size) + 1;
}

// Columns [first, cols) of row i of the page table: the page of token j * page_size for the
// first ceil(len / page_size) columns, the padding page after them; this block's share over
// gridDim.y blocks (passes of kBlock * Unroll columns), loads first as in CopySlots. Each
// load is a sector of its own (one slot per page), so the standalone kernel keeps more in
// flight than the token copy does.
template <int Unroll, int kBlock>
__device__ inline void WritePageTableRow(const SlotSource& s, const int32_t* row, int32_t len,
                                         int32_t* out, int32_t first, int32_t cols, int64_t request,
                                         DeviceViolation* v) {
  constexpr int32_t kPerPass = kBlock * Unroll;
  int32_t pages = PagesCeil(len, s);
  if (pages > cols) {
    if (blockIdx.y == 0 && threadIdx.x == 0) RecordViolation(v, kPagesPastTable, request, pages, cols);
    pages = cols;
  }
  if (first >= cols) return;
  for (int32_t j0 = first + blockIdx.y * kPerPass + threadIdx.x; j0 < cols;
       j0 += gridDim.y * kPerPass) {
    int32_t slot[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
      const int32_t j = j0 + u * kBlock;
      slot[u] = (row != nullptr && j < pages) ? row[static_cast<int64_t>(j) * s.page_size] : -1;
    }
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
      const int32_t j = j0 + u * kBlock;
      if (j >= cols) continue;
      int32_t page = 0;
      if (row != nullptr && j < pages) {
        if (s.pool_slots > 0 && static_cast<uint32_t>(slot[u]) >= static_cast<uint64_t>(s.pool_slots)) {
          RecordViolation(v, kSlotOutsidePool, request, slot[u], s.pool_slots);
        } else {
          page = s.page_size_log2 >= 0 ? slot[u] >> s.page_size_log2 : slot[u] / s.page_size;
        }
      }
      out[j] = page;
    }
  }
}

__global__ void __launch_bounds__(kIndptrThreads) IndptrKernel(IndptrParams p) {
  WaitForPrecedingGrid();  // launched to overlap the kernel ahead: before any read
  AllowDependentGridLaunch();
  __shared__ internal::BlockScratch<kIndptrThreads> scratch;
  int64_t carry = 0;
  if (threadIdx.x == 0) p.indptr[0] = 0;
  for (int32_t k0 = 0; k0 < p.n; k0 += kIndptrThreads) {
    const int32_t k = k0 + threadIdx.x;
    int64_t len = 0;
    if (k < p.n) {
      len = p.lens[k];
      if (len < 0) {
        RecordViolation(p.violation, kLengthNegative, k, len, 0);
        len = 0;
      }
      if (p.last_page_len != nullptr) {
        p.last_page_len[k] = len == 0 ? 0 : static_cast<int32_t>(len - 1) % p.page_size + 1;
      }
    }
    int64_t block_total = 0;
    const int64_t end = carry + internal::BlockInclusiveScan<kIndptrThreads>(len, scratch, &block_total);
    if (k < p.n) {
      if (end > kInt32Max) RecordViolation(p.violation, kTotalPastInt32, k, end, kInt32Max);
      p.indptr[k + 1] = static_cast<int32_t>(Clamp(end, 0, kInt32Max));
    }
    carry += block_total;
  }
}

__global__ void __launch_bounds__(kPageTableThreads) PageTableKernel(PageTableParams p) {
  WaitForPrecedingGrid();  // launched to overlap the kernel ahead: before any read
  AllowDependentGridLaunch();
  const int32_t i = blockIdx.x;
  const int32_t* row = RowSlots(p.src, p.rows[i], i, p.violation);
  const int64_t len = CheckedLength(p.kv_lens[i], p.src.stride, i, p.violation);
  WritePageTableRow<kPageTableUnroll, kPageTableThreads>(p.src, row, static_cast<int32_t>(len),
                                                         p.page_table + int64_t{i} * p.cols, 0,
                                                         p.cols, i, p.violation);
}

__global__ void __launch_bounds__(kTokenKvIndicesThreads)
    TokenKvIndicesKernel(TokenKvIndicesParams p) {
  WaitForPrecedingGrid();  // launched to overlap the kernel ahead: before any read
  AllowDependentGridLaunch();
  const int32_t i = blockIdx.x;
  const int64_t begin = p.kv_indptr[i];
  const int64_t end = p.kv_indptr[i + 1];
  if (begin < 0 || end < begin) {
    if (blockIdx.y == 0 && threadIdx.x == 0) {
      if (begin < 0) {
        RecordViolation(p.violation, kOffsetNegative, i, begin, 0);
      } else {
        RecordViolation(p.violation, kIndptrDecreasing, i + 1, end, begin);
      }
    }
    return;
  }
  int64_t start = p.kv_start_idx != nullptr ? p.kv_start_idx[i] : 0;
  // A start outside the row is recorded, and the sequence's entries are written as the padding
  // page's slots, as for a row outside the table.
  const bool start_in_row = start >= 0 && start <= p.src.stride;
  if (!start_in_row) {
    if (blockIdx.y == 0 && threadIdx.x == 0) {
      RecordViolation(p.violation, kStartOutsideRow, i, start, p.src.stride);
    }
    start = 0;
  }
  int64_t len = CheckedLength(end - begin, p.src.stride - start, i, p.violation);
  if (begin + len > p.kv_indices_capacity) {
    RecordViolation(p.violation, kTotalPastCapacity, i, begin + len, p.kv_indices_capacity);
    len = begin < p.kv_indices_capacity ? p.kv_indices_capacity - begin : 0;
  }
  // A row outside the table (-1 included: this batch has no padded rows) is recorded and
  // written as the padding page.
  const int32_t* row =
      start_in_row ? RowSlots(p.src, p.rows[i], i, p.violation, /*padded_allowed=*/false) : nullptr;
  const int32_t* src = row == nullptr ? nullptr : row + start;
  const RowFrame f = FrameOf(src, static_cast<int32_t>(len));
  // One pass per block when the grid covers max_kv_len: no load ahead (its registers would
  // cost the kernel occupancy for nothing).
  constexpr int kBlock = kTokenKvIndicesThreads;
  constexpr int kUnroll = kGroupUnroll<kTokenKvIndicesTokensPerPass, kBlock>;
  const int32_t k = static_cast<int32_t>(blockIdx.y);
  Pass<kUnroll, kBlock> pass = BeginPass<kUnroll, kBlock>(f, k);
  LoadPass(p.src, src, f, pass);
  CopySlots<kUnroll, kBlock, /*kLoadAhead=*/false>(
      p.src, src, f, pass, k, RowPasses<kUnroll, kBlock>(f), static_cast<int32_t>(gridDim.y),
      p.kv_indices + begin, f.n, nullptr, 0, i, p.violation);
}

// 8 blocks per multiprocessor at 8 tokens per thread, 64 registers, no spills: with 4 per
// thread it ran 10 (48 registers; held to 40, 12 blocks, ptxas spilled 56 bytes and 1024 x 4096
// took 7% longer, gpu_metadata_kernels.md).
__global__ void ATTNMETA_LAUNCH_BOUNDS(kFusedMetadataThreads, 8)
    FusedMetadataKernel(FusedMetadataParams p) {
  constexpr int kBlock = kFusedMetadataThreads;
  __shared__ internal::BlockScratch<kBlock> scratch;
  // Launched to overlap the kernel ahead, the block waits for it before it reads anything:
  // the staged rows and lengths and req_to_token are what kernels ahead write. Its loads are
  // plain ones, which the wait orders; the row and share pass through OpaqueAfter too, so
  // that a read-only load added to the helpers later still cannot move above the wait. A
  // kernel launched to overlap this one may start once every block of this grid has started;
  // its blocks then wait in the slots this grid leaves free.
  WaitForPrecedingGrid();
  AllowDependentGridLaunch();
  const int32_t i = static_cast<int32_t>(OpaqueAfter(int64_t{blockIdx.x}));
  const int32_t block_y = static_cast<int32_t>(OpaqueAfter(int64_t{blockIdx.y}));
  const bool first_pass = block_y == 0;
  DeviceViolation* v = p.violation;
  // Where this row starts: the clamped lengths of the rows before it, summed by every block
  // so that one launch suffices. The lengths of the first kRowsAhead of those rows are loaded
  // ahead of the row's own loads: they return while the first pass's slots are in flight,
  // and only the rows past them add a round trip after those (2-5% of the launch at bs 1024 x
  // 1k and x 4k on the H200; gpu_metadata_kernels.md).
  constexpr int kLengthsAhead = 2;
  constexpr int32_t kRowsAhead = kLengthsAhead * kBlock;
  int32_t kv_ahead[kLengthsAhead], q_ahead[kLengthsAhead];
#pragma unroll
  for (int u = 0; u < kLengthsAhead; ++u) {
    const int32_t r = static_cast<int32_t>(threadIdx.x) + u * kBlock;
    kv_ahead[u] = r < i ? p.kv_lens[r] : 0;
    q_ahead[u] = first_pass && r < i ? p.q_lens[r] : 0;
  }
  const int32_t* row = RowSlots(p.src, p.rows[i], i, v);
  const int64_t len = CheckedLength(p.kv_lens[i], p.src.stride, i, v);
  // The first pass's loads do not depend on where the row lands in kv_indices: they are issued
  // before the block sums the lengths before its row, and wait in registers.
  const RowFrame f = FrameOf(row, static_cast<int32_t>(len));
  constexpr int kUnroll = kGroupUnroll<kFusedMetadataTokensPerPass, kBlock>;
  // The row's passes in contiguous shares, one per block: a 32-byte sector that two passes
  // share is then finished by the same block moments later. A grid-stride split left it
  // half written in L2 until a block of the next wave wrote the other half: with rows at
  // every alignment (1024 x 32767 on the H200) DRAM read 143 MB instead of 135 and the
  // launch took 104 us instead of 88.
  const int32_t row_passes = RowPasses<kUnroll, kBlock>(f);
  const int32_t share =
      (row_passes + static_cast<int32_t>(gridDim.y) - 1) / static_cast<int32_t>(gridDim.y);
  const int32_t k = block_y * share;
  // A block past the row's tokens and the table's columns (a wide table, a short row) has
  // nothing to write: it skips the sum below.
  if (!first_pass && k >= row_passes &&
      (p.page_table == nullptr ||
       block_y * kFusedMetadataPageTableColumnsPerPass >= p.page_table_cols)) {
    return;
  }
  Pass<kUnroll, kBlock> pass = BeginPass<kUnroll, kBlock>(f, k);
  LoadPass(p.src, row, f, pass);

  // The sum. Its clamps are 32-bit (the lengths are int32): with thousands of rows its
  // instructions, repeated by every block, are most of the launch's.
  const int32_t len_limit =
      static_cast<int32_t>(p.src.stride < kInt32Max ? p.src.stride : kInt32Max);
  int64_t kv_before = 0, q_before = 0;
  auto add_row = [&](int32_t kv_len, int32_t q_len) {
    const int32_t k = min(max(kv_len, 0), len_limit);
    kv_before += k;
    q_before += first_pass ? min(max(q_len, 0), k) : 0;
  };
#pragma unroll
  for (int u = 0; u < kLengthsAhead; ++u) add_row(kv_ahead[u], q_ahead[u]);
  for (int32_t r = static_cast<int32_t>(threadIdx.x) + kRowsAhead; r < i; r += kBlock) {
    add_row(p.kv_lens[r], first_pass ? p.q_lens[r] : 0);
  }
  internal::BlockSum2Once<kBlock>(kv_before, q_before, scratch);

  int64_t q = p.q_lens[i];
  if (q < 0 || q > len) {
    RecordViolation(v, q < 0 ? kLengthNegative : kQueryPastKv, i, q, len);
    q = Clamp(q, 0, len);
  }
  if (first_pass && threadIdx.x == 0) {
    if (i == 0) {
      p.kv_indptr[0] = 0;
      p.qo_indptr[0] = 0;
    }
    if (kv_before + len > kInt32Max) {
      RecordViolation(v, kTotalPastInt32, i, kv_before + len, kInt32Max);
    }
    p.kv_indptr[i + 1] = static_cast<int32_t>(Clamp(kv_before + len, 0, kInt32Max));
    p.qo_indptr[i + 1] = static_cast<int32_t>(Clamp(q_before + q, 0, kInt32Max));
    p.kv_last_page_len[i] = LastPageLen(static_cast<int32_t>(len), p.src);
  }
  int64_t writable = len;
  if (kv_before + len > p.kv_indices_capacity) {
    RecordViolation(v, kTotalPastCapacity, i, kv_before + len, p.kv_indices_capacity);
    writable = kv_before < p.kv_indices_capacity ? p.kv_indices_capacity - kv_before : 0;
  }
  int32_t* pt_row = p.page_table != nullptr ? p.page_table + int64_t{i} * p.page_table_cols : nullptr;
  // With a power-of-two page size the page-table entries of the tokens copied come from the
  // same loads; the page-table pass then writes the columns past them (padding, or pages past
  // a clamped capacity), or every column for other page sizes.
  const int64_t table_tokens = int64_t{p.page_table_cols} * p.src.page_size;
  const int64_t shared = pt_row != nullptr && p.src.page_size_log2 >= 0
                             ? (writable < table_tokens ? writable : table_tokens)
                             : 0;
  int32_t* dst = p.kv_indices + kv_before;
  const int32_t k_end = k + share < row_passes ? k + share : row_passes;
  CopySlots<kUnroll, kBlock, /*kLoadAhead=*/true>(p.src, row, f, pass, k, k_end, 1, dst,
                                                  static_cast<int32_t>(writable), pt_row,
                                                  static_cast<int32_t>(shared), i, v);
  if (pt_row != nullptr) {
    WritePageTableRow<kFusedPageTableUnroll, kBlock>(p.src, row, static_cast<int32_t>(len), pt_row,
                                                     PagesCeil(static_cast<int32_t>(shared), p.src),
                                                     p.page_table_cols, i, v);
  }
}

__global__ void __launch_bounds__(kThreads) TreeMaskKernel(TreeMaskParams p) {
  WaitForPrecedingGrid();  // launched to overlap the kernel ahead: before any read
  AllowDependentGridLaunch();
  __shared__ internal::BlockScratch<kThreads> scratch;
  const int32_t i = blockIdx.x;
  DeviceViolation* v = p.violation;
  auto lengths = [&](int32_t k, int64_t* q, int64_t* kv) {
    *kv = p.kv_lens[k] < 0 ? 0 : p.kv_lens[k];
    *q = Clamp(p.q_lens[k], 0, *kv);
  };
  // A padded row (rows given and rows[k] == kPaddedRow) has no tree rows.
  auto padded = [&](int32_t k) { return p.rows != nullptr && p.rows[k] == kPaddedRow; };
  // A thread's sums saturate at 2^53 bytes, past any buffer: a block of corrupted lengths near
  // INT32_MAX holds 2^62 bytes, and three of them wrapped an unsaturated sum below the
  // capacity checks. The block's sum is then at most kThreads * 2^53, and adding one more
  // block's bytes stays below 2^63.
  constexpr int64_t kSumCap = int64_t{1} << 53;
  int64_t mask_before = 0, tree_before = 0;
  for (int32_t k = threadIdx.x; k < i; k += kThreads) {
    int64_t q, kv;
    lengths(k, &q, &kv);
    const int64_t m = mask_before + q * kv;
    const int64_t t = tree_before + (padded(k) ? 0 : q * q);
    mask_before = m < kSumCap ? m : kSumCap;
    tree_before = t < kSumCap ? t : kSumCap;
  }
  internal::BlockSum2<kThreads>(mask_before, tree_before, scratch);
  int64_t q, kv;
  lengths(i, &q, &kv);
  if (p.kv_lens[i] < 0) RecordViolation(v, kLengthNegative, i, p.kv_lens[i], 0);
  if (p.q_lens[i] < 0) RecordViolation(v, kLengthNegative, i, p.q_lens[i], 0);
  if (p.q_lens[i] > kv) RecordViolation(v, kQueryPastKv, i, p.q_lens[i], kv);
  if (blockIdx.y == 0 && threadIdx.x == 0) {
    if (i == 0) p.mask_indptr[0] = 0;
    p.mask_indptr[i + 1] = mask_before + q * kv;
  }
  int64_t bytes = q * kv;
  if (mask_before + bytes > p.mask_capacity) {
    RecordViolation(v, kTotalPastCapacity, i, mask_before + bytes, p.mask_capacity);
    bytes = mask_before < p.mask_capacity ? p.mask_capacity - mask_before : 0;
  }
  uint8_t* out = p.mask + mask_before;
  if (padded(i)) {
    // It sees all of its KV, every token a padding slot (the host writer's block).
    for (int64_t e = int64_t{blockIdx.y} * kThreads + threadIdx.x; e < bytes;
         e += int64_t{gridDim.y} * kThreads) {
      out[e] = 1;
    }
    return;
  }
  const bool tree_ok = tree_before + q * q <= p.tree_capacity;
  if (!tree_ok) RecordViolation(v, kTotalPastCapacity, i, tree_before + q * q, p.tree_capacity);
  const int64_t prefix = kv - q;
  const uint8_t* tree = p.tree + tree_before;
  for (int64_t e = int64_t{blockIdx.y} * kThreads + threadIdx.x; e < bytes;
       e += int64_t{gridDim.y} * kThreads) {
    const int64_t r = e / kv, c = e % kv;
    out[e] = c < prefix ? 1 : (tree_ok ? tree[r * q + (c - prefix)] : 0);
  }
}

template <typename Word>
__global__ void __launch_bounds__(kGatherThreads) GatherKvKernel(GatherKvParams p) {
  WaitForPrecedingGrid();  // launched to overlap the kernel ahead: before any read
  AllowDependentGridLaunch();
  int64_t total = p.cu_k[p.batch_size];
  const int64_t rows_ok = p.tok_capacity < p.out_rows ? p.tok_capacity : p.out_rows;
  if (total < 0 || total > rows_ok) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      RecordViolation(p.violation, kTotalPastCapacity, p.batch_size, total, rows_ok);
    }
    total = Clamp(total, 0, rows_ok);
  }
  // lanes_per_row threads copy a row; a block moves kGatherThreads / lanes_per_row rows at once,
  // so that short rows (one head of 256) still keep every thread busy.
  const int32_t lanes = p.lanes_per_row;
  const int32_t rows_per_block = kGatherThreads / lanes;
  const int32_t lane = threadIdx.x % lanes;
  const int64_t words = p.row_bytes / static_cast<int64_t>(sizeof(Word));
  for (int64_t r = int64_t{blockIdx.x} * rows_per_block + threadIdx.x / lanes; r < total;
       r += int64_t{gridDim.x} * rows_per_block) {
    const int64_t slot = p.tok_idx[r];
    const bool ok = slot >= 0 && slot < p.pool_slots;
    if (!ok && lane == 0) RecordViolation(p.violation, kSlotOutsidePool, r, slot, p.pool_slots);
    const Word* k = reinterpret_cast<const Word*>(p.k_pool + slot * p.row_bytes);
    const Word* v = reinterpret_cast<const Word*>(p.v_pool + slot * p.row_bytes);
    Word* ko = reinterpret_cast<Word*>(p.k_out + r * p.row_bytes);
    Word* vo = reinterpret_cast<Word*>(p.v_out + r * p.row_bytes);
    for (int64_t w = lane; w < words; w += lanes) {
      const Word kw = ok ? k[w] : Word{};
      const Word vw = ok ? v[w] : Word{};
      ko[w] = kw;
      vo[w] = vw;
    }
  }
}

struct alignas(16) Word16 {
  uint32_t x, y, z, w;
};


// DraftSourcePosition of draft_decode_layout.h.
__device__ inline int64_t DraftSource(int64_t len, int32_t branch, const DraftStepParams& p) {
  const int64_t ps = p.src.page_size;
  if (ps == 1 || p.topk == 1) return len + int64_t{branch} * p.steps;
  const int64_t pages_per_branch = (len % ps + p.steps + ps - 1) / ps;
  return (len / ps) * ps + int64_t{branch} * pages_per_branch * ps + len % ps;
}

// A draft branch's request row and committed length, checked: row is null for a padded request
// and for one whose row, length or draft positions break their bounds (recorded).
struct DraftBranch {
  const int32_t* row;
  int64_t len;     // the committed length (the padded KV length for a padded request)
  int64_t source;  // where its draft slots start in the row
};
__device__ inline DraftBranch LoadDraftBranch(const DraftStepParams& p, int32_t z) {
  const int32_t s = z / p.topk;
  DraftBranch b{RowSlots(p.src, p.rows[s], s, p.violation), p.seq_lens[s], 0};
  if (b.len < 0) {
    RecordViolation(p.violation, kLengthNegative, s, b.len, 0);
    b.len = 0;
    b.row = nullptr;
    return b;
  }
  if (b.row == nullptr) return b;
  b.source = DraftSource(b.len, z % p.topk, p);
  const int64_t last = b.source + p.step + 1;
  if (b.len > p.src.stride || last > p.src.stride) {
    RecordViolation(p.violation, kLengthPastRow, s, b.len > p.src.stride ? b.len : last,
                    p.src.stride);
    b.row = nullptr;
  }
  return b;
}

__global__ void __launch_bounds__(kIndptrThreads) DraftStepIndptrKernel(DraftStepParams p) {
  WaitForPrecedingGrid();  // launched to overlap the kernel ahead: before any read
  AllowDependentGridLaunch();
  __shared__ internal::BlockScratch<kIndptrThreads> scratch;
  const int32_t branches = p.padded_batch * p.topk;
  const int64_t iters = p.step + 1;
  int64_t kv_carry = 0, q_carry = 0;
  if (threadIdx.x == 0) {
    p.kv_indptr[0] = 0;
    p.qo_indptr[0] = 0;
  }
  for (int32_t z0 = 0; z0 < branches; z0 += kIndptrThreads) {
    const int32_t z = z0 + threadIdx.x;
    int64_t kv = 0, q = 0;
    if (z < branches) {
      const DraftBranch b = LoadDraftBranch(p, z);
      // A real request's branch holds its prefix and the step's draft tokens; a padded one (or
      // one whose bounds broke) its length on the padding page. Every branch has one query row.
      const bool real = b.row != nullptr;
      kv = real ? b.len + iters : b.len;
      q = 1;
      p.kv_lens[z] = static_cast<int32_t>(Clamp(kv, 0, kInt32Max));
      p.kv_last_page_len[z] = LastPageLen(static_cast<int32_t>(Clamp(kv, 0, kInt32Max)), p.src);
    }
    int64_t kv_total = 0, q_total = 0;
    const int64_t kv_end = kv_carry + internal::BlockInclusiveScan<kIndptrThreads>(kv, scratch, &kv_total);
    const int64_t q_end = q_carry + internal::BlockInclusiveScan<kIndptrThreads>(q, scratch, &q_total);
    if (z < branches) {
      if (kv_end > kInt32Max) RecordViolation(p.violation, kTotalPastInt32, z, kv_end, kInt32Max);
      p.kv_indptr[z + 1] = static_cast<int32_t>(Clamp(kv_end, 0, kInt32Max));
      p.qo_indptr[z + 1] = static_cast<int32_t>(q_end);
    }
    kv_carry += kv_total;
    q_carry += q_total;
  }
}

__global__ void __launch_bounds__(kThreads) DraftStepIndicesKernel(DraftStepParams p) {
  WaitForPrecedingGrid();  // launched to overlap the kernel ahead: before any read
  AllowDependentGridLaunch();
  const int32_t z = blockIdx.x;
  const int64_t begin = p.kv_indptr[z];
  int64_t n = p.kv_indptr[z + 1] - begin;
  // The indptr launch ahead wrote these: a negative or decreasing entry can only come from a
  // broken launch order, and still writes nothing outside kv_indices.
  if (begin < 0 || n < 0) return;
  if (begin + n > p.kv_indices_capacity) {
    if (blockIdx.y == 0 && threadIdx.x == 0) {
      RecordViolation(p.violation, kTotalPastCapacity, z, begin + n, p.kv_indices_capacity);
    }
    n = begin < p.kv_indices_capacity ? p.kv_indices_capacity - begin : 0;
  }
  // The violations of the branch were recorded by the indptr launch: none again here.
  DraftStepParams quiet = p;
  quiet.violation = nullptr;
  const DraftBranch b = LoadDraftBranch(quiet, z);
  int32_t* dst = p.kv_indices + begin;
  for (int64_t t = blockIdx.y * int64_t{kThreads} + threadIdx.x; t < n;
       t += int64_t{gridDim.y} * kThreads) {
    int32_t slot = static_cast<int32_t>(t % p.src.page_size);
    if (b.row != nullptr) {
      const int64_t at = t < b.len ? t : b.source + (t - b.len);
      slot = CheckedSlot(p.src, b.row[at], static_cast<int32_t>(t), z / p.topk, p.violation);
    }
    dst[t] = slot;
  }
}

// PlanSplitKvInto hands the batch's chunks out in order, units [0, extra) taking base + 1 and
// the rest base: the unit of the g-th chunk and the first chunk of unit u are arithmetic, so a
// sequence's items can be written on their own once the prefix sums of chunks, items, partial
// slots and reduce items over the sequences before it are known.
struct UnitMap {
  int64_t base, extra;
  // REQUIRES: g < the batch's chunks (so base > 0 past the first extra * (base + 1)).
  __device__ int64_t UnitOf(int64_t g) const {
    return g < extra * (base + 1) ? g / (base + 1) : extra + (g - extra * (base + 1)) / base;
  }
  __device__ int64_t Start(int64_t u) const {
    return u < extra ? u * (base + 1) : extra * (base + 1) + (u - extra) * base;
  }
};

// Sequence i's query rows and KV length, checked (a bad indptr entry makes it empty; q past kv
// is clamped).
struct PlanSequence {
  int64_t qo_begin, q, kv, tiles, kv_chunks;
};
__device__ inline PlanSequence LoadPlanSequence(const SplitKvPlanParams& p, int32_t i) {
  PlanSequence s{0, 0, 0, 0, 0};
  const int64_t q0 = p.qo_indptr[i], q1 = p.qo_indptr[i + 1];
  const int64_t k0 = p.kv_indptr[i], k1 = p.kv_indptr[i + 1];
  // Each array's violations under its own name (qo_indptr's are the query-indptr kinds).
  if (q0 < 0) {
    RecordViolation(p.violation, kQueryIndptrNegative, i, q0, 0);
    return s;
  }
  if (k0 < 0) {
    RecordViolation(p.violation, kOffsetNegative, i, k0, 0);
    return s;
  }
  if (q1 < q0) {
    RecordViolation(p.violation, kQueryIndptrDecreasing, i + 1, q1, q0);
    return s;
  }
  if (k1 < k0) {
    RecordViolation(p.violation, kIndptrDecreasing, i + 1, k1, k0);
    return s;
  }
  s.qo_begin = q0;
  s.q = q1 - q0;
  s.kv = k1 - k0;
  if (s.q > s.kv) {
    RecordViolation(p.violation, kQueryPastKv, i, s.q, s.kv);
    s.q = s.kv;
  }
  s.tiles = (s.q + p.q_tile - 1) / p.q_tile;
  s.kv_chunks = (s.kv + p.chunk - 1) / p.chunk;
  return s;
}

__device__ inline int64_t ExclusiveScan(int64_t v, int64_t& carry,
                                        internal::BlockScratch<kIndptrThreads>& scratch) {
  int64_t total = 0;
  const int64_t before = carry + internal::BlockInclusiveScan<kIndptrThreads>(v, scratch, &total) - v;
  carry += total;
  return before;
}

__global__ void __launch_bounds__(kIndptrThreads) SplitKvPlanKernel(SplitKvPlanParams p) {
  WaitForPrecedingGrid();  // launched to overlap the kernel ahead: before any read
  AllowDependentGridLaunch();
  __shared__ internal::BlockScratch<kIndptrThreads> scratch;
  // The totals saturate at kTotalCap: corrupted indptrs (a sawtooth of INT32_MAX lengths, a
  // q_tile of 1) give a sequence up to 2^62 chunks and 2^31 tiles, whose unsaturated sum
  // wrapped the unit map (and with it unit_indptr's index), and whose tiles one thread walked.
  constexpr int64_t kTotalCap = int64_t{1} << 40;
  const auto capped = [](int64_t v) { return v < kTotalCap ? v : kTotalCap; };
  int64_t total_chunks = 0, total_tiles = 0;
  for (int32_t k0 = 0; k0 < p.n; k0 += kIndptrThreads) {
    const int32_t i = k0 + threadIdx.x;
    int64_t chunks = 0, tiles = 0;
    if (i < p.n) {
      const PlanSequence s = LoadPlanSequence(p, i);
      chunks = capped(s.tiles * s.kv_chunks);
      tiles = capped(s.tiles);
    }
    (void)ExclusiveScan(chunks, total_chunks, scratch);
    (void)ExclusiveScan(tiles, total_tiles, scratch);
    total_chunks = capped(total_chunks);
    total_tiles = capped(total_tiles);
  }
  // Every tile takes a work item at least: a batch of more tiles than items (or of saturated
  // totals) has no plan these buffers hold. Recorded, and written as a plan of no items.
  if (total_tiles > p.work_capacity || total_chunks == kTotalCap) {
    if (threadIdx.x == 0) {
      RecordViolation(p.violation, kTotalPastCapacity, p.n, total_tiles, p.work_capacity);
    }
    for (int32_t u = threadIdx.x; u <= p.num_units; u += kIndptrThreads) p.unit_indptr[u] = 0;
    return;
  }
  const UnitMap m{total_chunks / p.num_units, total_chunks % p.num_units};
  int64_t chunk_carry = 0, item_carry = 0, partial_carry = 0, reduce_carry = 0;
  for (int32_t k0 = 0; k0 < p.n; k0 += kIndptrThreads) {
    const int32_t i = k0 + threadIdx.x;
    PlanSequence s{0, 0, 0, 0, 0};
    if (i < p.n) s = LoadPlanSequence(p, i);
    const int64_t g_first = ExclusiveScan(s.tiles * s.kv_chunks, chunk_carry, scratch);
    int64_t items = 0, partials = 0, reduces = 0;
    for (int64_t t = 0; t < s.tiles; ++t) {
      const int64_t g = g_first + t * s.kv_chunks;
      const int64_t n_items = m.UnitOf(g + s.kv_chunks - 1) - m.UnitOf(g) + 1;
      items += n_items;
      if (n_items > 1) {
        partials += n_items;
        ++reduces;
      }
    }
    int64_t item = ExclusiveScan(items, item_carry, scratch);
    int64_t partial = ExclusiveScan(partials, partial_carry, scratch);
    int64_t reduce = ExclusiveScan(reduces, reduce_carry, scratch);
    for (int64_t t = 0; t < s.tiles; ++t) {
      const int64_t g = g_first + t * s.kv_chunks;
      const int64_t g_end = g + s.kv_chunks;
      const int64_t u_first = m.UnitOf(g), u_last = m.UnitOf(g_end - 1);
      const int64_t q_last = (t + 1) * p.q_tile < s.q ? (t + 1) * p.q_tile : s.q;
      const int32_t q_begin = static_cast<int32_t>(s.qo_begin + t * p.q_tile);
      const int32_t q_end = static_cast<int32_t>(s.qo_begin + q_last);
      const bool split = u_last > u_first;
      const int64_t partial_begin = partial;
      for (int64_t u = u_first; u <= u_last; ++u, ++item) {
        const int64_t c0 = m.Start(u) > g ? m.Start(u) : g;
        const int64_t c1 = m.Start(u + 1) < g_end ? m.Start(u + 1) : g_end;
        // The item holding a unit's first chunk starts the unit.
        if (c0 == m.Start(u)) p.unit_indptr[u] = static_cast<int32_t>(item);
        const int32_t slot = split ? static_cast<int32_t>(partial++) : -1;
        if (item >= p.work_capacity) {
          RecordViolation(p.violation, kTotalPastCapacity, i, item + 1, p.work_capacity);
          continue;
        }
        const int64_t kv_end = (c1 - g) * p.chunk < s.kv ? (c1 - g) * p.chunk : s.kv;
        p.work[item] = SplitKvWorkEntry{i, q_begin, q_end, static_cast<int32_t>((c0 - g) * p.chunk),
                                        static_cast<int32_t>(kv_end), slot};
      }
      if (!split) continue;
      if (reduce >= p.reduce_capacity) {
        RecordViolation(p.violation, kTotalPastCapacity, i, reduce + 1, p.reduce_capacity);
      } else {
        p.reduce[reduce] = SplitKvReduceEntry{i, q_begin, q_end, static_cast<int32_t>(partial_begin),
                                              static_cast<int32_t>(partial)};
      }
      ++reduce;
    }
  }
  // Units with no chunk, and the end: every item is before them.
  for (int32_t u = threadIdx.x; u <= p.num_units; u += kIndptrThreads) {
    if (u == p.num_units || m.Start(u + 1) == m.Start(u)) {
      p.unit_indptr[u] = static_cast<int32_t>(item_carry);
    }
  }
}

}  // namespace

hipError_t LaunchIndptrKernel(const IndptrParams& p, bool overlap_preceding, hipStream_t stream) {
  return LaunchKernelAfterPreceding(overlap_preceding, IndptrKernel, dim3(1), dim3(kIndptrThreads),
                                    0, stream, p);
}

hipError_t LaunchPageTableKernel(const PageTableParams& p, int32_t passes, bool overlap_preceding,
                                 hipStream_t stream) {
  return LaunchKernelAfterPreceding(overlap_preceding, PageTableKernel, dim3(p.batch_size, passes),
                                    dim3(kPageTableThreads), 0, stream, p);
}

hipError_t LaunchTokenKvIndicesKernel(const TokenKvIndicesParams& p, int32_t passes,
                                      bool overlap_preceding, hipStream_t stream) {
  return LaunchKernelAfterPreceding(overlap_preceding, TokenKvIndicesKernel,
                                    dim3(p.batch_size, passes), dim3(kTokenKvIndicesThreads), 0,
                                    stream, p);
}

hipError_t LaunchFusedMetadataKernel(const FusedMetadataParams& p, int32_t row_blocks,
                                     bool overlap_preceding, hipStream_t stream) {
  return LaunchKernelAfterPreceding(overlap_preceding, FusedMetadataKernel,
                                    dim3(p.padded_batch, row_blocks), dim3(kFusedMetadataThreads),
                                    0, stream, p);
}

hipError_t FusedMetadataBlocksPerMultiprocessor(int32_t* blocks) {
  int n = 0;
  const hipError_t err = hipOccupancyMaxActiveBlocksPerMultiprocessor(&n, FusedMetadataKernel,
                                                                      kFusedMetadataThreads, 0);
  if (err == hipSuccess) *blocks = n;
  return err;
}

hipError_t LaunchTreeMaskKernel(const TreeMaskParams& p, int32_t passes, bool overlap_preceding,
                                hipStream_t stream) {
  return LaunchKernelAfterPreceding(overlap_preceding, TreeMaskKernel, dim3(p.padded_batch, passes),
                                    dim3(kThreads), 0, stream, p);
}

hipError_t LaunchDraftStepKernels(const DraftStepParams& p, int32_t passes, bool overlap_preceding,
                                  hipStream_t stream) {
  if (const hipError_t err = LaunchKernelAfterPreceding(overlap_preceding, DraftStepIndptrKernel,
                                                        dim3(1), dim3(kIndptrThreads), 0, stream, p);
      err != hipSuccess) {
    return err;
  }
  return LaunchKernelAfterPreceding(overlap_preceding, DraftStepIndicesKernel,
                                    dim3(p.padded_batch * p.topk, passes), dim3(kThreads), 0,
                                    stream, p);
}

hipError_t LaunchSplitKvPlanKernel(const SplitKvPlanParams& p, bool overlap_preceding,
                                   hipStream_t stream) {
  return LaunchKernelAfterPreceding(overlap_preceding, SplitKvPlanKernel, dim3(1),
                                    dim3(kIndptrThreads), 0, stream, p);
}

hipError_t LaunchGatherKvKernel(const GatherKvParams& p, int32_t blocks, bool overlap_preceding,
                                hipStream_t stream) {
  GatherKvParams q = p;
  const bool words16 = p.row_bytes % 16 == 0 &&
                       (reinterpret_cast<uintptr_t>(p.k_pool) | reinterpret_cast<uintptr_t>(p.v_pool) |
                        reinterpret_cast<uintptr_t>(p.k_out) | reinterpret_cast<uintptr_t>(p.v_out)) %
                               16 ==
                           0;
  // Lanes per row: the row's words rounded up to a power of two, at least a wave of 32 and at
  // most the block.
  const int64_t words = p.row_bytes / (words16 ? 16 : 2);
  q.lanes_per_row = 32;
  while (q.lanes_per_row < kGatherThreads && q.lanes_per_row < words) q.lanes_per_row *= 2;
  const int64_t rows_per_block = kGatherThreads / q.lanes_per_row;
  const int32_t grid = static_cast<int32_t>(
      std::min<int64_t>(blocks, (p.out_rows + rows_per_block - 1) / rows_per_block + 1));
  return words16 ? LaunchKernelAfterPreceding(overlap_preceding, GatherKvKernel<Word16>, dim3(grid),
                                               dim3(kGatherThreads), 0, stream, q)
                 : LaunchKernelAfterPreceding(overlap_preceding, GatherKvKernel<uint16_t>,
                                              dim3(grid), dim3(kGatherThreads), 0, stream, q);
}

// Never launched: the build's code for this device is asked what it was compiled for.
__global__ void CompiledTargetProbeKernel() {}

hipError_t KernelsWaitForPrecedingGrids(bool* waits) {
  return KernelWaitsForPrecedingGrid(CompiledTargetProbeKernel, waits);
}

}  // namespace kernels
}  // namespace attnmeta
