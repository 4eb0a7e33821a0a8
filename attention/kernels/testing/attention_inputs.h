// Host inputs of the attention kernels' GPU tests in either element type (bf16 or fp16): values
// rounded to the type and read back, random N(0, 1) data, the bytes the kernels' spans take, and
// the dims with the usual softmax scale.

#ifndef ATTNMETA_ATTENTION_KERNELS_TESTING_ATTENTION_INPUTS_H_
#define ATTNMETA_ATTENTION_KERNELS_TESTING_ATTENTION_INPUTS_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "attention/kernels/half_bits.h"
#include "attention/kernels/metadata_launchers.h"
#include "attention/kernels/paged_decode_launcher.h"

namespace attnmeta {
namespace testing {

// x rounded to the nearest value of type t, as its bits.
inline uint16_t ToBits(KvElementType t, float x) {
  return t == KvElementType::kBf16 ? FloatToBf16(x) : FloatToFp16(x);
}

// The value of the bits b of type t.
inline float FromBits(KvElementType t, uint16_t b) {
  return t == KvElementType::kBf16 ? Bf16ToFloat(b) : Fp16ToFloat(b);
}

// n random N(0, 1) values rounded to type t: their bits, and the same values as floats. The
// caller's distribution, so that consecutive fills continue one stream of numbers.
inline void FillNormal(KvElementType t, int64_t n, std::mt19937_64& rng,
                       std::normal_distribution<float>& normal, std::vector<uint16_t>& bits,
                       std::vector<float>& values) {
  bits.resize(n);
  values.resize(n);
  for (int64_t e = 0; e < n; ++e) {
    bits[e] = ToBits(t, normal(rng));
    values[e] = FromBits(t, bits[e]);
  }
}

// The bytes of 2-byte elements, as the kernels' byte spans hold them.
inline std::vector<uint8_t> Bytes(const std::vector<uint16_t>& bits) {
  std::vector<uint8_t> out(bits.size() * 2);
  std::memcpy(out.data(), bits.data(), out.size());
  return out;
}

// The dims with the softmax scale 1 / sqrt(head_dim).
inline DecodeAttentionDims Dims(int32_t q_heads, int32_t kv_heads, int32_t head_dim, KvElementType t) {
  return DecodeAttentionDims{q_heads, kv_heads, head_dim, t,
                             1.0f / std::sqrt(static_cast<float>(head_dim))};
}

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_TESTING_ATTENTION_INPUTS_H_
