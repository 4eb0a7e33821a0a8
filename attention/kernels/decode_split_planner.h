// PlanDecodeSplitKv: the split-KV plan of a decode batch (one query row per sequence) sized to
// fill the GPU with one wave of decode attention blocks (paged_decode_launcher.h runs it), and
// CheckDecodeSplitPlan, the launcher's check of a host plan against the batch. Host code only,
// no GPU runtime: CPU tests check both on every commit.

#ifndef ATTNMETA_ATTENTION_KERNELS_DECODE_SPLIT_PLANNER_H_
#define ATTNMETA_ATTENTION_KERNELS_DECODE_SPLIT_PLANNER_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "attention/metadata/split_kv_planner.h"
#include "kvcache/units.h"

namespace attnmeta {

// How PlanDecodeSplitKv sizes the work to the GPU.
struct DecodeSplitOptions {
  int32_t multiprocessor_count = 1;  // of the GPU that runs the kernel, >= 1
  // The attention launch's blocks per work item, >= 1: DecodeBlocksPerWorkItem
  // (paged_decode_args.h), which is the number of KV heads only when a block takes a whole
  // GQA group (a group of 16 runs as two blocks of 8 query heads, a group of 3 as three of 1).
  int32_t blocks_per_item = 1;
  // Blocks to aim for per multiprocessor: one wave of the default decode variant, which fits
  // 2 blocks per multiprocessor (bf16, head dim 128, 4 query heads per block on sm_90: 248
  // registers per thread). Measured on the H200: at bs 1 x 16k and bs 8 x 4k one wave beats
  // 2 to 8 waves of smaller items (each item pays its index and length loads and its merge).
  int32_t blocks_per_multiprocessor = 2;
  // No split is shorter than this, >= 1: a step of 32 tokens for each of the default variant's
  // 4 warps at head dim 64 or 128 (two 16-token steps at 256). (64 cut bs 1 x 1k into 16 items,
  // half of each block's warps idle: 8.35-8.42 us on the H200 against 8.18-8.20 with 8 items
  // of 128.)
  TokenCount min_chunk = TokenCount(128);
  // At most this many items (partials) of one sequence, >= 1. The block that completes a
  // sequence's reduce item merges its partials, a warp per query head, 32 partials per round
  // trip to L2: with hundreds of them that merge is the launch. 8 query heads on 1 KV head (one
  // block per item) on the H200: bs 1 x 16k in 256 items of 64 tokens took 26.8 us, in 64 items
  // 16.6 us, in 32 items 18.0 us; bs 1 x 32k 29.1 (256 items), 21.1 (64), 26.6 (32).
  int32_t max_items_per_sequence = 64;
};

// A decode plan that fills the GPU. With target = multiprocessor_count *
// blocks_per_multiprocessor blocks:
//  - no split (one item per sequence) when the batch alone gives target / 2 blocks or more: a
//    split then costs more than the idle half gains (bs 32 x 4k at 256 blocks ran 4.0 TB/s
//    unsplit, 3.4 split into 64 items);
//  - otherwise the shortest chunk (at least min_chunk, a multiple of 16 and of the blocks of
//    `layout`) that cuts the sequences into at most floor(target / blocks_per_item) items and
//    no sequence into more than max_items_per_sequence, one item per chunk: items are of equal
//    size except each sequence's last, and none spills into a second wave. A chunk is at most
//    2^30 tokens (PlanSplitKv's limit), rounded down to the multiple: min_chunk beyond that, or
//    a sequence longer than max_items_per_sequence such chunks, gets chunks of that size.
// `kv_indptr` is the host copy of the batch's token-level indptr. Errors: PlanSplitKv's
// (InvalidArgument for an empty sequence: a decode row needs kv_len >= 1; run batches with
// empty sequences without a plan), InvalidArgument for options out of range, OutOfRange for
// more sequences than int32 query rows.
absl::StatusOr<SplitKvPlan> PlanDecodeSplitKv(absl::Span<const TokenOffset> kv_indptr,
                                              KvLayout layout, const DecodeSplitOptions& options);

// OK, or InvalidArgument: `plan` is not a decode plan for a batch of `bs` sequences whose K/V
// is read through `layout` (PagedDecodeAttention checks a host plan with it before anything is
// launched): a plan made for another layout; partial slots negative or more than the work
// items; a work item outside the batch (its sequence, query rows other than the sequence's one
// row, a negative or reversed KV range, a partial slot past num_partials); a partial slot
// written twice; a reduce item outside the batch, or merging a slot that no work item of its
// sequence writes or that another reduce item merges; a sequence without exactly one direct
// item, or split items and one reduce item; a sequence's items that do not tile its KV range
// from 0; a partial slot written but never merged. Where the items end is checked against the
// lengths in checked mode only (CheckLaunchedMetadata): the lengths live on the device.
absl::Status CheckDecodeSplitPlan(const SplitKvPlan& plan, const KvLayout& layout, int64_t bs);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_DECODE_SPLIT_PLANNER_H_
