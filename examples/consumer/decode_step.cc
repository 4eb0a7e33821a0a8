#include "decode_step.h"

#include "attention/metadata/builders.h"
#include "kvcache/paged_token_allocator.h"
#include "kvcache/req_to_token_pool.h"
#include "kvcache/units.h"

namespace consumer {

using attnmeta::TokenCount;

absl::StatusOr<attnmeta::ForwardMetadata> DecodeStepAfterPrefill(const std::vector<int>& prompt_lens,
                                                                 int page_size, int num_pages,
                                                                 unsigned seed) {
  absl::StatusOr<attnmeta::PageSize> ps = attnmeta::PageSize::Create(page_size);
  if (!ps.ok()) return ps.status();
  absl::StatusOr<attnmeta::PagedTokenAllocator> alloc = attnmeta::PagedTokenAllocator::Create(
      attnmeta::PageCount(num_pages), *ps, attnmeta::FreePagePolicy::Shuffled(seed));
  if (!alloc.ok()) return alloc.status();
  int longest = 0;
  for (int len : prompt_lens) longest = len > longest ? len : longest;
  absl::StatusOr<attnmeta::ReqToTokenPool> pool = attnmeta::ReqToTokenPool::Create(
      static_cast<int32_t>(prompt_lens.size()), TokenCount(longest + 1));
  if (!pool.ok()) return pool.status();

  std::vector<attnmeta::ReqPoolIndex> rows;
  std::vector<attnmeta::TokenLength> kv_lens, q_lens;
  for (int len : prompt_lens) {
    absl::StatusOr<attnmeta::ReqPoolIndex> row = pool->Allocate();
    if (!row.ok()) return row.status();
    // The prompt, then the decode step's token.
    auto prompt = alloc->AllocateExtend({{TokenCount(0), TokenCount(len), attnmeta::TokenSlot(0)}});
    if (!prompt.ok()) return prompt.status();
    auto next = alloc->AllocateDecode({{TokenCount(len + 1), prompt->back()}});
    if (!next.ok()) return next.status();
    if (absl::Status s = pool->Write(*row, TokenCount(0), *prompt); !s.ok()) return s;
    if (absl::Status s = pool->Write(*row, TokenCount(len), *next); !s.ok()) return s;
    rows.push_back(*row);
    kv_lens.push_back(attnmeta::TokenLength(len + 1));
    q_lens.push_back(attnmeta::TokenLength(1));
  }
  attnmeta::ForwardBatch batch;
  batch.mode = attnmeta::ForwardMode::kDecode;
  batch.req_rows = rows;
  batch.kv_lens = kv_lens;
  batch.q_lens = q_lens;
  attnmeta::BuildOptions options;
  options.check = attnmeta::MetadataCheck{alloc->pool_slots(),
                                          TokenCount(static_cast<int64_t>(prompt_lens.size()))};
  return attnmeta::BuildForwardMetadata(batch, *pool, *ps, options);
}

}  // namespace consumer
