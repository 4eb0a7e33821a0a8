// HostMetadataWriter: MetadataWriter over host-accessible buffers, built on the span builders
// of attention/metadata/builders.h, so a replay's real rows are exactly what the eager path
// (BuildForwardMetadata) gives. Allocates nothing.

#ifndef ATTNMETA_ATTENTION_GRAPH_HOST_METADATA_WRITER_H_
#define ATTNMETA_ATTENTION_GRAPH_HOST_METADATA_WRITER_H_

#include "attention/graph/metadata_writer.h"

namespace attnmeta {

// Errors of both writes: CheckWriteFitsBuffers's InvalidArgument first; then the builders'
// (InvalidArgument, OutOfRange, FailedPrecondition); InvalidArgument for a kv_indices, custom
// mask or draft step's kv_indices too short for the padded batch. Draft-decode checks
// everything before it writes. The other modes may have written kv_indptr, qo_indptr and
// kv_indices when a later builder refuses (a page table too narrow, a tree the mask refuses, a
// split-KV plan past its buffers): GraphState checks all of that before it writes, so only a
// direct caller can see it.
class HostMetadataWriter : public MetadataWriter {
 public:
  MemorySpace space() const override { return MemorySpace::kHost; }
  absl::Status WriteBatchArrays(const MetadataWriteRequest& request,
                                const GraphBuffers& buffers) override;
  absl::Status WriteTokenArrays(const MetadataWriteRequest& request, const GraphBuffers& buffers,
                                SplitKvPlanCounts* split_kv_counts) override;
};

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_GRAPH_HOST_METADATA_WRITER_H_
