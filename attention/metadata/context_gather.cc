#include "attention/metadata/context_gather.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "attention/metadata/internal/slot_range.h"
#include "glog/logging.h"

namespace attnmeta {
namespace {

int64_t ClampedLength(const ContextGatherInputs& in, size_t i) {
  const int64_t step = (in.kv_indptr[i + 1] - in.kv_indptr[i]).value();
  return std::max<int64_t>(0, std::min<int64_t>(in.kv_lens[i].value(), step));
}

absl::Status FallBack(const ContextGatherInputs& in, absl::string_view what, int64_t value,
                      absl::string_view table, int64_t table_len) {
  LOG(WARNING) << "context-prefill gather falls back to the paged kernel: mode="
               << ForwardModeName(in.mode) << " bs=" << in.kv_lens.size() << " " << what << " "
               << value << " outside " << table << " of length " << table_len;
  return absl::OutOfRangeError(absl::StrCat("context-prefill gather: ", what, " ", value,
                                            " outside ", table, " of length ", table_len));
}

}  // namespace

absl::Status GatherContextTokens(const ContextGatherInputs& in, absl::Span<TokenSlot> tok_idx,
                                 absl::Span<TokenOffset> cu_k, TokenCount* total) {
  if (in.kv_indptr.size() != in.kv_lens.size() + 1) {
    return absl::InvalidArgumentError(absl::StrCat("kv_indptr has ", in.kv_indptr.size(),
                                                   " entries, kv_lens ", in.kv_lens.size()));
  }
  const size_t bs = in.kv_lens.size();
  if (cu_k.size() != bs + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cu_k output has ", cu_k.size(), " entries, want ", bs + 1));
  }
  // Pass 1: lengths and both bounds checks; nothing is written.
  const int64_t table_len = static_cast<int64_t>(in.kv_indices.size());
  const int64_t pool = in.pool_slots.value();
  int64_t sum = 0;
  for (size_t i = 0; i < bs; ++i) {
    const int64_t len = ClampedLength(in, i);
    if (len == 0) continue;
    const int64_t first = in.kv_indptr[i].value();
    const int64_t last = first + len - 1;
    if (first < 0 || last >= table_len) {
      return FallBack(in, "kv_indices index", first < 0 ? first : last, "kv_indices", table_len);
    }
    const absl::Span<const TokenSlot> slots = in.kv_indices.subspan(first, len);
    if (!internal::AllSlotsIn(slots, 0, pool)) {
      for (TokenSlot s : slots) {
        if (s.value() < 0 || s.value() >= pool) {
          return FallBack(in, "slot", s.value(), "the KV pool", pool);
        }
      }
    }
    sum += len;
  }
  if (sum > std::numeric_limits<int32_t>::max()) {
    return FallBack(in, "total tokens", sum, "int32 offsets", std::numeric_limits<int32_t>::max());
  }
  if (static_cast<int64_t>(tok_idx.size()) < sum) {
    return absl::InvalidArgumentError(
        absl::StrCat("tok_idx output holds ", tok_idx.size(), " entries, the batch needs ", sum));
  }
  // Pass 2: write.
  int32_t at = 0;
  cu_k[0] = TokenOffset(0);
  for (size_t i = 0; i < bs; ++i) {
    const int64_t len = ClampedLength(in, i);
    if (len > 0) {
      const TokenSlot* src = in.kv_indices.data() + in.kv_indptr[i].value();
      std::copy(src, src + len, tok_idx.begin() + at);
      at += static_cast<int32_t>(len);
    }
    cu_k[i + 1] = TokenOffset(at);
  }
  if (total != nullptr) *total = TokenCount(sum);
  return absl::OkStatus();
}

absl::StatusOr<ContextGather> GatherContextTokens(const ContextGatherInputs& in) {
  if (in.kv_indptr.size() != in.kv_lens.size() + 1) {
    return absl::InvalidArgumentError(absl::StrCat("kv_indptr has ", in.kv_indptr.size(),
                                                   " entries, kv_lens ", in.kv_lens.size()));
  }
  // The clamped lengths are the output size; a total beyond int32 is reported by the span
  // version's checks, which run before it looks at the output's size.
  int64_t bound = 0;
  for (size_t i = 0; i < in.kv_lens.size(); ++i) bound += ClampedLength(in, i);
  ContextGather g;
  g.tok_idx.resize(bound <= std::numeric_limits<int32_t>::max() ? bound : 0);
  g.cu_k.resize(in.kv_lens.size() + 1);
  TokenCount total;
  if (absl::Status s = GatherContextTokens(in, absl::MakeSpan(g.tok_idx), absl::MakeSpan(g.cu_k),
                                           &total);
      !s.ok()) {
    return s;
  }
  g.tok_idx.resize(total.value());
  return g;
}

}  // namespace attnmeta
