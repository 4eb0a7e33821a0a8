#include "attention/metadata/testing/metadata_compare.h"

#include "attention/metadata/metadata_diff.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace testing {

void ExpectSameMetadata(const ForwardMetadataView& got, const ForwardMetadataView& want) {
  const absl::Status diff = DiffMetadata(got, want);
  EXPECT_TRUE(diff.ok()) << diff;
}

}  // namespace testing
}  // namespace attnmeta
