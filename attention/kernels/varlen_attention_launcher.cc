#include "attention/kernels/varlen_attention_launcher.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <variant>

#include "absl/strings/str_cat.h"
#include "attention/kernels/internal/launch_checks.h"
#include "attention/kernels/varlen_attention.h"

namespace attnmeta {

using internal::CheckNotNull;
using internal::LaunchResult;

namespace {

// Token positions the kernel handles in int32 with room for its tile arithmetic.
constexpr int64_t kMaxTokens = int64_t{1} << 30;
// Blocks of one launch: within NVIDIA's grid x and, at 128 threads, HIP's 2^32 threads.
constexpr int64_t kMaxBlocks = int64_t{1} << 24;
constexpr int64_t kMaxQueryHeads = 65535;
constexpr int64_t kVectorBytes = 16;
constexpr int64_t kElementBytes = 2;  // bf16 and fp16

bool Aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Query heads per block: the largest of 8, 4, 2, 1 dividing the group (kernel instantiations
// take any of them; the block's rows are VarlenQueryVectors / heads).
absl::StatusOr<int32_t> CheckDims(const DecodeAttentionDims& d) {
  if (d.num_q_heads < 1 || d.num_kv_heads < 1 || d.num_q_heads % d.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("varlen attention: num_q_heads ", d.num_q_heads,
                                                   " is not a positive multiple of num_kv_heads ",
                                                   d.num_kv_heads));
  }
  if (d.num_q_heads > kMaxQueryHeads) {
    return absl::OutOfRangeError(absl::StrCat("varlen attention: ", d.num_q_heads,
                                              " query heads, at most ", kMaxQueryHeads));
  }
  if (d.head_dim != 64 && d.head_dim != 128 && d.head_dim != 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("varlen attention: head_dim ", d.head_dim, " is not 64, 128 or 256"));
  }
  if (d.dtype != KvElementType::kBf16 && d.dtype != KvElementType::kFp16) {
    return absl::InvalidArgumentError("varlen attention: unknown element type");
  }
  if (!std::isfinite(d.softmax_scale) || d.softmax_scale <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("varlen attention: softmax_scale ",
                                                   d.softmax_scale, " is not finite and > 0"));
  }
  const int32_t group = d.num_q_heads / d.num_kv_heads;
  for (int32_t heads : {8, 4, 2}) {
    if (group % heads == 0) return heads;
  }
  return 1;
}

// The batch size the KV source describes, its shapes checked, and its part of the kernel's
// arguments.
absl::StatusOr<int64_t> CheckKv(const DecodeKv& kv, kernels::VarlenAttentionParams& p) {
  if (const auto* t = std::get_if<DecodeTokenLevelKv>(&kv)) {
    if (t->kv_indptr.empty()) {
      return absl::InvalidArgumentError("varlen attention: kv_indptr needs bs + 1 >= 1 entries");
    }
    if (static_cast<int64_t>(t->kv_indices.size()) > kMaxTokens) {
      return absl::OutOfRangeError(absl::StrCat("varlen attention: kv_indices of ",
                                                t->kv_indices.size(), " entries, at most ",
                                                kMaxTokens));
    }
    for (absl::Status s :
         {CheckNotNull("kv_indptr", t->kv_indptr), CheckNotNull("kv_indices", t->kv_indices)}) {
      if (!s.ok()) return s;
    }
    p.page_level = 0;
    p.kv_indptr = reinterpret_cast<const int32_t*>(t->kv_indptr.data());
    p.kv_indices = reinterpret_cast<const int32_t*>(t->kv_indices.data());
    p.kv_indices_capacity = static_cast<int64_t>(t->kv_indices.size());
    return static_cast<int64_t>(t->kv_indptr.size()) - 1;
  }
  const DecodePageTableKv& pt = std::get<DecodePageTableKv>(kv);
  const int64_t bs = static_cast<int64_t>(pt.kv_lens.size());
  if (pt.cols < 0 || pt.cols > kMaxTokens / pt.page_size.tokens()) {
    return absl::OutOfRangeError(absl::StrCat("varlen attention: a page table of ", pt.cols,
                                              " columns of page_size ", pt.page_size.tokens(),
                                              " covers more than ", kMaxTokens, " tokens"));
  }
  if (static_cast<int64_t>(pt.page_table.size()) < bs * pt.cols) {
    return absl::InvalidArgumentError(absl::StrCat("varlen attention: page_table of ",
                                                   pt.page_table.size(), " entries is not [", bs,
                                                   "][", pt.cols, "]"));
  }
  for (absl::Status s :
       {CheckNotNull("page_table", pt.page_table), CheckNotNull("kv_lens", pt.kv_lens)}) {
    if (!s.ok()) return s;
  }
  p.page_level = 1;
  p.page_table = reinterpret_cast<const int32_t*>(pt.page_table.data());
  p.page_table_cols = static_cast<int32_t>(pt.cols);
  p.kv_lens = reinterpret_cast<const int32_t*>(pt.kv_lens.data());
  p.page_size = static_cast<int32_t>(pt.page_size.tokens());
  p.page_size_log2 = pt.page_size.log2();
  return bs;
}

// q, out, lse and the pools against the dims; the query rows q holds.
absl::StatusOr<int64_t> CheckBuffers(const VarlenAttentionArgs& a) {
  const DecodeAttentionDims& d = a.dims;
  const int64_t q_row = int64_t{d.num_q_heads} * d.head_dim * kElementBytes;
  const int64_t q_bytes = static_cast<int64_t>(a.q.size());
  const int64_t rows = q_bytes / q_row;
  if (q_bytes % q_row != 0 || static_cast<int64_t>(a.out.size()) != q_bytes ||
      static_cast<int64_t>(a.lse.size()) != rows * d.num_q_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "varlen attention: q of ", q_bytes, " bytes, out of ", a.out.size(), " bytes and lse of ",
        a.lse.size(), " floats are not the same whole rows of ", q_row, " bytes and ",
        d.num_q_heads, " floats"));
  }
  if (rows > std::numeric_limits<int32_t>::max()) {
    return absl::OutOfRangeError(absl::StrCat("varlen attention: ", rows, " query rows, beyond int32"));
  }
  const int64_t kv_row = int64_t{d.num_kv_heads} * d.head_dim * kElementBytes;
  if (a.k_pool.size() != a.v_pool.size() || static_cast<int64_t>(a.k_pool.size()) % kv_row != 0) {
    return absl::InvalidArgumentError(absl::StrCat("varlen attention: K/V pools of ",
                                                   a.k_pool.size(), " and ", a.v_pool.size(),
                                                   " bytes are not the same whole rows of ", kv_row));
  }
  if (static_cast<int64_t>(a.k_pool.size()) / kv_row > (int64_t{1} << 31)) {
    return absl::OutOfRangeError("varlen attention: more than 2^31 pool slots");
  }
  for (const void* ptr :
       {static_cast<const void*>(a.q.data()), static_cast<const void*>(a.k_pool.data()),
        static_cast<const void*>(a.v_pool.data()), static_cast<const void*>(a.out.data())}) {
    if (!Aligned(ptr, kVectorBytes)) {
      return absl::InvalidArgumentError(
          "varlen attention: q, k_pool, v_pool and out must be 16-byte aligned (vector loads)");
    }
  }
  for (absl::Status s : {CheckNotNull("q", a.q), CheckNotNull("k_pool", a.k_pool),
                         CheckNotNull("v_pool", a.v_pool), CheckNotNull("out", a.out),
                         CheckNotNull("lse", a.lse)}) {
    if (!s.ok()) return s;
  }
  return rows;
}

// qo_indptr and max_q_len against the batch and the query rows.
absl::Status CheckQueries(const VarlenAttentionArgs& a, int64_t bs, int64_t rows) {
  if (static_cast<int64_t>(a.qo_indptr.size()) != bs + 1) {
    return absl::InvalidArgumentError(absl::StrCat("varlen attention: qo_indptr has ",
                                                   a.qo_indptr.size(),
                                                   " entries, the KV source's batch of ", bs,
                                                   " wants ", bs + 1));
  }
  if (absl::Status s = CheckNotNull("qo_indptr", a.qo_indptr); !s.ok()) return s;
  const int64_t max_q = a.max_q_len.value();
  // q_rows = qo_indptr[bs] = sum of q_len <= bs * max_q_len, and max_q_len <= q_rows.
  if (max_q < 0 || max_q > rows || rows > bs * max_q) {
    return absl::InvalidArgumentError(absl::StrCat(
        "varlen attention: max_q_len ", max_q, " does not fit ", rows, " query rows over ", bs,
        " sequences (want max_q_len <= q_rows <= bs * max_q_len)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<kernels::VarlenMask> MaskLayoutOf(MaskLayout layout) {
  switch (layout) {
    case MaskLayout::kNone:
      return kernels::kVarlenCausal;
    case MaskLayout::kFull:
      return kernels::kVarlenMaskFull;
    case MaskLayout::kQLenOnly:
      return kernels::kVarlenMaskQLenOnly;
    case MaskLayout::kBitPacked:
      return kernels::kVarlenMaskBitPacked;
  }
  return absl::InvalidArgumentError("varlen attention: unknown mask layout");
}

absl::Status CheckMask(const VarlenAttentionArgs& a, int64_t bs, kernels::VarlenAttentionParams& p) {
  const VarlenMask& m = a.mask;
  absl::StatusOr<kernels::VarlenMask> layout = MaskLayoutOf(m.layout);
  if (!layout.ok()) return layout.status();
  if (m.layout == MaskLayout::kNone) {
    if (!m.mask.empty() || !m.mask_indptr.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "varlen attention: mask arrays (", m.mask.size(), " bytes, ", m.mask_indptr.size(),
          " mask_indptr entries) without a mask layout"));
    }
    p.mask_layout = kernels::kVarlenCausal;
    return absl::OkStatus();
  }
  if (static_cast<int64_t>(m.mask_indptr.size()) != bs + 1) {
    return absl::InvalidArgumentError(absl::StrCat("varlen attention: a ", MaskLayoutName(m.layout),
                                                   " mask needs mask_indptr of bs + 1 = ", bs + 1,
                                                   " entries, got ", m.mask_indptr.size()));
  }
  const int32_t word_bytes = MaskWordBytes(a.max_q_len);
  if (m.layout == MaskLayout::kBitPacked && word_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("varlen attention: a bit-packed mask holds at most ",
                                                   kMaxBitPackedRows, " query rows, max_q_len is ",
                                                   a.max_q_len.value()));
  }
  if (!Aligned(m.mask_indptr.data(), sizeof(int64_t))) {
    return absl::InvalidArgumentError("varlen attention: mask_indptr must be 8-byte aligned");
  }
  for (absl::Status s : {CheckNotNull("mask", m.mask), CheckNotNull("mask_indptr", m.mask_indptr)}) {
    if (!s.ok()) return s;
  }
  p.mask_layout = *layout;
  p.mask = m.mask.data();
  p.mask_capacity = static_cast<int64_t>(m.mask.size());
  p.mask_indptr = m.mask_indptr.data();
  p.mask_word_bytes = word_bytes;
  return absl::OkStatus();
}

}  // namespace

absl::Status VarlenAttention(const VarlenAttentionArgs& a, kernels::DeviceViolation* violation,
                             hipStream_t stream) {
  absl::StatusOr<int32_t> heads_per_block = CheckDims(a.dims);
  if (!heads_per_block.ok()) return heads_per_block.status();
  kernels::VarlenAttentionParams p{};
  absl::StatusOr<int64_t> bs = CheckKv(a.kv, p);
  if (!bs.ok()) return bs.status();
  if (*bs > std::numeric_limits<int32_t>::max()) {
    return absl::OutOfRangeError("varlen attention: batch beyond int32");
  }
  absl::StatusOr<int64_t> rows = CheckBuffers(a);
  if (!rows.ok()) return rows.status();
  if (absl::Status s = CheckQueries(a, *bs, *rows); !s.ok()) return s;
  if (absl::Status s = CheckMask(a, *bs, p); !s.ok()) return s;
  const int32_t rows_per_block = kernels::VarlenQueryVectors(a.dims.head_dim) / *heads_per_block;
  const int64_t q_tiles = (a.max_q_len.value() + rows_per_block - 1) / rows_per_block;
  const int64_t blocks = *bs * q_tiles * (a.dims.num_q_heads / *heads_per_block);
  if (blocks > kMaxBlocks) {
    return absl::OutOfRangeError(absl::StrCat("varlen attention: ", blocks, " blocks, at most ",
                                              kMaxBlocks, " (fewer sequences, rows or heads)"));
  }
  if (blocks == 0) return absl::OkStatus();

  p.q = a.q.data();
  p.q_rows = static_cast<int32_t>(*rows);
  p.qo_indptr = reinterpret_cast<const int32_t*>(a.qo_indptr.data());
  p.max_q_len = static_cast<int32_t>(a.max_q_len.value());
  p.q_tiles = static_cast<int32_t>(q_tiles);
  p.k_pool = a.k_pool.data();
  p.v_pool = a.v_pool.data();
  p.pool_slots =
      static_cast<int64_t>(a.k_pool.size()) / (int64_t{a.dims.num_kv_heads} * a.dims.head_dim * kElementBytes);
  p.out = a.out.data();
  p.lse = a.lse.data();
  p.batch_size = static_cast<int32_t>(*bs);
  p.num_q_heads = a.dims.num_q_heads;
  p.num_kv_heads = a.dims.num_kv_heads;
  p.head_dim = a.dims.head_dim;
  p.heads_per_block = *heads_per_block;
  p.dtype = a.dims.dtype == KvElementType::kBf16 ? kernels::kVarlenBf16 : kernels::kVarlenFp16;
  p.softmax_scale = a.dims.softmax_scale;
  p.violation = violation;
  return LaunchResult(kernels::LaunchVarlenAttentionKernel(p, stream), "varlen attention");
}

}  // namespace attnmeta
