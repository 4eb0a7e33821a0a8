#include "attention/metadata/context_gather.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "attention/metadata/internal/indptr.h"
#include "attention/metadata/internal/slot_range.h"
#include "glog/logging.h"

namespace attnmeta {
namespace {

// REQUIRES: kv_indptr non-decreasing (CheckGather).
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

// Pass 1: shapes, lengths and both bounds checks; returns the total. Nothing is written.
absl::StatusOr<int64_t> CheckGather(const ContextGatherInputs& in) {
  // A pool size no pool can have is the caller's bug, not a batch for the paged kernel.
  if (!internal::PoolSlotsAddressable(in.pool_slots.value())) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool_slots ", in.pool_slots.value(), " outside [0, 2^31] (slots are int32)"));
  }
  if (in.kv_indptr.size() != in.kv_lens.size() + 1) {
    return absl::InvalidArgumentError(absl::StrCat("kv_indptr has ", in.kv_indptr.size(),
                                                   " entries, kv_lens ", in.kv_lens.size()));
  }
  // Non-decreasing from 0: the sequences' ranges of kv_indices are disjoint, so the output is
  // no larger than the table it reads (a step down would let them read one stretch again).
  if (absl::Status s = internal::CheckIndptr("kv_indptr", in.kv_indptr); !s.ok()) return s;
  const int64_t table_len = static_cast<int64_t>(in.kv_indices.size());
  const int64_t pool = in.pool_slots.value();
  int64_t sum = 0;
  for (size_t i = 0; i < in.kv_lens.size(); ++i) {
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
  // Each length is at most its step of kv_indptr, so the total is at most kv_indptr[bs], an
  // int32 offset: cu_k cannot overflow.
  return sum;
}

// Pass 2. REQUIRES: CheckGather(in) passed; tok_idx holds its total, cu_k bs + 1 entries.
void WriteGather(const ContextGatherInputs& in, absl::Span<TokenSlot> tok_idx,
                 absl::Span<TokenOffset> cu_k) {
  int32_t at = 0;
  cu_k[0] = TokenOffset(0);
  for (size_t i = 0; i < in.kv_lens.size(); ++i) {
    const int64_t len = ClampedLength(in, i);
    if (len > 0) {
      const TokenSlot* src = in.kv_indices.data() + in.kv_indptr[i].value();
      std::copy(src, src + len, tok_idx.begin() + at);
      at += static_cast<int32_t>(len);
    }
    cu_k[i + 1] = TokenOffset(at);
  }
}

}  // namespace

absl::Status GatherContextTokens(const ContextGatherInputs& in, absl::Span<TokenSlot> tok_idx,
                                 absl::Span<TokenOffset> cu_k, TokenCount* total) {
  absl::StatusOr<int64_t> sum = CheckGather(in);
  if (!sum.ok()) return sum.status();
  if (cu_k.size() != in.kv_lens.size() + 1) {
    return absl::InvalidArgumentError(absl::StrCat("cu_k output has ", cu_k.size(),
                                                   " entries, want ", in.kv_lens.size() + 1));
  }
  if (static_cast<int64_t>(tok_idx.size()) < *sum) {
    return absl::InvalidArgumentError(absl::StrCat("tok_idx output holds ", tok_idx.size(),
                                                   " entries, the batch needs ", *sum));
  }
  WriteGather(in, tok_idx, cu_k);
  if (total != nullptr) *total = TokenCount(*sum);
  return absl::OkStatus();
}

absl::StatusOr<ContextGather> GatherContextTokens(const ContextGatherInputs& in) {
  absl::StatusOr<int64_t> sum = CheckGather(in);
  if (!sum.ok()) return sum.status();
  ContextGather g;
  g.tok_idx.resize(*sum);
  g.cu_k.resize(in.kv_lens.size() + 1);
  WriteGather(in, absl::MakeSpan(g.tok_idx), absl::MakeSpan(g.cu_k));
  return g;
}

}  // namespace attnmeta
