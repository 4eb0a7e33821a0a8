#include "tools/bench/heap_counter.h"

#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <new>

namespace {

int64_t heap_allocations = 0;
int64_t live_bytes = 0;
int64_t peak_bytes = 0;

void* Counted(void* p) {
  if (p == nullptr) throw std::bad_alloc();
  ++heap_allocations;
  live_bytes += static_cast<int64_t>(malloc_usable_size(p));
  peak_bytes = std::max(peak_bytes, live_bytes);
  return p;
}

void Release(void* p) noexcept {
  if (p == nullptr) return;
  live_bytes -= static_cast<int64_t>(malloc_usable_size(p));
  std::free(p);
}

void* Aligned(size_t n, std::align_val_t a) {
  const size_t align = static_cast<size_t>(a);
  return Counted(std::aligned_alloc(align, (std::max<size_t>(n, 1) + align - 1) / align * align));
}

}  // namespace

void* operator new(size_t n) { return Counted(std::malloc(n == 0 ? 1 : n)); }
void* operator new[](size_t n) { return Counted(std::malloc(n == 0 ? 1 : n)); }
void* operator new(size_t n, std::align_val_t a) { return Aligned(n, a); }
void* operator new[](size_t n, std::align_val_t a) { return Aligned(n, a); }
void operator delete(void* p) noexcept { Release(p); }
void operator delete[](void* p) noexcept { Release(p); }
void operator delete(void* p, size_t) noexcept { Release(p); }
void operator delete[](void* p, size_t) noexcept { Release(p); }
void operator delete(void* p, std::align_val_t) noexcept { Release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { Release(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { Release(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { Release(p); }

namespace attnmeta {
namespace bench {

int64_t HeapAllocations() { return heap_allocations; }
int64_t HeapLiveBytes() { return live_bytes; }
int64_t HeapPeakBytes() { return peak_bytes; }
void ResetHeapPeak() { peak_bytes = live_bytes; }

bool HeapCounterIsLive() {
  // The probe escapes through a volatile pointer, so the compiler cannot elide it.
  static int* volatile escaped = nullptr;
  const int64_t before = heap_allocations;
  escaped = new int(1);
  delete escaped;
  return heap_allocations != before;
}

}  // namespace bench
}  // namespace attnmeta
