// CPU reference attention: the project's oracle for metadata. float32 inputs, double
// accumulation, GQA, causal with prefix (query row r of a sequence with q_len rows and
// kv_len KV tokens sits at position kv_len - q_len + r and sees positions [0, that]), or, when
// the metadata carries a custom mask (target-verify's tree), the positions the mask admits.
//
// The same attention is computed four ways, each reading the K/V pool only through one kind
// of metadata: token-level kv_indices, the page table, the context-prefill gather's linear
// buffer, and a split-KV plan with log-sum-exp merge. With correct metadata all four equal
// DenseAttention over the logical, unpaged sequences; a metadata bug shows up as a wrong
// attention result. Every entry point validates its metadata first, so a broken array is an
// error status, never an out-of-bounds read.

#ifndef ATTNMETA_ATTENTION_METADATA_REFERENCE_ATTENTION_H_
#define ATTNMETA_ATTENTION_METADATA_REFERENCE_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "attention/metadata/context_gather.h"
#include "attention/metadata/forward_metadata.h"
#include "attention/metadata/split_kv_planner.h"
#include "kvcache/units.h"

namespace attnmeta {

struct AttentionDims {
  int32_t num_q_heads = 1;
  int32_t num_kv_heads = 1;  // divides num_q_heads
  int32_t head_dim = 1;
};

struct ReferenceAttentionInputs {
  AttentionDims dims;
  ForwardMetadataView metadata;
  PageSize page_size;
  absl::Span<const float> q;       // [qo_indptr[bs]][num_q_heads][head_dim]
  absl::Span<const float> k_pool;  // [pool_slots][num_kv_heads][head_dim]
  absl::Span<const float> v_pool;  // [pool_slots][num_kv_heads][head_dim]
  // A captured graph's whole bucket (GraphState's ReplayResult::padded): padded rows read the
  // padding page (ValidationContext::allow_padding_page).
  bool allow_padding_page = false;
};

// Each writes out: [qo_indptr[bs]][num_q_heads][head_dim]. InvalidArgument for shapes that
// disagree or metadata the validator rejects. Those that take `lse` also write it when it is not
// empty: [qo_indptr[bs]][num_q_heads], the natural log of each row's sum of exp(score), -inf
// for a row that sees no token (the attention kernels' lse).
absl::Status ReferenceAttentionTokenLevel(const ReferenceAttentionInputs& in, absl::Span<float> out,
                                          absl::Span<float> lse = {});
// Reads slot page_table[i][t / page_size] * page_size + t % page_size for token t.
absl::Status ReferenceAttentionPageTable(const ReferenceAttentionInputs& in, absl::Span<float> out,
                                         absl::Span<float> lse = {});
// Copies the K/V rows of gather.tok_idx into linear buffers and reads row cu_k[i] + t.
absl::Status ReferenceAttentionGathered(const ReferenceAttentionInputs& in,
                                        const ContextGather& gather, absl::Span<float> out);
// Runs each work item of `plan` over its KV range (through token-level kv_indices) and
// merges split tiles by log-sum-exp. Items must lie within their sequence; what they cover is
// not checked (so a wrong plan gives a wrong result). Token-level indices serve any split, so
// plans of either layout are accepted.
absl::Status ReferenceAttentionSplitKv(const ReferenceAttentionInputs& in, const SplitKvPlan& plan,
                                       absl::Span<float> out);
// The MLA-prefill path: a split-KV plan run over the gathered linear K/V buffer (row
// cu_k[i] + t). The plan must have been made for the layout this consumer reads,
// KvLayout::LinearPerToken(): InvalidArgument otherwise (a linear-K/V plan made with the
// pool's page size is field bug 5).
absl::Status ReferenceAttentionGatheredSplitKv(const ReferenceAttentionInputs& in,
                                               const ContextGather& gather,
                                               const SplitKvPlan& plan, absl::Span<float> out);

// Attention of one logical sequence: q [q_len][num_q_heads][head_dim] over k, v
// [kv_len][num_kv_heads][head_dim], causal with prefix; out like q; lse, when not empty,
// [q_len][num_q_heads] as above.
absl::Status DenseAttention(const AttentionDims& dims, absl::Span<const float> q,
                            absl::Span<const float> k, absl::Span<const float> v,
                            absl::Span<float> out, absl::Span<float> lse = {});
// The same with an explicit mask: sees [q_len][kv_len], row r attends to position t when
// sees[r * kv_len + t] != 0 (a row that sees nothing gets 0).
absl::Status DenseMaskedAttention(const AttentionDims& dims, absl::Span<const float> q,
                                  absl::Span<const float> k, absl::Span<const float> v,
                                  absl::Span<const uint8_t> sees, absl::Span<float> out,
                                  absl::Span<float> lse = {});

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_REFERENCE_ATTENTION_H_
