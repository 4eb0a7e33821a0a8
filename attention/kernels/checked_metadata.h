// The checked mode of the attention launchers (PagedDecodeAttention, VarlenAttention): the host
// copy of the metadata a launch reads from device memory, validated before anything is
// launched. The kernels' own guards keep them inside every buffer whatever the device arrays
// hold; what they cannot see is metadata that is in bounds but wrong (a slot that another
// sequence owns, an indptr that does not step by the lengths, a page table that disagrees with
// kv_indices). Checked mode refuses such a batch with the validator's message. Host code only:
// the launchers do not read device memory, so the caller vouches that the host copy is what
// the device arrays hold; the sizes a launcher knows are checked against it.

#ifndef ATTNMETA_ATTENTION_KERNELS_CHECKED_METADATA_H_
#define ATTNMETA_ATTENTION_KERNELS_CHECKED_METADATA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "attention/metadata/custom_mask.h"
#include "attention/metadata/forward_metadata.h"
#include "attention/metadata/split_kv_planner.h"
#include "attention/metadata/validator.h"
#include "kvcache/units.h"

namespace attnmeta {

struct CheckedMetadata {
  // What the launch's device arrays hold: the builders' metadata the caller copied to the
  // device, or a graph replay's arrays read back.
  ForwardMetadataView metadata;
  // What it is validated against (ValidateForwardMetadata): num_query_rows must be the
  // launch's query rows, pool_slots at most the launch's pool slots, and page_size the page
  // table's when the launch reads K/V through one. Slot ownership is checked when asked.
  ValidationContext context;
};

// What a launcher knows of the metadata it launches on (sizes only).
struct LaunchedMetadataShape {
  int64_t batch_size = 0;  // sequences of the KV source
  TokenCount query_rows;   // rows of q
  // Whether the launch writes the rows of q past qo_indptr[bs] that no sequence claims
  // (VarlenAttentionArgs::zero_unclaimed_rows). The context's allow_unclaimed_rows holds only
  // for a launch that does: metadata with such a tail is otherwise the validator's qo_indptr
  // error.
  bool zero_unclaimed_rows = false;
  TokenCount pool_slots;   // slots of the K and V pools
  // K/V through the page table (page_table_cols, page_size), else through token-level
  // kv_indices of kv_indices_entries entries.
  bool page_table = false;
  TokenCount kv_indices_entries;
  PageCount page_table_cols;
  PageSize page_size = *PageSize::Create(1);
  MaskLayout mask_layout = MaskLayout::kNone;
  int64_t mask_bytes = 0;  // the device mask's bytes (with a mask layout)
  // The query rows the launch covers per sequence (varlen's max_q_len; 1 for decode), and
  // whether it must be the batch's maximum exactly (a bit-packed mask's word width follows it).
  TokenCount max_q_len;
  bool max_q_len_exact = false;
  // The split-KV plan the launch runs when the host holds it (not one held on the device).
  const SplitKvPlan* split_plan = nullptr;
};

// OK, or InvalidArgument starting "checked mode: ": the validator's error for the host metadata
// in its context (the array, index and values it names), or a host copy that is not the
// launch's: another batch size or query-row count, a context with more pool slots than the
// launch's pools, a token-level launch whose kv_indices holds fewer entries than the
// metadata's kv_indptr[bs], a page-table launch whose metadata has no page table, or one of
// other columns or another page size, another mask layout or a device mask smaller than the
// metadata's mask_indptr[bs], a max_q_len below the metadata's (or not equal to it when it
// must be exact), or a split plan whose items do not end at each sequence's KV length (a plan
// made for another step's batch: the kernel would not read a sequence's newest tokens, and
// could not tell). What the host cannot compare are the device arrays' values: the caller
// vouches that they are the host copy's.
absl::Status CheckLaunchedMetadata(const CheckedMetadata& checked,
                                   const LaunchedMetadataShape& launch);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_CHECKED_METADATA_H_
