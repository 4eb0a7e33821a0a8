#include "attention/kernels/internal/device_value_cache.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace internal {
namespace {

TEST(DeviceValueCacheTest, ReadsOncePerDeviceAndKey) {
  DeviceValueCache cache;
  int reads = 0;
  auto read = [&](int32_t value) {
    return [&reads, value]() -> absl::StatusOr<int32_t> {
      ++reads;
      return value;
    };
  };
  EXPECT_EQ(*cache.Get(0, 7, read(132)), 132);
  EXPECT_EQ(*cache.Get(0, 7, read(99)), 132);  // kept: not read again
  EXPECT_EQ(reads, 1);
  // Another device or another key is a value of its own.
  EXPECT_EQ(*cache.Get(1, 7, read(108)), 108);
  EXPECT_EQ(*cache.Get(0, 8, read(2)), 2);
  EXPECT_EQ(reads, 3);
  EXPECT_EQ(*cache.Get(1, 7, read(0)), 108);
  EXPECT_EQ(*cache.Get(0, 8, read(0)), 2);
  EXPECT_EQ(*cache.Get(0, 7, read(0)), 132);
  EXPECT_EQ(reads, 3);
}

TEST(DeviceValueCacheTest, AFailedReadIsNotKept) {
  DeviceValueCache cache;
  int reads = 0;
  absl::StatusOr<int32_t> got = cache.Get(0, 1, [&]() -> absl::StatusOr<int32_t> {
    ++reads;
    return absl::InternalError("no device");
  });
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal);
  got = cache.Get(0, 1, [&]() -> absl::StatusOr<int32_t> {
    ++reads;
    return 4;
  });
  EXPECT_EQ(*got, 4);
  EXPECT_EQ(*cache.Get(0, 1, [&]() -> absl::StatusOr<int32_t> { return 5; }), 4);
  EXPECT_EQ(reads, 2);
}

TEST(DeviceValueCacheTest, ThreadsThatMissTogetherGetOneValue) {
  DeviceValueCache cache;
  constexpr int kThreads = 8;
  std::atomic<int> waiting{kThreads};
  std::vector<int32_t> got(kThreads, -1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      got[t] = *cache.Get(3, 0, [&]() -> absl::StatusOr<int32_t> {
        // Every thread reads before any keeps its value, so that all of them miss.
        waiting.fetch_sub(1);
        while (waiting.load() > 0) std::this_thread::yield();
        return t + 1;
      });
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 1; t < kThreads; ++t) EXPECT_EQ(got[t], got[0]) << "thread " << t;
  EXPECT_EQ(*cache.Get(3, 0, [] { return absl::StatusOr<int32_t>(-1); }), got[0]);
}

}  // namespace
}  // namespace internal
}  // namespace attnmeta
