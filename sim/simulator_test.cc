#include "sim/simulator.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "attention/metadata/snapshot.h"
#include "gtest/gtest.h"
#include "sim/workload.h"

namespace attnmeta {
namespace {

Workload Default() {
  absl::StatusOr<Workload> w = ParseWorkload(DefaultWorkloadText());
  EXPECT_TRUE(w.ok()) << w.status();
  return *w;
}

const ModeReport* FindMode(const RunReport& r, absl::string_view mode) {
  for (const ModeReport& m : r.modes()) {
    if (m.mode() == mode) return &m;
  }
  return nullptr;
}

// Timings differ from run to run; everything else is determined by the workload and seed.
SimReport WithoutTimings(SimReport r) {
  for (RunReport& run : *r.mutable_runs()) {
    run.clear_eager_build_us_per_forward();
    run.clear_replay_us_per_forward();
  }
  return r;
}

// The default workload passes at every page size, and every feature it is meant to exercise
// happened: each mode ran and was replayed, prefixes were shared, the pool forced backoffs and
// retractions, large batches fell back to the eager path, attention was checked every step.
TEST(SimulatorTest, DefaultWorkloadPassesAndExercisesEverything) {
  absl::StatusOr<SimReport> report = RunWorkload(Default(), SimOptions{});
  ASSERT_TRUE(report.ok()) << report.status();
  std::cout << FormatReportTable(*report);
  EXPECT_TRUE(report->passed());
  ASSERT_EQ(report->runs_size(), 12);
  int64_t retractions = 0, backoffs = 0, fallbacks = 0, prefix_hits = 0;
  for (const RunReport& r : report->runs()) {
    SCOPED_TRACE(absl::StrCat(r.scenario(), " page size ", r.page_size()));
    EXPECT_TRUE(r.passed()) << r.failure();
    EXPECT_TRUE(r.finished());
    const int scenario = r.scenario() == "chat" ? 0 : r.scenario() == "eagle_topk1" ? 1 : 2;
    EXPECT_EQ(r.requests_finished(), Default().scenarios(scenario).requests_size());
    EXPECT_GT(r.attention_checks(), r.steps());  // every forward, not only every step
    EXPECT_LE(r.max_relative_error(), kMaxRelativeError);
    EXPECT_GT(r.graph_captures(), 0);
    EXPECT_LE(r.pages_high_water(), r.pool_pages());
    const bool eagle = r.scenario() != "chat";
    for (absl::string_view mode : eagle ? std::vector<absl::string_view>{"extend", "draft_decode",
                                                                         "target_verify", "draft_extend"}
                                        : std::vector<absl::string_view>{"extend", "mixed", "decode"}) {
      const ModeReport* m = FindMode(r, mode);
      ASSERT_NE(m, nullptr) << mode;
      EXPECT_GT(m->forwards(), 0) << mode;
      if (mode != "extend" && mode != "mixed") {
        EXPECT_GT(m->replays(), 0) << mode;
      }
    }
    if (eagle) {
      EXPECT_GT(r.accepted_draft_tokens(), 0);
    }
    retractions += r.retractions();
    backoffs += r.admission_backoffs();
    fallbacks += r.eager_fallbacks();
    prefix_hits += r.prefix_hit_tokens();
  }
  EXPECT_GT(retractions, 0);
  EXPECT_GT(backoffs, 0);
  EXPECT_GT(fallbacks, 0);
  EXPECT_GT(prefix_hits, 0);
}

TEST(SimulatorTest, SameSeedSameReportOtherSeedOtherRun) {
  SimOptions options;
  options.page_sizes = {16};
  absl::StatusOr<SimReport> a = RunWorkload(Default(), options);
  absl::StatusOr<SimReport> b = RunWorkload(Default(), options);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(WithoutTimings(*a).SerializeAsString(), WithoutTimings(*b).SerializeAsString());
  options.seed = 99;
  absl::StatusOr<SimReport> c = RunWorkload(Default(), options);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->passed());
  EXPECT_NE(WithoutTimings(*a).SerializeAsString(), WithoutTimings(*c).SerializeAsString());
}

TEST(SimulatorTest, StepLimitStopsWithoutFailing) {
  SimOptions options;
  options.page_sizes = {7};
  options.max_steps = 5;
  absl::StatusOr<SimReport> report = RunWorkload(Default(), options);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->passed());
  for (const RunReport& r : report->runs()) {
    EXPECT_EQ(r.steps(), 5);
    EXPECT_FALSE(r.finished());
  }
}

TEST(SimulatorTest, BadOptionsRunNothing) {
  SimOptions options;
  options.page_sizes = {0};
  EXPECT_EQ(RunWorkload(Default(), options).status().code(), absl::StatusCode::kInvalidArgument);
  options.page_sizes = {};
  options.dump_all = true;
  EXPECT_EQ(RunWorkload(Default(), options).status().code(), absl::StatusCode::kInvalidArgument);
  options.dump_all = false;
  options.max_steps = -1;
  EXPECT_EQ(RunWorkload(Default(), options).status().code(), absl::StatusCode::kInvalidArgument);
  options.max_steps = 0;
  options.backend = "tpu";
  EXPECT_EQ(RunWorkload(Default(), options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SimulatorTest, MaxStepsTooSmallFails) {
  Workload w = Default();
  Scenario* s = w.mutable_scenarios(0);
  s->set_max_steps(10);
  // Every request arrives in time (a later arrival does not validate): the work does not fit.
  for (Request& r : *s->mutable_requests()) r.set_arrival_step(std::min(r.arrival_step(), 9));
  SimOptions options;
  options.page_sizes = {16};
  absl::StatusOr<SimReport> report = RunWorkload(w, options);
  ASSERT_TRUE(report.ok());
  EXPECT_FALSE(report->passed());
  EXPECT_EQ(report->runs(0).failure(), "not finished within max_steps 10");
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The injected fault (sequence 0's token 0 pointed at token 1's slot) must fail the run, with
// a snapshot that the snapshot checker rejects. With a page table the validator sees the
// disagreement; without one the metadata is valid and only the attention check catches it.
// The default workload's first scenario alone, with or without a page table.
Workload OneScenario(bool page_table) {
  Workload w = Default();
  w.mutable_scenarios()->DeleteSubrange(1, 2);
  w.mutable_scenarios(0)->mutable_backend()->mutable_consumers()->set_page_table(page_table);
  return w;
}

// Page size 16, a fault injected into the metadata of step 30.
SimOptions FaultAtStep30() {
  SimOptions options;
  options.page_sizes = {16};
  options.inject_fault_step = 30;
  return options;
}

TEST(SimulatorTest, InjectedFaultFailsTheRunWithARejectedSnapshot) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmp, nullptr);
  for (bool page_table : {true, false}) {
    SCOPED_TRACE(page_table ? "page table" : "token-level only");
    const Workload w = OneScenario(page_table);
    SimOptions options = FaultAtStep30();
    options.dump_dir = absl::StrCat(tmp, page_table ? "/with_table" : "/without_table");
    ASSERT_EQ(std::system(("mkdir -p " + options.dump_dir).c_str()), 0);
    absl::StatusOr<SimReport> report = RunWorkload(w, options);
    ASSERT_TRUE(report.ok());
    EXPECT_FALSE(report->passed());
    const RunReport& r = report->runs(0);
    EXPECT_EQ(r.steps(), 30);
    EXPECT_TRUE(absl::StartsWith(r.failure(), "step 30, ")) << r.failure();
    EXPECT_TRUE(absl::StrContains(r.failure(), page_table ? "page_table" : "token-level attention"))
        << r.failure();
    ASSERT_EQ(r.snapshots_size(), 1);
    absl::StatusOr<MetadataSnapshot> snap = SnapshotFromText(ReadFile(r.snapshots(0)));
    ASSERT_TRUE(snap.ok()) << snap.status();
    const absl::Status check = CheckSnapshot(*snap);
    EXPECT_FALSE(check.ok());
    EXPECT_TRUE(absl::StartsWith(check.message(), page_table ? "page_table" : "kv_indices[0]"))
        << check;
  }
}

// The report names the seed and, for a failing run, how to rerun it alone; that rerun repeats
// the run exactly (its timings aside).
TEST(SimulatorTest, AFailingRunRerunsAloneFromTheReportedSeed) {
  const Workload w = OneScenario(/*page_table=*/true);
  SimOptions options = FaultAtStep30();
  options.page_sizes = {7, 16};
  options.seed = 1234;
  absl::StatusOr<SimReport> report = RunWorkload(w, options);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->runs_size(), 2);
  EXPECT_EQ(report->seed(), 1234u);
  const std::string table = FormatReportTable(*report);
  EXPECT_TRUE(absl::StrContains(table, "seed 1234\n")) << table;
  EXPECT_TRUE(absl::StrContains(table, "rerun alone: --seed=1234 --scenario=chat --page_sizes=16 "))
      << table;

  // Rerun from the whole default workload, as the line says: the named scenario alone.
  SimOptions alone = FaultAtStep30();
  alone.seed = report->seed();
  alone.scenario = "chat";
  alone.page_sizes = {16};
  absl::StatusOr<SimReport> rerun = RunWorkload(Default(), alone);
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  ASSERT_EQ(rerun->runs_size(), 1);
  RunReport a = report->runs(1), b = rerun->runs(0);
  EXPECT_FALSE(a.passed());
  for (RunReport* r : {&a, &b}) {
    r->clear_eager_build_us_per_forward();
    r->clear_replay_us_per_forward();
  }
  EXPECT_EQ(a.DebugString(), b.DebugString());
}

// Past check_steps only the validator looks at a step's metadata (the attention check is off):
// the same fault must still fail the run, named by the validator's page-table cross-check.
TEST(SimulatorTest, TheValidatorCatchesAFaultPastTheAttentionChecks) {
  Workload w = OneScenario(/*page_table=*/true);
  w.set_check_steps(10);
  absl::StatusOr<SimReport> report = RunWorkload(w, FaultAtStep30());
  ASSERT_TRUE(report.ok());
  EXPECT_FALSE(report->passed());
  const RunReport& r = report->runs(0);
  EXPECT_EQ(r.steps(), 30);
  EXPECT_TRUE(absl::StartsWith(r.failure(), "step 30, ")) << r.failure();
  EXPECT_TRUE(absl::StrContains(r.failure(), "page_table")) << r.failure();
}

TEST(SimulatorTest, DumpAllWritesSnapshotsThatCheck) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmp, nullptr);
  SimOptions options;
  options.page_sizes = {7};
  options.max_steps = 12;
  options.dump_all = true;
  options.dump_dir = absl::StrCat(tmp, "/all");
  ASSERT_EQ(std::system(("mkdir -p " + options.dump_dir).c_str()), 0);
  absl::StatusOr<SimReport> report = RunWorkload(Default(), options);
  ASSERT_TRUE(report.ok());
  int files = 0;
  for (const RunReport& r : report->runs()) {
    for (const std::string& path : r.snapshots()) {
      absl::StatusOr<MetadataSnapshot> snap = SnapshotFromText(ReadFile(path));
      ASSERT_TRUE(snap.ok()) << path;
      EXPECT_TRUE(CheckSnapshot(*snap).ok()) << path << ": " << CheckSnapshot(*snap);
      ++files;
    }
  }
  EXPECT_GT(files, 12);
}

TEST(SimulatorTest, ReportAsJson) {
  SimOptions options;
  options.page_sizes = {64};
  options.max_steps = 3;
  absl::StatusOr<SimReport> report = RunWorkload(Default(), options);
  ASSERT_TRUE(report.ok());
  absl::StatusOr<std::string> json = ReportToJson(*report);
  ASSERT_TRUE(json.ok());
  EXPECT_TRUE(absl::StrContains(*json, "\"passed\": true"));
  EXPECT_TRUE(absl::StrContains(*json, "\"scenario\": \"eagle_topk4\""));
  EXPECT_TRUE(absl::StrContains(*json, "\"pages_high_water\""));
}

}  // namespace
}  // namespace attnmeta
