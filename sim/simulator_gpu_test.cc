// attnmeta_sim's GPU backend end to end, on the workload the attention kernels take
// (sim/workloads/kernels.textproto): the metadata replayed on the device by the metadata
// kernels, and every replayed forward's attention computed by the attention kernels from that
// device metadata and compared with dense attention, path by path (decode by indices, by the
// page table and by the replay's split-KV plan in both layouts; target-verify with the tree
// mask and draft-extend through the varlen kernel). Needs a GPU.

#include <cstdint>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "attention/kernels/testing/gpu_test.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/simulator.h"
#include "sim/testing/replayed_forwards.h"
#include "sim/workload.h"

// sim/workloads/kernels.textproto (the kernels_workload_text genrule).
extern const char kAttnmetaKernelsWorkloadText[];

namespace attnmeta {
namespace {

class SimulatorGpuTest : public testing::GpuTest {};

TEST_F(SimulatorGpuTest, TheAttentionKernelsAgreeOnEveryReplayedForward) {
  absl::StatusOr<Workload> workload = ParseWorkload(kAttnmetaKernelsWorkloadText);
  ASSERT_TRUE(workload.ok()) << workload.status();
  SimOptions options;
  options.backend = "gpu";
  options.max_steps = 40;
  absl::StatusOr<SimReport> report = RunWorkload(*workload, options);
  ASSERT_TRUE(report.ok()) << report.status();
  std::cout << FormatReportTable(*report);
  EXPECT_TRUE(report->passed());
  ASSERT_EQ(report->runs_size(), workload->scenarios_size() * workload->page_sizes_size());
  for (const RunReport& r : report->runs()) {
    SCOPED_TRACE(absl::StrCat(r.scenario(), " page size ", r.page_size()));
    EXPECT_TRUE(r.passed()) << r.failure();
    // Every replayed forward with query rows went through the kernels.
    const int64_t replayed = testing::ReplayedForwardsWithQueryRows(*workload, r);
    EXPECT_GT(replayed, 0);
    EXPECT_EQ(r.device_attention_checks(), replayed);
    EXPECT_LE(r.max_device_relative_error(), kMaxDeviceRelativeError);
    EXPECT_LE(r.max_device_lse_error(), kMaxDeviceLseError);
    EXPECT_LE(r.max_relative_error(), kMaxRelativeError);
    // The device writer took every graph-able forward, so each such mode the scenario ran was
    // replayed and reached the kernels.
    EXPECT_EQ(r.replays_unsupported(), 0);
    EXPECT_THAT(testing::GraphModesNeverReplayed(r), ::testing::IsEmpty());
  }
  // The decode kernel's merge ran: the chat scenarios' plans split sequences.
  int64_t merges = 0;
  for (const RunReport& r : report->runs()) merges += r.device_split_merges();
  EXPECT_GT(merges, 0);
}

}  // namespace
}  // namespace attnmeta
