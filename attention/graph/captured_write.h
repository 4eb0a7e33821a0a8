// CapturedWrite: what a metadata write recorded once (a device graph) and relaunched fixes,
// besides the (generation, bucket, mode) a writer finds the recording by: the request's
// launch parameters and where the buffers are. A relaunch reads only the staged inputs again,
// so a later write of the same key that asks for anything else (the page table, another
// split-KV option, other buffers) would silently get the recorded write; a writer compares
// the two first and refuses.

#ifndef ATTNMETA_ATTENTION_GRAPH_CAPTURED_WRITE_H_
#define ATTNMETA_ATTENTION_GRAPH_CAPTURED_WRITE_H_

#include "absl/strings/string_view.h"
#include "attention/graph/metadata_writer.h"

namespace attnmeta {

struct CapturedWrite {
  PageSize page_size = *PageSize::Create(1);
  bool page_table = false;
  bool split_kv = false;
  SplitKvOptions split_kv_options;
  MaskLayout mask_layout = MaskLayout::kNone;
  DraftDecodeShape draft_decode;
  TokenLength q_len_per_request;
  // Addresses and sizes only: the spans are never dereferenced.
  GraphBuffers buffers;
};

// Everything of `request` and `buffers` that a recording fixes. Not kept: the batch's sizes
// and lengths (real_batch_size, padded_kv_len, host_kv_lens, host_q_lens), which the staged
// inputs carry, the host table (req_to_token), and the key (generation, padded_batch_size,
// mode).
CapturedWrite CapturedWriteOf(const MetadataWriteRequest& request, const GraphBuffers& buffers);

// The name of the first field in which the write of `request` over `buffers` differs from
// `recorded` ("page_table", "split_kv_options.num_units", "buffer kv_indices", ...), or an
// empty view when none does. q_len_per_request counts only with a mask (it bounds the mask's
// bytes per row; extend captures one bucket at several query lengths). Allocates nothing: a
// replay calls it.
absl::string_view FirstDifference(const CapturedWrite& recorded,
                                  const MetadataWriteRequest& request, const GraphBuffers& buffers);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_GRAPH_CAPTURED_WRITE_H_
