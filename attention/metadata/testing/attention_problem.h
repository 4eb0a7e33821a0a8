// AttentionProblem: random K/V for every slot of a BatchFixture's pool, random queries, and
// the dense attention of the batch's logical sequences, read from the allocator's own layout
// (req_to_token), never from metadata under test. Shared by the oracle tests and, later, the
// GPU attention tests.

#ifndef ATTNMETA_ATTENTION_METADATA_TESTING_ATTENTION_PROBLEM_H_
#define ATTNMETA_ATTENTION_METADATA_TESTING_ATTENTION_PROBLEM_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "attention/metadata/reference_attention.h"
#include "attention/metadata/testing/batch_fixture.h"

namespace attnmeta {
namespace testing {

struct AttentionProblem {
  AttentionDims dims;
  std::vector<float> k_pool;  // [pool_slots][num_kv_heads][head_dim], N(0, 1)
  std::vector<float> v_pool;  // [pool_slots][num_kv_heads][head_dim], N(0, 1)
  std::vector<float> q;       // [query rows][num_q_heads][head_dim], N(0, 1)
  std::vector<float> dense;   // the expected output, like q
};

AttentionProblem MakeAttentionProblem(const BatchFixture& batch, const AttentionDims& dims,
                                      uint64_t seed);

// ||got - want|| / ||want|| (L2); infinity when got holds a NaN.
double RelativeL2Error(absl::Span<const float> got, absl::Span<const float> want);

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_TESTING_ATTENTION_PROBLEM_H_
