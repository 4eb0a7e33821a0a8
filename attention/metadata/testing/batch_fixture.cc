#include "attention/metadata/testing/batch_fixture.h"

#include "glog/logging.h"

namespace attnmeta {
namespace testing {

BatchFixture::BatchFixture(int64_t page_size, uint64_t seed, int64_t num_pages, int32_t max_reqs,
                           int64_t max_context)
    : page_size_(*PageSize::Create(page_size)),
      alloc_(*PagedTokenAllocator::Create(PageCount(num_pages), page_size_,
                                          FreePagePolicy::Shuffled(seed))),
      pool_(*ReqToTokenPool::Create(max_reqs, TokenCount(max_context))) {}

void BatchFixture::Grow(ReqPoolIndex row, int64_t from, int64_t to) {
  TokenSlot last(0);
  if (from > 0) last = (*pool_.Read(row, TokenCount(from - 1), TokenCount(1)))[0];
  auto slots = alloc_.AllocateExtend({{TokenCount(from), TokenCount(to), last}});
  CHECK(slots.ok()) << slots.status();
  CHECK(pool_.Write(row, TokenCount(from), *slots).ok());
}

int BatchFixture::AddSequence(int64_t cached, int64_t new_tokens) {
  const ReqPoolIndex row = *pool_.Allocate();
  Grow(row, 0, cached);
  Grow(row, cached, cached + new_tokens);
  rows_.push_back(row);
  kv_lens_.push_back(TokenLength(static_cast<int32_t>(cached + new_tokens)));
  q_lens_.push_back(TokenLength(static_cast<int32_t>(new_tokens)));
  return static_cast<int>(rows_.size()) - 1;
}

int BatchFixture::AddSequenceSharingPrefix(int donor, int64_t shared, int64_t cached,
                                           int64_t new_tokens) {
  const int64_t ps = page_size_.tokens();
  // Only the donor's cached tokens can be shared: its new tokens are written this step.
  shared = std::min<int64_t>(shared, kv_lens_[donor].value() - q_lens_[donor].value()) / ps * ps;
  CHECK_LE(shared, cached);
  const ReqPoolIndex row = *pool_.Allocate();
  auto prefix = pool_.Read(rows_[donor], TokenCount(0), TokenCount(shared));
  CHECK(prefix.ok());
  CHECK(pool_.Write(row, TokenCount(0), *prefix).ok());
  Grow(row, shared, cached);
  Grow(row, cached, cached + new_tokens);
  rows_.push_back(row);
  kv_lens_.push_back(TokenLength(static_cast<int32_t>(cached + new_tokens)));
  q_lens_.push_back(TokenLength(static_cast<int32_t>(new_tokens)));
  return static_cast<int>(rows_.size()) - 1;
}

ForwardBatch BatchFixture::Batch(ForwardMode mode) const {
  ForwardBatch b;
  b.mode = mode;
  b.req_rows = rows_;
  b.kv_lens = kv_lens_;
  b.q_lens = q_lens_;
  return b;
}

std::vector<TokenSlot> BatchFixture::SlotsOf(int i) const {
  auto row = pool_.Read(rows_[i], TokenCount(0), kv_lens_[i].count());
  CHECK(row.ok());
  return std::vector<TokenSlot>(row->begin(), row->end());
}

TokenCount BatchFixture::num_query_rows() const {
  TokenCount n;
  for (TokenLength q : q_lens_) n += q.count();
  return n;
}

}  // namespace testing
}  // namespace attnmeta
