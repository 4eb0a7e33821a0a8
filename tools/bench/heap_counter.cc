#include "tools/bench/heap_counter.h"

#include <cstdlib>
#include <new>

namespace {
int64_t heap_allocations = 0;
}  // namespace

void* operator new(size_t n) {
  ++heap_allocations;
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace attnmeta {
namespace bench {

int64_t HeapAllocations() { return heap_allocations; }

}  // namespace bench
}  // namespace attnmeta
