#include "attention/kernels/testing/kv_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "attention/kernels/testing/bench_check.h"
#include "attention/kernels/testing/stream_read.h"

namespace attnmeta {
namespace testing {
namespace {

constexpr int kWarmup = 3;

// Draws a random N(0, 1) bf16 tile and fills `pool` with copies of it.
void FillWithTile(std::mt19937_64& rng, std::normal_distribution<float>& normal,
                  std::vector<uint16_t>& tile, DeviceBuffer<uint8_t>& pool) {
  tile.resize(RandomKvPool::kTileElements);
  for (uint16_t& x : tile) x = FloatToBf16(normal(rng));
  DeviceBuffer<uint16_t> staged = Unwrap(DeviceBuffer<uint16_t>::FromHost(tile));
  const int64_t tile_bytes = RandomKvPool::kTileElements * 2;
  const int64_t bytes = static_cast<int64_t>(pool.size());
  for (int64_t off = 0; off < bytes; off += tile_bytes) {
    const int64_t n = std::min<int64_t>(tile_bytes, bytes - off);
    BENCH_CHECK(GpuStatus(hipMemcpy(pool.data() + off, staged.data(), n, hipMemcpyDeviceToDevice),
                          "tile"));
  }
}

}  // namespace

DecodeAttentionDims BenchDims::Attention() const {
  return {q_heads, kv_heads, head_dim, KvElementType::kBf16,
          1.0f / std::sqrt(static_cast<float>(head_dim))};
}

bool ParseBenchDims(const std::string& text, BenchDims* dims) {
  BenchDims d;
  char rest = 0;
  if (std::sscanf(text.c_str(), "%d,%d,%d%c", &d.q_heads, &d.kv_heads, &d.head_dim, &rest) != 3 ||
      d.kv_heads < 1 || d.q_heads < d.kv_heads) {
    return false;
  }
  *dims = d;
  return true;
}

RandomKvPool::RandomKvPool(int64_t bytes, std::mt19937_64& rng)
    : k_(Unwrap(DeviceBuffer<uint8_t>::Create(bytes))), v_(Unwrap(DeviceBuffer<uint8_t>::Create(bytes))) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  FillWithTile(rng, normal, k_tile_, k_);
  FillWithTile(rng, normal, v_tile_, v_);
}

BandwidthReferences::BandwidthReferences(const RandomKvPool& pool, int64_t max_bytes,
                                         int32_t read_blocks)
    : read_blocks_(read_blocks),
      src_(Unwrap(DeviceBuffer<uint8_t>::Create(
          std::min<int64_t>(max_bytes, static_cast<int64_t>(pool.k().size()))))),
      dst_(Unwrap(DeviceBuffer<uint8_t>::Create(src_.size()))),
      sink_(Unwrap(DeviceBuffer<uint32_t>::Create(1))) {
  BENCH_CHECK(GpuStatus(hipMemcpy(src_.data(), pool.k().data(), src_.size(), hipMemcpyDeviceToDevice),
                        "fill"));
}

void BandwidthReferences::LaunchRead(int64_t offset, int64_t bytes, hipStream_t stream) {
  BENCH_CHECK(GpuStatus(LaunchStreamRead(src_.data() + offset, bytes, sink_.data(), read_blocks_, stream),
                        "stream read"));
}

void BandwidthReferences::LaunchCopy(int64_t offset, int64_t bytes, hipStream_t stream) {
  BENCH_CHECK(GpuStatus(hipMemcpyAsync(dst_.data() + offset, src_.data() + offset, bytes,
                                       hipMemcpyDeviceToDevice, stream),
                        "copy"));
}

double MedianEventUs(hipStream_t stream, int launches, const std::function<void(int)>& launch,
                     int samples) {
  hipEvent_t start, stop;
  BENCH_CHECK(GpuStatus(hipEventCreate(&start), "hipEventCreate"));
  BENCH_CHECK(GpuStatus(hipEventCreate(&stop), "hipEventCreate"));
  std::vector<float> ms;
  for (int s = -kWarmup; s < samples; ++s) {
    BENCH_CHECK(GpuStatus(hipEventRecord(start, stream), "hipEventRecord"));
    for (int i = 0; i < launches; ++i) launch(i);
    BENCH_CHECK(GpuStatus(hipEventRecord(stop, stream), "hipEventRecord"));
    BENCH_CHECK(GpuStatus(hipEventSynchronize(stop), "hipEventSynchronize"));
    float t = 0;
    BENCH_CHECK(GpuStatus(hipEventElapsedTime(&t, start, stop), "hipEventElapsedTime"));
    if (s >= 0) ms.push_back(t / launches);
  }
  BENCH_CHECK(GpuStatus(hipEventDestroy(start), "hipEventDestroy"));
  BENCH_CHECK(GpuStatus(hipEventDestroy(stop), "hipEventDestroy"));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e3;
}

}  // namespace testing
}  // namespace attnmeta
