// Model-based randomized test of the whole stack (DESIGN.md section 2, tests/): a stream of
// operations (admit, extend, decode, verify then greedy accept, free, capture, reserve,
// replay) drives the real subsystem (PagedTokenAllocator, ReqToTokenPool, BuildForwardMetadata,
// BuildTargetVerifyMetadata, AcceptGreedy, and a GraphState on host memory with the host
// writer) and a naive shadow model: for every request, the slot of each of its tokens as the
// allocator handed it out. After every step the table and the allocator must agree with the
// model. Every forward's metadata, eager and replayed through a captured bucket, must equal
// the arrays the model derives with plain loops (not the builders), the tree mask included,
// and must validate with slot ownership. Acceptance is checked against a walk of the tree
// written here.
//
// On failure it prints the seed, the step, the last operations and the command that reruns it:
//   ./bazelw test //tests:serving_model_test --test_env=ATTNMETA_MODEL_SEED=<seed>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attention/graph/graph_state.h"
#include "attention/graph/host_device_memory.h"
#include "attention/graph/host_metadata_writer.h"
#include "attention/graph/testing/graph_harness.h"
#include "attention/metadata/builders.h"
#include "attention/metadata/validator.h"
#include "gtest/gtest.h"
#include "kvcache/paged_token_allocator.h"
#include "kvcache/req_to_token_pool.h"
#include "spec_decode/greedy_accept.h"
#include "spec_decode/speculative_metadata.h"
#include "spec_decode/verify_tree.h"

namespace attnmeta {
namespace {

constexpr int kSteps = 1000;
constexpr int32_t kMaxReqs = 10;
constexpr int64_t kMaxContext = 192;
constexpr int32_t kDraftTokens = 4;   // verify tree tokens per request, the root included
constexpr int32_t kMaxQueryRows = 4;  // the config's max_query_rows_per_request
constexpr int32_t kCapacity = 8;      // the graph buffers' first batch capacity

// What a forward's metadata must be, from the model, by plain loops.
struct Expected {
  ForwardMode mode = ForwardMode::kIdle;
  std::vector<int32_t> kv_indptr{0}, qo_indptr{0}, kv_lens, last_page_len, kv_indices;
  std::vector<std::vector<int32_t>> pages;  // per request, the page of each of its pages
  int64_t max_q = 0, max_kv = 0;
  std::vector<uint8_t> mask;            // target-verify: the FULL blocks, request after request
  std::vector<int64_t> mask_indptr{0};  // target-verify: where each request's block starts
  int64_t query_rows() const { return qo_indptr.back(); }
};

// The run's seeds: 1 and 2, or the one ATTNMETA_MODEL_SEED names (0 when it is not a number,
// which the test reports).
std::vector<uint64_t> Seeds() {
  const char* env = std::getenv("ATTNMETA_MODEL_SEED");
  if (env == nullptr) return {1, 2};
  char* end = nullptr;
  const uint64_t seed = std::strtoull(env, &end, 10);
  if (*env == '\0' || *end != '\0') return {0};
  return {seed};
}

class ServingModelRun {
 public:
  ServingModelRun(int64_t page_size, uint64_t seed)
      : ps_(page_size),
        seed_(seed),
        rng_(seed),
        num_pages_(std::max<int64_t>(10, 480 / page_size)),
        alloc_(*PagedTokenAllocator::Create(PageCount(num_pages_), *PageSize::Create(page_size),
                                            FreePagePolicy::Shuffled(seed))),
        pool_(*ReqToTokenPool::Create(kMaxReqs, TokenCount(kMaxContext))) {
    testing::TestConfigOptions o;
    o.max_batch_size = kCapacity;
    o.max_context_len = kMaxContext - kDraftTokens;
    o.draft_tokens = kDraftTokens;
    o.topk = 1;
    o.steps = kDraftTokens - 1;
    o.max_query_rows_per_request = kMaxQueryRows;
    config_ = testing::MakeTestConfig(page_size, o);
    auto state = GraphState::Create(config_, &pool_, alloc_.page_size(), &memory_, &writer_);
    EXPECT_TRUE(state.ok()) << state.status();
    if (state.ok()) graph_ = *std::move(state);
  }

  void Run() {
    ASSERT_NE(graph_, nullptr);
    for (step_ = 0; step_ < kSteps && !::testing::Test::HasFailure(); ++step_) {
      const int op = Uniform(0, 99);
      if (op < 16)
        Admit();
      else if (op < 34)
        Extend();
      else if (op < 62)
        Decode();
      else if (op < 80)
        VerifyAndAccept();
      else if (op < 90)
        FreeRequest();
      else if (op < 96)
        CaptureBucket();
      else
        ReserveMore();
      CheckState();
    }
    // The stream must have reached every path it claims to test.
    EXPECT_GT(replays_, kSteps / 4) << Context();
    EXPECT_GT(accepted_, 0) << Context();
    EXPECT_GT(verifies_, 10) << Context();
    EXPECT_GT(refused_, 0) << "the pool never ran short" << Context();
    std::printf(
        "page size %lld, seed %llu: %lld forwards (%lld replayed), %lld verifies "
        "(%lld draft tokens accepted), %lld allocations refused\n",
        static_cast<long long>(ps_), static_cast<unsigned long long>(seed_),
        static_cast<long long>(forwards_), static_cast<long long>(replays_),
        static_cast<long long>(verifies_), static_cast<long long>(accepted_),
        static_cast<long long>(refused_));
  }

 private:
  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

  void Log(std::string op) {
    ops_.push_back(absl::StrCat(step_, ": ", op));
    if (ops_.size() > 12) ops_.pop_front();
  }

  std::string Context() const {
    return absl::StrCat("\npage size ", ps_, ", seed ", seed_, ", step ", step_,
                        "; last operations:\n  ", absl::StrJoin(ops_, "\n  "),
                        "\nrerun: ./bazelw test //tests:serving_model_test "
                        "--test_env=ATTNMETA_MODEL_SEED=",
                        seed_);
  }

  // Up to `most` distinct running requests, in random order; none with fewer than `room`
  // positions left in its row.
  std::vector<int> Pick(int64_t most, int64_t room) {
    std::vector<int> ids;
    for (const auto& [id, r] : reqs_) {
      if (static_cast<int64_t>(r.size()) + room <= kMaxContext - kDraftTokens) ids.push_back(id);
    }
    std::shuffle(ids.begin(), ids.end(), rng_);
    if (!ids.empty()) ids.resize(Uniform(1, std::min<int64_t>(most, ids.size())));
    return ids;
  }

  int64_t FreePagesInModel() const {
    std::set<int64_t> used;
    for (const auto& [id, r] : reqs_) {
      for (TokenSlot s : r) used.insert(s.value() / ps_);
    }
    return num_pages_ - static_cast<int64_t>(used.size());
  }

  // New slots for `ids`, each growing by grow[k] tokens from its current length, through the
  // allocator's extend (decode: one token each through its decode). Writes them to the table
  // and the model. False (and nothing changed, checked) when the pool is short.
  bool Grow(const std::vector<int>& ids, const std::vector<int64_t>& grow, bool decode) {
    const int64_t free_before = alloc_.free_pages().value();
    absl::StatusOr<std::vector<TokenSlot>> slots;
    if (decode) {
      std::vector<DecodeRequest> dr;
      for (int id : ids) {
        const std::vector<TokenSlot>& r = reqs_[id];
        dr.push_back(
            {TokenCount(static_cast<int64_t>(r.size()) + 1), r.empty() ? TokenSlot() : r.back()});
      }
      slots = alloc_.AllocateDecode(dr);
    } else {
      std::vector<ExtendRequest> er;
      for (size_t k = 0; k < ids.size(); ++k) {
        const std::vector<TokenSlot>& r = reqs_[ids[k]];
        const int64_t len = static_cast<int64_t>(r.size());
        er.push_back(
            {TokenCount(len), TokenCount(len + grow[k]), r.empty() ? TokenSlot() : r.back()});
      }
      slots = alloc_.AllocateExtend(er);
    }
    if (!slots.ok()) {
      EXPECT_EQ(slots.status().code(), absl::StatusCode::kResourceExhausted)
          << slots.status() << Context();
      EXPECT_EQ(alloc_.free_pages().value(), free_before)
          << "a refused allocation changed the pool" << Context();
      ++refused_;
      return false;
    }
    int64_t at = 0;
    for (size_t k = 0; k < ids.size(); ++k) {
      std::vector<TokenSlot>& r = reqs_[ids[k]];
      const absl::Span<const TokenSlot> mine =
          absl::MakeConstSpan(*slots).subspan(at, static_cast<size_t>(grow[k]));
      EXPECT_TRUE(pool_.Write(rows_[ids[k]], TokenCount(static_cast<int64_t>(r.size())), mine).ok())
          << Context();
      r.insert(r.end(), mine.begin(), mine.end());
      at += grow[k];
    }
    return true;
  }

  void Admit() {
    if (pool_.num_free_rows() == 0) return;
    const int64_t prompt = Uniform(1, 40);
    Log(absl::StrCat("admit a prompt of ", prompt));
    absl::StatusOr<ReqPoolIndex> row = pool_.Allocate();
    ASSERT_TRUE(row.ok()) << row.status() << Context();
    const int id = next_id_++;
    reqs_[id] = {};
    rows_[id] = *row;
    if (!Grow({id}, {prompt}, /*decode=*/false)) {
      reqs_.erase(id);
      rows_.erase(id);
      ASSERT_TRUE(pool_.Free(*row).ok()) << Context();
      return;
    }
    Forward(ForwardMode::kExtend, {id}, {prompt});
  }

  void Extend() {
    const std::vector<int> ids = Pick(kCapacity, 8);
    if (ids.empty()) return;
    std::vector<int64_t> q;
    for (size_t k = 0; k < ids.size(); ++k) q.push_back(Uniform(1, 8));
    Log(absl::StrCat("extend ", absl::StrJoin(ids, ","), " by ", absl::StrJoin(q, ",")));
    if (Grow(ids, q, /*decode=*/false)) Forward(ForwardMode::kExtend, ids, q);
  }

  void Decode() {
    const std::vector<int> ids = Pick(kMaxReqs, 1);
    if (ids.empty()) return;
    Log(absl::StrCat("decode ", absl::StrJoin(ids, ",")));
    const std::vector<int64_t> q(ids.size(), 1);
    if (Grow(ids, q, /*decode=*/true)) Forward(ForwardMode::kDecode, ids, q);
  }

  // The model's metadata of `ids` after their growth, q[k] query rows each (their last
  // tokens); with a verify tree (`parents`, [ids.size() * n]), its FULL mask too.
  Expected Expect(ForwardMode mode, const std::vector<int>& ids, const std::vector<int64_t>& q,
                  const std::vector<int32_t>& parents = {}) const {
    Expected e;
    e.mode = mode;
    for (size_t k = 0; k < ids.size(); ++k) {
      const std::vector<TokenSlot>& r = reqs_.at(ids[k]);
      const int64_t len = static_cast<int64_t>(r.size());
      e.kv_lens.push_back(static_cast<int32_t>(len));
      e.kv_indptr.push_back(e.kv_indptr.back() + static_cast<int32_t>(len));
      e.qo_indptr.push_back(e.qo_indptr.back() + static_cast<int32_t>(q[k]));
      e.last_page_len.push_back(static_cast<int32_t>(len == 0 ? 0 : (len - 1) % ps_ + 1));
      std::vector<int32_t> pages;
      for (int64_t t = 0; t < len; ++t) {
        e.kv_indices.push_back(r[t].value());
        if (t % ps_ == 0) pages.push_back(static_cast<int32_t>(r[t].value() / ps_));
      }
      e.pages.push_back(pages);
      e.max_q = std::max(e.max_q, q[k]);
      e.max_kv = std::max(e.max_kv, len);
      if (parents.empty()) continue;
      // Row t of a verify block sees the whole prefix and its own ancestors and itself.
      const int64_t n = q[k];
      for (int64_t t = 0; t < n; ++t) {
        std::vector<uint8_t> sees(n, 0);
        for (int64_t a = t; a >= 0; a = parents[k * n + a]) sees[a] = 1;
        for (int64_t c = 0; c < len; ++c) e.mask.push_back(c < len - n ? 1 : sees[c - (len - n)]);
      }
      e.mask_indptr.push_back(static_cast<int64_t>(e.mask.size()));
    }
    return e;
  }

  // `exact_mask`: eager metadata holds exactly the mask's blocks; a replay's fixed buffer more.
  void ExpectEqual(const ForwardMetadataView& v, const Expected& e, const std::string& what,
                   bool exact_mask) {
    SCOPED_TRACE(what);
    auto ints = [](auto span) {
      std::vector<int32_t> out;
      for (const auto& x : span) out.push_back(x.value());
      return out;
    };
    EXPECT_EQ(v.mode, e.mode) << Context();
    EXPECT_EQ(ints(v.kv_indptr), e.kv_indptr) << Context();
    EXPECT_EQ(ints(v.qo_indptr), e.qo_indptr) << Context();
    EXPECT_EQ(ints(v.kv_lens), e.kv_lens) << Context();
    EXPECT_EQ(ints(v.kv_last_page_len), e.last_page_len) << Context();
    EXPECT_EQ(ints(v.kv_indices), e.kv_indices) << Context();
    EXPECT_EQ(v.max_q_len.value(), e.max_q) << Context();
    EXPECT_EQ(v.max_kv_len.value(), e.max_kv) << Context();
    ASSERT_EQ(v.page_table.rows(), static_cast<int64_t>(e.pages.size())) << Context();
    for (size_t i = 0; i < e.pages.size(); ++i) {
      const std::vector<int32_t> row = ints(v.page_table.row(static_cast<int64_t>(i)));
      ASSERT_GE(row.size(), e.pages[i].size()) << "page-table row " << i << Context();
      for (size_t j = 0; j < row.size(); ++j) {
        ASSERT_EQ(row[j], j < e.pages[i].size() ? e.pages[i][j] : kPaddingPage.value())
            << "page-table row " << i << " column " << j << Context();
      }
    }
    if (e.mask.empty()) {
      EXPECT_EQ(v.custom_mask.layout, MaskLayout::kNone) << Context();
    } else {
      ASSERT_EQ(v.custom_mask.layout, MaskLayout::kFull) << Context();
      EXPECT_EQ(
          std::vector<int64_t>(v.custom_mask.mask_indptr.begin(), v.custom_mask.mask_indptr.end()),
          e.mask_indptr)
          << Context();
      // Exactly the blocks when eager; a replay's fixed buffer may be longer.
      if (exact_mask) {
        EXPECT_EQ(v.custom_mask.mask.size(), e.mask.size()) << Context();
      }
      ASSERT_GE(v.custom_mask.mask.size(), e.mask.size()) << Context();
      EXPECT_EQ(std::vector<uint8_t>(v.custom_mask.mask.begin(),
                                     v.custom_mask.mask.begin() + e.mask.size()),
                e.mask)
          << Context();
    }
    ValidationContext ctx{alloc_.pool_slots(), alloc_.page_size(), TokenCount(e.query_rows())};
    ctx.check_slot_ownership = true;
    const absl::Status valid = ValidateForwardMetadata(v, ctx);
    EXPECT_TRUE(valid.ok()) << valid << Context();
  }

  // A captured bucket of `mode` for `bs` requests with `q` query rows each at most: the first
  // captured that fits (the newest capture first), else one captured now.
  absl::StatusOr<CaptureHandle> HandleFor(ForwardMode mode, int64_t bs, int64_t q) {
    for (const CaptureHandle& h : handles_) {
      if (h.mode == mode && h.bucket >= bs && h.q_len_per_request.value() >= q) return h;
    }
    if (bs > capacity_) return absl::NotFoundError("no bucket");
    const int64_t bucket = std::min<int64_t>(capacity_, bs + Uniform(0, 2));
    absl::StatusOr<CaptureHandle> h =
        graph_->Capture(bucket, mode, TokenLength(static_cast<int32_t>(q)));
    if (h.ok()) handles_.push_back(*h);
    return h;
  }

  // The eager metadata and a replay of `ids` (their growth already made), both against the
  // model.
  void Forward(ForwardMode mode, const std::vector<int>& ids, const std::vector<int64_t>& q) {
    std::vector<ReqPoolIndex> rows;
    std::vector<TokenLength> kv, ql;
    for (size_t k = 0; k < ids.size(); ++k) {
      rows.push_back(rows_.at(ids[k]));
      kv.push_back(TokenLength(static_cast<int32_t>(reqs_.at(ids[k]).size())));
      ql.push_back(TokenLength(static_cast<int32_t>(q[k])));
    }
    const Expected e = Expect(mode, ids, q);
    ++forwards_;
    absl::StatusOr<ForwardMetadata> eager =
        BuildForwardMetadata(ForwardBatch{mode, rows, kv, ql, {}, {}}, pool_, alloc_.page_size());
    ASSERT_TRUE(eager.ok()) << eager.status() << Context();
    ExpectEqual(eager->view(), e, "eager", /*exact_mask=*/true);

    const int64_t most_q = *std::max_element(q.begin(), q.end());
    if (most_q > kMaxQueryRows) return;  // a graph captures at most the config's rows
    const int64_t captured_q = mode == ForwardMode::kDecode ? 1 : kMaxQueryRows;
    absl::StatusOr<CaptureHandle> h = HandleFor(mode, static_cast<int64_t>(ids.size()), captured_q);
    if (absl::IsNotFound(h.status())) return;  // past the graph's capacity: eager only
    ASSERT_TRUE(h.ok()) << h.status() << Context();
    ReplayBatch batch{rows, kv, {}, {}};
    if (mode == ForwardMode::kExtend) batch.q_lens = ql;
    absl::StatusOr<ReplayResult> r = graph_->Replay(*h, batch);
    ASSERT_TRUE(r.ok()) << r.status() << Context();
    ++replays_;
    ExpectEqual(r->metadata, e, absl::StrCat("replay in a bucket of ", h->bucket),
                /*exact_mask=*/false);
  }

  // Each picked request writes a tree of kDraftTokens tokens after its prefix; the target
  // verifies it (eager and replayed), greedy acceptance keeps the accepted path's tokens at
  // the next positions (their K/V moved there) and frees the slots past them.
  void VerifyAndAccept() {
    const std::vector<int> ids = Pick(kCapacity, kDraftTokens);
    if (ids.empty()) return;
    const int64_t n = kDraftTokens;
    const int64_t bs = static_cast<int64_t>(ids.size());
    std::vector<int32_t> parents(bs * n), draft(bs * n), predict(bs * n);
    std::vector<TokenLength> committed;
    for (int64_t b = 0; b < bs; ++b) {
      committed.push_back(TokenLength(static_cast<int32_t>(reqs_[ids[b]].size())));
      std::vector<int32_t> children(n, 0);
      for (int64_t t = 0; t < n; ++t) {
        parents[b * n + t] = t == 0 ? -1 : static_cast<int32_t>(Uniform(0, t - 1));
        // Siblings carry distinct tokens, so that at most one child matches a prediction.
        draft[b * n + t] = t == 0 ? 7 : children[parents[b * n + t]]++;
        predict[b * n + t] = static_cast<int32_t>(Uniform(0, 2));
      }
    }
    Log(absl::StrCat("verify ", absl::StrJoin(ids, ","), ", parents ", absl::StrJoin(parents, ","),
                     ", predictions ", absl::StrJoin(predict, ",")));
    if (!Grow(ids, std::vector<int64_t>(bs, n), /*decode=*/false)) return;
    ++verifies_;
    ++forwards_;
    absl::StatusOr<VerifyTree> tree =
        BuildVerifyTreeFromParents(parents, committed, TokenLength(kDraftTokens));
    ASSERT_TRUE(tree.ok()) << tree.status() << Context();
    std::vector<ReqPoolIndex> rows;
    std::vector<TokenLength> kv;
    std::vector<TokenSlot> tree_slots;
    for (int id : ids) {
      rows.push_back(rows_[id]);
      kv.push_back(TokenLength(static_cast<int32_t>(reqs_[id].size())));
      tree_slots.insert(tree_slots.end(), reqs_[id].end() - n, reqs_[id].end());
    }
    const Expected e =
        Expect(ForwardMode::kTargetVerify, ids, std::vector<int64_t>(bs, n), parents);
    absl::StatusOr<ForwardMetadata> eager = BuildTargetVerifyMetadata(
        pool_, rows, *tree, MaskLayout::kFull, TokenCount(bs * n), alloc_.page_size());
    ASSERT_TRUE(eager.ok()) << eager.status() << Context();
    ExpectEqual(eager->view(), e, "eager target-verify", /*exact_mask=*/true);
    absl::StatusOr<CaptureHandle> h = HandleFor(ForwardMode::kTargetVerify, bs, n);
    if (!absl::IsNotFound(h.status())) {
      ASSERT_TRUE(h.ok()) << h.status() << Context();
    }
    if (h.ok()) {
      absl::StatusOr<ReplayResult> r = graph_->Replay(*h, ReplayBatch{rows, kv, {}, tree->sees});
      ASSERT_TRUE(r.ok()) << r.status() << Context();
      ++replays_;
      ExpectEqual(r->metadata, e, absl::StrCat("target-verify replay in a bucket of ", h->bucket),
                  /*exact_mask=*/false);
    }

    absl::StatusOr<AcceptResult> acc = AcceptGreedy({&*tree, draft, predict, tree_slots});
    ASSERT_TRUE(acc.ok()) << acc.status() << Context();
    std::vector<TokenSlot> want_keep, want_free;
    for (int64_t b = 0; b < bs; ++b) {
      // The walk: from the root, to the child whose token is the prediction after the current
      // token, while there is one.
      std::vector<int64_t> path = {0};
      for (bool moved = true; moved;) {
        moved = false;
        for (int64_t c = 1; c < n; ++c) {
          if (parents[b * n + c] == path.back() &&
              draft[b * n + c] == predict[b * n + path.back()]) {
            path.push_back(c);
            moved = true;
            break;
          }
        }
      }
      EXPECT_EQ(acc->accept_count[b].value(), static_cast<int32_t>(path.size()) - 1) << Context();
      EXPECT_EQ(acc->bonus_token[b], predict[b * n + path.back()]) << Context();
      for (int64_t i = 0; i < n; ++i) {
        const int64_t want = i < static_cast<int64_t>(path.size()) ? path[i] : -1;
        EXPECT_EQ(acc->accept_index[b * n + i], want) << "accept_index " << b * n + i << Context();
      }
      for (int64_t t : path) want_keep.push_back(tree_slots[b * n + t]);
      for (int64_t t = 0; t < n; ++t) {
        if (std::find(path.begin(), path.end(), t) == path.end()) {
          want_free.push_back(tree_slots[b * n + t]);
        }
      }
      accepted_ += static_cast<int64_t>(path.size()) - 1;
    }
    EXPECT_EQ(acc->keep_slots, want_keep) << Context();
    EXPECT_EQ(acc->free_slots, want_free) << Context();

    // The engine moves the path's K/V to the first 1 + accept positions after the prefix and
    // frees the tree's other slots: those past them.
    std::vector<TokenSlot> tail;
    for (int64_t b = 0; b < bs; ++b) {
      std::vector<TokenSlot>& r = reqs_[ids[b]];
      const int64_t keep = 1 + acc->accept_count[b].value();
      tail.insert(tail.end(), r.end() - (n - keep), r.end());
      r.resize(r.size() - (n - keep));
    }
    ASSERT_TRUE(alloc_.Free(tail).ok()) << Context();
  }

  void FreeRequest() {
    if (reqs_.empty()) return;
    auto it = reqs_.begin();
    std::advance(it, Uniform(0, static_cast<int64_t>(reqs_.size()) - 1));
    Log(absl::StrCat("free ", it->first, " (", it->second.size(), " tokens)"));
    ASSERT_TRUE(alloc_.Free(it->second).ok()) << Context();
    ASSERT_TRUE(pool_.Free(rows_[it->first]).ok()) << Context();
    rows_.erase(it->first);
    reqs_.erase(it);
  }

  void CaptureBucket() {
    const ForwardMode modes[] = {ForwardMode::kDecode, ForwardMode::kExtend,
                                 ForwardMode::kTargetVerify};
    const ForwardMode mode = modes[Uniform(0, 2)];
    const int64_t bucket = Uniform(1, capacity_);
    const int64_t q = mode == ForwardMode::kDecode   ? 1
                      : mode == ForwardMode::kExtend ? kMaxQueryRows
                                                     : kDraftTokens;
    Log(absl::StrCat("capture ", ForwardModeName(mode), " in a bucket of ", bucket));
    absl::StatusOr<CaptureHandle> h =
        graph_->Capture(bucket, mode, TokenLength(static_cast<int32_t>(q)));
    ASSERT_TRUE(h.ok()) << h.status() << Context();
    handles_.insert(handles_.begin(), *h);
  }

  // Regrows the buffers: every handle captured before is refused, and recaptured.
  void ReserveMore() {
    if (capacity_ >= 2 * kCapacity) return;
    capacity_ += 2;
    Log(absl::StrCat("reserve ", capacity_));
    ASSERT_TRUE(graph_->Reserve(capacity_).ok()) << Context();
    for (const CaptureHandle& h : handles_) {
      const absl::StatusOr<ReplayResult> r = graph_->Replay(h, ReplayBatch{});
      EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << Context();
    }
    handles_.clear();
  }

  // The table, the allocator and the pool of rows against the model.
  void CheckState() {
    std::set<int32_t> seen;
    int64_t live = 0;
    for (const auto& [id, r] : reqs_) {
      absl::StatusOr<absl::Span<const TokenSlot>> row =
          pool_.Read(rows_.at(id), TokenCount(0), TokenCount(static_cast<int64_t>(r.size())));
      ASSERT_TRUE(row.ok()) << row.status() << Context();
      ASSERT_EQ(std::vector<TokenSlot>(row->begin(), row->end()), r)
          << "req_to_token row of request " << id << Context();
      for (TokenSlot s : r) {
        ASSERT_TRUE(seen.insert(s.value()).second) << "slot " << s << " held twice" << Context();
        ASSERT_GE(s.value(), ps_) << "a request holds a slot of the padding page" << Context();
        ASSERT_TRUE(alloc_.IsLive(s)) << "slot " << s << " of request " << id << Context();
      }
      live += static_cast<int64_t>(r.size());
    }
    ASSERT_EQ(alloc_.live_tokens().value(), live) << Context();
    ASSERT_EQ(alloc_.free_pages().value(), FreePagesInModel()) << Context();
    ASSERT_EQ(pool_.num_free_rows(), kMaxReqs - static_cast<int32_t>(reqs_.size())) << Context();
  }

  const int64_t ps_;
  const uint64_t seed_;
  std::mt19937_64 rng_;
  const int64_t num_pages_;
  PagedTokenAllocator alloc_;
  ReqToTokenPool pool_;
  BackendConfig config_;
  HostDeviceMemory memory_;
  HostMetadataWriter writer_;
  std::unique_ptr<GraphState> graph_;
  int64_t capacity_ = kCapacity;
  std::vector<CaptureHandle> handles_;
  std::map<int, std::vector<TokenSlot>> reqs_;  // the model: each request's slots by position
  std::map<int, ReqPoolIndex> rows_;
  int next_id_ = 0;
  int step_ = 0;
  int64_t forwards_ = 0, replays_ = 0, verifies_ = 0, accepted_ = 0, refused_ = 0;
  std::deque<std::string> ops_;
};

class ServingModelTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(ServingModelTest, RandomOperationsAgainstShadowModel) {
  for (uint64_t seed : Seeds()) {
    ASSERT_NE(seed, 0u) << "ATTNMETA_MODEL_SEED is not a positive number";
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    ServingModelRun(GetParam(), seed).Run();
    if (HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(PageSizes, ServingModelTest, ::testing::Values(1, 7, 16, 64),
                         [](const auto& info) { return absl::StrCat("ps", info.param); });

}  // namespace
}  // namespace attnmeta
