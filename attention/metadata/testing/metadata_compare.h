// ExpectSameMetadata: a gtest expectation that two views hold the same metadata, for tests
// that compare a path (graph replay, a device twin) against the eager builders.

#ifndef ATTNMETA_ATTENTION_METADATA_TESTING_METADATA_COMPARE_H_
#define ATTNMETA_ATTENTION_METADATA_TESTING_METADATA_COMPARE_H_

#include "attention/metadata/forward_metadata.h"

namespace attnmeta {
namespace testing {

// DiffMetadata(got, want) is OK (metadata_diff.h); the failure names the first difference.
void ExpectSameMetadata(const ForwardMetadataView& got, const ForwardMetadataView& want);

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_TESTING_METADATA_COMPARE_H_
