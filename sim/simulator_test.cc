#include "sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "attention/graph/host_device_memory.h"
#include "attention/graph/host_metadata_writer.h"
#include "attention/kernels/half_bits.h"
#include "attention/metadata/reference_attention.h"
#include "attention/metadata/snapshot.h"
#include "attention/metadata/split_kv_planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/replay_backend.h"
#include "sim/testing/replayed_forwards.h"
#include "sim/workload.h"

// sim/workloads/kernels.textproto (the kernels_workload_text genrule).
extern const char kAttnmetaKernelsWorkloadText[];

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
  ASSERT_EQ(report->runs_size(), Default().scenarios_size());  // one page size
  for (const RunReport& r : report->runs()) {
    EXPECT_EQ(r.steps(), 5);
    EXPECT_FALSE(r.finished());
  }
}

// The validator's page bound for one request and the simulator's allocations agree: a request
// alone runs to the end in the smallest pool the validator accepts, at every page size and
// draft shape, whether every draft is accepted (the longest rounds) or none (a round at every
// length). A bound short of the draft runs' pages (each branch page-aligned) accepted pools in
// which the request could never take its next round.
TEST(SimulatorTest, ARequestAloneRunsInTheSmallestPoolTheValidatorAccepts) {
  struct Shape {
    int32_t draft_tokens, topk, steps;
  };
  struct Lengths {
    int32_t prompt, output;
  };
  int runs = 0;
  for (const int64_t ps : {1, 7, 16, 64}) {
    for (const Shape shape : {Shape{8, 4, 2}, Shape{6, 2, 3}, Shape{4, 1, 3}}) {
      for (const Lengths len : {Lengths{16, 17}, Lengths{30, 5}, Lengths{5, 40}}) {
        for (const double probability : {0.0, 1.0}) {
          Workload w = Default();
          w.clear_page_sizes();
          w.add_page_sizes(ps);
          w.mutable_scenarios()->DeleteSubrange(0, 2);
          Scenario& sc = *w.mutable_scenarios(0);
          sc.mutable_backend()->mutable_speculative()->set_draft_tokens(shape.draft_tokens);
          sc.mutable_backend()->mutable_speculative()->set_topk(shape.topk);
          sc.mutable_backend()->mutable_speculative()->set_steps(shape.steps);
          sc.mutable_acceptance()->set_probability(probability);
          sc.set_max_running_requests(1);
          sc.mutable_requests()->DeleteSubrange(1, sc.requests_size() - 1);
          sc.mutable_requests(0)->set_arrival_step(0);
          sc.mutable_requests(0)->set_prompt_len(len.prompt);
          sc.mutable_requests(0)->set_output_len(len.output);
          const std::string where =
              absl::StrCat("page size ", ps, ", draft_tokens ", shape.draft_tokens, " topk ",
                           shape.topk, " steps ", shape.steps, ", prompt ", len.prompt, " output ",
                           len.output, ", acceptance ", probability);
          int64_t pages = 1;
          for (;; ++pages) {
            ASSERT_LE(pages, 64) << where;
            sc.set_kv_pool_tokens(pages * ps);
            if (ValidateWorkload(w).ok()) break;
          }
          SimOptions options;
          options.page_sizes = {ps};
          const absl::StatusOr<SimReport> report = RunWorkload(w, options);
          ASSERT_TRUE(report.ok()) << where << ": " << report.status();
          ASSERT_EQ(report->runs_size(), 1);
          EXPECT_TRUE(report->runs(0).passed())
              << where << ", pool of " << pages << " pages: " << report->runs(0).failure();
          EXPECT_TRUE(report->runs(0).finished()) << where;
          ++runs;
        }
      }
    }
  }
  EXPECT_EQ(runs, 72);
}

// A prefix group whose members' prompts differ, one as long as the shared prefix: each request
// shares at most its own prompt_len - 1 tokens in whole pages, so the second member takes fewer
// of the cached pages than were cached (short prompt second) or finds fewer cached than its own
// share (short prompt first). Both orders pass at every page size and hit the prefix: what was
// shared, counted per run, is the whole pages both can take.
TEST(SimulatorTest, PrefixGroupMembersWithDifferentPromptsShareWhatWasCached) {
  for (const bool short_first : {true, false}) {
    Workload w = Default();
    w.mutable_scenarios()->DeleteSubrange(1, w.scenarios_size() - 1);
    Scenario& sc = *w.mutable_scenarios(0);
    sc.mutable_requests()->Clear();
    const int32_t prompts[2] = {short_first ? 96 : 200, short_first ? 200 : 96};
    for (int i = 0; i < 2; ++i) {
      Request& r = *sc.add_requests();
      r.set_arrival_step(i == 0 ? 0 : 12);
      r.set_prompt_len(prompts[i]);
      r.set_output_len(i == 0 ? 40 : 8);
      r.set_prefix_group(1);
      r.set_shared_prefix_len(96);
    }
    ASSERT_TRUE(ValidateWorkload(w).ok()) << ValidateWorkload(w);
    const absl::StatusOr<SimReport> report = RunWorkload(w, SimOptions{});
    ASSERT_TRUE(report.ok()) << report.status();
    ASSERT_EQ(report->runs_size(), w.page_sizes_size());
    for (const RunReport& run : report->runs()) {
      SCOPED_TRACE(absl::StrCat(short_first ? "short prompt first" : "long prompt first",
                                ", page size ", run.page_size()));
      EXPECT_TRUE(run.passed()) << run.failure();
      EXPECT_TRUE(run.finished());
      // min(96, 96 - 1) = 95 tokens, in whole pages.
      EXPECT_EQ(run.prefix_hit_tokens(), 95 / run.page_size() * run.page_size());
    }
  }
}

// A host backend whose writer gives a variable-row draft-extend's padded rows after the first
// one query row each instead of the captured rows. Every array stays valid (the first padded
// row keeps max_q_len the captured rows; the tail of unclaimed rows only grows), so only the
// run's own count of that tail sees it.
class ShortPaddedRowsWriter : public HostMetadataWriter {
 public:
  absl::Status WriteBatchArrays(const MetadataWriteRequest& r, const GraphBuffers& b) override {
    if (absl::Status s = HostMetadataWriter::WriteBatchArrays(r, b); !s.ok()) return s;
    const auto real_q = r.host_q_lens.subspan(0, static_cast<size_t>(r.real_batch_size));
    const bool variable = std::any_of(real_q.begin(), real_q.end(),
                                      [&](TokenLength q) { return q < r.q_len_per_request; });
    if (r.mode != ForwardMode::kDraftExtend || !variable) return absl::OkStatus();
    for (int64_t i = r.real_batch_size + 1; i < r.padded_batch_size; ++i) {
      b.qo_indptr[i + 1] = b.qo_indptr[i] + TokenCount(1);
      ++corrupted;
    }
    return absl::OkStatus();
  }
  int64_t corrupted = 0;
};

class ShortPaddedRowsBackend : public ReplayBackend {
 public:
  DeviceMemory& memory() override { return memory_; }
  MetadataWriter& writer() override { return writer_; }
  absl::Status SyncReqToToken(const ReqToTokenPool&) override { return absl::OkStatus(); }
  absl::Status CheckAfterReplay() override { return memory_.VerifyCanaries(); }

 private:
  HostDeviceMemory memory_;
  ShortPaddedRowsWriter writer_;
};

TEST(SimulatorTest, PaddedDraftExtendRowsShortOfTheCapturedFailTheRun) {
  SimOptions options;
  options.scenario = "eagle_topk4";
  options.make_backend = [] { return std::make_unique<ShortPaddedRowsBackend>(); };
  // Buckets of 1 and 4 only: a batch of 2 replays with two padded rows.
  Workload w = Default();
  for (Scenario& sc : *w.mutable_scenarios()) {
    if (sc.name() != "eagle_topk4") continue;
    sc.mutable_backend()->clear_capture_batch_sizes();
    sc.mutable_backend()->add_capture_batch_sizes(1);
    sc.mutable_backend()->add_capture_batch_sizes(4);
  }
  SimOptions plain;
  plain.scenario = options.scenario;
  const absl::StatusOr<SimReport> clean = RunWorkload(w, plain);
  ASSERT_TRUE(clean.ok()) << clean.status();
  EXPECT_TRUE(clean->passed()) << "the host writer's own rows pass";
  const absl::StatusOr<SimReport> report = RunWorkload(w, options);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_GT(report->runs_size(), 0);
  for (const RunReport& run : report->runs()) {
    SCOPED_TRACE(absl::StrCat("page size ", run.page_size()));
    EXPECT_FALSE(run.passed());
    EXPECT_THAT(run.failure(), ::testing::HasSubstr("the real and padded rows add up to"));
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

// ---- A replay backend with attention "kernels" ----
// The GPU backend's attention kernels cannot run where no GPU is. This stand-in keeps the host
// backend's memory and writer and computes each path with the CPU reference attention over
// what the simulator hands it (the replayed metadata in its memory, the pools it was sent, the
// split plan in the graph's buffers), so that the simulator's side of the check is tested
// here: the values it sends, when it resends the pools, the inputs of each path, the bound.

struct KernelStandInLog {
  int64_t pool_syncs = 0;
  int64_t forwards = 0;
  int64_t split_forwards = 0;
  int64_t paged_split_forwards = 0;
  int64_t page_table_forwards = 0;
};

class ReferenceKernelsBackend : public ReplayBackend {
 public:
  // Every output is multiplied by `scale` (1: as computed), and the last query row of a forward
  // of 10 rows or more by `last_row_scale` too; `lse_offset` is added to the first lse value of
  // every forward; the path named `skip` is not returned, and the one named `no_lse` has no lse.
  ReferenceKernelsBackend(KernelStandInLog* log, float scale, float last_row_scale,
                          std::string skip, float lse_offset, std::string no_lse)
      : log_(log),
        scale_(scale),
        last_row_scale_(last_row_scale),
        skip_(std::move(skip)),
        lse_offset_(lse_offset),
        no_lse_(std::move(no_lse)) {}

  DeviceMemory& memory() override { return memory_; }
  MetadataWriter& writer() override { return writer_; }
  absl::Status SyncReqToToken(const ReqToTokenPool&) override { return absl::OkStatus(); }
  absl::Status CheckAfterReplay() override { return memory_.VerifyCanaries(); }
  bool AttendsReplays(const AttentionDims&) const override { return true; }

  absl::Status SyncKvPool(absl::Span<const float> k, absl::Span<const float> v) override {
    for (absl::Span<const float> pool : {k, v}) {
      for (float x : pool) {
        if (Bf16ToFloat(FloatToBf16(x)) != x) {
          return absl::InvalidArgumentError(
              absl::StrCat("pool value ", x, " is not a bf16 number"));
        }
      }
    }
    k_.assign(k.begin(), k.end());
    v_.assign(v.begin(), v.end());
    ++log_->pool_syncs;
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<ReplayAttentionOutput>> AttendReplay(
      const ReplayAttentionInputs& in) override {
    ++log_->forwards;
    for (float x : in.q) {
      if (Bf16ToFloat(FloatToBf16(x)) != x) {
        return absl::InvalidArgumentError(absl::StrCat("query value ", x, " is not a bf16 number"));
      }
    }
    std::vector<ReplayAttentionOutput> outputs;
    const ReferenceAttentionInputs ref{in.dims, in.metadata, in.page_size, in.q, k_, v_};
    const auto add = [&](const char* path, absl::Status s, std::vector<float> out,
                         std::vector<float> lse) -> absl::Status {
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
      if (path == skip_) return absl::OkStatus();
      for (float& x : out) x *= scale_;
      const size_t row = static_cast<size_t>(in.dims.num_q_heads) * in.dims.head_dim;
      if (out.size() >= 10 * row) {
        for (size_t e = out.size() - row; e < out.size(); ++e) out[e] *= last_row_scale_;
      }
      if (!lse.empty()) lse[0] += lse_offset_;
      if (path == no_lse_) lse.clear();
      outputs.push_back({path, std::move(out), std::move(lse)});
      return absl::OkStatus();
    };
    // NaN first: a path that wrote nothing must not pass on the values of the one before.
    std::vector<float> out(in.q.size(), NAN);
    std::vector<float> lse(in.q.size() / in.dims.head_dim, NAN);
    const absl::Status token_level =
        ReferenceAttentionTokenLevel(ref, absl::MakeSpan(out), absl::MakeSpan(lse));
    if (absl::Status s = add("token-level", token_level, out, lse); !s.ok()) return s;
    // The reference's split-KV merge keeps no lse: the split path reports the token-level one.
    const std::vector<float> token_level_lse = lse;
    if (in.metadata.page_table.rows() > 0) {
      ++log_->page_table_forwards;
      out.assign(out.size(), NAN);
      lse.assign(lse.size(), NAN);
      const absl::Status page_table =
          ReferenceAttentionPageTable(ref, absl::MakeSpan(out), absl::MakeSpan(lse));
      if (absl::Status s = add("page-table", page_table, out, lse); !s.ok()) return s;
    }
    if (in.split_kv.work_items > 0) {
      ++log_->split_forwards;
      if (in.split_layout.paged()) ++log_->paged_split_forwards;
      // The plan the replay wrote covers the whole bucket (in.padded); its items for the real
      // sequences, run over the real rows (the reference refuses the padding page).
      if (in.padded.batch_size() < in.metadata.batch_size()) {
        return absl::InvalidArgumentError("the padded view is smaller than the batch");
      }
      const int32_t bs = static_cast<int32_t>(in.metadata.batch_size());
      for (int64_t i = 0; i < in.split_kv.work_items; ++i) {
        if (in.split_buffers.work[i].sequence >= in.padded.batch_size()) {
          return absl::InvalidArgumentError("a plan item's sequence lies past the padded view");
        }
      }
      SplitKvPlan plan;
      plan.layout = in.split_layout;
      plan.chunk = in.split_kv.chunk;
      for (int64_t i = 0; i < in.split_kv.work_items; ++i) {
        if (in.split_buffers.work[i].sequence < bs) plan.work.push_back(in.split_buffers.work[i]);
      }
      for (int64_t i = 0; i < in.split_kv.reduce_items; ++i) {
        if (in.split_buffers.reduce[i].sequence < bs) {
          plan.reduce.push_back(in.split_buffers.reduce[i]);
        }
      }
      plan.num_partials = in.split_kv.num_partials;
      std::vector<float> split_out(in.q.size());
      const absl::Status s = ReferenceAttentionSplitKv(ref, plan, absl::MakeSpan(split_out));
      if (absl::Status a = add("split-KV", s, split_out, token_level_lse); !a.ok()) return a;
    }
    return outputs;
  }

 private:
  KernelStandInLog* log_;
  const float scale_;
  const float last_row_scale_;
  const std::string skip_;
  const float lse_offset_;
  const std::string no_lse_;
  HostDeviceMemory memory_;
  HostMetadataWriter writer_;
  std::vector<float> k_, v_;
};

Workload KernelsWorkload() {
  absl::StatusOr<Workload> w = ParseWorkload(kAttnmetaKernelsWorkloadText);
  EXPECT_TRUE(w.ok()) << w.status();
  return *w;
}

SimOptions WithKernelStandIn(KernelStandInLog* log, float scale, float last_row_scale = 1.0f,
                             std::string skip = "", float lse_offset = 0.0f,
                             std::string no_lse = "") {
  SimOptions options;
  options.page_sizes = {16};
  options.max_steps = 25;
  options.make_backend = [log, scale, last_row_scale, skip, lse_offset, no_lse] {
    return std::make_unique<ReferenceKernelsBackend>(log, scale, last_row_scale, skip, lse_offset,
                                                     no_lse);
  };
  return options;
}

// Every replayed forward of a checked step goes to the backend's kernels, with its token-level,
// page-table and (decode) split-KV inputs; the pools are resent only after K/V rows changed,
// as bf16 numbers, which every CPU path then reads too.
TEST(SimulatorTest, ABackendWithAttentionKernelsChecksEveryReplayedForward) {
  KernelStandInLog log;
  const Workload workload = KernelsWorkload();
  absl::StatusOr<SimReport> report = RunWorkload(workload, WithKernelStandIn(&log, 1.0f));
  ASSERT_TRUE(report.ok()) << report.status();
  std::cout << FormatReportTable(*report);
  EXPECT_TRUE(report->passed());
  int64_t checks = 0;
  for (const RunReport& r : report->runs()) {
    SCOPED_TRACE(r.scenario());
    EXPECT_TRUE(r.passed()) << r.failure();
    EXPECT_GT(r.device_attention_checks(), 0);
    EXPECT_LE(r.max_device_relative_error(), kMaxRelativeError);
    EXPECT_LE(r.max_relative_error(), kMaxRelativeError);
    // The reference's lse in float against dense attention's: the same loop, so equal but for
    // the order of the float additions.
    EXPECT_LE(r.max_device_lse_error(), 1e-6);
    EXPECT_EQ(r.device_attention_checks(), testing::ReplayedForwardsWithQueryRows(workload, r));
    EXPECT_EQ(r.replays_unsupported(), 0);
    EXPECT_THAT(testing::GraphModesNeverReplayed(r), ::testing::IsEmpty());
    checks += r.device_attention_checks();
  }
  EXPECT_EQ(log.forwards, checks);
  EXPECT_GT(log.paged_split_forwards, 0) << "no decode replay ran a paged split-KV plan";
  int64_t merges = 0;
  for (const RunReport& r : report->runs()) merges += r.device_split_merges();
  EXPECT_GT(merges, 0) << "no split-KV plan merged partials";
  EXPECT_LE(merges, log.split_forwards);
  EXPECT_GT(log.split_forwards, log.paged_split_forwards)
      << "no decode replay ran a linear split-KV plan";
  EXPECT_GT(log.page_table_forwards, 0);
  EXPECT_GT(log.pool_syncs, 3);
  EXPECT_LT(log.pool_syncs, log.forwards) << "the pools were resent without a K/V change";
}

// The bound: outputs off by 0.5% pass (about twice what bf16 kernels are off by estimate), by
// 2% fail, naming the path.
TEST(SimulatorTest, AttentionKernelsOffByMoreThanTheBoundFailTheRun) {
  KernelStandInLog log;
  SimOptions near = WithKernelStandIn(&log, 1.005f);
  near.scenario = "chat";
  absl::StatusOr<SimReport> close = RunWorkload(KernelsWorkload(), near);
  ASSERT_TRUE(close.ok()) << close.status();
  EXPECT_TRUE(close->passed()) << close->runs(0).failure();
  EXPECT_GT(close->runs(0).max_device_relative_error(), 4e-3);
  SimOptions off = WithKernelStandIn(&log, 1.02f);
  off.scenario = "chat";
  absl::StatusOr<SimReport> far = RunWorkload(KernelsWorkload(), off);
  ASSERT_TRUE(far.ok()) << far.status();
  ASSERT_FALSE(far->passed());
  EXPECT_TRUE(absl::StrContains(far->runs(0).failure(), "token-level attention kernel"))
      << far->runs(0).failure();
  EXPECT_TRUE(absl::StrContains(far->runs(0).failure(), "relative error 0.02"))
      << far->runs(0).failure();
}

// The lse bound: one lse value of every forward off by 1e-4 passes, by 0.05 fails (over 1e-3
// of 1 + |lse| while |lse| stays under 49), naming the row and head.
TEST(SimulatorTest, AttentionKernelsLseOffByMoreThanTheBoundFailsTheRun) {
  KernelStandInLog log;
  SimOptions near = WithKernelStandIn(&log, 1.0f, 1.0f, "", 1e-4f);
  near.scenario = "chat";
  absl::StatusOr<SimReport> close = RunWorkload(KernelsWorkload(), near);
  ASSERT_TRUE(close.ok()) << close.status();
  EXPECT_TRUE(close->passed()) << close->runs(0).failure();
  EXPECT_GT(close->runs(0).max_device_lse_error(), 0);
  // The table's `lse err` column, right of `kern err`, shows it.
  const std::string table = FormatReportTable(*close);
  EXPECT_TRUE(absl::StrContains(
      table, absl::StrFormat(" %9s %9s ",
                             absl::StrFormat("%.2e", close->runs(0).max_device_relative_error()),
                             absl::StrFormat("%.2e", close->runs(0).max_device_lse_error()))))
      << table;
  SimOptions off = WithKernelStandIn(&log, 1.0f, 1.0f, "", 0.05f);
  off.scenario = "chat";
  absl::StatusOr<SimReport> far = RunWorkload(KernelsWorkload(), off);
  ASSERT_TRUE(far.ok()) << far.status();
  ASSERT_FALSE(far->passed());
  EXPECT_TRUE(absl::StrContains(far->runs(0).failure(), "token-level attention kernel"))
      << far->runs(0).failure();
  EXPECT_TRUE(absl::StrContains(far->runs(0).failure(), "query row 0 head 0: lse"))
      << far->runs(0).failure();
}

// A path without its lse fails the run: nothing would be compared.
TEST(SimulatorTest, AnAttentionKernelPathWithoutItsLseFailsTheRun) {
  KernelStandInLog log;
  SimOptions options = WithKernelStandIn(&log, 1.0f, 1.0f, "", 0.0f, "page-table");
  options.scenario = "chat";
  absl::StatusOr<SimReport> report = RunWorkload(KernelsWorkload(), options);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_FALSE(report->passed());
  EXPECT_TRUE(absl::StrContains(report->runs(0).failure(), "page-table attention kernel"))
      << report->runs(0).failure();
  EXPECT_TRUE(absl::StrContains(report->runs(0).failure(), "0 lse values"))
      << report->runs(0).failure();
}

// A backend that leaves out a path the metadata offers fails the run: the page table's, and
// the split-KV plan's of a decode replay.
TEST(SimulatorTest, ABackendThatSkipsAPathFailsTheRun) {
  for (const char* path : {"page-table", "split-KV"}) {
    SCOPED_TRACE(path);
    KernelStandInLog log;
    SimOptions options = WithKernelStandIn(&log, 1.0f, 1.0f, path);
    options.scenario = "chat";
    absl::StatusOr<SimReport> report = RunWorkload(KernelsWorkload(), options);
    ASSERT_TRUE(report.ok()) << report.status();
    ASSERT_FALSE(report->passed());
    EXPECT_TRUE(absl::StrContains(report->runs(0).failure(), "the backend ran the paths"))
        << report->runs(0).failure();
  }
}

// The bound holds row by row: one row of a forward off by 3% fails the run, although over the
// forward's 10 rows or more the error is under 1e-2.
TEST(SimulatorTest, OneWrongQueryRowOfManyFailsTheRun) {
  KernelStandInLog log;
  SimOptions options = WithKernelStandIn(&log, 1.0f, 1.03f);
  options.scenario = "chat";
  absl::StatusOr<SimReport> report = RunWorkload(KernelsWorkload(), options);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_FALSE(report->passed());
  EXPECT_TRUE(absl::StrContains(report->runs(0).failure(), "attention kernel: "))
      << report->runs(0).failure();
  EXPECT_TRUE(absl::StrContains(report->runs(0).failure(), "relative error 0.03"))
      << report->runs(0).failure();
}

}  // namespace
}  // namespace attnmeta
