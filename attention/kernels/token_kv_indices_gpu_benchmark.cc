// Bandwidth of BuildTokenKvIndicesOnDevice against a device-to-device copy of the same bytes,
// measured in the same run, and the host cost of one launcher call.
//
// Each shape: every request has `ctx` KV tokens; 8 rotating input/output sets take the large
// shapes (>= 1M tokens: >= 64 MB per rotation) past the 50 MB L2 cache; the small shapes fit
// in it and measure launch latency. Outputs are poisoned and checked after timing. Bytes counted: the
// int32 read from req_to_token plus the int32 written to kv_indices per token.
// Needs a GPU; exits non-zero on any error or mismatch.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "attention/kernels/testing/device_buffer.h"
#include "attention/kernels/token_kv_indices.h"

namespace attnmeta {
namespace {

using testing::DeviceBuffer;
using testing::GpuStatus;

#define BENCH_CHECK(expr)                                                    \
  do {                                                                       \
    const absl::Status _s = (expr);                                          \
    if (!_s.ok()) {                                                          \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, _s.ToString().c_str()); \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

template <typename T>
T Unwrap(absl::StatusOr<T> v) {
  BENCH_CHECK(v.status());
  return *std::move(v);
}

constexpr int kSets = 8;
constexpr int kLaunchesPerSample = 8;
constexpr int kSamples = 41;

struct Shape {
  int bs;
  int ctx;
};

struct Set {
  DeviceBuffer<TokenSlot> table;
  DeviceBuffer<ReqPoolIndex> rows;
  DeviceBuffer<TokenOffset> indptr;
  DeviceBuffer<TokenSlot> out;
  std::vector<TokenSlot> expected;
};

float MedianMs(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
float TimeMedianMs(F run_one_sample) {
  hipEvent_t start, stop;
  BENCH_CHECK(GpuStatus(hipEventCreate(&start), "hipEventCreate"));
  BENCH_CHECK(GpuStatus(hipEventCreate(&stop), "hipEventCreate"));
  std::vector<float> ms;
  for (int s = -3; s < kSamples; ++s) {  // 3 warm-up samples
    BENCH_CHECK(GpuStatus(hipEventRecord(start, nullptr), "hipEventRecord"));
    run_one_sample();
    BENCH_CHECK(GpuStatus(hipEventRecord(stop, nullptr), "hipEventRecord"));
    BENCH_CHECK(GpuStatus(hipEventSynchronize(stop), "hipEventSynchronize"));
    float t = 0;
    BENCH_CHECK(GpuStatus(hipEventElapsedTime(&t, start, stop), "hipEventElapsedTime"));
    if (s >= 0) ms.push_back(t / kLaunchesPerSample);
  }
  BENCH_CHECK(GpuStatus(hipEventDestroy(start), "hipEventDestroy"));
  BENCH_CHECK(GpuStatus(hipEventDestroy(stop), "hipEventDestroy"));
  return MedianMs(ms);
}

void RunShape(const Shape& shape, std::mt19937_64& rng) {
  const int64_t tokens = int64_t{shape.bs} * shape.ctx;
  const int max_reqs = shape.bs + 16;
  std::vector<Set> sets;
  for (int k = 0; k < kSets; ++k) {
    std::vector<TokenSlot> table(int64_t{max_reqs} * shape.ctx);
    for (TokenSlot& s : table) s = TokenSlot(static_cast<int32_t>(rng() >> 34));
    std::vector<ReqPoolIndex> rows(max_reqs);
    for (int r = 0; r < max_reqs; ++r) rows[r] = ReqPoolIndex(r);
    std::shuffle(rows.begin(), rows.end(), rng);
    rows.resize(shape.bs);
    std::vector<TokenOffset> indptr(shape.bs + 1);
    std::vector<TokenSlot> expected;
    expected.reserve(tokens);
    for (int i = 0; i < shape.bs; ++i) {
      indptr[i + 1] = TokenOffset(static_cast<int32_t>(int64_t{i + 1} * shape.ctx));
      const TokenSlot* row = table.data() + int64_t{rows[i].value()} * shape.ctx;
      expected.insert(expected.end(), row, row + shape.ctx);
    }
    Set set{Unwrap(DeviceBuffer<TokenSlot>::FromHost(table)),
            Unwrap(DeviceBuffer<ReqPoolIndex>::FromHost(rows)),
            Unwrap(DeviceBuffer<TokenOffset>::FromHost(indptr)),
            Unwrap(DeviceBuffer<TokenSlot>::Create(tokens)), std::move(expected)};
    sets.push_back(std::move(set));
  }
  auto inputs = [&](const Set& set) {
    TokenKvIndicesDeviceInputs in;
    in.req_to_token = set.table.const_span();
    in.max_context_len = TokenCount(shape.ctx);
    in.req_pool_indices = set.rows.const_span();
    in.kv_indptr = set.indptr.const_span();
    in.max_kv_len = TokenCount(shape.ctx);
    return in;
  };

  // Poison, then time; every launch's status is checked.
  for (Set& set : sets) {
    BENCH_CHECK(GpuStatus(hipMemset(set.out.data(), 0xff, tokens * sizeof(TokenSlot)), "poison"));
  }
  int next = 0;
  const float kernel_ms = TimeMedianMs([&] {
    for (int l = 0; l < kLaunchesPerSample; ++l, next = (next + 1) % kSets) {
      BENCH_CHECK(BuildTokenKvIndicesOnDevice(inputs(sets[next]), sets[next].out.span(), nullptr));
    }
  });
  BENCH_CHECK(GpuStatus(hipDeviceSynchronize(), "kernel"));
  for (const Set& set : sets) {
    const std::vector<TokenSlot> got = Unwrap(set.out.ToHost());
    if (got != set.expected) {
      std::fprintf(stderr, "MISMATCH at bs=%d ctx=%d\n", shape.bs, shape.ctx);
      std::exit(1);
    }
  }
  // Reference: a device-to-device copy of the same number of int32 (same bytes read+written).
  next = 0;
  const float copy_ms = TimeMedianMs([&] {
    for (int l = 0; l < kLaunchesPerSample; ++l, next = (next + 1) % kSets) {
      BENCH_CHECK(GpuStatus(hipMemcpyAsync(sets[next].out.data(), sets[next].table.data(),
                                           tokens * sizeof(TokenSlot), hipMemcpyDeviceToDevice,
                                           nullptr),
                            "hipMemcpyAsync"));
    }
  });
  BENCH_CHECK(GpuStatus(hipDeviceSynchronize(), "copy"));
  // Host cost of one launcher call (checks + launch): few enough calls after an idle device
  // that the launch queue never fills (a full queue would block on the GPU).
  constexpr int kHostCalls = 64;
  const auto t0 = std::chrono::steady_clock::now();
  for (int l = 0; l < kHostCalls; ++l) {
    BENCH_CHECK(BuildTokenKvIndicesOnDevice(inputs(sets[l % kSets]), sets[l % kSets].out.span(),
                                            nullptr));
  }
  const auto t1 = std::chrono::steady_clock::now();
  BENCH_CHECK(GpuStatus(hipDeviceSynchronize(), "host-cost launches"));
  const double host_us =
      std::chrono::duration<double, std::micro>(t1 - t0).count() / kHostCalls;

  const double bytes = 8.0 * tokens;
  const double kernel_tbs = bytes / (kernel_ms * 1e-3) / 1e12;
  const double copy_tbs = bytes / (copy_ms * 1e-3) / 1e12;
  std::printf("bs=%5d ctx=%7d tokens=%9lld  kernel %8.1f us %5.2f TB/s | copy %8.1f us %5.2f TB/s | "
              "ratio %5.1f%% | host %5.2f us/call\n",
              shape.bs, shape.ctx, static_cast<long long>(tokens), kernel_ms * 1e3, kernel_tbs,
              copy_ms * 1e3, copy_tbs, 100.0 * kernel_tbs / copy_tbs, host_us);
}

}  // namespace
}  // namespace attnmeta

int main() {
  BENCH_CHECK(attnmeta::testing::RequireGpu());
  std::mt19937_64 rng(42);
  for (const attnmeta::Shape& s : std::vector<attnmeta::Shape>{
           {1, 16384}, {64, 4096}, {256, 4096}, {1024, 4096}, {64, 131072}, {8, 131072}}) {
    attnmeta::RunShape(s, rng);
  }
  return 0;
}
