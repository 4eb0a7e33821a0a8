// MetadataSnapshot (snapshot.proto): dump a batch and its metadata, load it back, and check
// it: rebuild the metadata from the recorded inputs, validate the recorded arrays and compare
// the two.

#ifndef ATTNMETA_ATTENTION_METADATA_SNAPSHOT_H_
#define ATTNMETA_ATTENTION_METADATA_SNAPSHOT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attention/metadata/builders.h"
#include "attention/metadata/forward_metadata.h"
#include "attention/metadata/snapshot.pb.h"
#include "kvcache/req_to_token_pool.h"
#include "kvcache/units.h"

namespace attnmeta {

// Records `batch`, the req_to_token rows it reads, and `metadata`. Errors: those of
// ReqToTokenPool::Read for a row the batch reads, naming the request.
absl::StatusOr<MetadataSnapshot> MakeSnapshot(const ForwardBatch& batch,
                                              const ReqToTokenPool& pool, PageSize page_size,
                                              TokenCount pool_slots,
                                              const ForwardMetadata& metadata);

std::string SnapshotToText(const MetadataSnapshot& snapshot);
// InvalidArgument when `text` is not a MetadataSnapshot in text format.
absl::StatusOr<MetadataSnapshot> SnapshotFromText(absl::string_view text);

// OK when the recorded metadata is valid and equals what the builders make from the recorded
// inputs. Only the recorded req_to_token rows are rebuilt (renumbered densely; at most 2^28
// entries), so a corrupt file cannot make it allocate without bound. Otherwise an error whose message starts with the broken array or input (for a
// difference, its first differing index and both values: "kv_indices[17]: recorded 123,
// rebuilt 456"; for inputs the builders reject, "rebuilding from the recorded inputs: ...").
absl::Status CheckSnapshot(const MetadataSnapshot& snapshot);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_SNAPSHOT_H_
