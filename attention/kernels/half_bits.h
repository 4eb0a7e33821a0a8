// Host conversions between float and the 2-byte element types of the attention kernels (bf16
// and fp16, round to nearest even), for code that builds the kernels' inputs on the host and
// reads their outputs back (attnmeta_sim's GPU backend, the GPU tests and benchmarks).

#ifndef ATTNMETA_ATTENTION_KERNELS_HALF_BITS_H_
#define ATTNMETA_ATTENTION_KERNELS_HALF_BITS_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace attnmeta {

inline uint32_t FloatBits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  return x;
}

inline float BitsFloat(uint32_t x) {
  float f;
  std::memcpy(&f, &x, sizeof(f));
  return f;
}

inline uint16_t FloatToBf16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float Bf16ToFloat(uint16_t b) { return BitsFloat(uint32_t{b} << 16); }

inline uint16_t FloatToFp16(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to 65520 or more: infinity
  if (abs < 0x38800000u) {                        // below 2^-14: a subnormal (or zero)
    // The default rounding mode rounds to nearest even.
    return sign | static_cast<uint16_t>(std::nearbyint(BitsFloat(abs) * 16777216.0f));  // / 2^-24
  }
  uint32_t h = (abs - 0x38000000u) >> 13;  // exponent rebiased from 127 to 15, 10 mantissa bits
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

inline float Fp16ToFloat(uint16_t h) {
  const float sign = (h & 0x8000u) ? -1.0f : 1.0f;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  if (exponent == 31) {
    return mantissa != 0 ? std::numeric_limits<float>::quiet_NaN()
                         : sign * std::numeric_limits<float>::infinity();
  }
  return sign * std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
}

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_HALF_BITS_H_
