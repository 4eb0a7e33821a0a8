// What each forward mode allows of a sequence's lengths; shared by the builders and the
// validator so that the two cannot disagree.

#ifndef ATTNMETA_ATTENTION_METADATA_MODE_RULES_H_
#define ATTNMETA_ATTENTION_METADATA_MODE_RULES_H_

#include <cstdint>

#include "absl/status/status.h"
#include "attention/metadata/custom_mask.h"
#include "attention/metadata/forward_mode.h"
#include "kvcache/units.h"

namespace attnmeta {

// InvalidArgument unless `mode` is a forward mode (CheckKnownForwardMode) and a batch of
// `batch_size` sequences is allowed in it (idle: exactly 0; every other mode: at least 1).
absl::Status CheckModeBatchSize(ForwardMode mode, int64_t batch_size);

// InvalidArgument unless sequence `i` with q_len query rows over kv_len KV tokens is allowed
// in `mode`: always 0 <= q_len <= kv_len (the query rows are the last q_len tokens); decode
// and draft-decode (one row per branch): q_len == 1; extend, mixed, draft-extend and
// target-verify: q_len >= 1.
absl::Status CheckModeSequence(ForwardMode mode, int64_t i, TokenCount q_len, TokenCount kv_len);

// InvalidArgument unless `mode` allows a custom mask of `layout`: target-verify needs one (a
// tree of query rows read causally attends to the wrong tokens); decode, draft-decode and
// idle have one query row per sequence or none and take none; extend, mixed and draft-extend
// take either.
absl::Status CheckModeMask(ForwardMode mode, MaskLayout layout);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_MODE_RULES_H_
