// attnmeta_sim: runs a serving workload through the whole stack on the CPU and checks every
// step (sim/simulator.h); prints a report table and exits 0 only when every run passed.
//
//   attnmeta_sim [--workload=FILE] [--backend=cpu|gpu] [--scenario=NAME]
//                [--page_sizes=1,16,...] [--steps=N] [--seed=N] [--dump_dir=DIR [--dump_all]]
//                [--report=FILE.json] [--quiet]
//
// Without --workload it runs the default workload compiled into it (the same text ships as
// sim/default_workload.textproto). --backend=gpu (a build with --config=cuda or rocm, on a
// machine with a GPU) replays the graphs with the device metadata kernels instead of the host
// writer; the checks are the same. Exit codes: 0 PASS, 1 FAIL (the report names the first
// failure of each failing run, and --dump_dir holds a MetadataSnapshot of the failing forward,
// which `metadata_check` replays), 2 for a bad flag, workload or option, an unwritable --report
// or --dump_dir, or a backend that cannot start (nothing is run; the backend is found after the
// progress line), 3 when the host runs out of memory. --page_sizes replaces the workload's page
// sizes before the workload is checked.
//
// --inject_fault=STEP is for tests: it corrupts the metadata of the first forward of that
// step in every run, as a builder bug would, so that the run must fail.
//
// Under `bazel run`, relative paths are taken from the directory the command was run in.

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "sim/simulator.h"
#include "sim/workload.h"

namespace {

constexpr char kUsage[] =
    "usage: attnmeta_sim [--workload=FILE] [--backend=cpu|gpu] [--scenario=NAME]\n"
    "                    [--page_sizes=1,16,...] [--steps=N] [--seed=N]\n"
    "                    [--dump_dir=DIR [--dump_all]] [--report=FILE.json] [--quiet]\n";

std::string Resolve(const std::string& path) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || cwd == nullptr) return path;
  return std::string(cwd) + "/" + path;
}

int UsageError(const std::string& message) {
  std::fprintf(stderr, "attnmeta_sim: %s\n%s", message.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  attnmeta::SimOptions options;
  std::string workload_file, report_file;
  bool quiet = false;
  int64_t fault_step = -1;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    const size_t eq = arg.find('=');
    const absl::string_view name = arg.substr(0, eq);
    const bool has_value = eq != absl::string_view::npos;
    const std::string value = has_value ? std::string(arg.substr(eq + 1)) : "";
    const auto need_value = [&]() { return has_value && !value.empty(); };
    if (name == "--help" || name == "-h") {
      std::printf("%s", kUsage);
      return 0;
    } else if (name == "--backend" && need_value()) {
      options.backend = value;
    } else if (name == "--workload" && need_value()) {
      workload_file = Resolve(value);
    } else if (name == "--scenario" && need_value()) {
      options.scenario = value;
    } else if (name == "--page_sizes" && need_value()) {
      for (absl::string_view p : absl::StrSplit(value, ',')) {
        int64_t ps;
        if (!absl::SimpleAtoi(p, &ps)) return UsageError("--page_sizes: \"" + value + "\" is not a list of integers");
        options.page_sizes.push_back(ps);
      }
    } else if (name == "--steps" && need_value()) {
      if (!absl::SimpleAtoi(value, &options.max_steps) || options.max_steps < 1) {
        return UsageError("--steps: \"" + value + "\" is not a positive integer");
      }
    } else if (name == "--seed" && need_value()) {
      uint64_t seed;
      if (!absl::SimpleAtoi(value, &seed)) return UsageError("--seed: \"" + value + "\" is not an integer");
      options.seed = seed;
    } else if (name == "--dump_dir" && need_value()) {
      options.dump_dir = Resolve(value);
    } else if (name == "--dump_all" && !has_value) {
      options.dump_all = true;
    } else if (name == "--report" && need_value()) {
      report_file = Resolve(value);
    } else if (name == "--quiet" && !has_value) {
      quiet = true;
    } else if (name == "--inject_fault" && need_value()) {
      if (!absl::SimpleAtoi(value, &fault_step) || fault_step < 0) {
        return UsageError("--inject_fault: \"" + value + "\" is not a step");
      }
      options.inject_fault_step = fault_step;
    } else {
      return UsageError("unknown flag or missing value: " + std::string(arg));
    }
  }

  std::string text(attnmeta::DefaultWorkloadText());
  if (!workload_file.empty()) {
    std::ifstream in(workload_file);
    if (!in) return UsageError("--workload: cannot read " + workload_file);
    std::stringstream buffer;
    buffer << in.rdbuf();
    text = buffer.str();
  }
  const std::string source = workload_file.empty() ? "the default workload" : workload_file;
  absl::StatusOr<attnmeta::Workload> parsed = attnmeta::ParseWorkloadText(text);
  if (!parsed.ok()) return UsageError(source + ": " + std::string(parsed.status().message()));
  // Validated with the flags' page sizes, which replace the file's.
  absl::StatusOr<attnmeta::Workload> workload = attnmeta::PrepareWorkload(*parsed, options);
  if (!workload.ok()) return UsageError(source + ": " + std::string(workload.status().message()));
  if (!options.dump_dir.empty()) {
    std::ofstream probe(options.dump_dir + "/.attnmeta_sim_probe");
    if (!probe) return UsageError("--dump_dir: cannot write to " + options.dump_dir);
    probe.close();
    std::remove((options.dump_dir + "/.attnmeta_sim_probe").c_str());
  }
  // Found now, not after the runs: opened for appending, so nothing is truncated, and a file
  // made only by the probe is removed again.
  if (!report_file.empty()) {
    const bool existed = static_cast<bool>(std::ifstream(report_file));
    if (!std::ofstream(report_file, std::ios::app)) {
      return UsageError("--report: cannot write to " + report_file);
    }
    if (!existed) std::remove(report_file.c_str());
  }
  if (!quiet) {
    options.progress = &std::cerr;
    std::fprintf(stderr, "attnmeta_sim: workload \"%s\" (%s), %d scenarios\n",
                 workload->name().c_str(),
                 workload_file.empty() ? "compiled in: sim/default_workload.textproto"
                                       : workload_file.c_str(),
                 workload->scenarios_size());
  }
  absl::StatusOr<attnmeta::SimReport> report;
  try {
    report = attnmeta::RunWorkload(*workload, options);
  } catch (const std::bad_alloc&) {
    // The workload's limits keep a run under kMaxSimulatedBytes; this host has less free.
    std::fprintf(stderr, "attnmeta_sim: out of host memory (a run holds up to %lld bytes)\n",
                 static_cast<long long>(attnmeta::kMaxSimulatedBytes));
    return 3;
  }
  if (!report.ok()) return UsageError(std::string(report.status().message()));
  std::printf("%s", attnmeta::FormatReportTable(*report).c_str());
  if (!report_file.empty()) {
    absl::StatusOr<std::string> json = attnmeta::ReportToJson(*report);
    std::ofstream out(report_file, std::ios::trunc);
    if (json.ok()) out << *json;
    out.close();
    if (!json.ok() || !out) {
      std::fprintf(stderr, "attnmeta_sim: cannot write the report to %s\n", report_file.c_str());
      return 1;
    }
  }
  return report->passed() ? 0 : 1;
}
