#include "attention/kernels/device_metadata_writer.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attention/graph/graph_state.h"
#include "attention/kernels/internal/device_queries.h"
#include "attention/kernels/internal/launch_checks.h"
#include "attention/kernels/metadata_kernels.h"
#include "attention/metadata/draft_decode_layout.h"
#include "attention/metadata/forward_mode.h"
#include "glog/logging.h"

namespace attnmeta {
namespace {

absl::Status Runtime(hipError_t err, absl::string_view what) {
  return internal::RuntimeStatus(err, absl::StrCat("device metadata writer: ", what));
}

// The graph layer stages padded rows as GraphState::kPaddedRow; the kernels recognise
// kernels::kPaddedRow.
static_assert(GraphState::kPaddedRow.value() == kernels::kPaddedRow);

// The first n entries of a buffer. REQUIRES: n <= s.size() (CheckWriteFitsBuffers).
template <typename T>
DeviceSpan<T> Device(absl::Span<T> s, size_t n) {
  CHECK_LE(n, s.size());
  return DeviceSpan<T>(s.data(), n);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceMetadataWriter>> DeviceMetadataWriter::Create(
    DeviceReqToToken req_to_token, TokenCount pool_slots, hipStream_t stream, Options options) {
  if (req_to_token.table.empty() || req_to_token.max_context_len.value() < 1) {
    return absl::InvalidArgumentError("device metadata writer: empty req_to_token");
  }
  // What every write's launchers check of the table and the pool, checked once here: a
  // writer that Create returns can write (a launcher's page size is checked per request).
  if (pool_slots.value() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("device metadata writer: a pool of ",
                                                   pool_slots.value(), " slots"));
  }
  if (absl::StatusOr<kernels::SlotSource> src = internal::CheckedSlotSource(
          req_to_token.table, req_to_token.max_context_len, pool_slots, *PageSize::Create(1));
      !src.ok()) {
    return src.status();
  }
  if (options.uploads != nullptr && options.uploads->stream() != stream) {
    return absl::InvalidArgumentError(
        "device metadata writer: the staged uploads are queued on another stream");
  }
  absl::StatusOr<DeviceViolationWord> violation = DeviceViolationWord::Create();
  if (!violation.ok()) return violation.status();
  if (options.uploads != nullptr) {
    if (absl::Status s = options.uploads->Attach(); !s.ok()) return s;
  }
  return std::unique_ptr<DeviceMetadataWriter>(new DeviceMetadataWriter(
      req_to_token, pool_slots, stream, options, *std::move(violation)));
}

DeviceMetadataWriter::~DeviceMetadataWriter() {
  // What is staged still lands, through an apply kernel of its own.
  if (options_.uploads != nullptr) (void)options_.uploads->Detach();
  DropGraphs();
}

void DeviceMetadataWriter::NoteLaunched() {
  if (options_.uploads != nullptr) options_.uploads->NoteApplyLaunched();
}

void DeviceMetadataWriter::DropGraphs() {
  for (Graph& g : graphs_) {
    (void)hipGraphExecDestroy(g.exec);
    (void)hipGraphDestroy(g.graph);
  }
  graphs_.clear();
}

absl::Status DeviceMetadataWriter::Launch(const MetadataWriteRequest& r, const GraphBuffers& b,
                                          bool direct) {
  if (absl::Status s = CheckWriteFitsBuffers(r, b, "device metadata writer"); !s.ok()) {
    return s;
  }
  const size_t padded = static_cast<size_t>(r.padded_batch_size);
  // Every launch's arguments are made and checked before anything is queued, so that a
  // request that fails changes nothing: not the violation word, not the staged uploads.
  std::vector<DraftStepDeviceArgs> draft_steps;
  DecodeMetadataDeviceArgs a;
  std::optional<SplitKvPlanDeviceArgs> plan;
  std::optional<TreeMaskDeviceArgs> mask;
  if (r.mode == ForwardMode::kDraftDecode) {
    // Every step's arrays over the padded batch's branches, from the staged committed lengths.
    const size_t branches = padded * static_cast<size_t>(r.draft_decode.topk);
    for (int32_t step = 0; step < r.draft_decode.steps; ++step) {
      const DraftStepBuffers& d = b.draft_steps[step];
      DraftStepDeviceArgs s;
      s.req_to_token = req_to_token_;
      s.pool_slots = pool_slots_;
      s.page_size = r.page_size;
      s.rows = Device<const ReqPoolIndex>(b.req_rows, padded);
      s.seq_lens = Device<const TokenLength>(b.kv_lens, padded);
      s.shape = r.draft_decode;
      s.step = step;
      s.kv_lens = Device(d.kv_lens, branches);
      s.kv_indptr = Device(d.kv_indptr, branches + 1);
      s.qo_indptr = Device(b.draft_qo_indptr, branches + 1);
      s.kv_last_page_len = Device(d.kv_last_page_len, branches);
      s.kv_indices = Device(d.kv_indices, d.kv_indices.size());
      s.overlap_preceding_kernel = options_.overlap_launches;
      if (absl::Status st = DraftStepParamsFor(s, nullptr).status(); !st.ok()) return st;
      draft_steps.push_back(s);
    }
  } else {
    a.req_to_token = req_to_token_;
    a.pool_slots = pool_slots_;
    a.page_size = r.page_size;
    a.rows = Device<const ReqPoolIndex>(b.req_rows, padded);
    a.kv_lens = Device<const TokenLength>(b.kv_lens, padded);
    a.q_lens = Device<const TokenLength>(b.q_lens, padded);
    a.kv_indptr = Device(b.kv_indptr, padded + 1);
    a.qo_indptr = Device(b.qo_indptr, padded + 1);
    a.kv_last_page_len = Device(b.kv_last_page_len, padded);
    a.kv_indices = Device(b.kv_indices, b.kv_indices.size());
    if (r.page_table) {
      a.page_table =
          DeviceSpan<PageId>(b.page_table.entries().data(), b.page_table.entries().size());
      a.page_table_cols = b.page_table.cols();
    }
    // The grid covers the longest row req_to_token holds, so that one capture serves any batch.
    a.max_kv_len = req_to_token_.max_context_len;
    a.overlap_preceding_kernel = options_.overlap_launches;
    if (absl::Status s = FusedMetadataParamsFor(a, nullptr).status(); !s.ok()) return s;
    if (r.split_kv) {
      plan.emplace();
      plan->qo_indptr = Device<const TokenOffset>(b.qo_indptr, padded + 1);
      plan->kv_indptr = Device<const TokenOffset>(b.kv_indptr, padded + 1);
      plan->options = r.split_kv_options;
      plan->work = Device(b.split_kv.work, b.split_kv.work.size());
      plan->unit_indptr = Device(b.split_kv.unit_indptr, b.split_kv.unit_indptr.size());
      plan->reduce = Device(b.split_kv.reduce, b.split_kv.reduce.size());
      plan->overlap_preceding_kernel = options_.overlap_launches;
      if (absl::Status s = SplitKvPlanParamsFor(*plan, nullptr).status(); !s.ok()) return s;
    }
    if (r.mask_layout != MaskLayout::kNone) {
      mask.emplace();
      mask->rows = a.rows;
      mask->q_lens = a.q_lens;
      mask->kv_lens = a.kv_lens;
      mask->tree = DeviceSpan<const uint8_t>(b.tree_mask.data(), b.tree_mask.size());
      mask->mask_indptr = Device(b.mask_indptr, padded + 1);
      mask->mask = Device(b.custom_mask, b.custom_mask.size());
      mask->max_mask_bytes_per_row = std::max<int64_t>(
          1, int64_t{r.q_len_per_request.value()} * req_to_token_.max_context_len.value());
      mask->overlap_preceding_kernel = options_.overlap_launches;
      if (absl::Status s = TreeMaskParamsFor(*mask, nullptr).status(); !s.ok()) return s;
    }
  }
  if (options_.uploads != nullptr) {
    // The apply kernel clears the violation word too: one node fewer in the graph.
    if (absl::Status s = options_.uploads->EnqueueApply(violation_.device(),
                                                        sizeof(kernels::DeviceViolation));
        !s.ok()) {
      return s;
    }
    if (direct) NoteLaunched();
  } else if (absl::Status s = violation_.Reset(stream_); !s.ok()) {
    return s;
  }
  // Checked above: what fails from here on is the runtime (Internal).
  for (const DraftStepDeviceArgs& s : draft_steps) {
    if (absl::Status st = BuildDraftStepOnDevice(s, violation_.device(), stream_); !st.ok()) {
      return st;
    }
  }
  if (r.mode == ForwardMode::kDraftDecode) return absl::OkStatus();
  if (absl::Status s = BuildDecodeMetadataOnDevice(a, violation_.device(), stream_); !s.ok()) {
    return s;
  }
  if (plan.has_value()) {
    if (absl::Status s = BuildSplitKvPlanOnDevice(*plan, violation_.device(), stream_); !s.ok()) {
      return s;
    }
  }
  if (!mask.has_value()) return absl::OkStatus();
  return BuildTreeMaskOnDevice(*mask, violation_.device(), stream_);
}

absl::Status DeviceMetadataWriter::CheckSupported(const MetadataWriteRequest& r) const {
  if (r.mask_layout != MaskLayout::kNone && r.mask_layout != MaskLayout::kFull) {
    return absl::UnimplementedError("device metadata writer: only the FULL mask layout");
  }
  if (r.split_kv && r.mode == ForwardMode::kDraftDecode) {
    return absl::InvalidArgumentError(
        "device metadata writer: draft-decode has no split-KV plan (its steps are decodes of "
        "the branches)");
  }
  const size_t padded = static_cast<size_t>(r.padded_batch_size);
  if (r.split_kv && (r.host_kv_lens.size() != padded || r.host_q_lens.size() != padded)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device metadata writer: the split-KV counts need the host's lengths of the ", padded,
        " padded rows, got ", r.host_kv_lens.size(), " and ", r.host_q_lens.size()));
  }
  return absl::OkStatus();
}

int64_t DeviceMetadataWriter::max_write_rows() const { return kernels::kMaxMetadataRows; }

absl::Status DeviceMetadataWriter::WriteBatchArrays(const MetadataWriteRequest& r,
                                                    const GraphBuffers& b) {
  // Until this write succeeds, WriteTokenArrays has no counts to report.
  split_kv_counts_.reset();
  if (absl::Status s = CheckSupported(r); !s.ok()) return s;
  // The split-KV plan's counts (reported by WriteTokenArrays) follow from the host's lengths:
  // counted before anything is queued, so that lengths the planner refuses change nothing.
  SplitKvPlanCounts counts;
  if (r.split_kv) {
    absl::StatusOr<SplitKvPlanCounts> c =
        CountSplitKvPlan(r.host_q_lens, r.host_kv_lens, r.split_kv_options);
    if (!c.ok()) return c.status();
    counts = *c;
  }
  absl::Status written = options_.use_graphs ? LaunchGraph(r, b) : Launch(r, b, /*direct=*/true);
  if (written.ok()) split_kv_counts_ = counts;
  return written;
}

absl::Status DeviceMetadataWriter::LaunchGraph(const MetadataWriteRequest& r,
                                               const GraphBuffers& b) {
  // Graphs of an older generation read buffers that have moved: they are never launched, and
  // are dropped once a graph of the new generation is captured (a write that fails keeps
  // them, and the writer as it was).
  auto it = std::find_if(graphs_.begin(), graphs_.end(), [&](const Graph& g) {
    return g.generation == r.generation && g.bucket == r.padded_batch_size && g.mode == r.mode;
  });
  if (it == graphs_.end()) {
    Graph g{r.generation, r.padded_batch_size, r.mode, CapturedWriteOf(r, b), nullptr, nullptr};
    if (absl::Status s = Runtime(hipStreamBeginCapture(stream_, hipStreamCaptureModeThreadLocal),
                                 "begin capture");
        !s.ok()) {
      return s;
    }
    const absl::Status launched = Launch(r, b, /*direct=*/false);
    const absl::Status ended = Runtime(hipStreamEndCapture(stream_, &g.graph), "end capture");
    if (!launched.ok()) {
      if (g.graph != nullptr) (void)hipGraphDestroy(g.graph);
      return launched;
    }
    if (!ended.ok()) {
      if (g.graph != nullptr) (void)hipGraphDestroy(g.graph);
      return ended;
    }
    if (absl::Status s = Runtime(hipGraphInstantiate(&g.exec, g.graph, nullptr, nullptr, 0),
                                 "instantiate");
        !s.ok()) {
      (void)hipGraphDestroy(g.graph);
      return s;
    }
    if (r.generation != generation_) {
      DropGraphs();
      generation_ = r.generation;
    }
    graphs_.push_back(g);
    ++graphs_captured_;
    it = graphs_.end() - 1;
  } else if (const absl::string_view differs = FirstDifference(it->recorded, r, b);
             !differs.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device metadata writer: the ", differs, " differs from the write captured ",
                     "for (generation ", r.generation, ", bucket ", r.padded_batch_size, ", mode ",
                     ForwardModeName(r.mode), "), which its graph relaunches as it was"));
  }
  if (absl::Status s = Runtime(hipGraphLaunch(it->exec, stream_), "graph launch"); !s.ok()) {
    return s;
  }
  NoteLaunched();
  return absl::OkStatus();
}

absl::Status DeviceMetadataWriter::WriteTokenArrays(const MetadataWriteRequest& r,
                                                    const GraphBuffers&,
                                                    SplitKvPlanCounts* split_kv_counts) {
  // Everything was queued by WriteBatchArrays, which also counted the split-KV plan.
  if (!split_kv_counts_.has_value()) {
    return absl::FailedPreconditionError(
        "device metadata writer: token arrays without a successful WriteBatchArrays before");
  }
  if (split_kv_counts != nullptr) {
    *split_kv_counts = r.split_kv ? *split_kv_counts_ : SplitKvPlanCounts{};
  }
  return absl::OkStatus();
}

absl::Status DeviceMetadataWriter::CheckViolations() { return violation_.Check(stream_); }

}  // namespace attnmeta
