// The arguments of VarlenAttention (varlen_attention_launcher.h) and the checks it makes
// before anything is launched, which give the launch it makes (the kernel's argument struct,
// varlen_attention.h) when the arguments pass. Host code without the GPU runtime: the checks
// are tested on the CPU (spans over host memory: nothing here reads through them, except
// checked mode's host metadata).

#ifndef ATTNMETA_ATTENTION_KERNELS_VARLEN_ATTENTION_ARGS_H_
#define ATTNMETA_ATTENTION_KERNELS_VARLEN_ATTENTION_ARGS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "attention/kernels/checked_metadata.h"
#include "attention/kernels/device_span.h"
#include "attention/kernels/device_violation.h"
#include "attention/kernels/paged_decode_args.h"
#include "attention/kernels/varlen_attention.h"
#include "attention/metadata/custom_mask.h"
#include "kvcache/units.h"

namespace attnmeta {

// The custom mask of a batch (custom_mask.h's CustomMaskView, in device memory). Layout kNone:
// causal with prefix, and both arrays empty. (kernels::VarlenMaskKind is the kernel's view of
// the layout.)
struct VarlenMask {
  MaskLayout layout = MaskLayout::kNone;
  // [>= mask_indptr[bs]] bytes: the blocks of the layout, 0/1 bytes or bit-packed words.
  DeviceSpan<const uint8_t> mask;
  // [bs + 1] byte offsets, mask_indptr[0] == 0, step i == MaskBlockBytes(layout, q_len_i,
  // kv_len_i, MaskWordBytes(max_q_len)); 8-byte aligned.
  DeviceSpan<const int64_t> mask_indptr;
};

// The kernels of varlen attention; all compute the same (varlen_attention.h).
enum class VarlenKernel {
  kAuto,
  kTiledCudaCores,    // blocks of query-row tiles, fp32 FMAs
  kTiledTensorCores,  // the same blocks, MmaM16N8K16 (FlashAttention-style)
  kShortQueries,      // the decode kernel's warp step on the tensor cores, for short q_len
};

// The kernel's name as logs and benchmark tables print it: "tiled_cuda_cores",
// "tiled_tensor_cores", "short_queries" or "auto".
const char* VarlenKernelName(VarlenKernel kernel);

struct VarlenAttentionArgs {
  // Head counts (GQA: num_q_heads a multiple of num_kv_heads), head dim (64, 128, 256), the
  // element type of q, the pools and out (bf16, fp16) and the softmax scale (finite, > 0).
  DecodeAttentionDims dims;
  // [q_rows][num_q_heads][head_dim] of dtype, 16-byte aligned; q_rows <= INT32_MAX.
  DeviceSpan<const uint8_t> q;
  // [bs + 1] (bs: the KV source's batch), qo_indptr[0] == 0, non-decreasing,
  // qo_indptr[bs] == q_rows (<= q_rows with zero_unclaimed_rows); sequence i's rows are its
  // last q_len_i positions. Device memory: the kernel checks it (varlen_attention.h; a row no
  // sequence claims is not written and is recorded, unless zero_unclaimed_rows).
  DeviceSpan<const TokenOffset> qo_indptr;
  // The rows of q past qo_indptr[bs] belong to no sequence and are expected: a graph captured
  // for a bucket in the variable-row form of extend or draft-extend (GraphState's
  // ReplayResult::padded), whose real requests may use fewer rows than captured. The kernel
  // then writes those rows as rows that see nothing (out 0, lse -inf) instead of recording
  // kQueryRowsMismatch. No sequence can take them: every one is at the grid's max_q_len
  // rows already or is a real request. Such a launch passes the captured rows per request as
  // max_q_len (the bucket's ReplayResult::padded.max_q_len is the batch's true maximum, which
  // can be smaller). In checked mode the context allows the tail (allow_unclaimed_rows).
  bool zero_unclaimed_rows = false;
  // The largest q_len of the batch (ForwardMetadataView::max_q_len), at most q_rows and at
  // least q_rows / bs: the grid covers this many rows per sequence. The kernel still bounds
  // itself by the device qo_indptr (a longer sequence is recorded and sees nothing).
  // With a bit-packed mask it must be the batch's maximum q_len exactly, not a bound: the
  // width of the mask's words, MaskWordBytes(max_q_len), comes from it, and a looser bound
  // (say 9 for a batch whose longest q_len is 8) reads the 1-byte words as 2-byte ones, which
  // gives wrong rows, recorded only where a sequence's words then run past the mask buffer.
  TokenCount max_q_len;
  DeviceSpan<const uint8_t> k_pool;  // [pool_slots][num_kv_heads][head_dim] of dtype, aligned
  DeviceSpan<const uint8_t> v_pool;  // like k_pool, the same size; pool_slots <= 2^31
  // Where K/V position c of sequence i is read: token-level kv_indices or the page table
  // (paged_decode_args.h); its batch is the launch's bs. Device memory: lengths and slots
  // are checked by the kernel.
  DecodeKv kv;
  VarlenMask mask;
  DeviceSpan<uint8_t> out;  // [q_rows][num_q_heads][head_dim] of dtype, 16-byte aligned
  DeviceSpan<float> lse;    // [q_rows][num_q_heads]
  // Which kernel runs: kAuto takes kShortQueries when
  // max_q_len * (num_q_heads / num_kv_heads) <= kVarlenChunkVectors * kVarlenMaxVectorChunks
  // (64: verify, draft-extend, decode), else the tiled path: kTiledTensorCores where
  // MmaM16N8K16 is the tensor-core instruction (NVIDIA, kNativeMmaM16N8K16), kTiledCudaCores
  // where it is the portable form (AMD). The others force one (kShortQueries past that bound is
  // InvalidArgument).
  VarlenKernel kernel = VarlenKernel::kAuto;
  // The launch may start under the tail of the kernel ahead on the stream (where
  // DeviceOverlapsLaunches says so; plain elsewhere): its blocks wait for that kernel before
  // they read anything, so it is right after any kernel, the metadata launches that write what
  // it reads included. What it hides is the gap between the two launches and its blocks'
  // ramp-up. A captured graph keeps it as a programmatic edge.
  bool overlap_preceding_kernel = true;
  // Checked mode (checked_metadata.h): the host copy of the metadata that qo_indptr, kv and
  // mask hold, validated before anything is launched. Null: not checked.
  const CheckedMetadata* checked = nullptr;
};

// What VarlenAttention launches for arguments that pass its checks: the kernel over `blocks`
// blocks (none when 0: an empty batch or no query rows).
struct VarlenAttentionLaunch {
  int64_t blocks = 0;
  kernels::VarlenAttentionParams params{};
};

// VarlenAttention's checks, in its order, and its launch: the kernel's arguments (`violation`
// among them) and grid. `native_mma`: whether MmaM16N8K16 is the tensor-core instruction
// where the kernel runs (kNativeMmaM16N8K16, hip_port.h), which kAuto's choice depends on.
// Errors:
//  InvalidArgument:
//   - dims: num_q_heads not a positive multiple of num_kv_heads, a head dim other than
//     64/128/256, an element type other than bf16/fp16, a softmax_scale not finite and > 0;
//   - the KV source: a kv_indptr without entries, a page table of negative columns or
//     smaller than [bs][cols];
//   - sizes: q / out / lse that are not the same whole rows of num_q_heads * head_dim
//     elements (and num_q_heads floats), K/V pools that are not the same whole rows of
//     num_kv_heads * head_dim elements, a qo_indptr that is not bs + 1 entries;
//   - max_q_len negative, past q's rows, or too small for them (q_rows <= bs * max_q_len is
//     refused otherwise: the grid covers bs * max_q_len rows);
//   - alignment: q, k_pool, v_pool or out not 16-byte aligned, mask_indptr not 8-byte aligned;
//   - a null pointer with a nonzero size (any array);
//   - the mask: a layout without mask_indptr of bs + 1 entries, mask arrays without a layout,
//     a bit-packed mask with max_q_len > kMaxBitPackedRows;
//   - kernel kShortQueries for max_q_len * group > 64 (kVarlenChunkVectors *
//     kVarlenMaxVectorChunks);
//   - in checked mode (args.checked): host metadata that fails validation or is not the
//     launch's (CheckLaunchedMetadata);
//  OutOfRange (beyond the kernel's int32 arithmetic or the grid):
//   - more than 2^31 - 1 query rows, more than 2^31 pool slots, a pool slot (num_kv_heads *
//     head_dim elements) of 2^31 bytes or more, a batch beyond int32;
//   - kv_indices of more than 2^30 entries, a page table covering more than 2^30 tokens;
//   - a grid of more than 2^24 blocks, 2^23 for kTiledTensorCores (bs * ceil(max_q_len / rows
//     per block) * num_q_heads / heads per block, or bs * num_kv_heads * vector chunks on the
//     short-query path), checked without overflow for any claimed sizes.
absl::StatusOr<VarlenAttentionLaunch> VarlenAttentionLaunchFor(
    const VarlenAttentionArgs& args, bool native_mma, kernels::DeviceViolation* violation);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_VARLEN_ATTENTION_ARGS_H_
