#include "attention/graph/graph_state.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attention/metadata/request_rows.h"

namespace attnmeta {
namespace {

// Generations are unique in the process, so that a handle captured by one GraphState never
// replays on another.
uint64_t NextGeneration() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

const char* SpaceName(MemorySpace space) {
  return space == MemorySpace::kHost ? "host" : "device";
}

template <typename T>
absl::Span<T> Typed(DeviceBuffer b) {
  return absl::Span<T>(static_cast<T*>(b.ptr), static_cast<size_t>(b.bytes) / sizeof(T));
}

// The rows of the largest write a batch capacity can ask of the writer: requests, and
// draft-decode's branches when the config plans it.
absl::Status CheckWriterRows(const BackendConfig& config, const MetadataWriter& writer,
                             int64_t batch_capacity) {
  const int64_t most = writer.max_write_rows();
  if (batch_capacity > most) {
    return absl::OutOfRangeError(absl::StrCat("batch capacity of ", batch_capacity,
                                              " requests beyond the metadata writer's ", most,
                                              " rows per write"));
  }
  const int64_t topk = config.speculative().topk();
  if (topk > 0 && batch_capacity > most / topk) {
    return absl::OutOfRangeError(absl::StrCat(
        "batch capacity of ", batch_capacity, " requests: draft-decode's ", batch_capacity,
        " * topk ", topk, " branches beyond the metadata writer's ", most, " rows per write"));
  }
  return absl::OkStatus();
}

}  // namespace

GraphState::GraphState(const BackendConfig& config, const ReqToTokenPool* req_to_token,
                       PageSize page_size, DeviceMemory* memory, MetadataWriter* writer)
    : config_(config),
      req_to_token_(req_to_token),
      page_size_(page_size),
      memory_(memory),
      writer_(writer),
      generation_(NextGeneration()),
      row_marks_(static_cast<size_t>(req_to_token->max_reqs()), 0) {}

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
  if (writer->space() != memory->space()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "graph state: the metadata writer works on ", SpaceName(writer->space()),
        " buffers, the memory allocates ", SpaceName(memory->space()), " buffers"));
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
  if (config.speculative().topk() > 0) {
    const DraftDecodeShape shape{config.speculative().topk(), config.speculative().steps()};
    const int64_t draft_row =
        MaxDraftRowTokens(TokenLength(static_cast<int32_t>(config.max_context_len())), shape,
                          pool_page_size)
            .value();
    if (req_to_token->max_context_len().value() < draft_row) {
      return absl::FailedPreconditionError(absl::StrCat(
          "max_context_len: req_to_token rows hold ", req_to_token->max_context_len().value(),
          " positions, draft-decode with top-k ", shape.topk, " and ", shape.steps,
          " steps reads up to ", draft_row));
    }
  }
  if (absl::Status s = CheckWriterRows(config, *writer, config.max_batch_size()); !s.ok()) {
    return s;
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
    // The views are cut from each buffer's bytes: a shorter one would put them past its end.
    if (b->bytes < spec.bytes || (spec.bytes > 0 && b->ptr == nullptr)) {
      FreeAll(buffers);
      return absl::InternalError(
          absl::StrCat("graph state: the memory gave ", spec.name, " ", b->bytes, " bytes",
                       b->ptr == nullptr ? " at null" : "", ", ", spec.bytes, " asked"));
    }
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
  const size_t cap = static_cast<size_t>(plan_.batch_capacity);
  staged_buffer_ = buffer(gb::kStagedInputs);
  v.req_rows = Typed<ReqPoolIndex>(staged_buffer_).subspan(0, cap);
  v.kv_lens = Typed<TokenLength>(staged_buffer_).subspan(cap, cap);
  v.q_lens = Typed<TokenLength>(staged_buffer_).subspan(2 * cap, cap);
  v.kv_indptr = Typed<TokenOffset>(buffer(gb::kKvIndptr));
  v.qo_indptr = Typed<TokenOffset>(buffer(gb::kQoIndptr));
  v.kv_last_page_len = Typed<TokenLength>(buffer(gb::kKvLastPageLen));
  v.kv_indices = Typed<TokenSlot>(buffer(gb::kKvIndices));
  if (plan_.page_table_cols > PageCount(0)) {
    v.page_table = *PageTableSpan<PageId>::Create(Typed<PageId>(buffer(gb::kPageTable)),
                                                  plan_.batch_capacity, plan_.page_table_cols);
  }
  v.split_kv = SplitKvPlanSpans{Typed<SplitKvWorkItem>(buffer(gb::kSplitKvWork)),
                                Typed<int32_t>(buffer(gb::kSplitKvUnitIndptr)),
                                Typed<SplitKvReduceItem>(buffer(gb::kSplitKvReduce))};
  v.tree_mask = Typed<uint8_t>(buffer(gb::kTreeMask));
  v.mask_indptr = Typed<int64_t>(buffer(gb::kMaskIndptr));
  v.custom_mask = Typed<uint8_t>(buffer(gb::kCustomMask));
  v.draft_qo_indptr = Typed<TokenOffset>(buffer(gb::kDraftQoIndptr));
  const int64_t steps =
      plan_.draft_branch_tokens > TokenCount(0) ? config_.speculative().steps() : 0;
  const int64_t branch_tokens = plan_.draft_branch_tokens.value();
  const size_t branches = static_cast<size_t>(plan_.batch_capacity) * config_.speculative().topk();
  for (int64_t step = 0; step < steps; ++step) {
    v.draft_steps.push_back(DraftStepBuffers{
        Typed<TokenOffset>(buffer(gb::kDraftKvIndptr)).subspan(step * (branches + 1), branches + 1),
        Typed<TokenLength>(buffer(gb::kDraftKvLens)).subspan(step * branches, branches),
        Typed<TokenLength>(buffer(gb::kDraftKvLastPageLen)).subspan(step * branches, branches),
        Typed<TokenSlot>(buffer(gb::kDraftKvIndices))
            .subspan(step * branches * branch_tokens, branches * branch_tokens)});
  }
  views_ = std::move(v);
  draft_step_views_.assign(steps, ForwardMetadataView{});
  padded_draft_step_views_.assign(steps, ForwardMetadataView{});
  tree_mask_buffer_ = buffer(gb::kTreeMask);
  staged_rows_.assign(plan_.batch_capacity, kPaddedRow);
  staged_kv_lens_.assign(plan_.batch_capacity, kPaddedKvLen);
  staged_q_lens_.assign(plan_.batch_capacity, TokenLength(0));
  staging_.assign(3 * cap * sizeof(int32_t), 0);
}

absl::Status GraphState::Reserve(int64_t batch_capacity) {
  if (batch_capacity < 1) {
    return absl::InvalidArgumentError(absl::StrCat("Reserve(", batch_capacity, "): need >= 1"));
  }
  if (batch_capacity <= plan_.batch_capacity) return absl::OkStatus();
  if (absl::Status s = CheckWriterRows(config_, *writer_, batch_capacity); !s.ok()) return s;
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
  // The switch below has no case for a mode outside the enum: it would pass every rule.
  if (absl::Status s = CheckKnownForwardMode(mode); !s.ok()) return s;
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
      if (q.value() < 1 || q.count() > MaxQueryRowsPerRequest(config_)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "extend capture needs 1 to max_query_rows_per_request = ",
            MaxQueryRowsPerRequest(config_).value(), " query rows per request, got ", q.value()));
      }
      break;
    case ForwardMode::kDraftExtend: {
      const int64_t most = MaxReplayQueryRowsPerRequest(config_).value();
      if (q.value() < 1 || q.value() > most) {
        return absl::InvalidArgumentError(absl::StrCat(
            "draft_extend capture needs 1 to max(max_query_rows_per_request, draft_tokens) = ",
            most, " query rows per request, got ", q.value()));
      }
      break;
    }
    case ForwardMode::kTargetVerify:
      if (config_.speculative().draft_tokens() < 1) {
        return absl::FailedPreconditionError(
            "target_verify capture: the config plans no draft tokens (speculative.draft_tokens)");
      }
      if (q.value() != config_.speculative().draft_tokens()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "target_verify has draft_tokens = ", config_.speculative().draft_tokens(),
            " query rows per request, not ", q.value()));
      }
      break;
    case ForwardMode::kDraftDecode:
      if (plan_.draft_branch_tokens == TokenCount(0) || config_.speculative().steps() < 1) {
        return absl::FailedPreconditionError(
            "draft_decode capture: the config plans no draft-decode (speculative.topk, steps)");
      }
      if (q != TokenLength(1)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "draft_decode has one query row per branch, not ", q.value()));
      }
      break;
    case ForwardMode::kMixed:
      return absl::InvalidArgumentError(
          "mixed batches have no fixed shape to capture; run them eagerly");
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
  if ((mode == ForwardMode::kExtend || mode == ForwardMode::kDraftExtend) &&
      !q_len_per_request.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(ForwardModeName(mode),
                                                   " capture needs its query rows per request"));
  }
  TokenLength default_q(1);
  if (mode == ForwardMode::kIdle) default_q = TokenLength(0);
  if (mode == ForwardMode::kTargetVerify) {
    default_q = TokenLength(config_.speculative().draft_tokens());
  }
  const TokenLength q = q_len_per_request.value_or(default_q);
  if (absl::Status s = CheckShape(bucket, mode, q); !s.ok()) return s;
  // Every per-batch buffer must hold the padded batch (DESIGN.md section 3, row 4: buffers
  // not regrown for a padded capture batch).
  namespace gb = graph_buffer;
  const std::pair<absl::string_view, size_t> per_batch[] = {
      {gb::kStagedInputs, views_.req_rows.size()},
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
  if (mode == ForwardMode::kTargetVerify &&
      static_cast<int64_t>(views_.mask_indptr.size()) < bucket + 1) {
    return absl::ResourceExhaustedError(absl::StrCat(gb::kMaskIndptr, ": holds ",
                                                     views_.mask_indptr.size(),
                                                     " entries, the padded batch needs ",
                                                     bucket + 1));
  }
  if (mode == ForwardMode::kDraftDecode) {
    // Every step's arrays are as long as step 0's.
    const int64_t branches = bucket * config_.speculative().topk();
    const int64_t held = static_cast<int64_t>(views_.draft_steps[0].kv_lens.size());
    if (held < branches || static_cast<int64_t>(views_.draft_qo_indptr.size()) < branches + 1) {
      return absl::ResourceExhaustedError(absl::StrCat(
          gb::kDraftKvLens, ": holds ", held, " branches, the padded batch has ", branches));
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
  if (!batch.q_lens.empty()) {
    if (h.mode != ForwardMode::kExtend && h.mode != ForwardMode::kDraftExtend) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replay batch: per-request q_lens are for extend and draft_extend, not ",
          ForwardModeName(h.mode)));
    }
    if (static_cast<int64_t>(batch.q_lens.size()) != bs) {
      return absl::InvalidArgumentError(absl::StrCat("replay batch: ", bs, " rows but ",
                                                     batch.q_lens.size(), " q_lens"));
    }
    for (int64_t i = 0; i < bs; ++i) {
      if (batch.q_lens[i].value() < 1 || batch.q_lens[i].value() > q) {
        return absl::InvalidArgumentError(absl::StrCat("q_lens[", i, "] = ",
                                                       batch.q_lens[i].value(),
                                                       " outside [1, ", q, "], the captured rows"));
      }
    }
  }
  const bool verify = h.mode == ForwardMode::kTargetVerify;
  if (verify == batch.tree_mask.empty()) {
    return absl::InvalidArgumentError(
        verify ? "target_verify replay needs the tree mask"
               : absl::StrCat("replay batch: a tree mask given to ", ForwardModeName(h.mode)));
  }
  if (verify) {
    if (static_cast<int64_t>(batch.tree_mask.size()) != bs * q * q) {
      return absl::InvalidArgumentError(absl::StrCat("tree_mask: ", batch.tree_mask.size(),
                                                     " bytes, want bs * n * n = ", bs * q * q));
    }
    if (absl::Status s = CheckTreeRows(batch.tree_mask, bs, TokenLength(static_cast<int32_t>(q)),
                                       /*draft_tree=*/true);
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("tree_mask: ", s.message()));
    }
  }
  const bool draft_decode = h.mode == ForwardMode::kDraftDecode;
  const DraftDecodeShape shape{config_.speculative().topk(), config_.speculative().steps()};
  const int64_t padded_rows = h.bucket - bs;
  const int64_t padded_kv = PaddedRowKvLen(h.q_len_per_request).value();
  const int64_t limit = config_.max_context_len() +
                        (draft_decode ? 0 : config_.speculative().draft_tokens());
  int64_t total = 0;
  int64_t longest = 0;
  int64_t max_q = 0;
  int64_t mask_bytes = 0;
  for (int64_t i = 0; i < bs; ++i) {
    const int64_t kv = batch.kv_lens[i].value();
    const int64_t q_i = batch.q_lens.empty() ? q : batch.q_lens[i].value();
    // A draft-decode length is the committed prefix, which may be empty: each branch's query
    // row reads its own draft tokens (the eager BuildDraftDecodeMetadata takes 0 too).
    if (kv < (draft_decode ? 0 : q_i)) {
      return absl::InvalidArgumentError(
          draft_decode ? absl::StrCat("kv_lens[", i, "] = ", kv, " is negative")
                       : absl::StrCat("kv_lens[", i, "] = ", kv, " is below the ", q_i,
                                      " query rows of the request"));
    }
    if (kv > limit) {
      return absl::OutOfRangeError(absl::StrCat(
          "kv_lens[", i, "] = ", kv, " beyond ",
          draft_decode ? "max_context_len" : "max_context_len + draft_tokens", " = ", limit));
    }
    const int64_t row_tokens =
        draft_decode ? DraftRowTokens(batch.kv_lens[i], shape, page_size_).value() : kv;
    // The common case is checked inline; the pool explains a failure.
    if (!req_to_token_->IsAllocated(batch.req_rows[i]) ||
        row_tokens > req_to_token_->max_context_len().value()) {
      const absl::Status s =
          req_to_token_->Read(batch.req_rows[i], TokenCount(0), TokenCount(row_tokens)).status();
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat("request ", i, ": ", s.message()));
    }
    total += kv;
    longest = std::max(longest, kv);
    max_q = std::max(max_q, q_i);
    mask_bytes += verify ? MaskBlockBytes(MaskLayout::kFull, TokenCount(q_i), TokenCount(kv),
                                          /*word_bytes=*/0)
                         : 0;
  }
  if (absl::Status s = CheckDistinctRows(batch.req_rows, absl::MakeSpan(row_marks_)); !s.ok()) {
    return s;
  }
  const int64_t real_total = total;
  const int64_t real_mask_bytes = mask_bytes;
  total += padded_rows * padded_kv;
  if (verify) mask_bytes += padded_rows * q * padded_kv;
  // The capacity checks below cannot fail for a correct plan (rows are at most
  // max_context_len + draft_tokens, buckets at most the capacity); they turn a plan that
  // sized a buffer wrong (DESIGN.md section 3, rows 1, 6, 7, 10) into an error before any
  // write.
  const int64_t kv_capacity = static_cast<int64_t>(views_.kv_indices.size());
  if (total > kv_capacity) {
    return absl::ResourceExhaustedError(absl::StrCat(gb::kKvIndices, ": the padded batch needs ",
                                                     total, " slots, capacity ", kv_capacity));
  }
  if (mask_bytes > static_cast<int64_t>(views_.custom_mask.size())) {
    return absl::ResourceExhaustedError(absl::StrCat(gb::kCustomMask, ": the batch needs ",
                                                     mask_bytes, " bytes, capacity ",
                                                     views_.custom_mask.size()));
  }
  if (draft_decode) {
    const int64_t need = DraftStepTokens(batch.kv_lens, shape, shape.steps - 1).value() +
                         padded_rows * shape.topk * padded_kv;
    const int64_t capacity = static_cast<int64_t>(views_.draft_steps[0].kv_indices.size());
    if (need > capacity) {
      return absl::ResourceExhaustedError(absl::StrCat(
          gb::kDraftKvIndices, ": the last step of the padded batch needs ", need,
          " slots, capacity ", capacity, " per step"));
    }
  }
  const bool page_table = config_.consumers().page_table() && !draft_decode;
  const int64_t padded_longest = padded_rows > 0 ? std::max(longest, padded_kv) : longest;
  const PageCount pages = PagesForTokensCeil(TokenCount(padded_longest), page_size_);
  if (page_table && pages > views_.page_table.cols()) {
    return absl::ResourceExhaustedError(absl::StrCat(gb::kPageTable, ": a row needs ",
                                                     pages.value(), " pages, capacity ",
                                                     views_.page_table.cols().value(), " columns"));
  }
  if (config_.consumers().split_kv().enabled() && !draft_decode) {
    const int64_t q_tile = config_.consumers().split_kv().q_tile();
    const SplitKvCapacity need = SplitKvCapacityFor(h.bucket * ((q + q_tile - 1) / q_tile),
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
  if (draft_decode) {
    const size_t branches = static_cast<size_t>(bs) * shape.topk;
    const size_t all_branches = static_cast<size_t>(h.bucket) * shape.topk;
    for (int32_t step = 0; step < shape.steps; ++step) {
      const DraftStepBuffers& d = views_.draft_steps[step];
      const int64_t real_tokens = DraftStepTokens(batch.kv_lens, shape, step).value();
      const auto view = [&](size_t n, int64_t tokens, int64_t max_kv) {
        ForwardMetadataView v;
        v.mode = h.mode;
        v.kv_indptr = d.kv_indptr.subspan(0, n + 1);
        v.kv_indices = d.kv_indices.subspan(0, tokens);
        v.qo_indptr = views_.draft_qo_indptr.subspan(0, n + 1);
        v.kv_lens = d.kv_lens.subspan(0, n);
        v.kv_last_page_len = d.kv_last_page_len.subspan(0, n);
        v.max_q_len = TokenCount(n > 0 ? 1 : 0);
        v.max_kv_len = TokenCount(max_kv);
        return v;
      };
      draft_step_views_[step] = view(branches, real_tokens, bs > 0 ? longest + step + 1 : 0);
      padded_draft_step_views_[step] =
          view(all_branches, real_tokens + padded_rows * shape.topk * padded_kv,
               std::max(bs > 0 ? longest + step + 1 : 0, padded_rows > 0 ? padded_kv : 0));
    }
    r.metadata = draft_step_views_[0];
    r.draft_steps = draft_step_views_;
    r.padded = padded_draft_step_views_[0];
    r.padded_draft_steps = padded_draft_step_views_;
    return r;
  }
  const auto view = [&](int64_t n, int64_t tokens, int64_t rows_q, int64_t bytes, int64_t max_kv) {
    const size_t rows = static_cast<size_t>(n);
    ForwardMetadataView v;
    v.mode = h.mode;
    v.kv_indptr = views_.kv_indptr.subspan(0, rows + 1);
    v.kv_indices = views_.kv_indices.subspan(0, tokens);
    v.qo_indptr = views_.qo_indptr.subspan(0, rows + 1);
    v.kv_lens = views_.kv_lens.subspan(0, rows);
    v.kv_last_page_len = views_.kv_last_page_len.subspan(0, rows);
    if (page_table) {
      v.page_table = *PageTableSpan<const PageId>::Create(views_.page_table.entries(), n,
                                                          views_.page_table.cols());
    }
    if (verify) {
      v.custom_mask = CustomMaskView{MaskLayout::kFull, views_.custom_mask.subspan(0, bytes),
                                     views_.mask_indptr.subspan(0, rows + 1)};
    }
    v.max_q_len = TokenCount(rows_q);
    v.max_kv_len = TokenCount(max_kv);
    return v;
  };
  r.metadata = view(bs, real_total, max_q, real_mask_bytes, longest);
  // An idle graph's kernels are given no query rows: its bucket is the empty batch.
  r.padded = h.mode == ForwardMode::kIdle
                 ? r.metadata
                 : view(h.bucket, total, padded_rows > 0 ? std::max(max_q, q) : max_q, mask_bytes,
                        padded_longest);
  r.split_kv = *counts;
  return r;
}

absl::StatusOr<SplitKvPlanCounts> GraphState::Write(const CaptureHandle& h,
                                                    const ReplayBatch& batch) {
  const size_t bs = batch.req_rows.size();
  MetadataWriteRequest request;
  request.mode = h.mode;
  request.real_batch_size = static_cast<int64_t>(bs);
  request.padded_batch_size = h.bucket;
  request.padded_kv_len = PaddedRowKvLen(h.q_len_per_request);
  request.page_size = page_size_;
  request.req_to_token = req_to_token_;
  request.page_table = config_.consumers().page_table();
  request.split_kv = config_.consumers().split_kv().enabled();
  if (request.split_kv) request.split_kv_options = ConfigSplitKvOptions(config_);
  request.q_len_per_request = h.q_len_per_request;
  request.generation = generation_;
  if (h.mode == ForwardMode::kTargetVerify) request.mask_layout = MaskLayout::kFull;
  if (h.mode == ForwardMode::kDraftDecode) {
    request.draft_decode = DraftDecodeShape{config_.speculative().topk(),
                                            config_.speculative().steps()};
    request.page_table = false;
    request.split_kv = false;
  }
  const size_t padded = static_cast<size_t>(h.bucket);
  // The host copies of what is staged below (filled before the writer runs).
  request.host_kv_lens = absl::MakeConstSpan(staged_kv_lens_).subspan(0, padded);
  request.host_q_lens = absl::MakeConstSpan(staged_q_lens_).subspan(0, padded);
  // Before anything is staged: a request the writer cannot write changes nothing.
  if (absl::Status s = writer_->CheckSupported(request); !s.ok()) return s;
  std::copy(batch.req_rows.begin(), batch.req_rows.end(), staged_rows_.begin());
  std::fill(staged_rows_.begin() + bs, staged_rows_.begin() + padded, kPaddedRow);
  std::copy(batch.kv_lens.begin(), batch.kv_lens.end(), staged_kv_lens_.begin());
  std::fill(staged_kv_lens_.begin() + bs, staged_kv_lens_.begin() + padded, request.padded_kv_len);
  if (batch.q_lens.empty()) {
    std::fill(staged_q_lens_.begin(), staged_q_lens_.begin() + bs, h.q_len_per_request);
  } else {
    std::copy(batch.q_lens.begin(), batch.q_lens.end(), staged_q_lens_.begin());
  }
  std::fill(staged_q_lens_.begin() + bs, staged_q_lens_.begin() + padded, h.q_len_per_request);
  // One copy per replay: the three arrays side by side, as the staged_inputs buffer holds them.
  const size_t cap = staged_rows_.size() * sizeof(int32_t);
  std::memcpy(staging_.data(), staged_rows_.data(), cap);
  std::memcpy(staging_.data() + cap, staged_kv_lens_.data(), cap);
  std::memcpy(staging_.data() + 2 * cap, staged_q_lens_.data(), cap);
  if (absl::Status s = memory_->CopyToDevice(staged_buffer_, 0, staging_.data(),
                                             static_cast<int64_t>(staging_.size()));
      !s.ok()) {
    return s;
  }
  if (!batch.tree_mask.empty()) {
    if (absl::Status s = memory_->CopyToDevice(tree_mask_buffer_, 0, batch.tree_mask.data(),
                                               static_cast<int64_t>(batch.tree_mask.size()));
        !s.ok()) {
      return s;
    }
  }
  SplitKvPlanCounts counts;
  // The inputs were checked against the buffers: a writer error here is an internal one,
  // except a writer that does not implement the request (Unimplemented stays so).
  auto writer_error = [](absl::string_view stage, const absl::Status& s) {
    return absl::Status(s.code() == absl::StatusCode::kUnimplemented ? s.code()
                                                                      : absl::StatusCode::kInternal,
                        absl::StrCat("metadata writer, ", stage, ": ", s.message()));
  };
  if (absl::Status s = writer_->WriteBatchArrays(request, views_); !s.ok()) {
    return writer_error("batch arrays", s);
  }
  if (absl::Status s = writer_->WriteTokenArrays(request, views_, &counts); !s.ok()) {
    return writer_error("token arrays", s);
  }
  return counts;
}

}  // namespace attnmeta
