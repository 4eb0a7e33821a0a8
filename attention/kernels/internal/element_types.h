// Device helpers the attention kernels share (paged_decode_attention.hip.cc,
// varlen_attention.hip.cc): the log2-domain constants, -inf, and the 2-byte element types
// (bf16, fp16) to and from fp32. Device code only: include it from .hip.cc sources.

#ifndef ATTNMETA_ATTENTION_KERNELS_INTERNAL_ELEMENT_TYPES_H_
#define ATTNMETA_ATTENTION_KERNELS_INTERNAL_ELEMENT_TYPES_H_

#include <cstdint>

#include "attention/kernels/hip_port.h"

#if defined(__CUDACC__) || defined(__HIPCC__)

namespace attnmeta {
namespace kernels {
namespace internal {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

__device__ inline float NegInf() { return __int_as_float(0xff800000); }

// The element types: eight 2-byte elements of a 16-byte word to floats (exact); Pack2 rounds
// floats to them (to nearest even; a NaN stays a NaN).
struct Bf16 {
  static constexpr bool kIsBf16 = true;
  __device__ static void ToFloat(const uint4& w, float (&f)[8]) {
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(words[i] << 16);
      f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
};

struct Fp16 {
  static constexpr bool kIsBf16 = false;
  __device__ static void ToFloat(const uint4& w, float (&f)[8]) {
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = HalfBitsToFloat(static_cast<uint16_t>(words[i] & 0xffffu));
      f[2 * i + 1] = HalfBitsToFloat(static_cast<uint16_t>(words[i] >> 16));
    }
  }
  __device__ static uint32_t FromFloat(float x) { return FloatToHalfBits(x); }
};

// Two floats as one word of two elements: lo in the low half.
template <typename Dtype>
__device__ inline uint32_t Pack2(float lo, float hi) {
  if constexpr (Dtype::kIsBf16) {
    return PackBf16x2(lo, hi);
  } else {
    return Dtype::FromFloat(lo) | (Dtype::FromFloat(hi) << 16);
  }
}

}  // namespace internal
}  // namespace kernels
}  // namespace attnmeta

#endif  // defined(__CUDACC__) || defined(__HIPCC__)

#endif  // ATTNMETA_ATTENTION_KERNELS_INTERNAL_ELEMENT_TYPES_H_
