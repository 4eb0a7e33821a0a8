// DiffMetadata: whether two views hold the same metadata, and if not, where they first differ.
// One definition of "the same" for every path that must equal the eager builders (graph
// replay, a device twin, a simulator step), used by the tests and by tools.

#ifndef ATTNMETA_ATTENTION_METADATA_METADATA_DIFF_H_
#define ATTNMETA_ATTENTION_METADATA_METADATA_DIFF_H_

#include "absl/status/status.h"
#include "attention/metadata/forward_metadata.h"

namespace attnmeta {

// OK when every array of `want` equals `got`'s: the mode, indptrs, kv_indices up to
// kv_indptr[bs], lengths, maxima, the custom mask (layout, mask_indptr, bytes up to
// mask_indptr[bs]) and the page table, where `got` may be wider than `want` as long as its
// extra columns are the padding page (a fixed buffer is as wide as the longest row it can
// hold). Otherwise FailedPrecondition naming the first difference: the array, the index and
// both values ("kv_indices[17]: got 123, want 456").
absl::Status DiffMetadata(const ForwardMetadataView& got, const ForwardMetadataView& want);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_METADATA_DIFF_H_
