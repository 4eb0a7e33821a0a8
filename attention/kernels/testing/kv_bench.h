// What the attention kernels' GPU benchmarks share: K and V pools of random bf16 data, the
// bandwidth references a kernel's KV read rate is set against in the same run, and event
// timing. Every failed call exits 1, naming it (BENCH_CHECK).

#ifndef ATTNMETA_ATTENTION_KERNELS_TESTING_KV_BENCH_H_
#define ATTNMETA_ATTENTION_KERNELS_TESTING_KV_BENCH_H_

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attention/kernels/half_bits.h"
#include "attention/kernels/hip_port.h"
#include "attention/kernels/paged_decode_launcher.h"
#include "attention/kernels/testing/device_buffer.h"

namespace attnmeta {
namespace testing {

// The attention shape a benchmark runs (its --dims=Q,KV,D): bf16 K and V, q_heads query and
// kv_heads KV heads of head_dim elements; the issues' 32/8 heads at head dim 128 by default.
struct BenchDims {
  int32_t q_heads = 32;
  int32_t kv_heads = 8;
  int32_t head_dim = 128;

  int64_t RowElements() const { return int64_t{kv_heads} * head_dim; }  // a slot of K (or V)
  int64_t RowBytes() const { return RowElements() * 2; }
  int64_t QRowElements() const { return int64_t{q_heads} * head_dim; }
  int32_t Group() const { return q_heads / kv_heads; }
  bool IsDefault() const { return q_heads == 32 && kv_heads == 8 && head_dim == 128; }
  // The launchers' dims: bf16, softmax scale 1 / sqrt(head_dim).
  DecodeAttentionDims Attention() const;
};

// *dims from "Q,KV,D" (the text after --dims=). False, *dims unchanged, unless the text is
// three integers with Q >= KV >= 1 (a launcher refuses the rest, such as KV not dividing Q).
bool ParseBenchDims(const std::string& text, BenchDims* dims);

// A K pool and a V pool in device memory, each one random N(0, 1) bf16 tile repeated (random
// data, never zeros, without drawing gigabytes of numbers); the tiles stay on the host so that a
// CPU reference reads the values the kernel reads.
class RandomKvPool {
 public:
  // Elements in the tile each pool repeats (32 MiB).
  static constexpr int64_t kTileElements = int64_t{1} << 24;

  // Pools of `bytes` bytes each; K's tile drawn from `rng` first, then V's.
  RandomKvPool(int64_t bytes, std::mt19937_64& rng);

  const DeviceBuffer<uint8_t>& k() const { return k_; }
  const DeviceBuffer<uint8_t>& v() const { return v_; }
  // Element e (counted in bf16 elements from the pool's start) of K, of V, as a float.
  float K(int64_t e) const { return Bf16ToFloat(k_tile_[e % kTileElements]); }
  float V(int64_t e) const { return Bf16ToFloat(v_tile_[e % kTileElements]); }

 private:
  std::vector<uint16_t> k_tile_, v_tile_;
  DeviceBuffer<uint8_t> k_, v_;
};

// The ceilings of a memory-bound kernel, over a buffer holding the first bytes of a K pool: the
// read-only streaming kernel (stream_read.h, the ceiling of a kernel that only reads) and a
// device-to-device copy into a second buffer.
class BandwidthReferences {
 public:
  // Buffers of min(max_bytes, the pool's size) bytes; the streaming kernel runs `read_blocks`
  // blocks.
  BandwidthReferences(const RandomKvPool& pool, int64_t max_bytes, int32_t read_blocks);

  int64_t bytes() const { return static_cast<int64_t>(src_.size()); }
  // Reads `bytes` bytes from `offset` of the buffer, on `stream`.
  void LaunchRead(int64_t offset, int64_t bytes, hipStream_t stream);
  // Copies `bytes` bytes from `offset` of the buffer to the same offset of the second, issued on
  // `stream` (a copy captured in a graph may run on a copy engine instead).
  void LaunchCopy(int64_t offset, int64_t bytes, hipStream_t stream);

 private:
  int32_t read_blocks_;
  DeviceBuffer<uint8_t> src_, dst_;
  DeviceBuffer<uint32_t> sink_;  // the streaming kernel's output, never written in practice
};

// Median microseconds of one launch: `launches` calls launch(0), launch(1), ... issued on
// `stream` between two events, `samples` samples after 3 of warm-up.
double MedianEventUs(hipStream_t stream, int launches, const std::function<void(int)>& launch,
                     int samples = 15);

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_TESTING_KV_BENCH_H_
