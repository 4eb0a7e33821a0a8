// The same-run reference of the CPU benchmarks: the time a plain memcpy takes to move the
// bytes an operation writes, measured in the same process just before the operation is
// timed. CPU figures vary several-fold between machines of the same kind; the ratio
// op_time / memcpy_time does much less, so benchmarks report it as the counter "x_memcpy".

#ifndef ATTNMETA_TOOLS_BENCH_MEMCPY_REFERENCE_H_
#define ATTNMETA_TOOLS_BENCH_MEMCPY_REFERENCE_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstddef>
#include <cstring>
#include <vector>

#include "benchmark/benchmark.h"

namespace attnmeta {
namespace bench {

// Median nanoseconds of one memcpy of `bytes` between two buffers already touched (so page
// faults are not counted), over 21 runs after 3 warm-up runs.
inline double MemcpyNanos(size_t bytes) {
  std::vector<char> src(std::max<size_t>(bytes, 1), 1), dst(std::max<size_t>(bytes, 1), 0);
  std::vector<double> ns;
  for (int run = 0; run < 24; ++run) {
    // Enough copies per sample that the clock's resolution does not matter.
    const int reps = static_cast<int>(std::max<size_t>(1, (size_t{1} << 20) / (bytes + 64)));
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) {
      std::memcpy(dst.data(), src.data(), bytes);
      benchmark::DoNotOptimize(dst.data());
      benchmark::ClobberMemory();
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (run >= 3) ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / reps);
  }
  std::nth_element(ns.begin(), ns.begin() + ns.size() / 2, ns.end());
  return ns[ns.size() / 2];
}

// Sets the counters "memcpy_ns" (the reference: one memcpy of `bytes`) and "x_memcpy" (the
// benchmark's own time per iteration, as the framework measures it, paused time excluded,
// divided by the reference). Call it before or after the timed loop.
inline void ReportRatioToMemcpy(benchmark::State& state, size_t bytes) {
  const double memcpy_ns = MemcpyNanos(bytes);
  state.counters["memcpy_ns"] = memcpy_ns;
  // value * iterations / seconds, inverted: seconds / (iterations * memcpy_seconds).
  state.counters["x_memcpy"] =
      benchmark::Counter(memcpy_ns * 1e-9, benchmark::Counter::kIsIterationInvariantRate |
                                               benchmark::Counter::kInvert);
}

}  // namespace bench
}  // namespace attnmeta

#endif  // ATTNMETA_TOOLS_BENCH_MEMCPY_REFERENCE_H_
