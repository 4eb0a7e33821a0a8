#include "attention/kernels/varlen_attention_args.h"

#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "attention/kernels/internal/launch_checks.h"

namespace attnmeta {

using internal::Aligned;
using internal::CheckNotNull;
using internal::kElementBytes;

namespace {

// Blocks of one launch: within NVIDIA's grid x and, at up to 128 threads, HIP's 2^32 threads;
// half of it for the tensor-core tiled kernel's 256-thread blocks. (The grid is
// one-dimensional: the query heads set no limit of their own, unlike decode's merge kernel,
// whose grid y is the query head.)
constexpr int64_t kMaxBlocks = int64_t{1} << 24;
constexpr const char* kOp = "varlen attention";

// What CheckBuffers finds: the query rows q holds and the pool slots.
struct BufferSizes {
  int64_t rows;
  int64_t pool_slots;
};

// q, out, lse and the pools against the dims.
absl::StatusOr<BufferSizes> CheckBuffers(const VarlenAttentionArgs& a) {
  const DecodeAttentionDims& d = a.dims;
  const int64_t q_row = int64_t{d.num_q_heads} * d.head_dim * kElementBytes;
  const int64_t q_bytes = internal::ClaimedSize(a.q);
  const int64_t rows = q_bytes / q_row;
  if (q_bytes % q_row != 0 || internal::ClaimedSize(a.out) != q_bytes ||
      internal::ClaimedSize(a.lse) != rows * d.num_q_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "varlen attention: q of ", q_bytes, " bytes, out of ", a.out.size(), " bytes and lse of ",
        a.lse.size(), " floats are not the same whole rows of ", q_row, " bytes and ",
        d.num_q_heads, " floats"));
  }
  if (rows > std::numeric_limits<int32_t>::max()) {
    return absl::OutOfRangeError(absl::StrCat("varlen attention: ", rows, " query rows, beyond int32"));
  }
  absl::StatusOr<int64_t> slots = internal::CheckAttentionBuffers(
      kOp, a.q, a.k_pool, a.v_pool, a.out, a.lse, d.num_kv_heads, d.head_dim);
  if (!slots.ok()) return slots.status();
  return BufferSizes{rows, *slots};
}

// qo_indptr and max_q_len against the batch and the query rows.
absl::Status CheckQueries(const VarlenAttentionArgs& a, int64_t bs, int64_t rows) {
  if (internal::ClaimedSize(a.qo_indptr) != bs + 1) {
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

absl::StatusOr<kernels::VarlenMaskKind> MaskLayoutOf(MaskLayout layout) {
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
  absl::StatusOr<kernels::VarlenMaskKind> layout = MaskLayoutOf(m.layout);
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
  if (internal::ClaimedSize(m.mask_indptr) != bs + 1) {
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
  p.mask_capacity = internal::ClaimedSize(m.mask);
  p.mask_indptr = m.mask_indptr.data();
  p.mask_word_bytes = word_bytes;
  return absl::OkStatus();
}

}  // namespace

const char* VarlenKernelName(VarlenKernel kernel) {
  switch (kernel) {
    case VarlenKernel::kTiledCudaCores:
      return "tiled_cuda_cores";
    case VarlenKernel::kTiledTensorCores:
      return "tiled_tensor_cores";
    case VarlenKernel::kShortQueries:
      return "short_queries";
    case VarlenKernel::kAuto:
      break;
  }
  return "auto";
}

absl::StatusOr<VarlenAttentionLaunch> VarlenAttentionLaunchFor(
    const VarlenAttentionArgs& a, bool native_mma, kernels::DeviceViolation* violation) {
  if (absl::Status s = internal::CheckAttentionDims(kOp, a.dims); !s.ok()) return s;
  const int32_t heads_per_block = internal::HeadsPerBlock(a.dims.num_q_heads / a.dims.num_kv_heads);
  VarlenAttentionLaunch launch;
  kernels::VarlenAttentionParams& p = launch.params;
  absl::StatusOr<int64_t> bs = internal::CheckKvSource(kOp, a.kv, p);
  if (!bs.ok()) return bs.status();
  if (*bs > std::numeric_limits<int32_t>::max()) {
    return absl::OutOfRangeError("varlen attention: batch beyond int32");
  }
  absl::StatusOr<BufferSizes> sizes = CheckBuffers(a);
  if (!sizes.ok()) return sizes.status();
  if (absl::Status s = CheckQueries(a, *bs, sizes->rows); !s.ok()) return s;
  if (absl::Status s = CheckMask(a, *bs, p); !s.ok()) return s;
  if (a.checked != nullptr) {
    LaunchedMetadataShape shape =
        internal::LaunchedKvShape(a.kv, *bs, sizes->rows, sizes->pool_slots);
    shape.mask_layout = a.mask.layout;
    shape.mask_bytes = internal::ClaimedSize(a.mask.mask);
    shape.max_q_len = a.max_q_len;
    shape.max_q_len_exact = a.mask.layout == MaskLayout::kBitPacked;
    shape.zero_unclaimed_rows = a.zero_unclaimed_rows;
    if (absl::Status s = CheckLaunchedMetadata(*a.checked, shape); !s.ok()) return s;
  }
  const int64_t group = a.dims.num_q_heads / a.dims.num_kv_heads;
  // max_q_len <= q_rows < 2^31 and group < 2^31: the product fits int64.
  const int64_t vector_chunks =
      (a.max_q_len.value() * group + kernels::kVarlenChunkVectors - 1) / kernels::kVarlenChunkVectors;
  const bool short_queries = vector_chunks <= kernels::kVarlenMaxVectorChunks;
  if (a.kernel == VarlenKernel::kShortQueries && !short_queries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "varlen attention: the short-query path takes at most ",
        kernels::kVarlenChunkVectors * kernels::kVarlenMaxVectorChunks,
        " query vectors per sequence and KV head, max_q_len ", a.max_q_len.value(), " x group ",
        group, " is more"));
  }
  const bool short_query_path = a.kernel == VarlenKernel::kShortQueries ||
                                (a.kernel == VarlenKernel::kAuto && short_queries);
  const bool tiled_tensor_cores =
      a.kernel == VarlenKernel::kTiledTensorCores ||
      (a.kernel == VarlenKernel::kAuto && !short_queries && native_mma);
  const int64_t max_blocks = tiled_tensor_cores ? kMaxBlocks / 2 : kMaxBlocks;
  const int32_t rows_per_block =
      kernels::VarlenQueryVectors(a.dims.head_dim, tiled_tensor_cores) / heads_per_block;
  const int64_t q_tiles = (a.max_q_len.value() + rows_per_block - 1) / rows_per_block;
  // The grid: bs * row_groups * head_groups blocks: tiles of rows x query-head chunks (tiled),
  // or blocks of vector chunks x KV heads (short-query path).
  const int64_t row_groups =
      short_query_path
          ? kernels::VarlenShortQueryBlocks(a.dims.head_dim, static_cast<int32_t>(vector_chunks))
          : q_tiles;
  const int64_t head_groups =
      short_query_path ? a.dims.num_kv_heads : a.dims.num_q_heads / heads_per_block;
  // Each factor up to 2^31, checked by division before it is multiplied (the product of
  // claimed sizes would overflow int64).
  if (*bs > 0 && row_groups > 0 &&
      (row_groups > max_blocks / head_groups || *bs > max_blocks / (row_groups * head_groups))) {
    return absl::OutOfRangeError(absl::StrCat(
        "varlen attention: ", *bs, " sequences x ", row_groups, " groups of rows x ", head_groups,
        " groups of heads is more than ", max_blocks, " blocks (fewer sequences, rows or heads)"));
  }
  launch.blocks = *bs * row_groups * head_groups;
  if (launch.blocks == 0) return launch;

  p.q = a.q.data();
  p.q_rows = static_cast<int32_t>(sizes->rows);
  p.qo_indptr = reinterpret_cast<const int32_t*>(a.qo_indptr.data());
  p.max_q_len = static_cast<int32_t>(a.max_q_len.value());
  p.q_tiles = static_cast<int32_t>(q_tiles);
  p.vector_chunks = short_query_path ? static_cast<int32_t>(vector_chunks) : 0;
  p.tiled_tensor_cores = tiled_tensor_cores ? 1 : 0;
  p.zero_unclaimed_rows = a.zero_unclaimed_rows ? 1 : 0;
  p.k_pool = a.k_pool.data();
  p.v_pool = a.v_pool.data();
  p.kv.pool_slots = sizes->pool_slots;
  p.out = a.out.data();
  p.lse = a.lse.data();
  p.batch_size = static_cast<int32_t>(*bs);
  p.num_q_heads = a.dims.num_q_heads;
  p.num_kv_heads = a.dims.num_kv_heads;
  p.head_dim = a.dims.head_dim;
  p.heads_per_block = heads_per_block;
  p.dtype = internal::ElementDtypeOf(a.dims.dtype);
  p.softmax_scale = a.dims.softmax_scale;
  p.violation = violation;
  return launch;
}

}  // namespace attnmeta
