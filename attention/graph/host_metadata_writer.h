// HostMetadataWriter: MetadataWriter over host-accessible buffers, built on the span builders
// of attention/metadata/builders.h, so a replay's real rows are exactly what the eager path
// (BuildForwardMetadata) gives. Allocates nothing.

#ifndef ATTNMETA_ATTENTION_GRAPH_HOST_METADATA_WRITER_H_
#define ATTNMETA_ATTENTION_GRAPH_HOST_METADATA_WRITER_H_

#include "attention/graph/metadata_writer.h"

namespace attnmeta {

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
