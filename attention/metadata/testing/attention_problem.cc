#include "attention/metadata/testing/attention_problem.h"

#include <cmath>
#include <limits>
#include <random>

#include "glog/logging.h"

namespace attnmeta {
namespace testing {

AttentionProblem MakeAttentionProblem(const BatchFixture& batch, const AttentionDims& dims,
                                      uint64_t seed) {
  const int64_t kv_row = int64_t{dims.num_kv_heads} * dims.head_dim;
  const int64_t q_row = int64_t{dims.num_q_heads} * dims.head_dim;
  AttentionProblem p;
  p.dims = dims;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  p.k_pool.resize(batch.pool_slots().value() * kv_row);
  p.v_pool.resize(p.k_pool.size());
  p.q.resize(batch.num_query_rows().value() * q_row);
  for (auto* buf : {&p.k_pool, &p.v_pool, &p.q}) {
    for (float& x : *buf) x = normal(rng);
  }
  p.dense.resize(p.q.size());
  int64_t q0 = 0;
  for (int i = 0; i < static_cast<int>(batch.rows().size()); ++i) {
    std::vector<float> k, v;
    for (TokenSlot s : batch.SlotsOf(i)) {
      k.insert(k.end(), p.k_pool.begin() + s.value() * kv_row,
               p.k_pool.begin() + (s.value() + 1) * kv_row);
      v.insert(v.end(), p.v_pool.begin() + s.value() * kv_row,
               p.v_pool.begin() + (s.value() + 1) * kv_row);
    }
    const int64_t n = batch.q_lens()[i].value() * q_row;
    CHECK(DenseAttention(dims, absl::MakeConstSpan(p.q).subspan(q0, n), k, v,
                         absl::MakeSpan(p.dense).subspan(q0, n))
              .ok());
    q0 += n;
  }
  return p;
}

double RelativeL2Error(absl::Span<const float> got, absl::Span<const float> want) {
  CHECK_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i])) return std::numeric_limits<double>::infinity();
    const double d = double{got[i]} - want[i];
    num += d * d;
    den += double{want[i]} * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

}  // namespace testing
}  // namespace attnmeta
