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

// Records `batch`, the req_to_token rows it reads, and `metadata`. InvalidArgument: kv_lens,
// q_lens or a non-empty kv_start_idx not one per request; then the errors of
// ReqToTokenPool::Read for a row the batch reads, naming the request.
absl::StatusOr<MetadataSnapshot> MakeSnapshot(const ForwardBatch& batch,
                                              const ReqToTokenPool& pool, PageSize page_size,
                                              TokenCount pool_slots,
                                              const ForwardMetadata& metadata);

std::string SnapshotToText(const MetadataSnapshot& snapshot);
// InvalidArgument when `text` is not a MetadataSnapshot in text format.
absl::StatusOr<MetadataSnapshot> SnapshotFromText(absl::string_view text);

// OK when the recorded metadata is valid (slot ownership included) and equals what the
// builders make from the recorded inputs. Otherwise an error whose message starts with the
// broken array or input (for a difference, its first differing index and both values:
// "kv_indices[17]: recorded 123, rebuilt 456"; for inputs the builders reject, "rebuilding
// from the recorded inputs: ...").
// Inputs are checked against the file's own arrays before anything is rebuilt: recorded and
// requested rows in [0, max_reqs) and recorded rows of at most max_context_len slots
// (OutOfRange otherwise), array sizes that agree, and every
// request reading only positions its recorded req_to_token row holds. Only the recorded rows
// are rebuilt (renumbered densely, as wide as the longest, at most 2^28 entries), so what a
// corrupt file makes it allocate is bounded by what it records: the rebuilt table by its
// rows, kv_indices by its requests times its longest row, a custom mask by the sum of each
// request's q_len (whose tree rows it holds) times its kv_len.
absl::Status CheckSnapshot(const MetadataSnapshot& snapshot);

// The snapshot with its metadata arrays re-recorded from its inputs, once the inputs pass
// CheckSnapshot's input checks and the rebuilt metadata validates: a batch captured from a
// buggy engine becomes a regression test of the fixed behaviour. Errors as CheckSnapshot's
// for the inputs.
absl::StatusOr<MetadataSnapshot> RewriteSnapshot(const MetadataSnapshot& snapshot);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_SNAPSHOT_H_
