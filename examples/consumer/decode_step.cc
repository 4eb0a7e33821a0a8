#include "decode_step.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "attention/graph/backend_config.h"
#include "attention/graph/graph_state.h"
#include "attention/graph/host_device_memory.h"
#include "attention/graph/host_metadata_writer.h"
#include "attention/metadata/builders.h"
#include "attention/metadata/validator.h"
#include "kvcache/paged_token_allocator.h"
#include "kvcache/req_to_token_pool.h"
#include "kvcache/units.h"

namespace consumer {
namespace {

using attnmeta::TokenCount;

// What admitting the requests leaves: the allocator, the request-to-token table and the decode
// step's batch (each request's prompt and its next token allocated and written).
struct Admitted {
  attnmeta::PagedTokenAllocator alloc;
  attnmeta::ReqToTokenPool pool;
  std::vector<attnmeta::ReqPoolIndex> rows;
  std::vector<attnmeta::TokenLength> kv_lens;
};

// `row_tokens`: the table's row width, at least the longest prompt plus its step's tokens.
// `step_tokens`: each request's tokens of this step after its prompt (empty: one each, a
// decode step).
absl::StatusOr<Admitted> Admit(const std::vector<int>& prompt_lens, attnmeta::PageSize ps,
                               int num_pages, unsigned seed, int64_t row_tokens,
                               const std::vector<int>& step_tokens = {}) {
  if (!step_tokens.empty() && step_tokens.size() != prompt_lens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(prompt_lens.size(), " prompts but ",
                                                   step_tokens.size(), " step token counts"));
  }
  absl::StatusOr<attnmeta::PagedTokenAllocator> alloc = attnmeta::PagedTokenAllocator::Create(
      attnmeta::PageCount(num_pages), ps, attnmeta::FreePagePolicy::Shuffled(seed));
  if (!alloc.ok()) return alloc.status();
  absl::StatusOr<attnmeta::ReqToTokenPool> pool = attnmeta::ReqToTokenPool::Create(
      static_cast<int32_t>(prompt_lens.size()), TokenCount(row_tokens));
  if (!pool.ok()) return pool.status();
  Admitted a{*std::move(alloc), *std::move(pool), {}, {}};
  for (size_t i = 0; i < prompt_lens.size(); ++i) {
    const int len = prompt_lens[i];
    const int step = step_tokens.empty() ? 1 : step_tokens[i];
    // The step's tokens are allocated after the prompt's last slot, so a prompt has one.
    if (len < 1) return absl::InvalidArgumentError(absl::StrCat("prompt length ", len, " < 1"));
    if (step < 1) return absl::InvalidArgumentError(absl::StrCat("step of ", step, " tokens"));
    absl::StatusOr<attnmeta::ReqPoolIndex> row = a.pool.Allocate();
    if (!row.ok()) return row.status();
    // The prompt, then the step's tokens: one decode token, or an extend.
    auto prompt =
        a.alloc.AllocateExtend({{TokenCount(0), TokenCount(len), attnmeta::TokenSlot(0)}});
    if (!prompt.ok()) return prompt.status();
    auto next =
        step_tokens.empty()
            ? a.alloc.AllocateDecode({{TokenCount(len + 1), prompt->back()}})
            : a.alloc.AllocateExtend({{TokenCount(len), TokenCount(len + step), prompt->back()}});
    if (!next.ok()) return next.status();
    if (absl::Status s = a.pool.Write(*row, TokenCount(0), *prompt); !s.ok()) return s;
    if (absl::Status s = a.pool.Write(*row, TokenCount(len), *next); !s.ok()) return s;
    a.rows.push_back(*row);
    a.kv_lens.push_back(attnmeta::TokenLength(len + step));
  }
  return a;
}

constexpr int kMaxContextLen = 4096;

// The backend config of a graph captured for `bucket` requests, in text format; with
// draft_tokens > 0, also speculative decoding's (one draft step, top-k 1).
absl::StatusOr<attnmeta::BackendConfig> GraphConfig(int bucket, int page_size, int draft_tokens) {
  return attnmeta::ParseBackendConfig(absl::StrCat(
      "max_batch_size: ", bucket, " max_context_len: ", kMaxContextLen, " page_size: ", page_size,
      " num_q_heads: 32 num_kv_heads: 8 head_dim: 128 kv_dtype: KV_DTYPE_BF16"
      " consumers { page_table: true }",
      draft_tokens > 0
          ? absl::StrCat(" speculative { draft_tokens: ", draft_tokens, " topk: 1 steps: 1 }")
          : ""));
}

int Longest(const std::vector<int>& lens) {
  int longest = 0;
  for (int len : lens) longest = len > longest ? len : longest;
  return longest;
}

}  // namespace

absl::StatusOr<attnmeta::ForwardMetadata> DecodeStepAfterPrefill(
    const std::vector<int>& prompt_lens, int page_size, int num_pages, unsigned seed,
    int64_t query_rows) {
  absl::StatusOr<attnmeta::PageSize> ps = attnmeta::PageSize::Create(page_size);
  if (!ps.ok()) return ps.status();
  absl::StatusOr<Admitted> a = Admit(prompt_lens, *ps, num_pages, seed, Longest(prompt_lens) + 1);
  if (!a.ok()) return a.status();
  const std::vector<attnmeta::TokenLength> q_lens(prompt_lens.size(), attnmeta::TokenLength(1));
  attnmeta::ForwardBatch batch;
  batch.mode = attnmeta::ForwardMode::kDecode;
  batch.req_rows = a->rows;
  batch.kv_lens = a->kv_lens;
  batch.q_lens = q_lens;
  attnmeta::BuildOptions options;
  options.check = attnmeta::MetadataCheck{a->alloc.pool_slots(), TokenCount(query_rows)};
  return attnmeta::BuildForwardMetadata(batch, a->pool, *ps, options);
}

absl::Status ReplayDecodeStepAndValidate(const std::vector<int>& prompt_lens, int page_size,
                                         int num_pages, unsigned seed, int bucket,
                                         int64_t query_rows) {
  absl::StatusOr<attnmeta::BackendConfig> config = GraphConfig(bucket, page_size, 0);
  if (!config.ok()) return config.status();
  const attnmeta::PageSize ps = attnmeta::ConfigPageSize(*config);
  absl::StatusOr<Admitted> a = Admit(prompt_lens, ps, num_pages, seed, kMaxContextLen);
  if (!a.ok()) return a.status();
  attnmeta::HostDeviceMemory memory;
  attnmeta::HostMetadataWriter writer;
  auto state = attnmeta::GraphState::Create(*config, &a->pool, ps, &memory, &writer);
  if (!state.ok()) return state.status();
  absl::StatusOr<attnmeta::CaptureHandle> graph =
      (*state)->Capture(bucket, attnmeta::ForwardMode::kDecode);
  if (!graph.ok()) return graph.status();
  absl::StatusOr<attnmeta::ReplayResult> step =
      (*state)->Replay(*graph, attnmeta::ReplayBatch{a->rows, a->kv_lens});
  if (!step.ok()) return step.status();
  attnmeta::ValidationContext ctx{a->alloc.pool_slots(), ps, TokenCount(query_rows)};
  ctx.allow_padding_page = true;
  ctx.check_slot_ownership = true;
  return attnmeta::ValidateForwardMetadata(step->padded, ctx);
}

absl::StatusOr<int64_t> ReplayDraftExtendStepAndValidate(const std::vector<int>& prompt_lens,
                                                         const std::vector<int>& accepted,
                                                         int page_size, int num_pages,
                                                         unsigned seed, int bucket,
                                                         int draft_tokens, int64_t query_rows) {
  if (accepted.size() != prompt_lens.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prompt_lens.size(), " prompts but ", accepted.size(), " accepted counts"));
  }
  absl::StatusOr<attnmeta::BackendConfig> config = GraphConfig(bucket, page_size, draft_tokens);
  if (!config.ok()) return config.status();
  const attnmeta::PageSize ps = attnmeta::ConfigPageSize(*config);
  // Request i's query rows: its accepted draft tokens and the next one.
  std::vector<int> rows_of;
  std::vector<attnmeta::TokenLength> q_lens;
  for (int n : accepted) {
    rows_of.push_back(n + 1);
    q_lens.push_back(attnmeta::TokenLength(n + 1));
  }
  absl::StatusOr<Admitted> a =
      Admit(prompt_lens, ps, num_pages, seed, kMaxContextLen + draft_tokens, rows_of);
  if (!a.ok()) return a.status();
  attnmeta::HostDeviceMemory memory;
  attnmeta::HostMetadataWriter writer;
  auto state = attnmeta::GraphState::Create(*config, &a->pool, ps, &memory, &writer);
  if (!state.ok()) return state.status();
  absl::StatusOr<attnmeta::CaptureHandle> graph = (*state)->Capture(
      bucket, attnmeta::ForwardMode::kDraftExtend, attnmeta::TokenLength(draft_tokens));
  if (!graph.ok()) return graph.status();
  absl::StatusOr<attnmeta::ReplayResult> step =
      (*state)->Replay(*graph, attnmeta::ReplayBatch{a->rows, a->kv_lens, q_lens});
  if (!step.ok()) return step.status();
  attnmeta::ValidationContext ctx{a->alloc.pool_slots(), ps, TokenCount(query_rows)};
  ctx.allow_padding_page = true;
  ctx.allow_unclaimed_rows = true;
  ctx.check_slot_ownership = true;
  if (absl::Status s = attnmeta::ValidateForwardMetadata(step->padded, ctx); !s.ok()) return s;
  return int64_t{step->padded.qo_indptr.back().value()};
}

}  // namespace consumer
