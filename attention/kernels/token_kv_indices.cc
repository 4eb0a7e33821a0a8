#include "attention/kernels/token_kv_indices.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "attention/kernels/token_kv_indices_kernel.h"

namespace attnmeta {
namespace {

// Grid dimension y is limited to 65535 on NVIDIA GPUs.
constexpr int64_t kMaxChunks = 65535;

template <typename T>
absl::Status CheckPointer(const char* name, DeviceSpan<T> span) {
  if (!span.empty() && span.data() == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " has ", span.size(), " elements but a null pointer"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BuildTokenKvIndicesOnDevice(const TokenKvIndicesDeviceInputs& in,
                                         DeviceSpan<TokenSlot> kv_indices, hipStream_t stream) {
  if (in.kv_indptr.empty()) {
    return absl::InvalidArgumentError("kv_indptr must have batch_size + 1 >= 1 entries, got 0");
  }
  const int64_t bs = static_cast<int64_t>(in.kv_indptr.size()) - 1;
  if (static_cast<int64_t>(in.req_pool_indices.size()) != bs) {
    return absl::InvalidArgumentError(
        absl::StrCat("req_pool_indices has ", in.req_pool_indices.size(),
                     " entries, kv_indptr implies batch_size ", bs));
  }
  if (!in.kv_start_idx.empty() && static_cast<int64_t>(in.kv_start_idx.size()) != bs) {
    return absl::InvalidArgumentError(absl::StrCat("kv_start_idx has ", in.kv_start_idx.size(),
                                                   " entries, want 0 or batch_size ", bs));
  }
  const int64_t stride = in.max_context_len.value();
  if (stride < 1 || in.req_to_token.size() % stride != 0) {
    return absl::InvalidArgumentError(absl::StrCat("req_to_token has ", in.req_to_token.size(),
                                                   " entries, not a whole number of rows of ",
                                                   stride));
  }
  if (in.max_kv_len.value() < 0 || in.max_kv_len.value() > stride) {
    return absl::OutOfRangeError(absl::StrCat("max_kv_len ", in.max_kv_len.value(),
                                              " outside [0, max_context_len = ", stride, "]"));
  }
  if (bs > INT32_MAX) {
    return absl::OutOfRangeError(absl::StrCat("batch_size ", bs, " exceeds the grid"));
  }
  for (absl::Status s : {CheckPointer("req_to_token", in.req_to_token),
                         CheckPointer("req_pool_indices", in.req_pool_indices),
                         CheckPointer("kv_indptr", in.kv_indptr),
                         CheckPointer("kv_start_idx", in.kv_start_idx),
                         CheckPointer("kv_indices", kv_indices)}) {
    if (!s.ok()) return s;
  }
  const int64_t chunks = (in.max_kv_len.value() + kernels::kTokenKvIndicesChunk - 1) /
                         kernels::kTokenKvIndicesChunk;
  if (chunks > kMaxChunks) {
    return absl::OutOfRangeError(
        absl::StrCat("max_kv_len ", in.max_kv_len.value(), " needs ", chunks,
                     " chunks per request, the grid allows ", kMaxChunks));
  }
  if (bs == 0 || chunks == 0) return absl::OkStatus();

  kernels::TokenKvIndicesParams params;
  params.req_to_token = reinterpret_cast<const int32_t*>(in.req_to_token.data());
  params.req_to_token_stride = stride;
  params.req_pool_indices = reinterpret_cast<const int32_t*>(in.req_pool_indices.data());
  params.kv_indptr = reinterpret_cast<const int32_t*>(in.kv_indptr.data());
  params.kv_start_idx = reinterpret_cast<const int32_t*>(in.kv_start_idx.data());
  params.kv_indices = reinterpret_cast<int32_t*>(kv_indices.data());
  params.batch_size = static_cast<int32_t>(bs);
  params.num_chunks = static_cast<int32_t>(chunks);
  const hipError_t err = kernels::LaunchTokenKvIndicesKernel(params, stream);
  if (err != hipSuccess) {
    return absl::InternalError(
        absl::StrCat("token kv_indices kernel launch failed: ", hipGetErrorString(err)));
  }
  return absl::OkStatus();
}

}  // namespace attnmeta
