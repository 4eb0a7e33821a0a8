// The device side of the metadata kernels: the argument structs shared by the host launchers
// (metadata_launchers.h) and the device source, whose launch functions are in
// metadata_kernels_launch.h. Plain types only: no Abseil, no glog, no vendor header (the host
// launchers' checks fill these structs and are tested without a GPU). Every kernel
// bounds-checks what it reads from device memory (request rows, lengths, slots, indptr totals)
// against the bounds given here, clamps, and records the first violation in `violation`
// (device_violation.h; may be null).

#ifndef ATTNMETA_ATTENTION_KERNELS_METADATA_KERNELS_H_
#define ATTNMETA_ATTENTION_KERNELS_METADATA_KERNELS_H_

#include <cstdint>

#include "attention/kernels/device_violation.h"

namespace attnmeta {
namespace kernels {

// The request row staged for a padded row of a captured graph: its tokens are slots of the
// padding page (slot t % page_size), its page-table row all padding page (0).
inline constexpr int32_t kPaddedRow = -1;

// Threads per block of the token-parallel kernels, and the tokens one block copies per pass
// in each, in groups of 4 (one 16-byte load): kv_indices 8 per thread (on the H200 as fast
// as 4 or faster at every large shape), the fused kernel 8 too (same-run A/B on the H200
// against 4, three rounds, docs/gpu_metadata_kernels.md: 1024 x 4096 at page sizes 1, 16 and
// 64 86.0-89.0% of copy against 78.9-85.2%, 64 x 128k 96.8-99.7% against 90.5-96.5%,
// 256 x 4096 5.74-5.94 us against 6.04-6.30; 1024 x 32767 at page size 16 3.5% slower).
// kv_indices, the page table and the fused kernel run blocks of 128 threads,
// whose grids quantize into waves more finely than 256-thread blocks (same-run A/Bs on the
// H200, us, 128 against 256 threads: kv_indices 1024 x 1k 6.1-6.3 against 7.0-7.2, the page
// table 1024 x 4k at page size 64 5.5 against 6.6-6.7, the fused kernel 1024 x 1k 8.6
// against 9.8-10.0; the same or better at every other large shape). kMetadataThreads: the
// tree-mask and draft-step kernels.
inline constexpr int32_t kMetadataThreads = 256;
inline constexpr int32_t kTokenKvIndicesThreads = 128;
inline constexpr int32_t kTokenKvIndicesTokensPerPass = kTokenKvIndicesThreads * 8;
inline constexpr int32_t kFusedMetadataThreads = 128;
inline constexpr int32_t kFusedMetadataTokensPerPass = kFusedMetadataThreads * 8;
inline constexpr int32_t kFusedMetadataPageTableColumnsPerPass = kFusedMetadataThreads * 4;

// The most rows (or draft branches) of one launch of the kernels above. Each row is a block
// along the grid's x dimension. HIP on AMD supports fewer than 2^32 threads along one dimension
// (grid times block; its documentation, not run here): 2^23 rows of blocks of up to 256
// threads are 2^31. NVIDIA allows 2^31 - 1 blocks along x; the one bound holds on both
// backends, so that a batch one accepts the other does too.
inline constexpr int64_t kMaxMetadataRows = int64_t{1} << 23;

// The KV pool and the request-to-token table, as every kernel that reads slots sees them.
struct SlotSource {
  const int32_t* req_to_token;  // [max_reqs * stride], row-major
  int64_t stride;               // max_context_len, >= 1
  int32_t max_reqs;             // >= 1
  int64_t pool_slots;           // slots of the KV pool; 0: slots are not checked
  int32_t page_size;            // >= 1
  int32_t page_size_log2;       // log2(page_size) for a power of two, else -1
};

// indptr = [0, lens[0], lens[0] + lens[1], ...] and, when last_page_len is not null,
// last_page_len[k] = (lens[k] - 1) % page_size + 1 (0 for an empty length). One block.
// Violations: a negative length (taken as 0), a total past INT32_MAX (clamped).
struct IndptrParams {
  const int32_t* lens;     // [n]
  int32_t* indptr;         // [n + 1]
  int32_t* last_page_len;  // [n] or null
  int32_t n;               // >= 0
  int32_t page_size;       // >= 1
  DeviceViolation* violation;
};

// page_table[i][j] = req_to_token[rows[i]][j * page_size] / page_size for
// j < ceil(kv_lens[i] / page_size), else 0 (the padding page), for rows i < batch_size; rows
// past the batch are not written. Grid (batch_size, passes). Violations: a row outside the
// table (written as padding), a length past the row or needing more than `cols` pages
// (clamped), a slot outside the pool (its page written as padding).
struct PageTableParams {
  SlotSource src;
  const int32_t* rows;     // [batch_size], kPaddedRow allowed
  const int32_t* kv_lens;  // [batch_size]
  int32_t* page_table;     // [>= batch_size][cols]
  int32_t batch_size;
  int32_t cols;
  DeviceViolation* violation;
};
// Columns one block pass of the page-table kernel covers.
inline constexpr int32_t kPageTableThreads = 128;
inline constexpr int32_t kPageTableColumnsPerPass = kPageTableThreads * 8;

// kv_indices[kv_indptr[i] + t] = req_to_token[rows[i]][start[i] + t], t < kv_indptr[i + 1] -
// kv_indptr[i]. Grid (batch_size, passes). Violations: a row outside the table or a start
// outside [0, src.stride] (the padding page's slots written), a range past the row, an indptr
// end past kv_indices_capacity or decreasing (the out-of-bounds part is not written), a slot
// outside the pool when src.pool_slots > 0.
struct TokenKvIndicesParams {
  SlotSource src;
  const int32_t* rows;          // [batch_size]
  const int32_t* kv_indptr;     // [batch_size + 1]
  const int32_t* kv_start_idx;  // [batch_size] or null (all 0)
  int32_t* kv_indices;          // [kv_indices_capacity]
  int64_t kv_indices_capacity;
  int32_t batch_size;
  DeviceViolation* violation;
};

// Everything a decode (or fixed-row extend) replay writes, in one launch, from the staged
// rows and lengths of a padded batch: kv_indptr, qo_indptr, kv_last_page_len, kv_indices
// (padded rows: slots of the padding page) and, when page_table is not null, the page table
// (padded rows: all padding). Each block derives its row's offsets from the lengths before
// it, so no second launch is needed. Grid (padded_batch, row_blocks), any row_blocks >= 1: the
// row_blocks blocks of a row take contiguous shares of its passes (of
// kFusedMetadataTokensPerPass tokens) and the page-table columns past them in passes of
// kFusedMetadataPageTableColumnsPerPass; the grid depends only on the padded batch and the
// buffers, so a captured graph replays any real batch.
// Violations: those of the kernels above, and q_len > kv_len (q clamped).
struct FusedMetadataParams {
  SlotSource src;
  const int32_t* rows;     // [padded_batch], kPaddedRow for padded rows
  const int32_t* kv_lens;  // [padded_batch]
  const int32_t* q_lens;   // [padded_batch]
  int32_t* kv_indptr;      // [padded_batch + 1]
  int32_t* qo_indptr;      // [padded_batch + 1]
  int32_t* kv_last_page_len;  // [padded_batch]
  int32_t* kv_indices;     // [kv_indices_capacity]
  int64_t kv_indices_capacity;
  int32_t* page_table;     // [>= padded_batch][page_table_cols], or null
  int32_t page_table_cols;
  int32_t padded_batch;
  DeviceViolation* violation;
};

// Step `step` of draft-decode (iters = step + 1; draft_decode_layout.h) over the padded
// batch's branches z = s * topk + k: for a real request s (rows[s] != kPaddedRow), branch z is
// seq_lens[s] + iters tokens (the request's prefix, then iters draft slots from
// DraftSourcePosition(seq_lens[s], k) on) with one query row; for a padded request, seq_lens[s]
// tokens on the padding page and one query row. Two launches: one block for the per-branch
// arrays, then a grid (branches, passes) for kv_indices. Violations: a row outside the table
// or a negative length (the branch written as padding), draft positions past the row (the
// branch written as padding), a total past INT32_MAX or past kv_indices (clamped), a slot
// outside the pool (its token written as padding).
struct DraftStepParams {
  SlotSource src;
  const int32_t* rows;       // [padded_batch], kPaddedRow allowed
  const int32_t* seq_lens;   // [padded_batch] committed lengths
  int32_t padded_batch;      // >= 1
  int32_t topk;              // >= 1
  int32_t steps;             // >= 1
  int32_t step;              // [0, steps)
  int32_t* kv_lens;          // [padded_batch * topk]
  int32_t* kv_indptr;        // [padded_batch * topk + 1]
  int32_t* qo_indptr;        // [padded_batch * topk + 1]
  int32_t* kv_last_page_len; // [padded_batch * topk]
  int32_t* kv_indices;       // [kv_indices_capacity]
  int64_t kv_indices_capacity;
  DeviceViolation* violation;
};

// A split-KV plan's work and reduce items as the host planner lays them out (SplitKvWorkItem
// and SplitKvReduceItem of attention/metadata/split_kv_planner.h; the device writer checks
// that the layouts match).
struct SplitKvWorkEntry {
  int32_t sequence, q_begin, q_end, kv_begin, kv_end, partial_slot;
};
struct SplitKvReduceEntry {
  int32_t sequence, q_begin, q_end, partial_begin, partial_end;
};

// The split-KV plan PlanSplitKvInto writes for sequences [0, n) of qo_indptr / kv_indptr,
// bit for bit: the same work items in the same order, unit_indptr[0, num_units], the reduce
// items, the partial slots. One block. Violations: a negative or decreasing indptr entry (the
// sequence taken as empty), q_len > kv_len (q taken as kv), items past a capacity (not
// written); more query tiles than work_capacity (each tile takes an item), or more than 2^40
// chunks, is recorded once and written as a plan of no items (unit_indptr all 0).
struct SplitKvPlanParams {
  const int32_t* qo_indptr;  // [n + 1]
  const int32_t* kv_indptr;  // [n + 1]
  int32_t n;                 // >= 0
  int32_t num_units;         // >= 1
  int32_t chunk;             // >= 1: the split unit in tokens (SplitKvPlanCounts::chunk)
  int32_t q_tile;            // >= 1
  SplitKvWorkEntry* work;    // [work_capacity]
  int64_t work_capacity;
  int32_t* unit_indptr;      // [num_units + 1]
  SplitKvReduceEntry* reduce;  // [reduce_capacity]
  int64_t reduce_capacity;
  DeviceViolation* violation;
};

// Target-verify's FULL mask from tree rows: mask_indptr = [0] + cumsum(q_len * kv_len) and,
// per request, [q_len][kv_len] bytes: 1 for the kv_len - q_len prefix columns, then the tree
// row (tree rows of request i start at sum over the requests k < i that are not padded of
// q_len_k^2); a padded request (rows given and rows[i] == kPaddedRow) has no tree rows and all
// ones. Grid (padded_batch, passes). Violations: q_len > kv_len or a negative length (clamped),
// tree rows or mask bytes past their capacity (not read / not written).
struct TreeMaskParams {
  const int32_t* rows;     // [padded_batch], kPaddedRow for padded rows; or null: none padded
  const int32_t* q_lens;   // [padded_batch]
  const int32_t* kv_lens;  // [padded_batch]
  const uint8_t* tree;     // [tree_capacity]
  int64_t tree_capacity;
  int64_t* mask_indptr;    // [padded_batch + 1]
  uint8_t* mask;           // [mask_capacity]
  int64_t mask_capacity;
  int32_t padded_batch;
  DeviceViolation* violation;
};

// The paged-to-linear K/V gather: row r < cu_k[batch_size] of k_out / v_out is row tok_idx[r]
// of k_pool / v_pool, row_bytes bytes each (any dtype and head layout). Rows move in 16-byte
// words when row_bytes and every pointer are multiples of 16, else in 2-byte words. Grid-stride
// over rows. Violations: cu_k[batch_size] past tok_idx's or the outputs' rows (clamped), a
// slot outside the pool (the row written as zeros).
struct GatherKvParams {
  const uint8_t* k_pool;  // [pool_slots * row_bytes]
  const uint8_t* v_pool;  // [pool_slots * row_bytes]
  int64_t pool_slots;
  int64_t row_bytes;      // a multiple of 2
  const int32_t* tok_idx;  // [tok_capacity]
  int64_t tok_capacity;
  const int32_t* cu_k;     // [batch_size + 1]
  int32_t batch_size;
  uint8_t* k_out;          // [out_rows * row_bytes]
  uint8_t* v_out;          // [out_rows * row_bytes]
  int64_t out_rows;
  DeviceViolation* violation;
  int32_t lanes_per_row;  // set by the launch function
};

}  // namespace kernels
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_METADATA_KERNELS_H_
