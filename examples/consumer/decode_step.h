// A consumer's use of attnmeta: admit requests into a paged KV cache, then build the decode
// metadata of one step.

#ifndef CONSUMER_DECODE_STEP_H_
#define CONSUMER_DECODE_STEP_H_

#include <vector>

#include "absl/status/statusor.h"
#include "attention/metadata/forward_metadata.h"

namespace consumer {

// Prefills requests of `prompt_lens` tokens into a pool of `num_pages` pages of `page_size`
// slots (shuffled with `seed`), then returns the metadata of one decode step over all of them.
absl::StatusOr<attnmeta::ForwardMetadata> DecodeStepAfterPrefill(const std::vector<int>& prompt_lens,
                                                                 int page_size, int num_pages,
                                                                 unsigned seed);

}  // namespace consumer

#endif  // CONSUMER_DECODE_STEP_H_
