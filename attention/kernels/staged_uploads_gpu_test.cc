// StagedUploads and HipDeviceMemory's staged path: staged copies land when an apply kernel
// runs (launched directly or from a graph), in order with the memory's other operations; a host
// running ahead of the GPU waits for the previous apply and every step lands its own bytes; a
// copy without room is refused and stages nothing, discarded copies never land, nor do those
// of an apply launch that failed (which leaves the batches launched before it alone); an apply
// reported launched that never runs is an error, not a hang. Needs a GPU: fails when none is
// visible.

#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "attention/kernels/device_metadata_writer.h"
#include "attention/kernels/hip_device_memory.h"
#include "attention/kernels/staged_uploads.h"
#include "attention/kernels/testing/device_buffer.h"
#include "attention/kernels/testing/gpu_test.h"
#include "attention/kernels/testing/spin.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

using testing::DeviceBuffer;

class StagedUploadsTest : public testing::GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_EQ(hipStreamCreate(&stream_), hipSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) (void)hipStreamDestroy(stream_);
  }
  std::unique_ptr<StagedUploads> MakeUploads(int64_t payload = StagedUploads::kDefaultPayloadBytes) {
    auto u = StagedUploads::Create(stream_, payload);
    EXPECT_TRUE(u.ok()) << u.status();
    return u.ok() ? *std::move(u) : nullptr;
  }
  // EnqueueApply made to fail: queued into a capture that a synchronization of the capturing
  // stream invalidated (which the sanitizer reports as errors: callers skip under it).
  absl::Status FailedEnqueueApply(StagedUploads& u) {
    EXPECT_EQ(hipStreamBeginCapture(stream_, hipStreamCaptureModeThreadLocal), hipSuccess);
    EXPECT_NE(hipStreamSynchronize(stream_), hipSuccess);
    const absl::Status failed = u.EnqueueApply();
    hipGraph_t graph = nullptr;
    (void)hipStreamEndCapture(stream_, &graph);
    if (graph != nullptr) (void)hipGraphDestroy(graph);
    (void)hipGetLastError();
    return failed;
  }
  template <typename T>
  std::vector<T> Read(const DeviceBuffer<T>& b) {
    EXPECT_EQ(hipStreamSynchronize(stream_), hipSuccess);
    auto h = b.ToHost();
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : std::vector<T>{};
  }
  hipStream_t stream_ = nullptr;
};

TEST_F(StagedUploadsTest, CopiesLandWhenTheApplyKernelRuns) {
  auto u = MakeUploads();
  ASSERT_NE(u, nullptr);
  constexpr int kBytes = 24000;
  auto dst = DeviceBuffer<uint8_t>::Create(kBytes);
  ASSERT_TRUE(dst.ok());
  ASSERT_EQ(hipMemset(dst->data(), 0xee, kBytes), hipSuccess);
  std::vector<uint8_t> want(kBytes, 0xee);
  // Aligned (16-byte words) and unaligned (bytes) copies, small ones and ones past the words
  // the kernel loads up front (256 x 16 bytes of payload).
  struct Copy {
    int at, bytes;
  };
  const Copy copies[] = {{0, 32}, {37, 5}, {1001, 9999}, {11008, 8192}, {19300, 17}};
  for (const Copy& c : copies) {
    std::vector<uint8_t> src(c.bytes);
    for (int k = 0; k < c.bytes; ++k) src[k] = static_cast<uint8_t>(c.at + 7 * k);
    std::copy(src.begin(), src.end(), want.begin() + c.at);
    ASSERT_TRUE(u->Stage(dst->data() + c.at, src.data(), c.bytes).ok()) << c.at;
  }
  EXPECT_TRUE(u->has_open_batch());
  EXPECT_EQ(Read(*dst), std::vector<uint8_t>(kBytes, 0xee)) << "nothing lands before an apply";
  ASSERT_TRUE(u->EnqueueApply().ok());
  u->NoteApplyLaunched();
  EXPECT_FALSE(u->has_open_batch());
  EXPECT_EQ(Read(*dst), want);
  // A batch is applied once: a later apply with nothing staged (a graph launched again) copies
  // nothing over what was written since.
  ASSERT_EQ(hipMemsetAsync(dst->data(), 0x11, kBytes, stream_), hipSuccess);
  ASSERT_TRUE(u->EnqueueApply().ok());
  u->NoteApplyLaunched();
  EXPECT_EQ(Read(*dst), std::vector<uint8_t>(kBytes, 0x11));
}

TEST_F(StagedUploadsTest, TheApplyKernelClearsItsConsumersWords) {
  auto u = MakeUploads();
  ASSERT_NE(u, nullptr);
  auto word = DeviceBuffer<uint32_t>::Create(80);
  ASSERT_TRUE(word.ok());
  ASSERT_EQ(hipMemset(word->data(), 0xff, 80 * 4), hipSuccess);
  ASSERT_TRUE(u->EnqueueApply(word->data(), 4 * kernels::kMaxZeroWords).ok());
  u->NoteApplyLaunched();
  std::vector<uint32_t> want(80, 0xffffffffu);
  std::fill(want.begin(), want.begin() + kernels::kMaxZeroWords, 0u);
  EXPECT_EQ(Read(*word), want);
  EXPECT_EQ(u->EnqueueApply(word->data(), 6).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(u->EnqueueApply(word->data(), 4 * kernels::kMaxZeroWords + 4).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(u->EnqueueApply(nullptr, 4).code(), absl::StatusCode::kInvalidArgument);
}

// The host stages step i + 1 while step i's apply is still queued behind a busy GPU: it waits
// for that apply, never clobbers bytes not yet copied, and every step reads its own inputs.
// Half the steps launch the apply from a captured graph.
TEST_F(StagedUploadsTest, AHostRunningAheadWaitsAndEveryStepLandsItsOwnBytes) {
  auto u = MakeUploads();
  ASSERT_NE(u, nullptr);
  constexpr int kSteps = 40;
  constexpr int kInts = 300;
  auto input = DeviceBuffer<int32_t>::Create(kInts);
  auto results = DeviceBuffer<int32_t>::Create(kSteps * kInts);
  ASSERT_TRUE(input.ok() && results.ok());
  hipGraph_t graph = nullptr;
  hipGraphExec_t exec = nullptr;
  ASSERT_EQ(hipStreamBeginCapture(stream_, hipStreamCaptureModeThreadLocal), hipSuccess);
  const absl::Status captured = u->EnqueueApply();
  ASSERT_EQ(hipStreamEndCapture(stream_, &graph), hipSuccess);
  ASSERT_TRUE(captured.ok()) << captured;
  ASSERT_EQ(hipGraphInstantiate(&exec, graph, nullptr, nullptr, 0), hipSuccess);
  std::vector<int32_t> want(kSteps * kInts);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int32_t> values(kInts);
    for (int k = 0; k < kInts; ++k) values[k] = step * 1000 + k;
    std::copy(values.begin(), values.end(), want.begin() + step * kInts);
    ASSERT_TRUE(u->Stage(input->data(), values.data(), kInts * 4).ok()) << "step " << step;
    if (step % 2 == 0) {
      ASSERT_TRUE(u->EnqueueApply().ok());
    } else {
      ASSERT_EQ(hipGraphLaunch(exec, stream_), hipSuccess);
    }
    u->NoteApplyLaunched();
    // The step's own work: long enough that the host gets ahead, then the inputs it read.
    ASSERT_EQ(testing::LaunchSpin(200000, stream_), hipSuccess);
    ASSERT_EQ(hipMemcpyAsync(results->data() + step * kInts, input->data(), kInts * 4,
                             hipMemcpyDeviceToDevice, stream_),
              hipSuccess);
  }
  EXPECT_EQ(Read(*results), want);
  EXPECT_EQ(u->applies_launched(), uint64_t{kSteps});
  (void)hipGraphExecDestroy(exec);
  (void)hipGraphDestroy(graph);
}

TEST_F(StagedUploadsTest, ABatchWithoutRoomIsRefusedAndStagesNothing) {
  auto u = MakeUploads(/*payload=*/64);
  ASSERT_NE(u, nullptr);
  auto dst = DeviceBuffer<uint8_t>::Create(256);
  ASSERT_TRUE(dst.ok());
  ASSERT_EQ(hipMemset(dst->data(), 0, 256), hipSuccess);
  std::vector<uint8_t> ones(80, 1), twos(80, 2);
  ASSERT_TRUE(u->Stage(dst->data(), ones.data(), 40).ok());  // 48 bytes of payload taken
  const absl::Status full = u->Stage(dst->data() + 64, twos.data(), 17);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  ASSERT_TRUE(u->Stage(dst->data() + 128, twos.data(), 16).ok());  // still fits
  ASSERT_TRUE(u->Flush().ok());
  std::vector<uint8_t> want(256, 0);
  std::fill(want.begin(), want.begin() + 40, 1);
  std::fill(want.begin() + 128, want.begin() + 144, 2);
  EXPECT_EQ(Read(*dst), want);
  // A copy larger than the payload opens no batch; closing an empty one launches nothing.
  const uint64_t launched = u->applies_launched();
  EXPECT_EQ(u->Stage(dst->data(), ones.data(), 65).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(u->has_open_batch());
  ASSERT_TRUE(u->Flush().ok());
  EXPECT_EQ(u->applies_launched(), launched);
  // Discarded copies never land.
  ASSERT_TRUE(u->Stage(dst->data() + 200, ones.data(), 8).ok());
  u->Discard();
  EXPECT_FALSE(u->has_open_batch());
  ASSERT_TRUE(u->Flush().ok());
  EXPECT_EQ(Read(*dst), want);
  // kMaxStagedUploads copies per batch.
  auto many = MakeUploads();
  ASSERT_NE(many, nullptr);
  for (uint32_t i = 0; i < kernels::kMaxStagedUploads; ++i) {
    ASSERT_TRUE(many->Stage(dst->data() + 160 + i, twos.data(), 1).ok()) << i;
  }
  EXPECT_EQ(many->Stage(dst->data(), twos.data(), 1).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(many->Stage(dst->data(), twos.data(), -1).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(many->Flush().ok());
  std::fill(want.begin() + 160, want.begin() + 160 + kernels::kMaxStagedUploads, 2);
  EXPECT_EQ(Read(*dst), want);
}

TEST_F(StagedUploadsTest, AnApplyReportedLaunchedThatNeverRunsIsAnErrorNotAHang) {
  auto u = MakeUploads();
  ASSERT_NE(u, nullptr);
  auto dst = DeviceBuffer<int32_t>::Create(4);
  ASSERT_TRUE(dst.ok());
  const int32_t v[4] = {1, 2, 3, 4};
  ASSERT_TRUE(u->Stage(dst->data(), v, 16).ok());
  u->NoteApplyLaunched();  // but no apply kernel was queued
  const absl::Status s = u->Stage(dst->data(), v, 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("never ran"), absl::string_view::npos) << s;
}

// An apply launch that fails loses its batch (the status says so): no later apply kernel
// lands it, since its destinations may be gone by then.
TEST_F(StagedUploadsTest, AFailedApplyLaunchLosesItsBatchForGood) {
  if (testing::UnderGpuSanitizer()) {
    GTEST_SKIP() << "its runtime calls fail on purpose, which the sanitizer reports as errors";
  }
  auto u = MakeUploads();
  ASSERT_NE(u, nullptr);
  auto dst = DeviceBuffer<int32_t>::Create(4);
  ASSERT_TRUE(dst.ok());
  ASSERT_EQ(hipMemset(dst->data(), 0, 16), hipSuccess);
  const int32_t lost[4] = {1, 2, 3, 4};
  ASSERT_TRUE(u->Stage(dst->data(), lost, 16).ok());
  const absl::Status failed = FailedEnqueueApply(*u);
  ASSERT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_FALSE(u->has_open_batch());
  // The next apply kernel, with nothing staged since, lands nothing.
  ASSERT_TRUE(u->EnqueueApply().ok());
  u->NoteApplyLaunched();
  EXPECT_EQ(Read(*dst), std::vector<int32_t>(4, 0));
  // The next batch lands as usual.
  const int32_t next[4] = {5, 6, 7, 8};
  ASSERT_TRUE(u->Stage(dst->data(), next, 16).ok());
  ASSERT_TRUE(u->Flush().ok());
  EXPECT_EQ(Read(*dst), std::vector<int32_t>(next, next + 4));
}

// An apply launch that fails with no batch open leaves alone the batch launched before it,
// whose kernel, queued behind a long kernel, has yet to read the header.
TEST_F(StagedUploadsTest, AFailedApplyLaunchKeepsTheBatchLaunchedBeforeIt) {
  if (testing::UnderGpuSanitizer()) {
    GTEST_SKIP() << "its runtime calls fail on purpose, which the sanitizer reports as errors";
  }
  auto u = MakeUploads();
  ASSERT_NE(u, nullptr);
  auto dst = DeviceBuffer<int32_t>::Create(4);
  ASSERT_TRUE(dst.ok());
  // One apply first: the runtime loads a kernel's module at its first launch, which may wait
  // for the device, and so for the spin below (run alone, this test then saw the queued apply
  // kernel run before the failed launch, and proved nothing).
  const int32_t zeros[4] = {0, 0, 0, 0};
  ASSERT_TRUE(u->Stage(dst->data(), zeros, 16).ok());
  ASSERT_TRUE(u->Flush().ok());
  ASSERT_EQ(Read(*dst), std::vector<int32_t>(4, 0));
  // About 10 ms at the H200's clock: far longer than the host takes to fail the launch below.
  hipEvent_t spun = nullptr;
  ASSERT_EQ(hipEventCreateWithFlags(&spun, hipEventDisableTiming), hipSuccess);
  ASSERT_EQ(testing::LaunchSpin(20000000, stream_), hipSuccess);
  ASSERT_EQ(hipEventRecord(spun, stream_), hipSuccess);
  const int32_t launched[4] = {1, 2, 3, 4};
  ASSERT_TRUE(u->Stage(dst->data(), launched, 16).ok());
  ASSERT_TRUE(u->Flush().ok());
  ASSERT_FALSE(u->has_open_batch());
  const absl::Status failed = FailedEnqueueApply(*u);
  ASSERT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  // The apply kernel (a plain launch) cannot have started before the spin ended.
  const hipError_t spinning = hipEventQuery(spun);
  EXPECT_EQ(hipEventDestroy(spun), hipSuccess);
  ASSERT_EQ(spinning, hipErrorNotReady)
      << "the spin ended before the failed launch: the apply kernel behind it may have run";
  EXPECT_EQ(Read(*dst), std::vector<int32_t>(launched, launched + 4));
}

TEST_F(StagedUploadsTest, CreateAndAttachRefuseWhatCannotWork) {
  EXPECT_EQ(StagedUploads::Create(stream_, 8).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StagedUploads::Create(stream_, int64_t{1} << 31).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto u = MakeUploads();
  ASSERT_NE(u, nullptr);
  auto table = DeviceBuffer<TokenSlot>::Create(64);
  ASSERT_TRUE(table.ok());
  const DeviceReqToToken req_to_token{table->const_span(), TokenCount(16)};
  // The uploads must be queued on the writer's stream.
  DeviceMetadataWriter::Options other_stream;
  other_stream.uploads = u.get();
  EXPECT_EQ(DeviceMetadataWriter::Create(req_to_token, TokenCount(64), nullptr, other_stream)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(u->attached());
  auto first = DeviceMetadataWriter::Create(req_to_token, TokenCount(64), stream_, other_stream);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(u->attached());
  const auto second = DeviceMetadataWriter::Create(req_to_token, TokenCount(64), stream_, other_stream);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  // A split-KV request needs the host's lengths of its padded rows for the plan's counts.
  MetadataWriteRequest request;
  request.padded_batch_size = 4;
  request.split_kv = true;
  EXPECT_EQ((*first)->CheckSupported(request).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<TokenLength> lens(4, TokenLength(1));
  request.host_kv_lens = lens;
  request.host_q_lens = lens;
  EXPECT_TRUE((*first)->CheckSupported(request).ok());
  first->reset();
  EXPECT_FALSE(u->attached()) << "a writer detaches when it goes";
}

// HipDeviceMemory stages small copies only while a consumer is attached, flushes them before
// any other operation of its own, and sends a copy without room the ordinary way after them.
TEST_F(StagedUploadsTest, DeviceMemoryKeepsTheOrderOfItsOperations) {
  auto u = MakeUploads(/*payload=*/256);
  ASSERT_NE(u, nullptr);
  HipDeviceMemory memory(stream_, u.get());
  auto buffer = memory.Allocate("buffer", 1024);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::vector<uint8_t> a(1024, 7), b(1024, 9), out(1024);
  // Not attached: an ordinary copy.
  ASSERT_TRUE(memory.CopyToDevice(*buffer, 0, a.data(), 64).ok());
  EXPECT_FALSE(u->has_open_batch());
  ASSERT_TRUE(u->Attach().ok());
  // Staged, then a fill over part of it: the staged bytes land first.
  ASSERT_TRUE(memory.CopyToDevice(*buffer, 0, b.data(), 64).ok());
  EXPECT_TRUE(u->has_open_batch());
  ASSERT_TRUE(memory.Fill(*buffer, 32, 16, 0x55).ok());
  EXPECT_FALSE(u->has_open_batch());
  ASSERT_TRUE(memory.CopyToHost(out.data(), *buffer, 0, 64).ok());
  std::vector<uint8_t> want(64, 9);
  std::fill(want.begin() + 32, want.begin() + 48, 0x55);
  EXPECT_EQ(std::vector<uint8_t>(out.begin(), out.begin() + 64), want);
  // Staged, then a copy too large for the payload over the same bytes: the large one wins.
  ASSERT_TRUE(memory.CopyToDevice(*buffer, 0, a.data(), 128).ok());
  EXPECT_TRUE(u->has_open_batch());
  ASSERT_TRUE(memory.CopyToDevice(*buffer, 0, b.data(), 1024).ok());
  EXPECT_FALSE(u->has_open_batch());
  ASSERT_TRUE(memory.CopyToHost(out.data(), *buffer, 0, 1024).ok());
  EXPECT_EQ(out, b);
  // Staged, then read back: the read flushes first.
  ASSERT_TRUE(memory.CopyToDevice(*buffer, 100, a.data(), 10).ok());
  ASSERT_TRUE(memory.CopyToHost(out.data(), *buffer, 0, 1024).ok());
  std::fill(b.begin() + 100, b.begin() + 110, 7);
  EXPECT_EQ(out, b);
  // Staged twice over overlapping bytes in one batch (whose copies land in no order): the
  // second copy goes after the first, through a flush.
  ASSERT_TRUE(memory.CopyToDevice(*buffer, 200, a.data(), 32).ok());
  ASSERT_TRUE(memory.CopyToDevice(*buffer, 216, b.data(), 32).ok());
  ASSERT_TRUE(memory.CopyToHost(out.data(), *buffer, 0, 1024).ok());
  std::fill(b.begin() + 200, b.begin() + 216, 7);
  EXPECT_EQ(out, b);
  ASSERT_TRUE(u->Detach().ok());
}

// A step retried after a failure stages its inputs again into the open batch: the copy to the
// same range replaces the first (two copies of one batch to the same bytes would race), and a
// copy overlapping another one otherwise is refused, staging nothing.
TEST_F(StagedUploadsTest, ACopyOverAnotherOfTheBatchReplacesItOrIsRefused) {
  auto u = MakeUploads();
  ASSERT_NE(u, nullptr);
  auto dst = DeviceBuffer<int32_t>::Create(64);
  ASSERT_TRUE(dst.ok());
  ASSERT_EQ(hipMemset(dst->data(), 0, 64 * sizeof(int32_t)), hipSuccess);
  std::vector<int32_t> first(64), second(64);
  std::iota(first.begin(), first.end(), 1000);
  std::iota(second.begin(), second.end(), 2000);
  ASSERT_TRUE(u->Stage(dst->data(), first.data(), 64 * sizeof(int32_t)).ok());
  ASSERT_TRUE(u->Stage(dst->data(), second.data(), 64 * sizeof(int32_t)).ok());
  const absl::Status overlapping = u->Stage(dst->data() + 8, first.data(), 4 * sizeof(int32_t));
  EXPECT_EQ(overlapping.code(), absl::StatusCode::kResourceExhausted) << overlapping;
  ASSERT_TRUE(u->Flush().ok());
  EXPECT_EQ(Read(*dst), second);
}

}  // namespace
}  // namespace attnmeta
