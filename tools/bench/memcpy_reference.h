// The same-run reference of the CPU benchmarks: the time a plain memcpy (or memset) takes to
// move the bytes an operation writes, measured in the same process just before or after the
// operation is timed. CPU figures vary several-fold between machines of the same kind; the ratio
// op_time / memcpy_time does much less, so benchmarks report it as the counter "x_memcpy".

#ifndef ATTNMETA_TOOLS_BENCH_MEMCPY_REFERENCE_H_
#define ATTNMETA_TOOLS_BENCH_MEMCPY_REFERENCE_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"

namespace attnmeta {
namespace bench {

// Median nanoseconds of one call of op() (which moves `bytes`), over 21 runs after 3 warm-up
// runs, with enough calls per sample that the clock's resolution does not matter.
template <typename Op>
double MedianNanos(size_t bytes, Op op) {
  std::vector<double> ns;
  for (int run = 0; run < 24; ++run) {
    const int reps = static_cast<int>(std::max<size_t>(1, (size_t{1} << 20) / (bytes + 64)));
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) {
      op();
      benchmark::ClobberMemory();
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (run >= 3) ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / reps);
  }
  std::nth_element(ns.begin(), ns.begin() + ns.size() / 2, ns.end());
  return ns[ns.size() / 2];
}

// One memcpy of `bytes` between two buffers already touched (page faults not counted).
inline double MemcpyNanos(size_t bytes) {
  std::vector<char> src(std::max<size_t>(bytes, 1), 1), dst(std::max<size_t>(bytes, 1), 0);
  return MedianNanos(bytes, [&] {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
  });
}

// One memset of `bytes` into a buffer already touched.
inline double MemsetNanos(size_t bytes) {
  std::vector<char> dst(std::max<size_t>(bytes, 1), 0);
  return MedianNanos(bytes, [&] {
    std::memset(dst.data(), 1, bytes);
    benchmark::DoNotOptimize(dst.data());
  });
}

// Sets the counters "<name>_ns" (the reference's nanoseconds) and "x_<name>" (the benchmark's
// own time per iteration, as the framework measures it, paused time excluded, divided by the
// reference).
inline void ReportRatio(benchmark::State& state, const char* name, double reference_ns) {
  state.counters[std::string(name) + "_ns"] = reference_ns;
  // value * iterations / seconds, inverted: seconds / (iterations * reference_seconds).
  state.counters[std::string("x_") + name] =
      benchmark::Counter(reference_ns * 1e-9, benchmark::Counter::kIsIterationInvariantRate |
                                                  benchmark::Counter::kInvert);
}

// "memcpy_ns" and "x_memcpy" for an operation that writes `bytes`. Call it before or after
// the timed loop.
inline void ReportRatioToMemcpy(benchmark::State& state, size_t bytes) {
  ReportRatio(state, "memcpy", MemcpyNanos(bytes));
}

// "memset_ns" and "x_memset": for an operation that fills `bytes` (a mask).
inline void ReportRatioToMemset(benchmark::State& state, size_t bytes) {
  ReportRatio(state, "memset", MemsetNanos(bytes));
}

}  // namespace bench
}  // namespace attnmeta

#endif  // ATTNMETA_TOOLS_BENCH_MEMCPY_REFERENCE_H_
