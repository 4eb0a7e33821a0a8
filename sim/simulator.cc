#include "sim/simulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "attention/graph/backend_config.h"
#include "attention/graph/batch_buckets.h"
#include "attention/graph/buffer_plan.h"
#include "attention/graph/graph_state.h"
#include "attention/kernels/half_bits.h"
#include "attention/metadata/builders.h"
#include "attention/metadata/draft_decode_layout.h"
#include "attention/metadata/metadata_diff.h"
#include "attention/metadata/reference_attention.h"
#include "attention/metadata/snapshot.h"
#include "attention/metadata/split_kv_planner.h"
#include "attention/metadata/validator.h"
#include "google/protobuf/util/json_util.h"
#include "kvcache/paged_token_allocator.h"
#include "kvcache/req_to_token_pool.h"
#include "kvcache/units.h"
#include "sim/replay_backend.h"
#include "sim/workload.h"
#include "spec_decode/greedy_accept.h"
#include "spec_decode/speculative_metadata.h"
#include "spec_decode/verify_tree.h"

namespace attnmeta {
namespace {

// ---- Token contents ----
// Every token is a 64-bit content id; its K, V and query vectors are a hash of it. The pool's
// K/V rows are written from the content of the token a slot holds, and dense attention reads
// the contents of a request's logical sequence, so the two agree only when the metadata
// points every token at the right slot.

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t Content(uint64_t seed, uint64_t kind, uint64_t a, uint64_t b, uint64_t c = 0,
                 uint64_t d = 0) {
  uint64_t h = Mix(seed ^ Mix(kind));
  for (uint64_t v : {a, b, c, d}) h = Mix(h ^ v);
  return h;
}

enum class Vec : uint64_t { kKey = 1, kValue = 2, kQuery = 3 };

// Values in [-1, 1).
void FillVector(uint64_t content, Vec which, absl::Span<float> out) {
  const uint64_t base = Mix(content ^ (static_cast<uint64_t>(which) << 56));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<float>(static_cast<double>(Mix(base + i) >> 40) / (1 << 23) - 1.0);
  }
}

// ---- Requests ----

enum class State { kPending, kWaiting, kPrefill, kRunning, kFinished };

struct Req {
  int index = 0;
  const Request* spec = nullptr;
  State state = State::kPending;
  std::optional<ReqPoolIndex> row;
  int64_t seq_len = 0;     // tokens with K/V in the pool
  int64_t generated = 0;   // output tokens so far
  int64_t shared_len = 0;  // positions [0, shared_len) are the prefix cache's slots
  int64_t admitted_at = 0; // admission order (the newest is retracted first)
  int64_t rounds = 0;      // EAGLE rounds, part of the draft tokens' contents
  std::vector<uint64_t> history;  // [seq_len] the content of each position
  std::vector<TokenSlot> slots;   // [seq_len] the slot of each position (its req_to_token row)
};

// A shared prefix: whole pages, held while a request uses them.
struct CachedPrefix {
  std::vector<TokenSlot> slots;
  std::vector<uint64_t> contents;
  int refs = 0;
};

// What dense attention sees for one sequence of a forward.
struct DenseSequence {
  std::vector<uint64_t> kv;     // [kv_len] contents
  std::vector<uint64_t> query;  // [q_len] contents of the query rows
  std::vector<uint8_t> sees;    // [q_len][kv_len], or empty: causal with prefix
};

// The query rows of a forward's dense sequences, in batch order, and dense attention's output
// for them: [rows][num_q_heads][head_dim] each.
struct DenseRows {
  std::vector<float> q;
  std::vector<float> want;
  std::vector<float> want_lse;  // [rows][num_q_heads]
};

// A forward's failure, which ends the run.
struct Failure {
  std::string message;
};

class Run {
 public:
  Run(const Workload& workload, const Scenario& scenario, PageSize page_size, uint64_t seed,
      const SimOptions& options, RunReport* report)
      : workload_(workload),
        scenario_(scenario),
        page_size_(page_size),
        seed_(seed),
        options_(options),
        report_(report),
        config_(ScenarioConfig(scenario, page_size)),
        spec_(scenario.backend().speculative()),
        buckets_(BatchSizeBuckets::ForConfig(config_)),
        accept_rng_(Mix(seed ^ scenario.acceptance().seed())) {
    report_->set_scenario(scenario.name());
    report_->set_page_size(page_size.tokens());
    report_->set_backend(options.backend);
    dims_.num_q_heads = config_.num_q_heads();
    dims_.num_kv_heads = config_.num_kv_heads();
    dims_.head_dim = config_.head_dim();
  }

  ~Run() {
    graph_.reset();
  }

  void Execute();

 private:
  bool eagle() const { return spec_.draft_tokens() > 0; }
  int64_t kv_row() const { return int64_t{dims_.num_kv_heads} * dims_.head_dim; }
  int64_t q_row() const { return int64_t{dims_.num_q_heads} * dims_.head_dim; }

  absl::Status Setup();
  bool Step();
  // Each returns false when it found nothing to run.
  bool PrefillStep();
  bool DecodeStep();
  bool EagleRound();
  void IdleStep();

  // ---- Allocation helpers ----
  uint64_t PromptContent(const Req& r, int64_t pos) const;
  int64_t PagesFor(int64_t from, int64_t to) const;
  int64_t NextDecodePages(const Req& r) const;
  TokenSlot LastSlot(const Req& r) const { return r.slots.back(); }
  // Writes `slots` at positions [from, from + n) of r's row with `contents`, K/V included.
  void Place(Req& r, int64_t from, absl::Span<const TokenSlot> slots,
             absl::Span<const uint64_t> contents);
  void WriteKv(TokenSlot slot, uint64_t content);
  void NoteHighWater();
  // Frees what r holds and its row.
  void Release(Req& r);
  void Finish(Req& r);
  // Requests done this step; freed together at its end (one free group).
  void Done(Req& r) { finishing_.push_back(&r); }
  // Sends the newest running (or, with `prefills`, prefilling) request back to the queue.
  bool RetractNewest(bool prefills);
  // The running requests, after retracting the newest until the pool holds the pages their
  // next decode step needs.
  std::vector<Req*> RunningThatFit();
  void MaybeCachePrefix(Req& r);
  int64_t CachedPrefixLen(const Req& r) const;

  // ---- Checks ----
  ValidationContext Context(int64_t query_rows) const;
  // Validates `m` and, in checked steps, compares its attention with dense attention. With
  // `rows`, leaves there the query rows and dense attention it compared with (empty when it
  // compared none).
  void CheckView(const std::string& what, const ForwardMetadataView& m,
                 const std::vector<DenseSequence>& dense, DenseRows* rows = nullptr);
  double AttentionError(const ForwardMetadataView& m, const DenseRows& dense,
                        const std::string& what);
  // The query rows of `dense` and dense attention's output for them. False when the run failed.
  bool DenseOutputs(const std::vector<DenseSequence>& dense, const std::string& what,
                    DenseRows& out);
  // The backend's attention kernels over a replayed forward (`in`, its query rows filled here
  // from `dense`) compared with dense attention, path by path, within kMaxDeviceRelativeError.
  void CheckDeviceAttention(const std::string& what, ReplayAttentionInputs in,
                            const DenseRows& dense);
  // The vector `which` of `content`: FillVector's values, rounded to bf16 when the backend's
  // attention kernels check the run (they read bf16), so that every path sees the same numbers.
  void Fill(uint64_t content, Vec which, absl::Span<float> out) const;
  // One forward of `batch`: its eager metadata `m` (or the builder's error) checked, then,
  // with `replay`, the batch replayed through the graph and compared; counted under its mode.
  // False when the run failed.
  bool CheckForward(absl::StatusOr<ForwardMetadata>& m, double build_us, const ForwardBatch& batch,
                    const std::vector<DenseSequence>& dense, bool replay);
  // CheckForward of BuildForwardMetadata(batch) with the config's consumers, timed.
  bool BuildAndCheckForward(const ForwardBatch& batch, const std::vector<DenseSequence>& dense,
                            bool replay);
  // The eager metadata of a forward: timed, maybe corrupted (the test-only fault), checked
  // and, with a dump directory, snapshotted (when `batch` describes it).
  void CheckEager(const std::string& what, ForwardMetadata& m, const ForwardBatch* batch,
                  const std::vector<DenseSequence>& dense, double build_us);
  // Replays `batch` through the graph when a capture size holds it and compares.
  void CheckReplay(ForwardMode mode, const ReplayBatch& batch,
                   const std::vector<const ForwardMetadata*>& eager,
                   const std::vector<std::vector<DenseSequence>>& dense,
                   const ForwardBatch* snapshot_batch);
  std::optional<int64_t> Bucket(int64_t bs) const;
  // A replayed view's arrays copied to the host through the backend's memory (on the GPU
  // backend the view holds device addresses).
  absl::StatusOr<ForwardMetadata> ReadBack(const ForwardMetadataView& v);
  template <typename T>
  absl::Status CopyToHost(absl::Span<const T> from, int64_t count, std::vector<T>& to);
  void Fail(const std::string& what, const absl::Status& status, const ForwardBatch* batch,
            const ForwardMetadata* m);
  void Snapshot(const std::string& what, const ForwardBatch& batch, const ForwardMetadata& m);
  ModeReport& Mode(ForwardMode mode);
  bool checked_step() const {
    return workload_.check_steps() == 0 || step_ < workload_.check_steps();
  }

  const Workload& workload_;
  const Scenario& scenario_;
  const PageSize page_size_;
  const uint64_t seed_;
  const SimOptions& options_;
  RunReport* report_;
  const BackendConfig config_;
  const SpeculativeConfig spec_;
  AttentionDims dims_;
  const BatchSizeBuckets buckets_;  // the config's capture sizes
  std::mt19937_64 accept_rng_;

  std::optional<PagedTokenAllocator> alloc_;
  std::optional<ReqToTokenPool> r2t_;
  std::vector<float> k_pool_, v_pool_;
  std::unique_ptr<ReplayBackend> backend_;  // declared before graph_, which frees into it
  bool device_attention_ = false;           // backend_->AttendsReplays(dims_)
  bool kv_pool_synced_ = false;             // the backend's pools equal k_pool_ and v_pool_
  std::unique_ptr<GraphState> graph_;
  std::map<std::pair<ForwardMode, int64_t>, CaptureHandle> handles_;

  std::vector<Req> reqs_;
  std::deque<int> waiting_;
  absl::flat_hash_map<int32_t, CachedPrefix> prefixes_;
  int64_t step_ = 0;
  int64_t admissions_ = 0;
  bool fault_pending_ = false;
  std::optional<Failure> failure_;
  int64_t eager_forwards_ = 0, replays_ = 0;
  double eager_us_ = 0, replay_us_ = 0;
  std::vector<float> k_scratch_, v_scratch_;
  std::vector<Req*> finishing_;
  // Set by a retraction, cleared when a request finishes: no new admissions in between, so a
  // retracted request is not readmitted into the same shortage (which would thrash).
  bool admission_paused_ = false;
};

double MicrosSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

// ---- Setup and the step loop ----

absl::Status Run::Setup() {
  const int64_t pages = scenario_.kv_pool_tokens() / page_size_.tokens();
  absl::StatusOr<PagedTokenAllocator> alloc = PagedTokenAllocator::Create(
      PageCount(pages), page_size_, FreePagePolicy::Shuffled(Mix(seed_ ^ 0x5eed)));
  if (!alloc.ok()) return alloc.status();
  alloc_.emplace(*std::move(alloc));
  absl::StatusOr<ReqToTokenPool> r2t = ReqToTokenPool::Create(
      scenario_.max_running_requests(), ReqToTokenWidth(scenario_, page_size_));
  if (!r2t.ok()) return r2t.status();
  r2t_.emplace(*std::move(r2t));
  const int64_t slots = alloc_->pool_slots().value();
  k_pool_.assign(slots * kv_row(), 0.0f);
  v_pool_.assign(slots * kv_row(), 0.0f);
  if (options_.make_backend) {
    backend_ = options_.make_backend();
  } else {
    absl::StatusOr<std::unique_ptr<ReplayBackend>> backend =
        MakeReplayBackend(options_.backend, *r2t_, alloc_->pool_slots());
    if (!backend.ok()) return backend.status();
    backend_ = *std::move(backend);
  }
  device_attention_ = backend_->AttendsReplays(dims_);
  absl::StatusOr<std::unique_ptr<GraphState>> graph = GraphState::Create(
      config_, &*r2t_, page_size_, &backend_->memory(), &backend_->writer());
  if (!graph.ok()) return graph.status();
  graph_ = *std::move(graph);
  report_->set_pool_pages(pages);
  report_->set_graph_buffer_bytes(graph_->plan().total_bytes);
  reqs_.resize(scenario_.requests_size());
  for (int i = 0; i < scenario_.requests_size(); ++i) {
    reqs_[i].index = i;
    reqs_[i].spec = &scenario_.requests(i);
  }
  return absl::OkStatus();
}

void Run::Execute() {
  if (absl::Status s = Setup(); !s.ok()) {
    failure_ = Failure{absl::StrCat("setup: ", s.message())};
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (!failure_.has_value()) {
    const bool all_done = std::all_of(reqs_.begin(), reqs_.end(),
                                      [](const Req& r) { return r.state == State::kFinished; });
    if (all_done) {
      report_->set_finished(true);
      break;
    }
    if (options_.max_steps > 0 && step_ >= options_.max_steps) break;
    if (step_ >= scenario_.max_steps()) {
      failure_ = Failure{absl::StrCat("not finished within max_steps ", scenario_.max_steps())};
      break;
    }
    fault_pending_ = step_ == options_.inject_fault_step;
    if (!Step()) break;
    ++step_;
    if (options_.progress != nullptr && step_ % 100 == 0) {
      int running = 0, finished = 0;
      for (const Req& r : reqs_) {
        running += r.state == State::kRunning || r.state == State::kPrefill;
        finished += r.state == State::kFinished;
      }
      *options_.progress << absl::StreamFormat(
          "  [%s, page size %d] step %d: %d running, %d waiting, %d/%d finished, %.1f s\n",
          scenario_.name(), page_size_.tokens(), step_, running, waiting_.size(), finished,
          reqs_.size(), MicrosSince(t0) / 1e6);
    }
  }
  report_->set_steps(step_);
  report_->set_passed(!failure_.has_value());
  if (failure_.has_value()) report_->set_failure(failure_->message);
  if (eager_forwards_ > 0) report_->set_eager_build_us_per_forward(eager_us_ / eager_forwards_);
  if (replays_ > 0) report_->set_replay_us_per_forward(replay_us_ / replays_);
  if (backend_ != nullptr && !failure_.has_value()) {
    if (absl::Status s = backend_->CheckAfterReplay(); !s.ok()) {
      report_->set_passed(false);
      report_->set_failure(absl::StrCat("graph buffers: ", s.message()));
    }
  }
}

bool Run::Step() {
  for (Req& r : reqs_) {
    if (r.state == State::kPending && r.spec->arrival_step() <= step_) {
      r.state = State::kWaiting;
      waiting_.push_back(r.index);
    }
  }
  finishing_.clear();
  bool ran = PrefillStep();
  if (!ran && !failure_.has_value()) ran = eagle() ? EagleRound() : DecodeStep();
  if (!ran && !failure_.has_value()) {
    const bool anything_active = std::any_of(reqs_.begin(), reqs_.end(), [](const Req& r) {
      return r.state == State::kRunning || r.state == State::kPrefill || r.state == State::kWaiting;
    });
    // Nothing could run while requests wait: the pool is held by partial prefills.
    if (anything_active && !RetractNewest(/*prefills=*/true)) {
      failure_ = Failure{absl::StrCat("step ", step_, ": no request can make progress")};
    }
    if (!anything_active) IdleStep();
  }
  if (failure_.has_value()) return false;
  // Engines free a step's finished requests together at its end.
  if (absl::Status s = alloc_->BeginFreeGroup(); !s.ok()) {
    failure_ = Failure{absl::StrCat("step ", step_, ": ", s.message())};
    return false;
  }
  for (Req* r : finishing_) Finish(*r);
  if (absl::Status s = alloc_->EndFreeGroup(); !s.ok() && !failure_.has_value()) {
    failure_ = Failure{absl::StrCat("step ", step_, ": ", s.message())};
  }
  return !failure_.has_value();
}

// ---- Allocation helpers ----

uint64_t Run::PromptContent(const Req& r, int64_t pos) const {
  const Request& q = *r.spec;
  if (q.prefix_group() > 0 && pos < q.shared_prefix_len()) {
    return Content(seed_, 'G', q.prefix_group(), pos);
  }
  return Content(seed_, 'P', r.index, pos);
}

int64_t Run::PagesFor(int64_t from, int64_t to) const {
  return PagesForTokensCeil(TokenCount(to), page_size_).value() -
         PagesForTokensCeil(TokenCount(from), page_size_).value();
}

int64_t Run::NextDecodePages(const Req& r) const {
  if (!eagle()) return PagesFor(r.seq_len, r.seq_len + 1);
  const int64_t draft_end =
      DraftRowTokens(TokenLength(static_cast<int32_t>(r.seq_len)),
                     DraftDecodeShape{spec_.topk(), spec_.steps()}, page_size_)
          .value();
  return std::max(PagesFor(r.seq_len, draft_end),
                  PagesFor(r.seq_len, r.seq_len + spec_.draft_tokens()));
}

void Run::Fill(uint64_t content, Vec which, absl::Span<float> out) const {
  FillVector(content, which, out);
  if (!device_attention_) return;
  for (float& x : out) x = Bf16ToFloat(FloatToBf16(x));
}

void Run::WriteKv(TokenSlot slot, uint64_t content) {
  const int64_t at = int64_t{slot.value()} * kv_row();
  Fill(content, Vec::kKey, absl::MakeSpan(k_pool_).subspan(at, kv_row()));
  Fill(content, Vec::kValue, absl::MakeSpan(v_pool_).subspan(at, kv_row()));
  kv_pool_synced_ = false;
}

void Run::Place(Req& r, int64_t from, absl::Span<const TokenSlot> slots,
                absl::Span<const uint64_t> contents) {
  if (absl::Status s = r2t_->Write(*r.row, TokenCount(from), slots); !s.ok()) {
    failure_ = Failure{absl::StrCat("step ", step_, ": req_to_token: ", s.message())};
    return;
  }
  for (size_t i = 0; i < slots.size(); ++i) WriteKv(slots[i], contents[i]);
}

void Run::NoteHighWater() {
  report_->set_pages_high_water(
      std::max(report_->pages_high_water(), alloc_->used_pages().value()));
}

void Run::Release(Req& r) {
  if (r.seq_len > r.shared_len) {
    const absl::Span<const TokenSlot> own =
        absl::MakeConstSpan(r.slots).subspan(r.shared_len, r.seq_len - r.shared_len);
    if (absl::Status s = alloc_->Free(own); !s.ok()) {
      failure_ = Failure{absl::StrCat("step ", step_, ": freeing request ", r.index, ": ", s.message())};
    }
  }
  if (r.shared_len > 0) {
    auto it = prefixes_.find(r.spec->prefix_group());
    if (--it->second.refs == 0) {
      if (absl::Status s = alloc_->Free(it->second.slots); !s.ok()) {
        failure_ = Failure{absl::StrCat("step ", step_, ": freeing a prefix: ", s.message())};
      }
      prefixes_.erase(it);
    }
  }
  if (r.row.has_value()) {
    if (absl::Status s = r2t_->Free(*r.row); !s.ok()) {
      failure_ = Failure{absl::StrCat("step ", step_, ": ", s.message())};
    }
  }
  r.row.reset();
  r.seq_len = r.generated = r.shared_len = 0;
  r.history.clear();
  r.slots.clear();
}

void Run::Finish(Req& r) {
  Release(r);
  r.state = State::kFinished;
  admission_paused_ = false;
  report_->set_requests_finished(report_->requests_finished() + 1);
}

bool Run::RetractNewest(bool prefills) {
  Req* newest = nullptr;
  for (Req& r : reqs_) {
    const bool candidate = r.state == State::kRunning || (prefills && r.state == State::kPrefill);
    if (candidate && (newest == nullptr || r.admitted_at > newest->admitted_at)) newest = &r;
  }
  if (newest == nullptr) return false;
  // Its output so far is regenerated from scratch (its contents are the same).
  report_->set_generated_tokens(report_->generated_tokens() - newest->generated);
  Release(*newest);
  newest->state = State::kWaiting;
  waiting_.push_front(newest->index);
  admission_paused_ = true;
  report_->set_retractions(report_->retractions() + 1);
  return true;
}

std::vector<Req*> Run::RunningThatFit() {
  for (;;) {
    std::vector<Req*> running;
    int64_t need = 0;
    for (Req& r : reqs_) {
      if (r.state != State::kRunning) continue;
      running.push_back(&r);
      need += NextDecodePages(r);
    }
    if (need <= alloc_->free_pages().value() || !RetractNewest(/*prefills=*/false)) return running;
  }
}

int64_t Run::CachedPrefixLen(const Req& r) const {
  const Request& q = *r.spec;
  if (q.prefix_group() == 0) return 0;
  // Whole pages, and never the whole prompt: its last token is always computed.
  const int64_t sharable = std::min<int64_t>(q.shared_prefix_len(), q.prompt_len() - 1);
  return sharable / page_size_.tokens() * page_size_.tokens();
}

void Run::MaybeCachePrefix(Req& r) {
  const int64_t len = CachedPrefixLen(r);
  if (len == 0 || r.shared_len > 0 || r.seq_len < len) return;
  if (prefixes_.contains(r.spec->prefix_group())) return;
  CachedPrefix& p = prefixes_[r.spec->prefix_group()];
  p.slots.assign(r.slots.begin(), r.slots.begin() + len);
  p.contents.assign(r.history.begin(), r.history.begin() + len);
  p.refs = 1;
  r.shared_len = len;
}

// ---- Prefill (and mixed) ----

bool Run::PrefillStep() {
  struct Entry {
    Req* req;
    int64_t prefix;
    int64_t extend;
  };
  std::vector<Entry> batch;
  int64_t budget = scenario_.chunked_prefill_tokens();
  int64_t reserve = 0;  // pages the running requests' next decode needs
  for (const Req& r : reqs_) {
    if (r.state == State::kRunning) reserve += NextDecodePages(r);
  }
  int64_t pages_left = alloc_->free_pages().value() - reserve;
  // A mixed batch brings the running decodes along: when their pages are not there, the
  // decode step runs instead (and retracts).
  if (scenario_.mixed_chunk() && pages_left < 0) return false;
  const auto fit = [&](const Req& r, int64_t want) {
    // The most of `want` tokens after r.seq_len that pages_left pages hold.
    const int64_t ps = page_size_.tokens();
    const int64_t room = (ps - r.seq_len % ps) % ps + std::max<int64_t>(pages_left, 0) * ps;
    return std::min(want, room);
  };
  // Partial prefills continue first, in admission order.
  std::vector<Req*> partial;
  for (Req& r : reqs_) {
    if (r.state == State::kPrefill) partial.push_back(&r);
  }
  std::sort(partial.begin(), partial.end(),
            [](const Req* a, const Req* b) { return a->admitted_at < b->admitted_at; });
  for (Req* r : partial) {
    if (budget == 0) break;
    const int64_t n = fit(*r, std::min(budget, r->spec->prompt_len() - r->seq_len));
    if (n <= 0) continue;
    batch.push_back({r, r->seq_len, n});
    budget -= n;
    pages_left -= PagesFor(r->seq_len, r->seq_len + n);
  }
  // Then new requests, while rows, pages and the budget last.
  int free_rows = scenario_.max_running_requests();
  for (const Req& r : reqs_) {
    free_rows -= r.state == State::kRunning || r.state == State::kPrefill;
  }
  std::vector<int> admitted;
  while (budget > 0 && free_rows > 0 && !waiting_.empty() && !admission_paused_) {
    Req& r = reqs_[waiting_.front()];
    // A group's members share shared_prefix_len but not prompt_len: each may take fewer
    // pages of the cached prefix than the request that cached it (CachedPrefixLen keeps its
    // own last prompt token out), and never more than were cached.
    const auto prefix = prefixes_.find(r.spec->prefix_group());
    const int64_t cached =
        prefix == prefixes_.end()
            ? 0
            : std::min<int64_t>(CachedPrefixLen(r),
                                static_cast<int64_t>(prefix->second.slots.size()));
    const int64_t want = std::min(budget, r.spec->prompt_len() - cached);
    const int64_t ps = page_size_.tokens();
    const int64_t room = std::max<int64_t>(pages_left, 0) * ps;  // cached ends on a page
    if (room < std::min<int64_t>(want, ps)) {
      report_->set_admission_backoffs(report_->admission_backoffs() + 1);
      break;
    }
    waiting_.pop_front();
    absl::StatusOr<ReqPoolIndex> row = r2t_->Allocate();
    if (!row.ok()) {
      failure_ = Failure{absl::StrCat("step ", step_, ": req_to_token: ", row.status().message())};
      return false;
    }
    r.row = *row;
    r.state = State::kPrefill;
    r.admitted_at = ++admissions_;
    if (cached > 0) {
      CachedPrefix& p = prefix->second;
      ++p.refs;
      const absl::Span<const TokenSlot> taken = absl::MakeConstSpan(p.slots).subspan(0, cached);
      if (absl::Status s = r2t_->Write(*r.row, TokenCount(0), taken); !s.ok()) {
        failure_ = Failure{absl::StrCat("step ", step_, ": req_to_token: ", s.message())};
        return false;
      }
      r.slots.assign(taken.begin(), taken.end());
      r.history.assign(p.contents.begin(), p.contents.begin() + cached);
      r.seq_len = r.shared_len = cached;
      report_->set_prefix_hit_tokens(report_->prefix_hit_tokens() + cached);
    }
    const int64_t n = std::min(want, room);
    batch.push_back({&r, r.seq_len, n});
    budget -= n;
    pages_left -= PagesFor(r.seq_len, r.seq_len + n);
    --free_rows;
  }
  if (batch.empty()) return false;
  const int64_t prefills = static_cast<int64_t>(batch.size());
  if (scenario_.mixed_chunk()) {
    for (Req& r : reqs_) {
      if (r.state != State::kRunning) continue;
      batch.push_back({&r, r.seq_len, 1});
    }
  }
  // Allocate: the accounting above keeps the batch within the free pages.
  std::vector<ExtendRequest> requests;
  for (const Entry& e : batch) {
    requests.push_back(ExtendRequest{TokenCount(e.prefix), TokenCount(e.prefix + e.extend),
                                     e.prefix > 0 ? LastSlot(*e.req) : TokenSlot(0)});
  }
  absl::StatusOr<std::vector<TokenSlot>> slots = alloc_->AllocateExtend(requests);
  if (!slots.ok()) {
    failure_ = Failure{absl::StrCat("step ", step_, ": prefill allocation: ", slots.status().message())};
    return false;
  }
  NoteHighWater();
  int64_t o = 0;
  std::vector<ReqPoolIndex> rows;
  std::vector<TokenLength> kv_lens, q_lens;
  std::vector<DenseSequence> dense;
  for (const Entry& e : batch) {
    Req& r = *e.req;
    const bool decoding = r.state == State::kRunning;
    std::vector<uint64_t> contents;
    for (int64_t p = e.prefix; p < e.prefix + e.extend; ++p) {
      contents.push_back(decoding ? Content(seed_, 'D', r.index, p) : PromptContent(r, p));
    }
    const absl::Span<const TokenSlot> mine = absl::MakeConstSpan(*slots).subspan(o, e.extend);
    o += e.extend;
    Place(r, e.prefix, mine, contents);
    r.slots.insert(r.slots.end(), mine.begin(), mine.end());
    r.history.insert(r.history.end(), contents.begin(), contents.end());
    r.seq_len += e.extend;
    rows.push_back(*r.row);
    kv_lens.push_back(TokenLength(static_cast<int32_t>(r.seq_len)));
    q_lens.push_back(TokenLength(static_cast<int32_t>(e.extend)));
    DenseSequence d;
    d.kv = r.history;
    d.query = contents;
    dense.push_back(std::move(d));
    if (!decoding) report_->set_prefill_tokens(report_->prefill_tokens() + e.extend);
  }
  if (failure_.has_value()) return false;
  ForwardBatch fb;
  fb.mode = static_cast<int64_t>(batch.size()) > prefills ? ForwardMode::kMixed : ForwardMode::kExtend;
  fb.req_rows = rows;
  fb.kv_lens = kv_lens;
  fb.q_lens = q_lens;
  if (!BuildAndCheckForward(fb, dense, /*replay=*/false)) return false;
  for (const Entry& e : batch) {
    Req& r = *e.req;
    if (r.state == State::kRunning) {
      ++r.generated;
      report_->set_generated_tokens(report_->generated_tokens() + 1);
    } else if (r.seq_len == r.spec->prompt_len()) {
      r.state = State::kRunning;
      r.generated = 1;  // the last prompt row predicts the first output token
      report_->set_generated_tokens(report_->generated_tokens() + 1);
    }
    MaybeCachePrefix(r);
    if (r.state == State::kRunning && r.generated >= r.spec->output_len()) Done(r);
  }
  return !failure_.has_value();
}

// ---- Decode ----

bool Run::DecodeStep() {
  if (std::none_of(reqs_.begin(), reqs_.end(),
                   [](const Req& r) { return r.state == State::kRunning; })) {
    return false;
  }
  const std::vector<Req*> running = RunningThatFit();
  if (running.empty()) return true;  // every one was retracted
  std::vector<DecodeRequest> requests;
  for (const Req* r : running) {
    requests.push_back(DecodeRequest{TokenCount(r->seq_len + 1), LastSlot(*r)});
  }
  absl::StatusOr<std::vector<TokenSlot>> slots = alloc_->AllocateDecode(requests);
  if (!slots.ok()) {
    failure_ = Failure{absl::StrCat("step ", step_, ": decode allocation: ", slots.status().message())};
    return false;
  }
  NoteHighWater();
  std::vector<ReqPoolIndex> rows;
  std::vector<TokenLength> kv_lens, q_lens;
  std::vector<DenseSequence> dense;
  for (size_t i = 0; i < running.size(); ++i) {
    Req& r = *running[i];
    const uint64_t c = Content(seed_, 'D', r.index, r.seq_len);
    Place(r, r.seq_len, absl::MakeConstSpan(&(*slots)[i], 1), absl::MakeConstSpan(&c, 1));
    r.slots.push_back((*slots)[i]);
    r.history.push_back(c);
    ++r.seq_len;
    rows.push_back(*r.row);
    kv_lens.push_back(TokenLength(static_cast<int32_t>(r.seq_len)));
    q_lens.push_back(TokenLength(1));
    dense.push_back(DenseSequence{r.history, {c}, {}});
  }
  if (failure_.has_value()) return false;
  ForwardBatch fb;
  fb.mode = ForwardMode::kDecode;
  fb.req_rows = rows;
  fb.kv_lens = kv_lens;
  fb.q_lens = q_lens;
  if (!BuildAndCheckForward(fb, dense, /*replay=*/true)) return false;
  for (Req* r : running) {
    ++r->generated;
    report_->set_generated_tokens(report_->generated_tokens() + 1);
    if (r->generated >= r->spec->output_len()) Done(*r);
  }
  return !failure_.has_value();
}

// ---- EAGLE ----

// The verify tree's parents: a chain for top-k 1, else a complete top-k-ary tree in
// breadth-first order.
std::vector<int32_t> TreeParents(int32_t n, int32_t topk) {
  std::vector<int32_t> parents(n);
  parents[0] = -1;
  for (int32_t t = 1; t < n; ++t) parents[t] = topk == 1 ? t - 1 : (t - 1) / topk;
  return parents;
}

bool Run::EagleRound() {
  if (std::none_of(reqs_.begin(), reqs_.end(),
                   [](const Req& r) { return r.state == State::kRunning; })) {
    return false;
  }
  const std::vector<Req*> running = RunningThatFit();
  if (running.empty()) return true;  // every one was retracted
  const int64_t bs = static_cast<int64_t>(running.size());
  const int32_t n = spec_.draft_tokens();
  const DraftDecodeShape shape{spec_.topk(), spec_.steps()};
  std::vector<ReqPoolIndex> rows;
  std::vector<TokenLength> seq_lens;
  for (const Req* r : running) {
    rows.push_back(*r->row);
    seq_lens.push_back(TokenLength(static_cast<int32_t>(r->seq_len)));
  }
  SpecBuildOptions spec_opts;
  spec_opts.page_table = config_.consumers().page_table();

  // 1. Draft-decode: the draft runs' slots are taken under a checkpoint and rolled back.
  {
    if (absl::Status s = alloc_->BeginCheckpoint(); !s.ok()) {
      failure_ = Failure{absl::StrCat("step ", step_, ": ", s.message())};
      return false;
    }
    std::vector<ExtendRequest> requests;
    std::vector<int64_t> draft_end;
    for (const Req* r : running) {
      draft_end.push_back(DraftRowTokens(TokenLength(static_cast<int32_t>(r->seq_len)), shape,
                                         page_size_)
                              .value());
      requests.push_back(ExtendRequest{TokenCount(r->seq_len), TokenCount(draft_end.back()),
                                       LastSlot(*r)});
    }
    absl::StatusOr<std::vector<TokenSlot>> slots = alloc_->AllocateExtend(requests);
    if (!slots.ok()) {
      failure_ = Failure{absl::StrCat("step ", step_, ": draft allocation: ", slots.status().message())};
      return false;
    }
    NoteHighWater();
    // Branch k's step-s token sits at DraftSourcePosition(k) + s; the rest of the run is unused.
    std::vector<std::vector<DenseSequence>> dense(shape.steps);
    int64_t o = 0;
    for (int64_t b = 0; b < bs; ++b) {
      Req& r = *running[b];
      const int64_t len = draft_end[b] - r.seq_len;
      std::vector<uint64_t> contents(len, 0);
      std::vector<std::vector<uint64_t>> branch(shape.topk);
      for (int32_t k = 0; k < shape.topk; ++k) {
        const int64_t start = DraftSourcePosition(seq_lens[b], k, shape, page_size_).value();
        for (int32_t s = 0; s < shape.steps; ++s) {
          const uint64_t c = Content(seed_, 'B', r.index, r.rounds, k, s);
          contents[start + s - r.seq_len] = c;
          branch[k].push_back(c);
        }
      }
      Place(r, r.seq_len, absl::MakeConstSpan(*slots).subspan(o, len), contents);
      o += len;
      for (int32_t s = 0; s < shape.steps; ++s) {
        for (int32_t k = 0; k < shape.topk; ++k) {
          DenseSequence d;
          d.kv = r.history;
          d.kv.insert(d.kv.end(), branch[k].begin(), branch[k].begin() + s + 1);
          d.query = {branch[k][s]};
          dense[s].push_back(std::move(d));
        }
      }
    }
    if (failure_.has_value()) return false;
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<ForwardMetadata>> steps = BuildDraftDecodeMetadata(
        *r2t_, rows, seq_lens, shape, TokenCount(bs * shape.topk), page_size_, spec_opts);
    const double us = MicrosSince(t0);
    if (!steps.ok()) {
      Fail("draft_decode", steps.status(), nullptr, nullptr);
      return false;
    }
    std::vector<const ForwardMetadata*> eager;
    for (int32_t s = 0; s < shape.steps; ++s) {
      CheckEager(absl::StrCat("draft_decode step ", s), (*steps)[s], nullptr, dense[s],
                 s == 0 ? us : 0);
      if (failure_.has_value()) return false;
      eager.push_back(&(*steps)[s]);
    }
    ReplayBatch rb;
    rb.req_rows = rows;
    rb.kv_lens = seq_lens;
    CheckReplay(ForwardMode::kDraftDecode, rb, eager, dense, nullptr);
    if (failure_.has_value()) return false;
    ModeReport& mode = Mode(ForwardMode::kDraftDecode);
    mode.set_forwards(mode.forwards() + 1);
    mode.set_query_rows(mode.query_rows() + bs * shape.topk * shape.steps);
    if (absl::Status s = alloc_->RollBack(); !s.ok()) {
      failure_ = Failure{absl::StrCat("step ", step_, ": ", s.message())};
      return false;
    }
  }

  // 2. Target-verify over the tree, its n tokens at positions [seq_len, seq_len + n).
  const std::vector<int32_t> tree_parents = TreeParents(n, spec_.topk());
  std::vector<int32_t> parents;
  for (int64_t b = 0; b < bs; ++b) parents.insert(parents.end(), tree_parents.begin(), tree_parents.end());
  absl::StatusOr<VerifyTree> tree = BuildVerifyTreeFromParents(parents, seq_lens, TokenLength(n));
  if (!tree.ok()) {
    Fail("target_verify tree", tree.status(), nullptr, nullptr);
    return false;
  }
  std::vector<ExtendRequest> requests;
  for (const Req* r : running) {
    requests.push_back(ExtendRequest{TokenCount(r->seq_len), TokenCount(r->seq_len + n), LastSlot(*r)});
  }
  absl::StatusOr<std::vector<TokenSlot>> tree_slots = alloc_->AllocateExtend(requests);
  if (!tree_slots.ok()) {
    failure_ = Failure{absl::StrCat("step ", step_, ": verify allocation: ", tree_slots.status().message())};
    return false;
  }
  NoteHighWater();
  std::vector<std::vector<uint64_t>> tree_contents(bs);
  std::vector<TokenLength> verify_lens;
  std::vector<DenseSequence> verify_dense;
  for (int64_t b = 0; b < bs; ++b) {
    Req& r = *running[b];
    for (int32_t t = 0; t < n; ++t) tree_contents[b].push_back(Content(seed_, 'T', r.index, r.rounds, t));
    Place(r, r.seq_len, absl::MakeConstSpan(*tree_slots).subspan(b * n, n), tree_contents[b]);
    verify_lens.push_back(TokenLength(static_cast<int32_t>(r.seq_len + n)));
    DenseSequence d;
    d.kv = r.history;
    d.kv.insert(d.kv.end(), tree_contents[b].begin(), tree_contents[b].end());
    d.query = tree_contents[b];
    // Row t sees the prefix and its own ancestors (itself included), walked from the parents.
    const int64_t kv_len = r.seq_len + n;
    d.sees.assign(n * kv_len, 0);
    for (int32_t t = 0; t < n; ++t) {
      std::fill_n(d.sees.begin() + t * kv_len, r.seq_len, 1);
      for (int32_t a = t; a != -1; a = tree_parents[a]) d.sees[t * kv_len + r.seq_len + a] = 1;
    }
    verify_dense.push_back(std::move(d));
  }
  if (failure_.has_value()) return false;
  {
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<ForwardMetadata> m = BuildTargetVerifyMetadata(
        *r2t_, rows, *tree, MaskLayout::kFull, TokenCount(bs * n), page_size_, spec_opts);
    const double us = MicrosSince(t0);
    std::vector<TokenLength> q_lens(bs, TokenLength(n));
    ForwardBatch fb;
    fb.mode = ForwardMode::kTargetVerify;
    fb.req_rows = rows;
    fb.kv_lens = verify_lens;
    fb.q_lens = q_lens;
    fb.tree_mask = tree->sees;
    if (!CheckForward(m, us, fb, verify_dense, /*replay=*/true)) return false;
  }

  // 3. Greedy acceptance: draft token ids are t + 1; the target predicts a random child's.
  std::vector<int32_t> draft_ids(bs * n), predict(bs * n, 0);
  std::bernoulli_distribution hit(scenario_.acceptance().probability());
  for (int64_t b = 0; b < bs; ++b) {
    for (int32_t t = 0; t < n; ++t) {
      draft_ids[b * n + t] = t + 1;
      std::vector<int32_t> children;
      for (int32_t c = 1; c < n; ++c) {
        if (tree_parents[c] == t) children.push_back(c);
      }
      if (!children.empty() && hit(accept_rng_)) {
        predict[b * n + t] = children[accept_rng_() % children.size()] + 1;
      }
    }
  }
  AcceptInputs in;
  in.tree = &*tree;
  in.draft_tokens = draft_ids;
  in.target_predict = predict;
  in.tree_slots = *tree_slots;
  absl::StatusOr<AcceptResult> accepted = AcceptGreedy(in);
  if (!accepted.ok()) {
    Fail("accept", accepted.status(), nullptr, nullptr);
    return false;
  }
  // The accepted path's K/V moves to positions [seq_len, seq_len + kept) (the slots of the
  // tree's first positions); the tree's other slots are freed.
  std::vector<TokenLength> accept_lens, extend_lens;
  std::vector<DenseSequence> extend_dense;
  int64_t extend_rows = 0;
  for (int64_t b = 0; b < bs; ++b) {
    Req& r = *running[b];
    const int64_t kept = std::min<int64_t>(accepted->accept_count[b].value() + 1,
                                           r.spec->output_len() - r.generated);
    const absl::Span<const TokenSlot> slots = absl::MakeConstSpan(*tree_slots).subspan(b * n, n);
    for (int64_t i = 0; i < kept; ++i) {
      const uint64_t c = tree_contents[b][accepted->accept_index[b * n + i]];
      WriteKv(slots[i], c);
      r.history.push_back(c);
      r.slots.push_back(slots[i]);
    }
    if (absl::Status s = alloc_->Free(slots.subspan(kept)); !s.ok()) {
      failure_ = Failure{absl::StrCat("step ", step_, ": freeing rejected drafts: ", s.message())};
      return false;
    }
    r.seq_len += kept;
    r.generated += kept;
    ++r.rounds;
    report_->set_generated_tokens(report_->generated_tokens() + kept);
    report_->set_accepted_draft_tokens(report_->accepted_draft_tokens() + kept - 1);
    accept_lens.push_back(TokenLength(static_cast<int32_t>(kept - 1)));
    extend_lens.push_back(TokenLength(static_cast<int32_t>(r.seq_len)));
    extend_rows += kept;
    DenseSequence d;
    d.kv = r.history;
    d.query.assign(r.history.end() - kept, r.history.end());
    extend_dense.push_back(std::move(d));
  }

  // 4. Draft-extend over the accepted tokens (the variable form).
  {
    DraftExtendBatch batch;
    batch.req_rows = rows;
    batch.kv_lens = extend_lens;
    batch.accept_lens = accept_lens;
    batch.num_draft_tokens = TokenCount(n);
    batch.num_query_rows = TokenCount(extend_rows);
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<ForwardMetadata> m = BuildDraftExtendMetadata(batch, *r2t_, page_size_, spec_opts);
    const double us = MicrosSince(t0);
    std::vector<TokenLength> q_lens;
    for (TokenLength a : accept_lens) q_lens.push_back(TokenLength(a.value() + 1));
    ForwardBatch fb;
    fb.mode = ForwardMode::kDraftExtend;
    fb.req_rows = rows;
    fb.kv_lens = extend_lens;
    fb.q_lens = q_lens;
    if (!CheckForward(m, us, fb, extend_dense, /*replay=*/true)) return false;
  }
  for (Req* r : running) {
    if (r->generated >= r->spec->output_len()) Done(*r);
  }
  return !failure_.has_value();
}

void Run::IdleStep() {
  ForwardBatch fb;
  fb.mode = ForwardMode::kIdle;
  BuildAndCheckForward(fb, {}, /*replay=*/true);
}

// ---- Checks ----

ValidationContext Run::Context(int64_t query_rows) const {
  ValidationContext ctx{alloc_->pool_slots(), page_size_, TokenCount(query_rows)};
  ctx.check_slot_ownership = true;
  return ctx;
}

// The relative L2 error of `got` against `want` (the absolute one when `want` is 0); infinity
// for NaN.
double RelativeError(absl::Span<const float> got, absl::Span<const float> want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    den += double{want[i]} * want[i];
  }
  const double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return std::isnan(err) ? INFINITY : err;
}

// |got - want| / (1 + |want|); 0 when they are equal (both -inf: a row that sees nothing),
// infinity for NaN or one infinity.
double LseError(float got, float want) {
  if (got == want) return 0;
  const double err = std::fabs(double{got} - want) / (1 + std::fabs(double{want}));
  return std::isnan(err) ? INFINITY : err;
}

bool Run::DenseOutputs(const std::vector<DenseSequence>& dense, const std::string& what,
                       DenseRows& out_rows) {
  std::vector<float>& q = out_rows.q;
  std::vector<float>& want = out_rows.want;
  std::vector<float>& want_lse = out_rows.want_lse;
  q.clear();
  want.clear();
  want_lse.clear();
  for (const DenseSequence& d : dense) {
    const int64_t q_at = static_cast<int64_t>(q.size());
    q.resize(q_at + d.query.size() * q_row());
    for (size_t r = 0; r < d.query.size(); ++r) {
      Fill(d.query[r], Vec::kQuery, absl::MakeSpan(q).subspan(q_at + r * q_row(), q_row()));
    }
    k_scratch_.resize(d.kv.size() * kv_row());
    v_scratch_.resize(d.kv.size() * kv_row());
    for (size_t t = 0; t < d.kv.size(); ++t) {
      Fill(d.kv[t], Vec::kKey, absl::MakeSpan(k_scratch_).subspan(t * kv_row(), kv_row()));
      Fill(d.kv[t], Vec::kValue, absl::MakeSpan(v_scratch_).subspan(t * kv_row(), kv_row()));
    }
    const int64_t out_at = static_cast<int64_t>(want.size());
    want.resize(out_at + d.query.size() * q_row());
    const int64_t lse_at = static_cast<int64_t>(want_lse.size());
    want_lse.resize(lse_at + d.query.size() * dims_.num_q_heads);
    const absl::Span<const float> qs = absl::MakeConstSpan(q).subspan(q_at);
    const absl::Span<float> out = absl::MakeSpan(want).subspan(out_at);
    const absl::Span<float> lse = absl::MakeSpan(want_lse).subspan(lse_at);
    const absl::Status s =
        d.sees.empty() ? DenseAttention(dims_, qs, k_scratch_, v_scratch_, out, lse)
                       : DenseMaskedAttention(dims_, qs, k_scratch_, v_scratch_, d.sees, out, lse);
    if (!s.ok()) {
      Fail(absl::StrCat(what, " dense attention"), s, nullptr, nullptr);
      return false;
    }
  }
  return true;
}

double Run::AttentionError(const ForwardMetadataView& m, const DenseRows& dense,
                           const std::string& what) {
  const std::vector<float>& want = dense.want;
  const ReferenceAttentionInputs in{dims_, m, page_size_, dense.q, k_pool_, v_pool_};
  std::vector<float> got(want.size());
  double worst = 0;
  const auto compare = [&](const char* path, const absl::Status& s) {
    if (!s.ok()) {
      Fail(absl::StrCat(what, " ", path, " attention"), s, nullptr, nullptr);
      return;
    }
    const double err = RelativeError(got, want);
    worst = std::max(worst, err);
    if (!(err <= kMaxRelativeError)) {
      Fail(absl::StrCat(what, " ", path, " attention"),
           absl::FailedPreconditionError(absl::StrFormat(
               "relative error %.3g against dense attention (limit %.0e)", err, kMaxRelativeError)),
           nullptr, nullptr);
    }
  };
  compare("token-level", ReferenceAttentionTokenLevel(in, absl::MakeSpan(got)));
  if (!failure_.has_value() && m.page_table.rows() > 0) {
    compare("page-table", ReferenceAttentionPageTable(in, absl::MakeSpan(got)));
  }
  if (!failure_.has_value() && config_.consumers().split_kv().enabled() && m.batch_size() > 0) {
    absl::StatusOr<SplitKvPlan> plan =
        PlanSplitKv(m.qo_indptr, m.kv_indptr, ConfigSplitKvOptions(config_));
    compare("split-KV", plan.ok() ? ReferenceAttentionSplitKv(in, *plan, absl::MakeSpan(got))
                                  : plan.status());
  }
  return worst;
}

void Run::CheckDeviceAttention(const std::string& what, ReplayAttentionInputs in,
                               const DenseRows& dense) {
  const std::vector<float>& want = dense.want;
  if (!kv_pool_synced_) {
    if (absl::Status s = backend_->SyncKvPool(k_pool_, v_pool_); !s.ok()) {
      Fail(absl::StrCat(what, " K/V pool to the backend"), s, nullptr, nullptr);
      return;
    }
    kv_pool_synced_ = true;
  }
  in.q = dense.q;
  absl::StatusOr<std::vector<ReplayAttentionOutput>> outputs = backend_->AttendReplay(in);
  if (!outputs.ok()) {
    Fail(absl::StrCat(what, " attention kernels"), outputs.status(), nullptr, nullptr);
    return;
  }
  // Every path the forward's metadata offers, in AttendReplay's order, and no other.
  std::vector<std::string> want_paths = {"token-level"};
  if (in.metadata.page_table.rows() > 0) want_paths.push_back("page-table");
  if (in.split_kv.work_items > 0) want_paths.push_back("split-KV");
  std::vector<std::string> paths;
  for (const ReplayAttentionOutput& o : *outputs) paths.push_back(o.path);
  if (paths != want_paths) {
    Fail(absl::StrCat(what, " attention kernels"),
         absl::InternalError(absl::StrCat("the backend ran the paths [", absl::StrJoin(paths, ", "),
                                          "], want [", absl::StrJoin(want_paths, ", "), "]")),
         nullptr, nullptr);
    return;
  }
  double worst = 0, worst_lse = 0;
  for (const ReplayAttentionOutput& o : *outputs) {
    const std::string label = absl::StrCat(what, " ", o.path, " attention kernel");
    if (o.out.size() != want.size() || o.lse.size() != dense.want_lse.size()) {
      Fail(label,
           absl::InternalError(absl::StrCat(o.out.size(), " outputs and ", o.lse.size(),
                                            " lse values, want ", want.size(), " and ",
                                            dense.want_lse.size())),
           nullptr, nullptr);
      return;
    }
    for (size_t e = 0; e < o.lse.size(); ++e) {
      const double err = LseError(o.lse[e], dense.want_lse[e]);
      worst_lse = std::max(worst_lse, err);
      if (!(err <= kMaxDeviceLseError)) {
        Fail(label,
             absl::FailedPreconditionError(absl::StrFormat(
                 "query row %d head %d: lse %.6g against dense attention's %.6g (limit %.0e)",
                 e / dims_.num_q_heads, e % dims_.num_q_heads, o.lse[e], dense.want_lse[e],
                 kMaxDeviceLseError)),
             nullptr, nullptr);
        return;
      }
    }
    // Row by row: over the whole forward one wrong token in one row of many would be diluted
    // under the bound.
    for (int64_t at = 0; at < static_cast<int64_t>(want.size()); at += q_row()) {
      const double err = RelativeError(absl::MakeConstSpan(o.out).subspan(at, q_row()),
                                       absl::MakeConstSpan(want).subspan(at, q_row()));
      worst = std::max(worst, err);
      if (!(err <= kMaxDeviceRelativeError)) {
        Fail(label,
             absl::FailedPreconditionError(absl::StrFormat(
                 "query row %d: relative error %.3g against dense attention (limit %.0e)",
                 at / q_row(), err, kMaxDeviceRelativeError)),
             nullptr, nullptr);
        return;
      }
    }
  }
  report_->set_device_attention_checks(report_->device_attention_checks() + 1);
  report_->set_max_device_relative_error(std::max(report_->max_device_relative_error(), worst));
  report_->set_max_device_lse_error(std::max(report_->max_device_lse_error(), worst_lse));
  if (in.split_kv.reduce_items > 0) {
    report_->set_device_split_merges(report_->device_split_merges() + 1);
  }
}

void Run::CheckView(const std::string& what, const ForwardMetadataView& m,
                    const std::vector<DenseSequence>& dense, DenseRows* rows) {
  int64_t query_rows = 0;
  for (const DenseSequence& d : dense) query_rows += static_cast<int64_t>(d.query.size());
  if (absl::Status s = ValidateForwardMetadata(m, Context(query_rows)); !s.ok()) {
    Fail(what, s, nullptr, nullptr);
    return;
  }
  if (!checked_step() || dense.empty()) return;
  DenseRows local;
  DenseRows& d = rows != nullptr ? *rows : local;
  if (!DenseOutputs(dense, what, d)) return;
  const double err = AttentionError(m, d, what);
  report_->set_attention_checks(report_->attention_checks() + 1);
  report_->set_max_relative_error(std::max(report_->max_relative_error(), err));
}

bool Run::BuildAndCheckForward(const ForwardBatch& batch, const std::vector<DenseSequence>& dense,
                               bool replay) {
  BuildOptions opts;
  opts.page_table = config_.consumers().page_table();
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<ForwardMetadata> m = BuildForwardMetadata(batch, *r2t_, page_size_, opts);
  return CheckForward(m, MicrosSince(t0), batch, dense, replay);
}

bool Run::CheckForward(absl::StatusOr<ForwardMetadata>& m, double build_us,
                       const ForwardBatch& batch, const std::vector<DenseSequence>& dense,
                       bool replay) {
  const std::string name(ForwardModeName(batch.mode));
  if (!m.ok()) {
    Fail(name, m.status(), &batch, nullptr);
    return false;
  }
  CheckEager(name, *m, &batch, dense, build_us);
  if (failure_.has_value()) return false;
  if (replay) {
    ReplayBatch rb;
    rb.req_rows = batch.req_rows;
    rb.kv_lens = batch.kv_lens;
    if (batch.mode == ForwardMode::kDraftExtend) rb.q_lens = batch.q_lens;
    rb.tree_mask = batch.tree_mask;
    CheckReplay(batch.mode, rb, {&*m}, {dense}, &batch);
    if (failure_.has_value()) return false;
  }
  ModeReport& mode = Mode(batch.mode);
  mode.set_forwards(mode.forwards() + 1);
  mode.set_query_rows(mode.query_rows() + m->qo_indptr.back().value());
  return true;
}

void Run::CheckEager(const std::string& what, ForwardMetadata& m, const ForwardBatch* batch,
                     const std::vector<DenseSequence>& dense, double build_us) {
  ++eager_forwards_;
  eager_us_ += build_us;
  if (fault_pending_ && m.kv_indptr.size() > 1 && m.kv_indptr[1].value() > 1) {
    fault_pending_ = false;
    m.kv_indices[0] = m.kv_indices[1];
  }
  const std::string label = absl::StrCat(what, " (eager)");
  CheckView(label, m.view(), dense);
  if (failure_.has_value()) {
    if (batch != nullptr) Snapshot(label, *batch, m);
    return;
  }
  if (options_.dump_all && batch != nullptr) Snapshot(label, *batch, m);
}

std::optional<int64_t> Run::Bucket(int64_t bs) const {
  // An idle batch replays the smallest bucket.
  const absl::StatusOr<BucketChoice> choice =
      buckets_.Choose(std::max<int64_t>(bs, 1));
  if (!choice.ok() || choice->eager) return std::nullopt;
  return choice->bucket;
}

void Run::CheckReplay(ForwardMode mode, const ReplayBatch& batch,
                      const std::vector<const ForwardMetadata*>& eager,
                      const std::vector<std::vector<DenseSequence>>& dense,
                      const ForwardBatch* snapshot_batch) {
  const std::optional<int64_t> bucket = Bucket(static_cast<int64_t>(batch.req_rows.size()));
  if (!bucket.has_value()) {
    report_->set_eager_fallbacks(report_->eager_fallbacks() + 1);
    return;
  }
  auto it = handles_.find({mode, *bucket});
  if (it == handles_.end()) {
    std::optional<TokenLength> q_len;
    if (mode == ForwardMode::kDraftExtend) q_len = TokenLength(spec_.draft_tokens());
    absl::StatusOr<CaptureHandle> handle = graph_->Capture(*bucket, mode, q_len);
    if (handle.status().code() == absl::StatusCode::kUnimplemented) {
      // The backend's writer cannot write this mode (or this config's split-KV plan).
      report_->set_replays_unsupported(report_->replays_unsupported() + 1);
      return;
    }
    if (!handle.ok()) {
      Fail(absl::StrCat(ForwardModeName(mode), " capture of bucket ", *bucket), handle.status(),
           nullptr, nullptr);
      return;
    }
    report_->set_graph_captures(report_->graph_captures() + 1);
    it = handles_.emplace(std::make_pair(mode, *bucket), *handle).first;
  }
  const std::string what = absl::StrCat(ForwardModeName(mode), " (replay, bucket ", *bucket, ")");
  if (absl::Status s = backend_->SyncReqToToken(*r2t_); !s.ok()) {
    Fail(what, s, nullptr, nullptr);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<ReplayResult> replay = graph_->Replay(it->second, batch);
  replay_us_ += MicrosSince(t0);
  ++replays_;
  if (!replay.ok()) {
    Fail(what, replay.status(), nullptr, nullptr);
    return;
  }
  if (absl::Status s = backend_->CheckAfterReplay(); !s.ok()) {
    Fail(what, s, nullptr, nullptr);
    return;
  }
  std::vector<ForwardMetadataView> views;
  if (mode == ForwardMode::kDraftDecode) {
    views.assign(replay->draft_steps.begin(), replay->draft_steps.end());
  } else {
    views.push_back(replay->metadata);
  }
  if (views.size() != eager.size()) {
    Fail(what, absl::InternalError(absl::StrCat(views.size(), " views for ", eager.size(), " forwards")),
         nullptr, nullptr);
    return;
  }
  for (size_t i = 0; i < views.size(); ++i) {
    const std::string label =
        views.size() > 1 ? absl::StrCat(what, " step ", i) : what;
    absl::StatusOr<ForwardMetadata> host = ReadBack(views[i]);
    if (!host.ok()) {
      Fail(label, host.status(), nullptr, nullptr);
      return;
    }
    if (absl::Status s = DiffMetadata(host->view(), eager[i]->view()); !s.ok()) {
      Fail(absl::StrCat(label, " differs from the eager metadata"), s, snapshot_batch, &*host);
      return;
    }
    // The dense attention CheckView compared with serves the kernels' check too.
    DenseRows rows;
    CheckView(label, host->view(), dense[i], &rows);
    if (failure_.has_value()) return;
    if (device_attention_ && !rows.want.empty()) {
      ReplayAttentionInputs in;
      in.dims = dims_;
      in.page_size = page_size_;
      in.metadata = views[i];
      if (mode == ForwardMode::kDecode && replay->split_kv.work_items > 0) {
        in.padded = replay->padded;
        in.split_kv = replay->split_kv;
        in.split_layout = ConfigSplitKvOptions(config_).layout;
        in.split_buffers = graph_->buffers().split_kv;
      }
      CheckDeviceAttention(label, in, rows);
      if (failure_.has_value()) return;
    }
  }
  // The whole bucket, as a kernel captured for it reads it, validates with its padded rows on
  // the padding page against the rows of the padded query tensor (the bucket's requests or
  // branches times the captured rows). Its qo_indptr ends there, or before in the variable-row
  // form, whose tail no request claims.
  std::vector<ForwardMetadataView> padded;
  if (mode == ForwardMode::kDraftDecode) {
    padded.assign(replay->padded_draft_steps.begin(), replay->padded_draft_steps.end());
  } else {
    padded.push_back(replay->padded);
  }
  const int64_t requests = mode == ForwardMode::kDraftDecode ? *bucket * spec_.topk() : *bucket;
  for (size_t i = 0; i < padded.size(); ++i) {
    const std::string label = absl::StrCat(what, padded.size() > 1 ? absl::StrCat(" step ", i) : "",
                                           ", the padded bucket");
    absl::StatusOr<ForwardMetadata> host = ReadBack(padded[i]);
    if (!host.ok()) {
      Fail(label, host.status(), nullptr, nullptr);
      return;
    }
    const int64_t captured_rows = it->second.q_len_per_request.value();
    ValidationContext ctx = Context(requests * captured_rows);
    ctx.allow_padding_page = true;
    ctx.allow_unclaimed_rows = !batch.q_lens.empty();
    if (absl::Status s = ValidateForwardMetadata(host->view(), ctx); !s.ok()) {
      Fail(label, s, nullptr, nullptr);
      return;
    }
    // The tail of the variable-row form: exactly the rows the real requests leave unused.
    int64_t claimed = requests * captured_rows;
    for (const TokenLength q : batch.q_lens) claimed -= captured_rows - q.value();
    if (host->view().qo_indptr.back().value() != claimed) {
      Fail(label,
           absl::InternalError(
               absl::StrCat("qo_indptr[bucket] = ", host->view().qo_indptr.back().value(),
                            ", the real and padded rows add up to ", claimed)),
           nullptr, nullptr);
      return;
    }
  }
  ModeReport& m = Mode(mode);
  m.set_replays(m.replays() + 1);
}

template <typename T>
absl::Status Run::CopyToHost(absl::Span<const T> from, int64_t count, std::vector<T>& to) {
  if (count < 0 || count > static_cast<int64_t>(from.size())) {
    return absl::OutOfRangeError(absl::StrCat("a replayed array of ", from.size(),
                                              " entries read up to ", count));
  }
  to.resize(count);
  if (count == 0) return absl::OkStatus();
  const uintptr_t at = reinterpret_cast<uintptr_t>(from.data());
  const int64_t bytes = count * static_cast<int64_t>(sizeof(T));
  for (const BufferSpec& spec : graph_->plan().buffers) {
    const DeviceBuffer b = graph_->buffer(spec.name);
    const uintptr_t base = reinterpret_cast<uintptr_t>(b.ptr);
    if (at >= base && at + bytes <= base + b.bytes) {
      return backend_->memory().CopyToHost(to.data(), b, static_cast<int64_t>(at - base), bytes);
    }
  }
  return absl::InternalError("a replayed array lies outside every graph buffer");
}

absl::StatusOr<ForwardMetadata> Run::ReadBack(const ForwardMetadataView& v) {
  const int64_t bs = v.batch_size();
  ForwardMetadata m;
  m.mode = v.mode;
  m.max_q_len = v.max_q_len;
  m.max_kv_len = v.max_kv_len;
  m.mask_layout = v.custom_mask.layout;
  absl::Status s = CopyToHost(v.kv_indptr, bs + 1, m.kv_indptr);
  if (s.ok()) s = CopyToHost(v.qo_indptr, bs + 1, m.qo_indptr);
  if (s.ok()) s = CopyToHost(v.kv_lens, bs, m.kv_lens);
  if (s.ok()) s = CopyToHost(v.kv_last_page_len, bs, m.kv_last_page_len);
  if (s.ok()) s = CopyToHost(v.kv_indices, m.kv_indptr.back().value(), m.kv_indices);
  if (s.ok() && !v.custom_mask.mask_indptr.empty()) {
    s = CopyToHost(v.custom_mask.mask_indptr, bs + 1, m.mask_indptr);
    if (s.ok()) s = CopyToHost(v.custom_mask.mask, m.mask_indptr.back(), m.custom_mask);
  }
  if (s.ok() && v.page_table.rows() > 0) {
    m.page_table = PageTable(v.page_table.rows(), v.page_table.cols());
    std::vector<PageId> entries;
    s = CopyToHost(v.page_table.entries(), static_cast<int64_t>(v.page_table.entries().size()),
                   entries);
    if (s.ok()) std::copy(entries.begin(), entries.end(), m.page_table.span().entries().begin());
  }
  if (!s.ok()) return s;
  return m;
}

void Run::Fail(const std::string& what, const absl::Status& status, const ForwardBatch* batch,
               const ForwardMetadata* m) {
  if (failure_.has_value()) return;
  failure_ = Failure{absl::StrCat("step ", step_, ", ", what, ": ", status.ToString())};
  if (batch != nullptr && m != nullptr) Snapshot(what, *batch, *m);
}

void Run::Snapshot(const std::string& what, const ForwardBatch& batch, const ForwardMetadata& m) {
  if (options_.dump_dir.empty()) return;
  absl::StatusOr<MetadataSnapshot> snap =
      MakeSnapshot(batch, *r2t_, page_size_, alloc_->pool_slots(), m);
  std::string file = absl::StrFormat("%s/%s_ps%d_step%05d_%s.textproto", options_.dump_dir,
                                     scenario_.name(), page_size_.tokens(), step_,
                                     ForwardModeName(batch.mode));
  if (!snap.ok()) {
    if (!failure_.has_value()) failure_ = Failure{absl::StrCat("snapshot: ", snap.status().message())};
    return;
  }
  snap->set_note(absl::StrCat("attnmeta_sim: ", workload_.name(), ", scenario ", scenario_.name(),
                              ", page size ", page_size_.tokens(), ", step ", step_, ", ", what));
  std::ofstream out(file, std::ios::trunc);
  out << SnapshotToText(*snap);
  out.close();
  if (!out) {
    if (!failure_.has_value()) failure_ = Failure{absl::StrCat("cannot write ", file)};
    return;
  }
  report_->add_snapshots(file);
}

ModeReport& Run::Mode(ForwardMode mode) {
  const absl::string_view name = ForwardModeName(mode);
  for (ModeReport& m : *report_->mutable_modes()) {
    if (m.mode() == name) return m;
  }
  ModeReport* m = report_->add_modes();
  m->set_mode(std::string(name));
  return *m;
}

}  // namespace

absl::StatusOr<Workload> PrepareWorkload(const Workload& workload, const SimOptions& options) {
  Workload w = workload;
  if (!options.page_sizes.empty()) {
    w.clear_page_sizes();
    for (int64_t ps : options.page_sizes) w.add_page_sizes(ps);
  }
  if (absl::Status s = ValidateWorkload(w); !s.ok()) return s;
  if (options.max_steps < 0) return absl::InvalidArgumentError("--steps must be >= 0");
  const std::vector<std::string> backends = ReplayBackendNames();
  if (std::find(backends.begin(), backends.end(), options.backend) == backends.end()) {
    return absl::InvalidArgumentError(absl::StrCat("--backend=", options.backend, ": this build has ",
                                                   absl::StrJoin(backends, ", ")));
  }
  if (options.dump_all && options.dump_dir.empty()) {
    return absl::InvalidArgumentError("--dump_all needs --dump_dir");
  }
  if (!options.scenario.empty()) {
    const auto named =
        std::find_if(w.scenarios().begin(), w.scenarios().end(),
                     [&](const Scenario& s) { return s.name() == options.scenario; });
    if (named == w.scenarios().end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--scenario=", options.scenario, ": the workload has no such scenario"));
    }
    const Scenario only = *named;
    w.clear_scenarios();
    *w.add_scenarios() = only;
  }
  return w;
}

absl::StatusOr<SimReport> RunWorkload(const Workload& workload, const SimOptions& options) {
  absl::StatusOr<Workload> prepared = PrepareWorkload(workload, options);
  if (!prepared.ok()) return prepared.status();
  const Workload& w = *prepared;
  // A backend that cannot start (no GPU visible) would fail every run: an error before any.
  if (!options.make_backend) {
    absl::StatusOr<ReqToTokenPool> probe_table = ReqToTokenPool::Create(1, TokenCount(1));
    if (!probe_table.ok()) return probe_table.status();
    absl::StatusOr<std::unique_ptr<ReplayBackend>> probe =
        MakeReplayBackend(options.backend, *probe_table, TokenCount(1));
    if (!probe.ok()) return probe.status();
  }
  const uint64_t seed = options.seed.value_or(w.seed());
  SimReport report;
  report.set_workload(w.name());
  report.set_seed(seed);
  bool passed = true;
  for (const Scenario& scenario : w.scenarios()) {
    for (int64_t ps : w.page_sizes()) {
      RunReport* run_report = report.add_runs();
      Run run(w, scenario, *PageSize::Create(ps), Mix(seed ^ Mix(ps)), options, run_report);
      run.Execute();
      passed = passed && run_report->passed();
    }
  }
  report.set_passed(passed);
  return report;
}

std::string FormatReportTable(const SimReport& report) {
  std::string out =
      absl::StrCat("replay backend: ", report.runs().empty() ? "" : report.runs(0).backend(),
                   ", seed ", report.seed(), "\n");
  out += absl::StrFormat(
      "%-14s %4s %6s  %-62s %7s %7s %6s %9s %9s %9s %8s %5s %9s %9s %7s %9s %9s %8s %8s  %s\n",
      "scenario", "ps", "steps", "forwards by mode (replayed)", "prefill", "output", "accept",
      "retr/back", "pages hw", "graph B", "replays", "eager", "fall/unsup", "max err", "kernels",
      "kern err", "lse err", "build us", "replay us", "result");
  for (const RunReport& r : report.runs()) {
    std::string modes;
    int64_t replays = 0, forwards = 0;
    for (const ModeReport& m : r.modes()) {
      absl::StrAppend(&modes, modes.empty() ? "" : " ", m.mode(), ":", m.forwards());
      if (m.replays() > 0) absl::StrAppend(&modes, "(", m.replays(), ")");
      replays += m.replays();
      forwards += m.forwards();
    }
    // The attention kernels' errors, or "-" where no kernel ran.
    auto kernel_error = [&r](double e) {
      return r.device_attention_checks() > 0 ? absl::StrFormat("%.2e", e) : std::string("-");
    };
    out += absl::StrFormat(
        "%-14s %4d %6d  %-62s %7d %7d %6d %4d/%-4d %4d/%-4d %9d %8d %5d %4d/%-4d %9.2e %7d %9s "
        "%9s %8.1f %8.1f  %s\n",
        r.scenario(), r.page_size(), r.steps(), modes, r.prefill_tokens(), r.generated_tokens(),
        r.accepted_draft_tokens(), r.retractions(), r.admission_backoffs(), r.pages_high_water(),
        r.pool_pages(), r.graph_buffer_bytes(), replays, forwards, r.eager_fallbacks(),
        r.replays_unsupported(), r.max_relative_error(), r.device_attention_checks(),
        kernel_error(r.max_device_relative_error()), kernel_error(r.max_device_lse_error()),
        r.eager_build_us_per_forward(), r.replay_us_per_forward(),
        r.passed() ? (r.finished() ? "PASS" : "PASS (stopped by --steps)") : "FAIL");
    if (!r.passed()) {
      out += absl::StrCat("    failure: ", r.failure(), "\n    rerun alone: --seed=", report.seed(),
                          " --scenario=", r.scenario(), " --page_sizes=", r.page_size(),
                          r.backend() == "cpu" ? "" : absl::StrCat(" --backend=", r.backend()),
                          " on the same workload\n");
    }
    for (const std::string& s : r.snapshots()) out += absl::StrCat("    snapshot: ", s, "\n");
  }
  out += report.passed() ? "PASS\n" : "FAIL\n";
  return out;
}

absl::StatusOr<std::string> ReportToJson(const SimReport& report) {
  std::string json;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.always_print_primitive_fields = true;
  opts.preserve_proto_field_names = true;
  const auto status = google::protobuf::util::MessageToJsonString(report, &json, opts);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("report to JSON: ", status.ToString()));
  }
  return json;
}

}  // namespace attnmeta
