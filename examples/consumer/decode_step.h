// A consumer's use of attnmeta: admit requests into a paged KV cache, then build the decode
// metadata of one step, eagerly or by replaying a captured graph's buffers, and replay an
// EAGLE draft-extend step in a graph.

#ifndef CONSUMER_DECODE_STEP_H_
#define CONSUMER_DECODE_STEP_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/metadata/forward_metadata.h"

namespace consumer {

// Prefills requests of `prompt_lens` tokens (each at least 1) into a pool of `num_pages` pages
// of `page_size` slots (shuffled with `seed`), then returns the metadata of one decode step over
// all of them, checked against `query_rows`: the rows of the query tensor the decode kernel is
// given. It comes from that tensor, not from the batch, so that a tensor of the wrong size is
// an error before any launch (DESIGN.md section 3).
absl::StatusOr<attnmeta::ForwardMetadata> DecodeStepAfterPrefill(
    const std::vector<int>& prompt_lens, int page_size, int num_pages, unsigned seed,
    int64_t query_rows);

// The same requests' decode step through a graph: a backend config in text format, a decode
// graph captured for `bucket` requests in host memory, one replay of the step, and the
// validator over what the replay wrote (checked slot ownership included): the whole bucket's
// view, which a kernel captured for the bucket reads, against `query_rows` (the captured query
// tensor's rows: one per request of the bucket).
absl::Status ReplayDecodeStepAndValidate(const std::vector<int>& prompt_lens, int page_size,
                                         int num_pages, unsigned seed, int bucket,
                                         int64_t query_rows);

// An EAGLE draft-extend step through a graph captured for `bucket` requests at `draft_tokens`
// query rows each: request i, after its prompt, extends by accepted[i] + 1 tokens (at most
// draft_tokens), its query rows. The replay's whole-bucket view is validated against
// `query_rows`, the rows of the captured query tensor (bucket * draft_tokens), with the tail of
// rows that fewer accepted tokens leave unclaimed allowed: a varlen kernel captured for the
// bucket is launched with zero_unclaimed_rows and max_q_len = draft_tokens. Returns
// qo_indptr[bucket], the rows the requests (real and padded) claim.
absl::StatusOr<int64_t> ReplayDraftExtendStepAndValidate(const std::vector<int>& prompt_lens,
                                                         const std::vector<int>& accepted,
                                                         int page_size, int num_pages,
                                                         unsigned seed, int bucket,
                                                         int draft_tokens, int64_t query_rows);

}  // namespace consumer

#endif  // CONSUMER_DECODE_STEP_H_
