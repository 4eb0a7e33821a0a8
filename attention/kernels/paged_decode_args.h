// The arguments of PagedDecodeAttention (paged_decode_launcher.h) and the checks it makes
// before anything is launched, which give the launches it makes (kernel argument structs of
// paged_decode_attention.h) when the arguments pass. Host code without the GPU runtime: the
// checks are tested on the CPU (spans over host memory: nothing here reads through them,
// except a host split plan and checked mode's host metadata).

#ifndef ATTNMETA_ATTENTION_KERNELS_PAGED_DECODE_ARGS_H_
#define ATTNMETA_ATTENTION_KERNELS_PAGED_DECODE_ARGS_H_

#include <cstdint>
#include <optional>
#include <variant>

#include "absl/status/statusor.h"
#include "attention/kernels/checked_metadata.h"
#include "attention/kernels/decode_split_planner.h"
#include "attention/kernels/device_span.h"
#include "attention/kernels/device_violation.h"
#include "attention/kernels/metadata_kernel_args.h"
#include "attention/kernels/paged_decode_attention.h"
#include "attention/metadata/split_kv_planner.h"
#include "kvcache/units.h"

namespace attnmeta {

struct DecodeAttentionDims {
  int32_t num_q_heads = 1;   // a multiple of num_kv_heads
  int32_t num_kv_heads = 1;  // >= 1
  int32_t head_dim = 128;    // 64, 128 or 256
  KvElementType dtype = KvElementType::kBf16;  // of q, the K/V pools and out
  float softmax_scale = 1.0f;  // finite and > 0; usually 1 / sqrt(head_dim)
};

// Token t of sequence i is slot kv_indices[kv_indptr[i] + t], t < kv_indptr[i + 1] -
// kv_indptr[i]. The batch is kv_indptr.size() - 1 sequences. A consumer reading K/V per token:
// split plans must be made for KvLayout::LinearPerToken().
struct DecodeTokenLevelKv {
  DeviceSpan<const TokenOffset> kv_indptr;  // [bs + 1], [0] == 0, non-decreasing
  DeviceSpan<const TokenSlot> kv_indices;   // [>= kv_indptr[bs]], at most 2^30 entries
};

// Token t of sequence i is slot page_table[i][t / page_size] * page_size + t % page_size,
// t < kv_lens[i]. The batch is kv_lens.size() sequences. A consumer reading the paged pool:
// split plans must be made for KvLayout::Paged(page_size).
struct DecodePageTableKv {
  DeviceSpan<const PageId> page_table;  // [>= bs][cols], row-major
  PageCount cols;                       // cols * page_size <= 2^30
  DeviceSpan<const TokenLength> kv_lens;  // [bs], kv_lens[i] <= cols * page_size
  PageSize page_size = *PageSize::Create(1);
};

using DecodeKv = std::variant<DecodeTokenLevelKv, DecodePageTableKv>;

// The layout a split plan for this KV source must be made for.
KvLayout DecodeKvLayout(const DecodeKv& kv);

// A split-KV plan that exists only on the device, as the graph layer's split-KV buffers hold
// it after a replay (DeviceMetadataWriter writes it there, bit for bit the plan PlanSplitKv
// makes from the replay's indptrs): the host knows its layout and counts
// (GraphState::Replay's ReplayResult::split_kv), not its items.
struct DeviceSplitKvPlan {
  KvLayout layout;
  SplitKvPlanCounts counts;
};

// A split-KV plan, its device copy and the partial buffers it writes.
// REQUIRES: `work` and `reduce` hold the plan's items (the kernels bounds-check what they read
// there, but cannot tell a stale copy), and the plan was made from the lengths the device
// metadata holds (a work item past its sequence's length is clamped and recorded).
struct DecodeSplitKv {
  // The host copy of the plan, made with qo_indptr = [0, 1, ..., bs] and checked item by item
  // against the batch before the launch; or a plan held only on the device, whose items only
  // the kernels check (a sequence outside the batch, a partial slot or reduce item outside
  // the buffers: recorded and skipped). A device plan's sequences without an item get no
  // output (a graph bucket's plan has items for its padded rows too, which hold one query row
  // each). REQUIRES for a device plan: a decode
  // plan, one query row per sequence (a decode replay's); the kernels do not read an item's
  // query rows, so the plan of a replay with more rows per request gives wrong rows unrecorded.
  std::variant<const SplitKvPlan*, DeviceSplitKvPlan> plan;
  // A host plan: exactly plan->work and plan->reduce. A device plan: at least its counts'
  // work_items and reduce_items (the graph's buffers, sized to their capacity).
  DeviceSpan<const SplitKvWorkItem> work;
  DeviceSpan<const SplitKvReduceItem> reduce;
  DeviceSpan<float>
      partial_out;  // [>= the plan's partials][num_q_heads][head_dim], 16-byte aligned
  DeviceSpan<float> partial_lse;  // [>= the plan's partials][num_q_heads]
  // Empty: the partials are merged by a second launch. Else [>= the plan's reduce items *
  // num_q_heads], all zero before the first launch: the block that completes a reduce item
  // merges it in the attention launch (no merge launch), and each launch leaves the counters
  // zero again, so that they can stay in a captured graph. One buffer per launch in flight
  // (two launches running at once must not share it), in device memory from hipMalloc. Items on
  // the device that are not a consistent plan (a stale copy, a device plan no planner wrote)
  // may leave them nonzero, and may merge wrongly without recording a violation (the REQUIRES
  // above): zero them again after such a plan.
  DeviceSpan<uint32_t> merge_counters;
};

// How PagedDecodeAttention's attention launch may overlap the kernel ahead of it on the stream:
// NVIDIA's programmatic dependent launch (compute capability 9.0 and later,
// DeviceOverlapsLaunches); elsewhere every mode is a plain launch. Back to back on the H200
// (docs/paged_decode_attention.md, "Waiting first, the default"), bs 1 x 16k takes 23.67-24.07
// us with kNone, 22.94-23.19 with kWaitFirst and 22.25-22.45 with kMetadataFirst (one call).
//
// In every overlapping mode a split plan's merge launch (no merge counters) overlaps the
// attention launch the same way, waiting for it before it reads anything.
//
// Whatever the mode, the kernel lets the next kernel start once its blocks have read K and V;
// it still reads the reduce items, the merge counters and the partials and writes out, lse, the
// partials, the counters and the violation word after that, so a kernel launched to overlap it
// must not write those before its own wait.
enum class DecodeLaunchOverlap {
  // A plain launch: no block starts before the kernel ahead has ended.
  kNone,
  // Blocks may start under the kernel ahead's tail; each waits for that kernel before it reads
  // or writes anything. Right after any kernel, whatever it writes. (The wait is for the
  // kernel ahead only: a kernel ahead that was itself launched to overlap the one before it
  // must wait for that one before it ends, as every overlapping kernel here does, or the
  // decode may run beside that one.)
  kWaitFirst,
  // As kWaitFirst, but a block reads its metadata before it waits (the plan's work item,
  // kv_indptr or kv_lens, and its warps' first index entries in kv_indices or the page table),
  // then Q, K and V and every write after.
  // REQUIRES: no kernel that may still run when this launch starts writes the metadata. That
  // is the kernel ahead, and, when that kernel was itself launched to overlap the one before
  // it, the ones before too unless it waits for them before it lets this one start (the decode
  // kernel itself does); in a captured graph, every kernel node this launch depends on. So not
  // after a metadata kernel (the fused decode metadata, a DeviceMetadataWriter replay, the
  // staged uploads' apply kernel, which writes the lengths). A kernel ahead that writes Q or
  // the new tokens' K and V is fine.
  kMetadataFirst,
  // As kWaitFirst (safe after any kernel), but before it waits a block brings into L2 what it
  // reads first after the wait: its work item, its sequence's kv_indptr entry (token-level),
  // its warps' first index entries (or page-table entries) and the K and V rows of their slots,
  // found from values loaded before the wait, which choose lines to warm and nothing else (the
  // block reads everything again after the wait). It pays where the kernel ahead lets this
  // launch start well before its end (it calls griddepcontrol.launch_dependents early, as every
  // kernel of this library does): on the H200, back to back, bs 1 x 16k 21.3 us against 23.0
  // waiting first and 22.2 reading the metadata first, bs 8 x 4k 35.9 against 38.1. Where
  // blocks start only as the kernel ahead ends, the warm-up's loads come before the block's
  // own: bs 1 x 4k behind a merge kernel that allowed no early start took 14.8 us against 13.2.
  // Page size 1 over a pool of 34 GB or more gains nothing and can lose up to 2 us
  // (docs/paged_decode_attention.md, "Warming L2 before the wait" and "Page size 1 over a
  // large pool"). A plain launch where launches cannot overlap.
  kWarmL2First,
};

struct PagedDecodeArgs {
  DecodeAttentionDims dims;
  DeviceSpan<const uint8_t> q;       // [bs][num_q_heads][head_dim] of dtype, 16-byte aligned
  DeviceSpan<const uint8_t> k_pool;  // [pool_slots][num_kv_heads][head_dim] of dtype, aligned
  DeviceSpan<const uint8_t> v_pool;  // like k_pool, the same size; pool_slots <= 2^31
  DecodeKv kv;
  // None: one work item per sequence over its whole length (no partials, no merge).
  std::optional<DecodeSplitKv> split;
  DeviceSpan<uint8_t> out;  // [bs][num_q_heads][head_dim] of dtype, 16-byte aligned
  DeviceSpan<float> lse;    // [bs][num_q_heads]
  // The kernel shape (kernels::kDecodeVariants). Variants other than 0 are compiled only for
  // head_dim 128 and run 4 query heads per block, so they need a group of a multiple of 4.
  int32_t variant = 0;
  // How the launch may overlap the kernel ahead of it on `stream` (DecodeLaunchOverlap). The
  // default is safe after any kernel.
  DecodeLaunchOverlap overlap = DecodeLaunchOverlap::kWaitFirst;
  // Checked mode (checked_metadata.h): the host copy of the metadata `kv` holds, validated
  // before anything is launched (one query row per sequence), and a host split plan's items
  // checked to end at each sequence's KV length (a device plan cannot be). Null: not checked.
  const CheckedMetadata* checked = nullptr;
};

// What PagedDecodeAttention launches for arguments that pass its checks: the attention kernel
// over `blocks` blocks (none when 0: an empty batch or plan), then, when merge_launch, the
// merge kernel (a plan that splits some sequence, without merge counters).
struct PagedDecodeLaunch {
  int64_t blocks = 0;
  kernels::PagedDecodeParams attention{};
  bool merge_launch = false;
  kernels::DecodeMergeParams merge{};
};

// PagedDecodeAttention's checks, in its order, and its launches; `violation` goes into the
// kernels' arguments. Errors, before anything is launched: InvalidArgument for dims (head
// counts that do not divide, a head dim other than 64/128/256, a scale that is not finite and
// positive, an unknown variant), sizes that disagree with the batch (a page table of negative
// columns among them), a pointer not 16-byte aligned, a null pointer with a nonzero size, a
// plan made for another layout, a host plan whose items do not fit the batch (a sequence
// outside it, query rows other than the sequence's one row, a KV range that is negative or
// reversed, a sequence with no item, partial slots and reduce items that do not match), a
// device plan whose counts are not a plan's or exceed its buffers, and in checked mode
// (args.checked) host metadata that fails validation or is not the launch's, or a host plan
// that does not end at its lengths (CheckLaunchedMetadata); ResourceExhausted for partial
// buffers or merge counters smaller than the plan needs; OutOfRange for a pool, table or grid
// beyond the kernel's int32 arithmetic.
absl::StatusOr<PagedDecodeLaunch> PagedDecodeLaunchFor(const PagedDecodeArgs& args,
                                                       kernels::DeviceViolation* violation);

// The blocks PagedDecodeAttention launches per work item (its grid is work items times this):
// one per KV head and chunk of query heads a block takes (a group of up to 8 is one chunk when
// the kernel for it is compiled, a group of 16 two chunks of 8, a group of 3 three of 1).
// Errors: InvalidArgument for dims or a variant that PagedDecodeAttention refuses; OutOfRange
// for more than 65535 query heads (the merge kernel's grid y).
absl::StatusOr<int32_t> DecodeBlocksPerWorkItem(const DecodeAttentionDims& dims, int32_t variant);

// The query heads one block of the decode kernel takes for these dims and variant (its
// instantiations: the largest of 8, 4, 2, 1 dividing the group for variant 0, 4 for the
// others). Errors: DecodeBlocksPerWorkItem's.
absl::StatusOr<int32_t> DecodeQueryHeadsPerBlock(const DecodeAttentionDims& dims, int32_t variant);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_PAGED_DECODE_ARGS_H_
