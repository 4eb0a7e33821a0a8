#include "attention/kernels/device_violation_message.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace attnmeta {

std::string DescribeViolation(const kernels::DeviceViolation& v) {
  const std::string at = absl::StrCat("entry ", v.index, ": ");
  switch (v.kind) {
    case kernels::kRowOutsideTable:
      return absl::StrCat("req_pool_indices ", at, "row ", v.value, " outside [0, ", v.bound, ")");
    case kernels::kLengthNegative:
      return absl::StrCat("lengths ", at, v.value, " is negative");
    case kernels::kLengthPastRow:
      return absl::StrCat("kv_lens ", at, v.value, " is past the row of ", v.bound,
                          " positions of req_to_token");
    case kernels::kQueryPastKv:
      return absl::StrCat("q_lens ", at, v.value, " query rows over ", v.bound, " KV tokens");
    case kernels::kTotalPastInt32:
      return absl::StrCat("indptr ", at, "total ", v.value, " is past INT32_MAX");
    case kernels::kTotalPastCapacity:
      return absl::StrCat("output ", at, "needs ", v.value, " entries, the buffer holds ", v.bound);
    case kernels::kSlotOutsidePool:
      return absl::StrCat("slots ", at, "slot ", v.value, " outside the pool of ", v.bound);
    case kernels::kIndptrDecreasing:
      return absl::StrCat("kv_indptr ", at, v.value, " is below the entry before it (", v.bound,
                          ")");
    case kernels::kOffsetNegative:
      return absl::StrCat("kv_indptr ", at, v.value, " is negative");
    case kernels::kPagesPastTable:
      return absl::StrCat("page_table ", at, "needs ", v.value, " pages, the table has ", v.bound,
                          " columns");
    case kernels::kQueryIndptrNegative:
      return absl::StrCat("qo_indptr ", at, v.value, " is negative");
    case kernels::kQueryIndptrDecreasing:
      return absl::StrCat("qo_indptr ", at, v.value, " is below the entry before it (", v.bound,
                          ")");
    case kernels::kQueryRowsPastCapacity:
      return absl::StrCat("qo_indptr ", at, v.value, " is past the ", v.bound,
                          " rows of the query tensor");
    case kernels::kQueryPastMaxQLen:
      return absl::StrCat("q_lens ", at, v.value, " query rows, past the max_q_len ", v.bound,
                          " the launch covers");
    case kernels::kMaskOutsideBuffer:
      return absl::StrCat("mask_indptr ", at, "the block at byte ", v.value,
                          " does not fit in the mask of ", v.bound, " bytes");
    case kernels::kQueryRowsMismatch:
      return absl::StrCat("qo_indptr ", at, v.value, ", want ", v.bound,
                          ": query rows no sequence claims are not written");
    case kernels::kWorkItemSequence:
      return absl::StrCat("split-KV work item ", v.index, ": sequence ", v.value,
                          " outside the batch of ", v.bound);
    case kernels::kWorkItemPartialSlot:
      return absl::StrCat("split-KV work item ", v.index, ": partial slot ", v.value,
                          ", the partial buffers hold ", v.bound);
    case kernels::kWorkItemKvBeginNegative:
      return absl::StrCat("split-KV work item ", v.index, ": kv_begin ", v.value, " is negative");
    case kernels::kWorkItemKvEndPastLength:
      return absl::StrCat("split-KV work item ", v.index, ": kv_end ", v.value,
                          " is past its sequence's KV length ", v.bound);
    case kernels::kWorkItemKvEndBeforeBegin:
      return absl::StrCat("split-KV work item ", v.index, ": kv_end ", v.value,
                          " is below its kv_begin ", v.bound);
    case kernels::kWorkItemShortOfSequence:
      return absl::StrCat("split-KV work item ", v.index, ": writes its sequence's output from ",
                          v.value, " of its ", v.bound,
                          " KV tokens (a plan made for other lengths)");
    case kernels::kStartOutsideRow:
      return absl::StrCat("kv_start_idx ", at, v.value, " outside the row of ", v.bound,
                          " positions");
    case kernels::kReduceItemSequence:
      return absl::StrCat("split-KV reduce item ", v.index, ": sequence ", v.value,
                          " outside the batch of ", v.bound);
    case kernels::kReduceItemPartialBeginNegative:
      return absl::StrCat("split-KV reduce item ", v.index, ": partial_begin ", v.value,
                          " is negative");
    case kernels::kReduceItemPartialEndBeforeBegin:
      return absl::StrCat("split-KV reduce item ", v.index, ": partial_end ", v.value,
                          " is below its partial_begin ", v.bound);
    case kernels::kReduceItemPartialEndPastBuffers:
      return absl::StrCat("split-KV reduce item ", v.index, ": partial_end ", v.value,
                          " is past the ", v.bound, " slots the partial buffers hold");
    case kernels::kPartialSlotUnmerged:
      return absl::StrCat("split-KV work item ", v.index, ": partial slot ", v.value,
                          " is merged by none of the ", v.bound, " reduce items");
    default:
      return absl::StrCat("unknown violation kind ", v.kind, " at entry ", v.index);
  }
}

}  // namespace attnmeta
