// DeviceSpan: a typed view of device memory (pointer and element count) for host launchers.
// Host code never dereferences it; launchers check the sizes and pass the pointer on.

#ifndef ATTNMETA_ATTENTION_KERNELS_DEVICE_SPAN_H_
#define ATTNMETA_ATTENTION_KERNELS_DEVICE_SPAN_H_

#include <cstddef>
#include <type_traits>

namespace attnmeta {

template <typename T>
class DeviceSpan {
 public:
  constexpr DeviceSpan() = default;
  constexpr DeviceSpan(T* data, size_t size) : data_(data), size_(size) {}
  // A span of T converts to a span of const T.
  template <typename U, typename = std::enable_if_t<std::is_same_v<const U, T>>>
  constexpr DeviceSpan(DeviceSpan<U> other) : data_(other.data()), size_(other.size()) {}

  constexpr T* data() const { return data_; }
  constexpr size_t size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_DEVICE_SPAN_H_
