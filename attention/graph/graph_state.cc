#include "attention/graph/graph_state.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attention/metadata/lengths.h"

namespace attnmeta {
namespace {

// Generations are unique in the process, so that a handle captured by one GraphState never
// replays on another.
uint64_t NextGeneration() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

template <typename T>
absl::Span<T> Typed(DeviceBuffer b) {
  return absl::Span<T>(static_cast<T*>(b.ptr), static_cast<size_t>(b.bytes) / sizeof(T));
}

}  // namespace

GraphState::GraphState(const BackendConfig& config, const ReqToTokenPool* req_to_token,
                       PageSize page_size, DeviceMemory* memory, MetadataWriter* writer)
    : config_(config),
      req_to_token_(req_to_token),
      page_size_(page_size),
      memory_(memory),
      writer_(writer),
      generation_(NextGeneration()) {}

GraphState::~GraphState() { FreeAll(allocated_); }

absl::StatusOr<std::unique_ptr<GraphState>> GraphState::Create(const BackendConfig& config,
                                                               const ReqToTokenPool* req_to_token,
                                                               PageSize pool_page_size,
                                                               DeviceMemory* memory,
                                                               MetadataWriter* writer) {
  if (absl::Status s = ValidateBackendConfig(config); !s.ok()) return s;
  if (req_to_token == nullptr || memory == nullptr || writer == nullptr) {
    return absl::InvalidArgumentError("graph state: req_to_token, memory and writer are required");
  }
  if (config.page_size() != pool_page_size.tokens()) {
    return absl::FailedPreconditionError(absl::StrCat("page_size: the config says ",
                                                      config.page_size(), ", the KV pool uses ",
                                                      pool_page_size.tokens()));
  }
  const int64_t row = config.max_context_len() + config.speculative().draft_tokens();
  if (req_to_token->max_context_len().value() < row) {
    return absl::FailedPreconditionError(absl::StrCat(
        "max_context_len: req_to_token rows hold ", req_to_token->max_context_len().value(),
        " positions, the config needs ", row, " (max_context_len + draft_tokens)"));
  }
  absl::StatusOr<BufferPlan> plan = ComputeBufferPlan(config, config.max_batch_size());
  if (!plan.ok()) return plan.status();
  std::unique_ptr<GraphState> state(
      new GraphState(config, req_to_token, pool_page_size, memory, writer));
  std::vector<DeviceBuffer> buffers;
  if (absl::Status s = state->AllocateAll(*plan, buffers); !s.ok()) return s;
  state->plan_ = *std::move(plan);
  state->allocated_ = std::move(buffers);
  state->BuildViews();
  return state;
}

absl::Status GraphState::AllocateAll(const BufferPlan& plan, std::vector<DeviceBuffer>& out) {
  std::vector<DeviceBuffer> buffers;
  for (const BufferSpec& spec : plan.buffers) {
    absl::StatusOr<DeviceBuffer> b = memory_->Allocate(spec.name, spec.bytes);
    if (!b.ok()) {
      FreeAll(buffers);
      return b.status();
    }
    buffers.push_back(*b);
  }
  out = std::move(buffers);
  return absl::OkStatus();
}

void GraphState::FreeAll(std::vector<DeviceBuffer>& buffers) {
  for (DeviceBuffer b : buffers) memory_->Free(b);
  buffers.clear();
}

DeviceBuffer GraphState::buffer(absl::string_view name) const {
  for (size_t i = 0; i < plan_.buffers.size(); ++i) {
    if (plan_.buffers[i].name == name) return allocated_[i];
  }
  return DeviceBuffer{};
}

void GraphState::BuildViews() {
  namespace gb = graph_buffer;
  GraphBuffers v;
  v.req_rows = Typed<ReqPoolIndex>(buffer(gb::kReqRows));
  v.kv_lens = Typed<TokenLength>(buffer(gb::kKvLens));
  v.q_lens = Typed<TokenLength>(buffer(gb::kQLens));
  v.kv_indptr = Typed<TokenOffset>(buffer(gb::kKvIndptr));
  v.qo_indptr = Typed<TokenOffset>(buffer(gb::kQoIndptr));
  v.kv_last_page_len = Typed<TokenLength>(buffer(gb::kKvLastPageLen));
  v.kv_indices = Typed<TokenSlot>(buffer(gb::kKvIndices));
  if (plan_.page_table_cols > 0) {
    v.page_table = *PageTableSpan<PageId>::Create(Typed<PageId>(buffer(gb::kPageTable)),
                                                  plan_.batch_capacity, plan_.page_table_cols);
  }
  v.split_kv = SplitKvPlanSpans{Typed<SplitKvWorkItem>(buffer(gb::kSplitKvWork)),
                                Typed<int32_t>(buffer(gb::kSplitKvUnitIndptr)),
                                Typed<SplitKvReduceItem>(buffer(gb::kSplitKvReduce))};
  views_ = v;
  rows_buffer_ = buffer(gb::kReqRows);
  kv_lens_buffer_ = buffer(gb::kKvLens);
  q_lens_buffer_ = buffer(gb::kQLens);
  staged_rows_.assign(plan_.batch_capacity, kPaddedRow);
  staged_kv_lens_.assign(plan_.batch_capacity, kPaddedKvLen);
  staged_q_lens_.assign(plan_.batch_capacity, TokenLength(0));
}

absl::Status GraphState::Reserve(int64_t batch_capacity) {
  if (batch_capacity < 1) {
    return absl::InvalidArgumentError(absl::StrCat("Reserve(", batch_capacity, "): need >= 1"));
  }
  if (batch_capacity <= plan_.batch_capacity) return absl::OkStatus();
  absl::StatusOr<BufferPlan> plan = ComputeBufferPlan(config_, batch_capacity);
  if (!plan.ok()) return plan.status();
  std::vector<DeviceBuffer> buffers;
  if (absl::Status s = AllocateAll(*plan, buffers); !s.ok()) return s;
  FreeAll(allocated_);
  plan_ = *std::move(plan);
  allocated_ = std::move(buffers);
  BuildViews();
  generation_ = NextGeneration();
  return absl::OkStatus();
}

absl::Status GraphState::CheckShape(int64_t bucket, ForwardMode mode, TokenLength q) const {
  if (bucket < 1) return absl::InvalidArgumentError(absl::StrCat("bucket ", bucket, " < 1"));
  switch (mode) {
    case ForwardMode::kDecode:
      if (q != TokenLength(1)) {
        return absl::InvalidArgumentError(
            absl::StrCat("decode has one query row per request, not ", q.value()));
      }
      break;
    case ForwardMode::kIdle:
      if (q != TokenLength(0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("idle has no query rows, not ", q.value(), " per request"));
      }
      break;
    case ForwardMode::kExtend:
      if (q.value() < 1 || q.value() > MaxQueryRowsPerRequest(config_)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "extend capture needs 1 to max_query_rows_per_request = ",
            MaxQueryRowsPerRequest(config_), " query rows per request, got ", q.value()));
      }
      break;
    case ForwardMode::kMixed:
      return absl::InvalidArgumentError(
          "mixed batches have no fixed shape to capture; run them eagerly");
    default:
      return absl::UnimplementedError(absl::StrCat("mode ", ForwardModeName(mode),
                                                   " has no graph support yet"));
  }
  if (bucket > plan_.batch_capacity) {
    return absl::FailedPreconditionError(absl::StrCat("bucket ", bucket,
                                                      " exceeds the batch capacity ",
                                                      plan_.batch_capacity, ": Reserve first"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CaptureHandle> GraphState::Capture(int64_t bucket, ForwardMode mode,
                                                  std::optional<TokenLength> q_len_per_request) {
  if (mode == ForwardMode::kExtend && !q_len_per_request.has_value()) {
    return absl::InvalidArgumentError("extend capture needs its query rows per request");
  }
  const TokenLength q = q_len_per_request.value_or(
      mode == ForwardMode::kIdle ? TokenLength(0) : TokenLength(1));
  if (absl::Status s = CheckShape(bucket, mode, q); !s.ok()) return s;
  // Every per-batch buffer must hold the padded batch (DESIGN.md section 3, row 4: buffers
  // not regrown for a padded capture batch).
  namespace gb = graph_buffer;
  const std::pair<absl::string_view, size_t> per_batch[] = {
      {gb::kReqRows, views_.req_rows.size()},
      {gb::kKvLens, views_.kv_lens.size()},
      {gb::kQLens, views_.q_lens.size()},
      {gb::kKvLastPageLen, views_.kv_last_page_len.size()},
      {gb::kKvIndptr, views_.kv_indptr.size() - 1},
      {gb::kQoIndptr, views_.qo_indptr.size() - 1},
  };
  for (const auto& [name, rows] : per_batch) {
    if (static_cast<int64_t>(rows) < bucket) {
      return absl::ResourceExhaustedError(absl::StrCat(
          name, ": holds ", rows, " requests, the padded batch has ", bucket));
    }
  }
  if (config_.consumers().page_table() && views_.page_table.rows() < bucket) {
    return absl::ResourceExhaustedError(absl::StrCat(gb::kPageTable, ": holds ",
                                                     views_.page_table.rows(),
                                                     " rows, the padded batch has ", bucket));
  }
  const CaptureHandle handle{bucket, mode, q, generation_};
  absl::StatusOr<SplitKvPlanCounts> written = Write(handle, ReplayBatch{});
  if (!written.ok()) return written.status();
  return handle;
}

absl::StatusOr<ReplayResult> GraphState::Replay(const CaptureHandle& h, const ReplayBatch& batch) {
  namespace gb = graph_buffer;
  if (h.generation != generation_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the graph was captured with buffer generation ", h.generation, "; Reserve moved the "
        "buffers since (generation ", generation_, "): capture it again"));
  }
  if (absl::Status s = CheckShape(h.bucket, h.mode, h.q_len_per_request); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("replay handle: ", s.message()));
  }
  const int64_t bs = static_cast<int64_t>(batch.req_rows.size());
  if (batch.kv_lens.size() != batch.req_rows.size()) {
    return absl::InvalidArgumentError(absl::StrCat("replay batch: ", bs, " rows but ",
                                                   batch.kv_lens.size(), " kv_lens"));
  }
  if (bs > h.bucket) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replay batch of ", bs, " requests does not fit the captured bucket of ", h.bucket));
  }
  if ((h.mode == ForwardMode::kIdle) != (bs == 0)) {
    return absl::InvalidArgumentError(absl::StrCat("a ", ForwardModeName(h.mode), " graph replayed with ",
                                                   bs, " requests: only idle graphs run empty batches"));
  }
  const int64_t q = h.q_len_per_request.value();
  const int64_t limit = config_.max_context_len() + config_.speculative().draft_tokens();
  int64_t total = 0;
  int64_t longest = 0;
  for (int64_t i = 0; i < bs; ++i) {
    const int64_t kv = batch.kv_lens[i].value();
    if (kv < q) {
      return absl::InvalidArgumentError(absl::StrCat("kv_lens[", i, "] = ", kv, " is below the ",
                                                     q, " query rows per request"));
    }
    if (kv > limit) {
      return absl::OutOfRangeError(absl::StrCat("kv_lens[", i, "] = ", kv,
                                                " beyond max_context_len + draft_tokens = ", limit));
    }
    if (absl::Status s = req_to_token_->Read(batch.req_rows[i], TokenCount(0), TokenCount(kv)).status();
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("request ", i, ": ", s.message()));
    }
    total += kv;
    longest = std::max(longest, kv);
  }
  total += (h.bucket - bs) * kPaddedKvLen.value();
  // The capacity checks below cannot fail for a correct plan (rows are at most
  // max_context_len + draft_tokens, buckets at most the capacity); they turn a plan that
  // sized a buffer wrong (DESIGN.md section 3, rows 1, 6, 7) into an error before any write.
  const int64_t kv_capacity = static_cast<int64_t>(views_.kv_indices.size());
  if (total > kv_capacity) {
    return absl::ResourceExhaustedError(absl::StrCat(gb::kKvIndices, ": the padded batch needs ",
                                                     total, " slots, capacity ", kv_capacity));
  }
  const bool page_table = config_.consumers().page_table();
  const int64_t pages = PagesForTokensCeil(TokenCount(longest), page_size_).value();
  if (page_table && pages > views_.page_table.cols()) {
    return absl::ResourceExhaustedError(absl::StrCat(gb::kPageTable, ": a row needs ", pages,
                                                     " pages, capacity ",
                                                     views_.page_table.cols(), " columns"));
  }
  if (config_.consumers().split_kv().enabled()) {
    const int64_t q_tile = config_.consumers().split_kv().q_tile();
    const SplitKvCapacity need = SplitKvCapacityFor(bs * ((q + q_tile - 1) / q_tile),
                                                    config_.consumers().split_kv().num_units());
    if (need.work_items > static_cast<int64_t>(views_.split_kv.work.size())) {
      return absl::ResourceExhaustedError(absl::StrCat(
          gb::kSplitKvWork, ": the batch can need ", need.work_items, " work items, capacity ",
          views_.split_kv.work.size()));
    }
  }
  absl::StatusOr<SplitKvPlanCounts> counts = Write(h, batch);
  if (!counts.ok()) return counts.status();

  ReplayResult r;
  ForwardMetadataView& v = r.metadata;
  v.mode = h.mode;
  v.kv_indptr = views_.kv_indptr.subspan(0, bs + 1);
  v.kv_indices = views_.kv_indices.subspan(0, total - (h.bucket - bs) * kPaddedKvLen.value());
  v.qo_indptr = views_.qo_indptr.subspan(0, bs + 1);
  v.kv_lens = views_.kv_lens.subspan(0, bs);
  v.kv_last_page_len = views_.kv_last_page_len.subspan(0, bs);
  if (page_table) {
    v.page_table = *PageTableSpan<const PageId>::Create(views_.page_table.entries(), bs,
                                                        views_.page_table.cols());
  }
  v.max_q_len = TokenCount(bs > 0 ? q : 0);
  v.max_kv_len = MaxLength(batch.kv_lens);
  r.split_kv = *counts;
  return r;
}

absl::StatusOr<SplitKvPlanCounts> GraphState::Write(const CaptureHandle& h,
                                                    const ReplayBatch& batch) {
  const size_t bs = batch.req_rows.size();
  const size_t padded = static_cast<size_t>(h.bucket);
  std::copy(batch.req_rows.begin(), batch.req_rows.end(), staged_rows_.begin());
  std::fill(staged_rows_.begin() + bs, staged_rows_.begin() + padded, kPaddedRow);
  std::copy(batch.kv_lens.begin(), batch.kv_lens.end(), staged_kv_lens_.begin());
  std::fill(staged_kv_lens_.begin() + bs, staged_kv_lens_.begin() + padded, kPaddedKvLen);
  std::fill(staged_q_lens_.begin(), staged_q_lens_.begin() + bs, h.q_len_per_request);
  std::fill(staged_q_lens_.begin() + bs, staged_q_lens_.begin() + padded, TokenLength(0));
  const int64_t bytes = static_cast<int64_t>(padded * sizeof(int32_t));
  for (auto [dst, src] : {std::pair<DeviceBuffer, const void*>{rows_buffer_, staged_rows_.data()},
                          {kv_lens_buffer_, staged_kv_lens_.data()},
                          {q_lens_buffer_, staged_q_lens_.data()}}) {
    if (absl::Status s = memory_->CopyToDevice(dst, 0, src, bytes); !s.ok()) return s;
  }
  MetadataWriteRequest request;
  request.mode = h.mode;
  request.real_batch_size = static_cast<int64_t>(bs);
  request.padded_batch_size = h.bucket;
  request.padded_kv_len = kPaddedKvLen;
  request.page_size = page_size_;
  request.req_to_token = req_to_token_;
  request.page_table = config_.consumers().page_table();
  request.split_kv = config_.consumers().split_kv().enabled();
  if (request.split_kv) request.split_kv_options = ConfigSplitKvOptions(config_);
  SplitKvPlanCounts counts;
  // The inputs were checked against the buffers: a writer error here is an internal one.
  if (absl::Status s = writer_->WriteBatchArrays(request, views_); !s.ok()) {
    return absl::InternalError(absl::StrCat("metadata writer, batch arrays: ", s.message()));
  }
  if (absl::Status s = writer_->WriteTokenArrays(request, views_, &counts); !s.ok()) {
    return absl::InternalError(absl::StrCat("metadata writer, token arrays: ", s.message()));
  }
  return counts;
}

}  // namespace attnmeta
