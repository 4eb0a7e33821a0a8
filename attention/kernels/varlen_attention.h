// The device side of varlen (unified) attention: the argument struct shared by the host
// launcher (varlen_attention_launcher.h) and the device source, whose launch function is in
// varlen_attention_launch.h. Plain types only: no Abseil, no glog, no vendor header (the
// launcher's checks fill the struct and are tested without a GPU).
//
// Ragged queries: sequence i has the q_len_i = qo_indptr[i + 1] - qo_indptr[i] query rows
// qo_indptr[i] .. qo_indptr[i + 1] - 1 of q, which are its last q_len_i positions: row r sits at
// position prefix_i + r, prefix_i = kv_len_i - q_len_i (the cached prefix). Query head h reads
// K/V head h / (num_q_heads / num_kv_heads) (GQA; MHA when the counts are equal). Over the KV
// positions c the row sees, with slot(i, c) the pool row of position c:
//   s_c       = softmax_scale * dot(q[row][h], K[slot(i, c)][h / group])
//   out[row][h] = sum_c exp(s_c) * V[slot(i, c)][h / group] / sum_c exp(s_c)
//   lse[row][h] = log(sum_c exp(s_c))          (natural log, fp32)
// Which positions row r sees is MaskSees (attention/metadata/custom_mask.h), the one
// definition the CPU reference uses too: causal with prefix (c <= prefix + r) without a custom
// mask; else the mask block at byte mask_indptr[i] in layout FULL ([q_len][kv_len] bytes),
// QLEN_ONLY ([q_len][q_len] bytes over the query positions, every prefix position seen) or
// bit-packed (q_len words of mask_word_bytes bytes, bit c - prefix; every prefix position
// seen). A row that sees nothing writes out = 0 and lse = -inf, as the CPU reference does
// (attention/metadata/reference_attention.h). Q, K, V and out are bf16 or fp16; scores, the
// online softmax and the accumulators are fp32.
//
// The slot of position c comes either from token-level indices (kv_indices[kv_indptr[i] + c],
// kv_len from kv_indptr) or from the page table (page_table[i][c / page_size] * page_size +
// c % page_size, kv_len from kv_lens[i]).
//
// What lives in device memory is bounds-checked by the kernel, which never reads or writes
// outside a buffer: it clamps, skips a position whose slot is outside the pool, and records the
// first violation in `violation` (device_violation.h; may be null). A sequence whose lengths
// or mask cannot be trusted (q_len > kv_len, q_len > max_q_len, a mask block outside the mask)
// sees nothing: its rows write 0 and -inf, except, when q_len > max_q_len, its rows past the
// q_tiles * rows-per-block rows the grid gives each sequence (>= max_q_len), which no block
// covers and which are not written. Rows no sequence claims (qo_indptr[0] > 0, qo_indptr[bs]
// < q_rows, or rows a clamped entry leaves out) are not written either, except, with
// zero_unclaimed_rows, rows [qo_indptr[bs], q_rows): out 0 and lse -inf, not recorded (when
// qo_indptr[bs] is in [0, q_rows] and not below qo_indptr[bs - 1]). An indptr that drops
// back across sequences (qo_indptr[i + 1] < qo_indptr[i], the sequence clamped to no rows, and
// the next sequence starting back at qo_indptr[i + 1]) makes two sequences' blocks write the
// same rows: in bounds, and recorded (kQueryIndptrDecreasing), but the rows hold either's
// result; so may rows of a sequence that the declared tail also covers (an earlier entry past
// qo_indptr[bs], recorded the same way). The kinds it records:
//   kQueryIndptrNegative / kQueryIndptrDecreasing / kQueryRowsPastCapacity
//                                         qo_indptr entry negative / below the one before it /
//                                         past the rows of q (clamped)
//   kQueryRowsMismatch                    qo_indptr[0] > 0 or qo_indptr[bs] < q_rows (checked by
//                                         one thread of the launch; rows no sequence claims
//                                         are not written); the latter not with
//                                         zero_unclaimed_rows
//   kQueryPastKv                          q_len > kv_len (the sequence sees nothing)
//   kQueryPastMaxQLen                     q_len > max_q_len, the rows the grid was sized for
//                                         (the sequence sees nothing)
//   kMaskOutsideBuffer                    a mask block (mask_indptr[i] and the block size its
//                                         layout gives) not inside the mask (sees nothing)
//   kOffsetNegative / kIndptrDecreasing / kTotalPastCapacity
//                                         kv_indptr entry negative / below the one before it /
//                                         past kv_indices' capacity (clamped)
//   kLengthNegative / kPagesPastTable     kv_lens[i] negative / needing more pages than the
//                                         table's columns (clamped)
//   kSlotOutsidePool                      a position's slot (from kv_indices or the page table)
//                                         outside the pool; the position is skipped

#ifndef ATTNMETA_ATTENTION_KERNELS_VARLEN_ATTENTION_H_
#define ATTNMETA_ATTENTION_KERNELS_VARLEN_ATTENTION_H_

#include <cstdint>

#include "attention/kernels/device_kv_source.h"
#include "attention/kernels/device_violation.h"
#include "attention/kernels/element_dtype.h"

namespace attnmeta {
namespace kernels {

// Which positions a row sees: the layouts of custom_mask.h's MaskLayout. (Named apart from
// attnmeta::VarlenMask, the launcher's device-memory mask.)
enum VarlenMaskKind : int32_t {
  kVarlenCausal = 0,  // no custom mask: causal with prefix
  kVarlenMaskFull = 1,
  kVarlenMaskQLenOnly = 2,
  kVarlenMaskBitPacked = 3,
};

// Query vectors (query row, query head pairs) one block of a tiled kernel computes: the
// block's K/V tiles are staged in shared memory once and used by all of them. A block takes
// heads_per_block query heads of one KV head's group, so it covers
// VarlenQueryVectors(head_dim, tensor_cores) / heads_per_block query rows of one sequence (the
// launcher sizes the grid with it). On the tensor cores a warp takes 16 vectors.
inline constexpr int32_t VarlenQueryVectors(int32_t head_dim, bool tensor_cores) {
  return tensor_cores ? (head_dim <= 128 ? 128 : 64) : (head_dim <= 128 ? 64 : 32);
}

// The short-query path takes batches of at most this many chunks of 16 query vectors per
// sequence and KV head (max_q_len * group <= 64: verify, draft-extend, decode). At head dims up
// to 128 a block takes two chunks when there are more than one; each block reads its
// sequence's K and V, from the L2 after the first when they run together.
inline constexpr int32_t kVarlenMaxVectorChunks = 4;
inline constexpr int32_t kVarlenChunkVectors = 16;

// The chunks one short-query block takes: two where there is more than one at head dims up to
// 128, else one (at 256 the registers hold one m-tile's accumulators only).
inline constexpr int32_t VarlenChunksPerBlock(int32_t head_dim, int32_t vector_chunks) {
  return head_dim <= 128 && vector_chunks > 1 ? 2 : 1;
}

// The short-query path's blocks per (sequence, KV head): the grid is batch_size x num_kv_heads
// x this.
inline constexpr int32_t VarlenShortQueryBlocks(int32_t head_dim, int32_t vector_chunks) {
  return (vector_chunks + VarlenChunksPerBlock(head_dim, vector_chunks) - 1) /
         VarlenChunksPerBlock(head_dim, vector_chunks);
}

struct VarlenAttentionParams {
  const void* q;       // [q_rows][num_q_heads][head_dim] of dtype, 16-byte aligned
  int32_t q_rows;      // rows of q, out and lse; qo_indptr entries past it are clamped
  // [batch_size + 1], qo_indptr[0] == 0, non-decreasing, qo_indptr[batch_size] == q_rows
  // (else recorded; see above), <= q_rows with zero_unclaimed_rows.
  const int32_t* qo_indptr;
  int32_t max_q_len;   // >= every q_len, >= 1; the grid covers q_tiles tiles of rows of it
  // ceil(max_q_len / rows per block), rows per block = VarlenQueryVectors(head_dim,
  // tiled_tensor_cores != 0) / heads_per_block: the tiled kernel that runs must be the one the
  // grid was sized for.
  int32_t q_tiles;
  // > 0: the short-query path on the tensor cores, VarlenShortQueryBlocks blocks per (sequence,
  // KV head), each taking VarlenChunksPerBlock chunks of 16 query vectors (vector v of chunk c:
  // row (16c + v) / group, head (16c + v) % group of the KV head's group); vector_chunks =
  // ceil(max_q_len * group / 16), at most kVarlenMaxVectorChunks. 0: the tiled path (q_tiles,
  // heads_per_block).
  int32_t vector_chunks;
  // With vector_chunks 0: 1 runs the tiled path on the tensor cores (MmaM16N8K16, hip_port.h;
  // 256-thread blocks at head dim <= 128), 0 on CUDA cores (128-thread blocks). The same
  // results up to rounding (the tensor cores take the weights rounded to the element type).
  int32_t tiled_tensor_cores;
  // Nonzero: rows [qo_indptr[batch_size], q_rows) belong to no sequence and are written as
  // rows that see nothing (out 0, lse -inf) instead of recorded (kQueryRowsMismatch); nothing
  // is written for a qo_indptr[batch_size] outside [qo_indptr[batch_size - 1], q_rows] (it
  // is recorded as above).
  int32_t zero_unclaimed_rows;

  const void* k_pool;  // [kv.pool_slots][num_kv_heads][head_dim] of dtype, 16-byte aligned
  const void* v_pool;  // like k_pool
  // The K/V rows of position c of sequence i, and their guards: PagedDecodeParams's, read by
  // the same device helpers (internal/kv_source.h).
  DeviceKvSource kv;

  int32_t mask_layout;         // VarlenMaskKind
  const uint8_t* mask;         // [mask_capacity] bytes (kVarlenCausal: not read)
  // Bytes of `mask` that may be read: a block that does not lie in [0, mask_capacity) is
  // recorded (kMaskOutsideBuffer) and its sequence sees nothing.
  int64_t mask_capacity;
  const int64_t* mask_indptr;  // [batch_size + 1] byte offsets of the blocks (causal: not read)
  int32_t mask_word_bytes;     // bit-packed: bytes per row, MaskWordBytes(max_q_len), so that
                               // 8 * mask_word_bytes >= max_q_len; the mask's rows must be
                               // words of this width (max_q_len the batch's true maximum)

  void* out;   // [q_rows][num_q_heads][head_dim] of dtype, 16-byte aligned
  float* lse;  // [q_rows][num_q_heads]

  int32_t batch_size;       // >= 1 (the launcher launches nothing for an empty batch)
  int32_t num_q_heads;      // a multiple of num_kv_heads
  int32_t num_kv_heads;     // >= 1; K/V head of query head h: h / (num_q_heads / num_kv_heads)
  int32_t head_dim;         // 64, 128 or 256: elements per head of q, the pools and out
  int32_t heads_per_block;  // 1, 2, 4 or 8, dividing num_q_heads / num_kv_heads
  int32_t dtype;            // ElementDtype, of q, the pools and out
  float softmax_scale;      // finite and > 0: scores are softmax_scale * dot(q, k)
  // Where the first violation of the contract above is recorded (the other ones are not);
  // null: none is recorded, the guards still apply.
  DeviceViolation* violation;
};

}  // namespace kernels
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_VARLEN_ATTENTION_H_
