#include "attention/graph/host_device_memory.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace attnmeta {
namespace {

TEST(HostDeviceMemoryTest, CopiesFillsAndCounts) {
  HostDeviceMemory m;
  auto b = m.Allocate("x", 16);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(m.allocations(), 1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->ptr) % 64, 0u);
  const std::vector<uint8_t> in = {1, 2, 3, 4};
  ASSERT_TRUE(m.Fill(*b, 0, 16, 9).ok());
  ASSERT_TRUE(m.CopyToDevice(*b, 12, in.data(), 4).ok());
  std::vector<uint8_t> out(16);
  ASSERT_TRUE(m.CopyToHost(out.data(), *b, 0, 16).ok());
  EXPECT_EQ(out, (std::vector<uint8_t>{9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 1, 2, 3, 4}));
  // Ranges are checked at exactly the end.
  EXPECT_EQ(m.CopyToDevice(*b, 13, in.data(), 4).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(m.CopyToHost(out.data(), *b, -1, 2).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(m.Fill(*b, 0, 17, 0).code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(m.VerifyCanaries().ok());
  EXPECT_EQ(m.live_bytes(), 16);
  m.Free(*b);
  EXPECT_EQ(m.live_allocations(), 0);
  EXPECT_EQ(m.Allocate("neg", -1).status().code(), absl::StatusCode::kInvalidArgument);
  // A size no memory can hold is what the interface calls ResourceExhausted.
  EXPECT_EQ(m.Allocate("huge", (int64_t{1} << 62) + 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(m.live_allocations(), 0);
  EXPECT_EQ(m.foreign_frees(), 0);
}

TEST(HostDeviceMemoryTest, BuffersItDoesNotHoldAreRefusedAndLeftAlone) {
  HostDeviceMemory m;
  const DeviceBuffer kept = *m.Allocate("kept", 8);
  const DeviceBuffer freed = *m.Allocate("freed", 8);
  m.Free(freed);
  char foreign[8] = {};
  const DeviceBuffer other{foreign, 8};
  const uint8_t in[4] = {1, 2, 3, 4};
  for (const DeviceBuffer& b : {freed, other}) {
    EXPECT_EQ(m.CopyToDevice(b, 0, in, 4).code(), absl::StatusCode::kOutOfRange);
    uint8_t out[4];
    EXPECT_EQ(m.CopyToHost(out, b, 0, 4).code(), absl::StatusCode::kOutOfRange);
    EXPECT_EQ(m.Fill(b, 0, 4, 7).code(), absl::StatusCode::kOutOfRange);
    m.Free(b);  // a second free, and a free of memory it never allocated: counted, no effect
  }
  EXPECT_EQ(m.foreign_frees(), 2);
  EXPECT_EQ(foreign[0], 0);
  EXPECT_EQ(m.live_allocations(), 1);
  EXPECT_TRUE(m.Fill(kept, 0, 8, 1).ok());
  m.Free(kept);
  EXPECT_EQ(m.live_allocations(), 0);
}

TEST(HostDeviceMemoryTest, CanariesCatchWritesOutsideABuffer) {
  HostDeviceMemory m;
  DeviceBuffer b = *m.Allocate("kv_indices", 40);
  static_cast<char*>(b.ptr)[40] = 0;  // one byte past the end
  absl::Status s = m.VerifyCanaries();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("kv_indices"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("past its end"), absl::string_view::npos) << s;
  static_cast<unsigned char*>(b.ptr)[40] = 0xA5;
  EXPECT_TRUE(m.VerifyCanaries().ok());
  static_cast<char*>(b.ptr)[-1] = 0;  // one byte before the start
  s = m.VerifyCanaries();
  EXPECT_NE(s.message().find("before its start"), absl::string_view::npos) << s;
  static_cast<unsigned char*>(b.ptr)[-1] = 0xA5;
  m.Free(b);
}

}  // namespace
}  // namespace attnmeta
