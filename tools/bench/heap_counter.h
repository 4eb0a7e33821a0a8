// Counts the calls of the global operator new in the binary that links this library (it
// replaces operator new/delete), so that tests and benchmarks can prove a path allocates
// nothing.

#ifndef ATTNMETA_TOOLS_BENCH_HEAP_COUNTER_H_
#define ATTNMETA_TOOLS_BENCH_HEAP_COUNTER_H_

#include <cstdint>

namespace attnmeta {
namespace bench {

// operator new calls since the program started.
int64_t HeapAllocations();

}  // namespace bench
}  // namespace attnmeta

#endif  // ATTNMETA_TOOLS_BENCH_HEAP_COUNTER_H_
