// BatchFixture: realistic batches for tests and benchmarks. A real PagedTokenAllocator with
// shuffled pages lays out each sequence (so no sequence is contiguous by accident), in two
// allocation steps (its cached prefix, then this step's new tokens, which continue the
// prefix's partial last page), and a real ReqToTokenPool records it. Sequences can share a
// page-aligned prefix with an earlier one (prefix reuse).

#ifndef ATTNMETA_ATTENTION_METADATA_TESTING_BATCH_FIXTURE_H_
#define ATTNMETA_ATTENTION_METADATA_TESTING_BATCH_FIXTURE_H_

#include <cstdint>
#include <vector>

#include "attention/metadata/builders.h"
#include "kvcache/paged_token_allocator.h"
#include "kvcache/req_to_token_pool.h"
#include "kvcache/units.h"

namespace attnmeta {
namespace testing {

class BatchFixture {
 public:
  // A pool of `num_pages` pages (page 0 reserved) and `max_reqs` rows of `max_context` tokens.
  BatchFixture(int64_t page_size, uint64_t seed, int64_t num_pages = 4096, int32_t max_reqs = 64,
               int64_t max_context = 8192);

  // Adds a sequence holding `cached` tokens from earlier steps plus `new_tokens` tokens of
  // this step (its query rows). Returns its index in the batch.
  int AddSequence(int64_t cached, int64_t new_tokens);
  // Like AddSequence, but the first `shared` tokens (rounded down to whole pages) are the
  // slots of sequence `donor`'s prefix, as a prefix cache would share them (at most the
  // donor's cached tokens: its new tokens are written this step).
  int AddSequenceSharingPrefix(int donor, int64_t shared, int64_t cached, int64_t new_tokens);

  ForwardBatch Batch(ForwardMode mode) const;
  // The slots of sequence i, position by position (its row in req_to_token).
  std::vector<TokenSlot> SlotsOf(int i) const;

  PageSize page_size() const { return page_size_; }
  const ReqToTokenPool& pool() const { return pool_; }
  // For tests that corrupt the table (e.g. give two sequences the same slots).
  ReqToTokenPool& mutable_pool() { return pool_; }
  TokenCount pool_slots() const { return alloc_.pool_slots(); }
  const std::vector<ReqPoolIndex>& rows() const { return rows_; }
  const std::vector<TokenLength>& kv_lens() const { return kv_lens_; }
  const std::vector<TokenLength>& q_lens() const { return q_lens_; }
  TokenCount num_query_rows() const;

 private:
  // Allocates positions [from, to) of `row`, continuing its slot at position from - 1.
  void Grow(ReqPoolIndex row, int64_t from, int64_t to);

  PageSize page_size_;
  PagedTokenAllocator alloc_;
  ReqToTokenPool pool_;
  std::vector<ReqPoolIndex> rows_;
  std::vector<TokenLength> kv_lens_;
  std::vector<TokenLength> q_lens_;
};

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_TESTING_BATCH_FIXTURE_H_
