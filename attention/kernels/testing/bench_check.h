// BENCH_CHECK and Unwrap: a GPU benchmark stops at the first failed call, naming it.

#ifndef ATTNMETA_ATTENTION_KERNELS_TESTING_BENCH_CHECK_H_
#define ATTNMETA_ATTENTION_KERNELS_TESTING_BENCH_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Exits 1 with the file, line and status when `expr` (an absl::Status) is not OK.
#define BENCH_CHECK(expr)                                                              \
  do {                                                                                 \
    const absl::Status _s = (expr);                                                    \
    if (!_s.ok()) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, _s.ToString().c_str());  \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

namespace attnmeta {
namespace testing {

// The value, or exit 1 with the status.
template <typename T>
T Unwrap(absl::StatusOr<T> v) {
  BENCH_CHECK(v.status());
  return *std::move(v);
}

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_TESTING_BENCH_CHECK_H_
