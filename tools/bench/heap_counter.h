// Counts the global operator new of the binary that links this library (it replaces operator
// new/delete), so that tests and benchmarks can prove a path allocates nothing, or that the
// memory it holds stays bounded. Under a sanitizer the sanitizer's runtime owns operator new
// and nothing is counted: callers check HeapCounterIsLive() first.

#ifndef ATTNMETA_TOOLS_BENCH_HEAP_COUNTER_H_
#define ATTNMETA_TOOLS_BENCH_HEAP_COUNTER_H_

#include <cstdint>

namespace attnmeta {
namespace bench {

// operator new calls since the program started.
int64_t HeapAllocations();
// Bytes held by live operator new allocations (as the allocator sized them), and the most
// held since the program started or the last ResetHeapPeak().
int64_t HeapLiveBytes();
int64_t HeapPeakBytes();
void ResetHeapPeak();
// True when this library's operator new is the one in use (a probe allocation is counted).
bool HeapCounterIsLive();

}  // namespace bench
}  // namespace attnmeta

#endif  // ATTNMETA_TOOLS_BENCH_HEAP_COUNTER_H_
