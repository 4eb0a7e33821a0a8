#include "tools/bench/heap_counter.h"

#include <algorithm>
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
void* operator new(size_t n, std::align_val_t a) {
  ++heap_allocations;
  const size_t align = static_cast<size_t>(a);
  void* p = std::aligned_alloc(align, (std::max<size_t>(n, 1) + align - 1) / align * align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }

namespace attnmeta {
namespace bench {

int64_t HeapAllocations() { return heap_allocations; }

}  // namespace bench
}  // namespace attnmeta
