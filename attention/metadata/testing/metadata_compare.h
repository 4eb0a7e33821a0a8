// ExpectSameMetadata: gtest expectations that two views hold the same metadata, for tests
// that compare a path (graph replay, a device twin) against the eager builders.

#ifndef ATTNMETA_ATTENTION_METADATA_TESTING_METADATA_COMPARE_H_
#define ATTNMETA_ATTENTION_METADATA_TESTING_METADATA_COMPARE_H_

#include "attention/metadata/forward_metadata.h"

namespace attnmeta {
namespace testing {

// Every array of `want` equals `got`'s: indptrs, kv_indices up to kv_indptr[bs], lengths,
// maxima, the custom mask (layout, mask_indptr, bytes up to mask_indptr[bs]) and the page
// table, where `got` may be wider than `want` as long as its extra columns are the padding
// page (a fixed buffer is as wide as the longest row it can hold).
void ExpectSameMetadata(const ForwardMetadataView& got, const ForwardMetadataView& want);

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_TESTING_METADATA_COMPARE_H_
