// Device helpers the attention kernels share for reading the KV pool through the device
// metadata (paged_decode_attention.hip.cc, varlen_attention.hip.cc): a sequence's KV length,
// clamped to what can be read, and the pool slot of its position t, from token-level indices
// (kv_indices[kv_indptr[i] + t]) or the page table (page_table[i][t / page_size] * page_size +
// t % page_size). Device code only: include it from .hip.cc sources.
//
// Each helper is a template over the kernel's parameter struct (PagedDecodeParams,
// VarlenAttentionParams), which holds the source as `kv` (DeviceKvSource,
// device_kv_source.h: the fields and their contracts) and a `DeviceViolation* violation`.
// Inlined into each kernel, so a kernel reads the fields of its own struct with no copy.

#ifndef ATTNMETA_ATTENTION_KERNELS_INTERNAL_KV_SOURCE_H_
#define ATTNMETA_ATTENTION_KERNELS_INTERNAL_KV_SOURCE_H_

#include <cstdint>

#include "attention/kernels/device_violation.h"
#include "attention/kernels/hip_port.h"
#include "attention/kernels/internal/violation_recorder.h"

#if defined(__CUDACC__) || defined(__HIPCC__)

namespace attnmeta {
namespace kernels {
namespace internal {

// Sequence `seq`'s KV length as the device metadata gives it, clamped to what can be read;
// `index_base` gets where its positions start in kv_indices (token-level; 0 for the page
// table). Violations go to record(kind, index, value, bound) (RecordViolation's arguments
// after the word): kOffsetNegative, kIndptrDecreasing, kTotalPastCapacity (token-level),
// kLengthNegative, kPagesPastTable (page table). It reads the lengths (kv_indptr or kv_lens)
// and nothing else.
template <typename Params, typename Record>
__device__ inline int32_t KvLength(const Params& p, int32_t seq, const Record& record,
                                   int64_t* index_base) {
  if (p.kv.page_level == 0) {
    int64_t begin = p.kv.kv_indptr[seq];
    int64_t end = p.kv.kv_indptr[seq + 1];
    if (begin < 0) {
      record(kOffsetNegative, seq, begin, 0);
      begin = 0;
    }
    if (end < begin) {
      record(kIndptrDecreasing, seq + 1, end, begin);
      end = begin;
    }
    if (end > p.kv.kv_indices_capacity) {
      record(kTotalPastCapacity, seq, end, p.kv.kv_indices_capacity);
      end = p.kv.kv_indices_capacity;
      if (begin > end) begin = end;
    }
    *index_base = begin;
    return static_cast<int32_t>(end - begin);
  }
  *index_base = 0;
  int64_t len = p.kv.kv_lens[seq];
  if (len < 0) {
    record(kLengthNegative, seq, len, 0);
    len = 0;
  }
  const int64_t table_tokens = int64_t{p.kv.page_table_cols} * p.kv.page_size;
  if (len > table_tokens) {
    record(kPagesPastTable, seq, (len + p.kv.page_size - 1) / p.kv.page_size,
           p.kv.page_table_cols);
    len = table_tokens;
  }
  return static_cast<int32_t>(len);
}

// The raw entry behind position t of sequence `seq`: its slot (token-level, at
// index_base + t of kv_indices) or its page (page table). Split from SlotFromEntry so that a
// kernel can load the entries of a step ahead of their use.
// REQUIRES: 0 <= t < KvLength(p, seq, ...), index_base as KvLength gave it.
template <typename Params>
__device__ inline int32_t LoadKvEntry(const Params& p, int32_t seq, int64_t index_base, int32_t t) {
  if (p.kv.page_level == 0) return __ldg(p.kv.kv_indices + index_base + t);
  const int32_t col = p.kv.page_size_log2 >= 0 ? t >> p.kv.page_size_log2 : t / p.kv.page_size;
  return __ldg(p.kv.page_table + int64_t{seq} * p.kv.page_table_cols + col);
}

// The slot of position t from its raw entry (LoadKvEntry), or -1 when it lies outside the pool
// (kSlotOutsidePool recorded in p.violation when `report`; index: the entry of kv_indices or
// of the page table).
template <typename Params>
__device__ inline int64_t SlotFromEntry(const Params& p, int32_t seq, int64_t index_base,
                                        int32_t raw, int32_t t, bool report) {
  int64_t slot = raw;
  int64_t entry = index_base + t;
  if (p.kv.page_level != 0) {
    const int32_t col = p.kv.page_size_log2 >= 0 ? t >> p.kv.page_size_log2 : t / p.kv.page_size;
    const int32_t offset = p.kv.page_size_log2 >= 0 ? t & (p.kv.page_size - 1) : t % p.kv.page_size;
    slot = int64_t{raw} * p.kv.page_size + offset;
    entry = int64_t{seq} * p.kv.page_table_cols + col;
  }
  // One unsigned compare catches negative slots too.
  if (static_cast<uint64_t>(slot) >= static_cast<uint64_t>(p.kv.pool_slots)) {
    if (report) RecordViolation(p.violation, kSlotOutsidePool, entry, slot, p.kv.pool_slots);
    return -1;
  }
  return slot;
}

}  // namespace internal
}  // namespace kernels
}  // namespace attnmeta

#endif  // defined(__CUDACC__) || defined(__HIPCC__)

#endif  // ATTNMETA_ATTENTION_KERNELS_INTERNAL_KV_SOURCE_H_
