// Checks every host launcher shares, and the checks the attention launchers share: dims, the
// KV source, the K/V pools and the vector-loaded buffers. Messages start with the caller's
// `op` name ("decode attention", "varlen attention"). Host code without the GPU runtime (the
// runtime queries are in device_queries.h): the launchers' checks are tested on the CPU.

#ifndef ATTNMETA_ATTENTION_KERNELS_INTERNAL_LAUNCH_CHECKS_H_
#define ATTNMETA_ATTENTION_KERNELS_INTERNAL_LAUNCH_CHECKS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <variant>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "attention/kernels/checked_metadata.h"
#include "attention/kernels/device_span.h"
#include "attention/kernels/element_dtype.h"
#include "attention/kernels/metadata_kernels.h"
#include "kvcache/units.h"

namespace attnmeta {
namespace internal {

// A span's element count as an int64, saturated at INT64_MAX: a claimed size of 2^63 or more
// must not turn negative and pass a bound.
template <typename T>
int64_t ClaimedSize(DeviceSpan<T> span) {
  return span.size() > static_cast<size_t>(std::numeric_limits<int64_t>::max())
             ? std::numeric_limits<int64_t>::max()
             : static_cast<int64_t>(span.size());
}

// InvalidArgument for a span with elements but no pointer.
template <typename T>
absl::Status CheckNotNull(absl::string_view name, DeviceSpan<T> span) {
  if (!span.empty() && span.data() == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " has ", span.size(), " elements but a null pointer"));
  }
  return absl::OkStatus();
}

// Counts the metadata kernels step through in int32 (a batch, its draft branches, page-table
// columns, a row's tokens): at most 2^30, so that a count plus a block's or a grid's stride
// (at most 2^26) or a page size (at most 2^30) less one stays within int32.
inline constexpr int64_t kMaxMetadataCount = int64_t{1} << 30;

// The kernels' view of req_to_token ([rows][stride], row-major) and the KV pool, checked:
// InvalidArgument unless the table is a whole number >= 1 of rows with a pointer; OutOfRange
// for rows, pool slots or a page size beyond int32, or rows longer than kMaxMetadataCount.
inline absl::StatusOr<kernels::SlotSource> CheckedSlotSource(DeviceSpan<const TokenSlot> table,
                                                             TokenCount stride,
                                                             TokenCount pool_slots,
                                                             PageSize page_size) {
  const int64_t cols = stride.value();
  if (cols < 1 || table.empty() || table.size() % cols != 0) {
    return absl::InvalidArgumentError(absl::StrCat("req_to_token has ", table.size(),
                                                   " entries, not a whole number >= 1 of rows of ",
                                                   cols));
  }
  if (absl::Status s = CheckNotNull("req_to_token", table); !s.ok()) return s;
  const int64_t rows = ClaimedSize(table) / cols;
  if (rows > INT32_MAX || pool_slots.value() < 0 || pool_slots.value() > (int64_t{1} << 31) ||
      page_size.tokens() > (int64_t{1} << 30)) {
    return absl::OutOfRangeError("req_to_token rows, pool slots or page size beyond int32");
  }
  if (cols > kMaxMetadataCount) {
    return absl::OutOfRangeError(
        absl::StrCat("req_to_token rows of ", cols, " tokens, beyond ", kMaxMetadataCount));
  }
  kernels::SlotSource s;
  s.req_to_token = reinterpret_cast<const int32_t*>(table.data());
  s.stride = cols;
  s.max_reqs = static_cast<int32_t>(rows);
  s.pool_slots = pool_slots.value();
  s.page_size = static_cast<int32_t>(page_size.tokens());
  s.page_size_log2 = page_size.log2();
  return s;
}

// Grid passes (grid dimension y) to cover `n` items at `per_pass` per block: at least 1, at
// most 65535 (the y limit on NVIDIA; blocks then loop over the rest). Any n: a tree mask's
// bytes per row are checked only to be >= 1, and n + per_pass - 1 must not overflow.
// REQUIRES: per_pass >= 1.
inline int32_t Passes(int64_t n, int64_t per_pass) {
  const int64_t most = int64_t{65535} * per_pass;
  return static_cast<int32_t>(
      std::clamp<int64_t>((std::min(n, most) + per_pass - 1) / per_pass, 1, 65535));
}

// Token positions the attention kernels handle in int32 with room for their tile arithmetic:
// kv_indices entries, and page-table columns times the page size.
inline constexpr int64_t kMaxKvTokens = int64_t{1} << 30;
// The attention kernels' vector loads and stores of q, the K/V pools and out.
inline constexpr int64_t kVectorBytes = 16;
// Bytes of one element of q, the pools and out (bf16 and fp16).
inline constexpr int64_t kElementBytes = 2;

inline bool Aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// The kernels' dtype of a KvElementType (metadata_kernel_args.h; a template, as that library
// depends on this one). REQUIRES: t is kBf16 or kFp16.
template <typename ElementType>
kernels::ElementDtype ElementDtypeOf(ElementType t) {
  return t == ElementType::kBf16 ? kernels::kElementBf16 : kernels::kElementFp16;
}

// Query heads per block of the attention kernels for a GQA group: the largest of 8, 4, 2, 1
// dividing it (their instantiations).
inline int32_t HeadsPerBlock(int32_t group) {
  for (int32_t heads : {8, 4, 2}) {
    if (group % heads == 0) return heads;
  }
  return 1;
}

// The attention dims (DecodeAttentionDims: num_q_heads, num_kv_heads, head_dim, dtype,
// softmax_scale): InvalidArgument for head counts that do not divide, a head dim other than
// 64/128/256, an unknown element type, a scale that is not finite and > 0.
template <typename Dims>
absl::Status CheckAttentionDims(absl::string_view op, const Dims& d) {
  if (d.num_q_heads < 1 || d.num_kv_heads < 1 || d.num_q_heads % d.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": num_q_heads ", d.num_q_heads,
                                                   " is not a positive multiple of num_kv_heads ",
                                                   d.num_kv_heads));
  }
  if (d.head_dim != 64 && d.head_dim != 128 && d.head_dim != 256) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": head_dim ", d.head_dim, " is not 64, 128 or 256"));
  }
  using ElementType = decltype(d.dtype);
  if (d.dtype != ElementType::kBf16 && d.dtype != ElementType::kFp16) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": unknown element type"));
  }
  if (!std::isfinite(d.softmax_scale) || d.softmax_scale <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": softmax_scale ", d.softmax_scale, " is not finite and > 0"));
  }
  return absl::OkStatus();
}

// The batch size a KV source (DecodeKv: DecodeTokenLevelKv or DecodePageTableKv) describes,
// its shapes checked, and its fields of the kernel's parameters (`Params`: the KV-source
// fields internal/kv_source.h names). InvalidArgument for a kv_indptr without entries, a
// page table smaller than [bs][cols], a null pointer with a nonzero size; OutOfRange for
// kv_indices or a page table beyond kMaxKvTokens.
template <typename TokenLevelKv, typename PageTableKv, typename Params>
absl::StatusOr<int64_t> CheckKvSource(absl::string_view op,
                                      const std::variant<TokenLevelKv, PageTableKv>& kv,
                                      Params& p) {
  if (const auto* t = std::get_if<TokenLevelKv>(&kv)) {
    if (t->kv_indptr.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": kv_indptr needs bs + 1 >= 1 entries"));
    }
    if (ClaimedSize(t->kv_indices) > kMaxKvTokens) {
      return absl::OutOfRangeError(absl::StrCat(op, ": kv_indices of ", t->kv_indices.size(),
                                                " entries, at most ", kMaxKvTokens));
    }
    for (absl::Status s :
         {CheckNotNull("kv_indptr", t->kv_indptr), CheckNotNull("kv_indices", t->kv_indices)}) {
      if (!s.ok()) return s;
    }
    p.kv.page_level = 0;
    p.kv.kv_indptr = reinterpret_cast<const int32_t*>(t->kv_indptr.data());
    p.kv.kv_indices = reinterpret_cast<const int32_t*>(t->kv_indices.data());
    p.kv.kv_indices_capacity = ClaimedSize(t->kv_indices);
    return ClaimedSize(t->kv_indptr) - 1;
  }
  const PageTableKv& pt = std::get<PageTableKv>(kv);
  const int64_t bs = ClaimedSize(pt.kv_lens);
  const int64_t cols = pt.cols.value();
  if (cols < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": a page table of ", cols, " columns (negative)"));
  }
  if (cols > kMaxKvTokens / pt.page_size.tokens()) {
    return absl::OutOfRangeError(absl::StrCat(op, ": a page table of ", cols,
                                              " columns of page_size ", pt.page_size.tokens(),
                                              " covers more than ", kMaxKvTokens, " tokens"));
  }
  // By division: bs is a span's size, so bs * cols can pass INT64_MAX.
  if (cols > 0 && ClaimedSize(pt.page_table) / cols < bs) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": page_table of ", pt.page_table.size(),
                                                   " entries is not [", bs, "][", cols, "]"));
  }
  for (absl::Status s :
       {CheckNotNull("page_table", pt.page_table), CheckNotNull("kv_lens", pt.kv_lens)}) {
    if (!s.ok()) return s;
  }
  p.kv.page_level = 1;
  p.kv.page_table = reinterpret_cast<const int32_t*>(pt.page_table.data());
  p.kv.page_table_cols = static_cast<int32_t>(cols);
  p.kv.kv_lens = reinterpret_cast<const int32_t*>(pt.kv_lens.data());
  p.kv.page_size = static_cast<int32_t>(pt.page_size.tokens());
  p.kv.page_size_log2 = pt.page_size.log2();
  return bs;
}

// What a launch over `kv` (of bs sequences, checked by CheckKvSource) with query_rows rows of
// q and pool_slots slots knows of its metadata, for the checked mode (checked_metadata.h). The
// caller sets the mask layout and max_q_len.
template <typename TokenLevelKv, typename PageTableKv>
LaunchedMetadataShape LaunchedKvShape(const std::variant<TokenLevelKv, PageTableKv>& kv,
                                      int64_t bs, int64_t query_rows, int64_t pool_slots) {
  LaunchedMetadataShape shape;
  shape.batch_size = bs;
  shape.query_rows = TokenCount(query_rows);
  shape.pool_slots = TokenCount(pool_slots);
  if (const auto* t = std::get_if<TokenLevelKv>(&kv)) {
    shape.kv_indices_entries = TokenCount(ClaimedSize(t->kv_indices));
  } else {
    const PageTableKv& pt = std::get<PageTableKv>(kv);
    shape.page_table = true;
    shape.page_table_cols = pt.cols;
    shape.page_size = pt.page_size;
  }
  return shape;
}

// The K/V pools and the vector-loaded buffers of an attention launch (their sizes against the
// query rows checked by the caller): the pool slots. InvalidArgument for pools that are not
// the same whole rows of num_kv_heads * head_dim elements, q / k_pool / v_pool / out not
// kVectorBytes-aligned, a null pointer with a nonzero size; OutOfRange for a slot
// (num_kv_heads * head_dim elements) of 2^31 bytes or more, or more than 2^31 pool slots.
inline absl::StatusOr<int64_t> CheckAttentionBuffers(absl::string_view op,
                                                     DeviceSpan<const uint8_t> q,
                                                     DeviceSpan<const uint8_t> k_pool,
                                                     DeviceSpan<const uint8_t> v_pool,
                                                     DeviceSpan<uint8_t> out,
                                                     DeviceSpan<float> lse, int32_t num_kv_heads,
                                                     int32_t head_dim) {
  const int64_t row = int64_t{num_kv_heads} * head_dim * kElementBytes;
  if (row > std::numeric_limits<int32_t>::max()) {
    return absl::OutOfRangeError(absl::StrCat(op, ": a pool slot of ", row,
                                              " bytes, past the kernels' 32-bit row offsets"));
  }
  if (k_pool.size() != v_pool.size() || k_pool.size() % static_cast<size_t>(row) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": K/V pools of ", k_pool.size(), " and ",
                                                   v_pool.size(),
                                                   " bytes are not the same whole rows of ", row));
  }
  // Saturated: a negative slot count would pass here and leave the kernels' unsigned slot
  // check with no bound at all.
  const int64_t slots = ClaimedSize(k_pool) / row;
  if (slots > (int64_t{1} << 31)) {
    return absl::OutOfRangeError(absl::StrCat(op, ": more than 2^31 pool slots"));
  }
  for (const void* ptr : {static_cast<const void*>(q.data()), static_cast<const void*>(k_pool.data()),
                          static_cast<const void*>(v_pool.data()),
                          static_cast<const void*>(out.data())}) {
    if (!Aligned(ptr, kVectorBytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": q, k_pool, v_pool and out must be 16-byte aligned (vector loads)"));
    }
  }
  for (absl::Status s : {CheckNotNull("q", q), CheckNotNull("k_pool", k_pool),
                         CheckNotNull("v_pool", v_pool), CheckNotNull("out", out),
                         CheckNotNull("lse", lse)}) {
    if (!s.ok()) return s;
  }
  return slots;
}

}  // namespace internal
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_INTERNAL_LAUNCH_CHECKS_H_
