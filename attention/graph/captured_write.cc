#include "attention/graph/captured_write.h"

#include <cstddef>

namespace attnmeta {
namespace {

template <typename T>
bool SamePlace(absl::Span<T> a, absl::Span<T> b) {
  return a.data() == b.data() && a.size() == b.size();
}

// The first of the buffers that `now` places elsewhere than `recorded`, or empty.
absl::string_view FirstMovedBuffer(const GraphBuffers& recorded, const GraphBuffers& now) {
  if (!SamePlace(recorded.req_rows, now.req_rows)) return "buffer req_rows";
  if (!SamePlace(recorded.kv_lens, now.kv_lens)) return "buffer kv_lens";
  if (!SamePlace(recorded.q_lens, now.q_lens)) return "buffer q_lens";
  if (!SamePlace(recorded.tree_mask, now.tree_mask)) return "buffer tree_mask";
  if (!SamePlace(recorded.kv_indptr, now.kv_indptr)) return "buffer kv_indptr";
  if (!SamePlace(recorded.qo_indptr, now.qo_indptr)) return "buffer qo_indptr";
  if (!SamePlace(recorded.kv_last_page_len, now.kv_last_page_len)) return "buffer kv_last_page_len";
  if (!SamePlace(recorded.kv_indices, now.kv_indices)) return "buffer kv_indices";
  if (!SamePlace(recorded.page_table.entries(), now.page_table.entries()) ||
      recorded.page_table.cols() != now.page_table.cols()) {
    return "buffer page_table";
  }
  if (!SamePlace(recorded.split_kv.work, now.split_kv.work)) return "buffer split_kv.work";
  if (!SamePlace(recorded.split_kv.unit_indptr, now.split_kv.unit_indptr)) {
    return "buffer split_kv.unit_indptr";
  }
  if (!SamePlace(recorded.split_kv.reduce, now.split_kv.reduce)) return "buffer split_kv.reduce";
  if (!SamePlace(recorded.mask_indptr, now.mask_indptr)) return "buffer mask_indptr";
  if (!SamePlace(recorded.custom_mask, now.custom_mask)) return "buffer custom_mask";
  if (!SamePlace(recorded.draft_qo_indptr, now.draft_qo_indptr)) return "buffer draft_qo_indptr";
  if (recorded.draft_steps.size() != now.draft_steps.size()) return "buffer draft_steps";
  for (size_t i = 0; i < now.draft_steps.size(); ++i) {
    const DraftStepBuffers& a = recorded.draft_steps[i];
    const DraftStepBuffers& b = now.draft_steps[i];
    if (!SamePlace(a.kv_indptr, b.kv_indptr) || !SamePlace(a.kv_lens, b.kv_lens) ||
        !SamePlace(a.kv_last_page_len, b.kv_last_page_len) ||
        !SamePlace(a.kv_indices, b.kv_indices)) {
      return "buffer draft_steps";
    }
  }
  return {};
}

}  // namespace

CapturedWrite CapturedWriteOf(const MetadataWriteRequest& request, const GraphBuffers& buffers) {
  CapturedWrite w;
  w.page_size = request.page_size;
  w.page_table = request.page_table;
  w.split_kv = request.split_kv;
  w.split_kv_options = request.split_kv_options;
  w.mask_layout = request.mask_layout;
  w.draft_decode = request.draft_decode;
  w.q_len_per_request = request.q_len_per_request;
  w.buffers = buffers;
  return w;
}

absl::string_view FirstDifference(const CapturedWrite& recorded,
                                  const MetadataWriteRequest& request,
                                  const GraphBuffers& buffers) {
  if (recorded.page_size != request.page_size) return "page_size";
  if (recorded.page_table != request.page_table) return "page_table";
  if (recorded.split_kv != request.split_kv) return "split_kv";
  const SplitKvOptions& a = recorded.split_kv_options;
  const SplitKvOptions& b = request.split_kv_options;
  if (!(a.layout == b.layout)) return "split_kv_options.layout";
  if (a.num_units != b.num_units) return "split_kv_options.num_units";
  if (a.kv_granularity != b.kv_granularity) return "split_kv_options.kv_granularity";
  if (a.q_tile != b.q_tile) return "split_kv_options.q_tile";
  if (recorded.mask_layout != request.mask_layout) return "mask_layout";
  if (recorded.draft_decode.topk != request.draft_decode.topk) return "draft_decode.topk";
  if (recorded.draft_decode.steps != request.draft_decode.steps) return "draft_decode.steps";
  if (recorded.mask_layout != MaskLayout::kNone &&
      recorded.q_len_per_request != request.q_len_per_request) {
    return "q_len_per_request";
  }
  return FirstMovedBuffer(recorded.buffers, buffers);
}

}  // namespace attnmeta
