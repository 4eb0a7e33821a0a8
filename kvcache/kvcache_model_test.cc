// Model-based randomized test of the KV-cache layer: a stream of operations (admit, extend
// by random lengths including 0 and page-crossing ones, decode, free, trim, exhaust then
// recover, checkpoint then roll back or commit, grouped frees, and bad calls) drives
// PagedTokenAllocator and ReqToTokenPool and a naive shadow model; every invariant is checked
// after every step.
//
// On failure it prints the seed, the last operations and the command that replays the run:
//   ./bazelw test //kvcache:kvcache_model_test --test_env=ATTNMETA_MODEL_SEED=<seed>
//       --test_filter=<test>

#include <cstdlib>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "kvcache/paged_token_allocator.h"
#include "kvcache/req_to_token_pool.h"

namespace attnmeta {
namespace {

constexpr int kOpsPerRun = 10000;
constexpr int kMaxReqs = 24;

struct ModelRequest {
  ReqPoolIndex row;
  std::vector<int32_t> slots;  // slot of each token position
};

// The naive model: requests and their slots, and the free-page list as a plain deque (exact
// for the in-order policy; for the shuffled policy only its set of pages is meaningful).
struct Model {
  std::map<int, ModelRequest> requests;
  std::deque<int32_t> free_pages;  // front = handed out next (in-order policy)
  std::vector<int> page_live;  // live slots per page
  int64_t live_tokens = 0;
};

class KvCacheModelRun {
 public:
  KvCacheModelRun(int64_t page_size, bool shuffled, uint64_t seed)
      : ps_(page_size),
        shuffled_(shuffled),
        seed_(seed),
        rng_(seed),
        num_pages_(std::max<int64_t>(6, 1536 / page_size)),
        alloc_(*PagedTokenAllocator::Create(
            PageCount(num_pages_), *PageSize::Create(page_size),
            shuffled ? FreePagePolicy::Shuffled(seed) : FreePagePolicy::InOrder())),
        pool_(*ReqToTokenPool::Create(kMaxReqs, TokenCount(max_context_))) {
    for (int32_t p = 1; p <= num_pages_; ++p) model_.free_pages.push_back(p);
    model_.page_live.assign(num_pages_ + 1, 0);
  }

  void Run() {
    for (step_ = 0; step_ < kOpsPerRun && !HasFailure(); ++step_) {
      const int op = Uniform(0, 99);
      if (op < 20) Admit();
      else if (op < 45) Extend();
      else if (op < 68) Decode();
      else if (op < 80) FreeRequest();
      else if (op < 87) Trim();
      else if (op < 90) ExhaustThenRecover();
      else if (op < 93) ToggleCheckpoint();
      else if (op < 96) ToggleFreeGroup();
      else BadCalls();
      CheckInvariants();
    }
    if (group_) ToggleFreeGroup();
    if (checkpoint_) {
      ASSERT_TRUE(alloc_.Commit().ok()) << Context();
      checkpoint_ = false;
    }
    EXPECT_GT(rollbacks_, 5) << "the run never rolled back" << Context();
    EXPECT_GT(groups_, 5) << "the run never ended a free group with frees in it" << Context();
    for (auto it = model_.requests.begin(); it != model_.requests.end() && !HasFailure();) {
      FreeWhole(it++->first);
      CheckInvariants();
    }
    EXPECT_EQ(alloc_.free_pages(), alloc_.total_pages()) << Context();
    EXPECT_EQ(alloc_.live_tokens(), TokenCount(0)) << Context();
    EXPECT_EQ(pool_.num_free_rows(), kMaxReqs) << Context();
    EXPECT_GT(exhausted_calls_, 10) << "the run never exhausted the pool" << Context();
  }

 private:
  static bool HasFailure() { return ::testing::Test::HasFailure(); }

  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

  void Log(std::string s) {
    history_.push_back(absl::StrCat("#", step_, " ", s));
    if (history_.size() > 12) history_.pop_front();
  }

  std::string Context() const {
    return absl::StrCat("\n  page_size=", ps_, " policy=", shuffled_ ? "shuffled" : "in-order",
                        " seed=", seed_, " step=", step_, "\n  last operations:\n    ",
                        absl::StrJoin(history_, "\n    "),
                        "\n  reproduce: ./bazelw test //kvcache:kvcache_model_test "
                        "--test_env=ATTNMETA_MODEL_SEED=", seed_, " --test_filter=",
                        ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name(),
                        ".", ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }

  // The new slots the model expects for growing `r` to `new_len`: it continues the last
  // page, then takes whole pages from the model's free list. For the shuffled policy the
  // page ids come from `actual` and are checked to be free in the model.
  std::vector<int32_t> ExpectSlots(const ModelRequest& r, int64_t new_len,
                                   const std::vector<TokenSlot>& actual, size_t actual_begin) {
    std::vector<int32_t> out;
    int64_t pos = static_cast<int64_t>(r.slots.size());
    if (pos % ps_ != 0) {
      for (int32_t s = r.slots.back() + 1; pos < new_len && pos % ps_ != 0; ++pos) {
        out.push_back(s++);
      }
    }
    while (pos < new_len) {
      int32_t page;
      if (!shuffled_) {
        page = model_.free_pages.front();
        model_.free_pages.pop_front();
      } else {
        const size_t i = actual_begin + out.size();
        page = i < actual.size() ? static_cast<int32_t>(actual[i].value() / ps_) : -1;
        auto it = std::find(model_.free_pages.begin(), model_.free_pages.end(), page);
        EXPECT_TRUE(it != model_.free_pages.end())
            << "allocator handed out page " << page << " that is not free" << Context();
        if (it == model_.free_pages.end()) return out;
        model_.free_pages.erase(it);
      }
      for (int64_t k = 0; k < ps_ && pos < new_len; ++k, ++pos) {
        out.push_back(static_cast<int32_t>(page * ps_ + k));
      }
    }
    return out;
  }

  // Grows the given requests by the given lengths in one batch, checking the slots against
  // the model, or checking that the failure left everything unchanged.
  void GrowBatch(const std::vector<int>& ids, const std::vector<int64_t>& adds, bool decode) {
    std::vector<ExtendRequest> ext;
    std::vector<DecodeRequest> dec;
    int64_t new_tokens = 0;
    int64_t pages_needed = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const ModelRequest& r = model_.requests.at(ids[i]);
      const int64_t len = static_cast<int64_t>(r.slots.size());
      const TokenSlot last(len > 0 ? r.slots.back() : 0);
      ext.push_back({TokenCount(len), TokenCount(len + adds[i]), last});
      dec.push_back({TokenCount(len + 1), last});
      new_tokens += adds[i];
      pages_needed += (len + adds[i] + ps_ - 1) / ps_ - (len + ps_ - 1) / ps_;
    }
    Log(absl::StrCat(decode ? "decode" : "extend", " ids=[", absl::StrJoin(ids, ","), "] adds=[",
                     absl::StrJoin(adds, ","), "] needs ", pages_needed, " pages, ",
                     model_.free_pages.size(), " free"));
    std::vector<TokenSlot> out(new_tokens);
    const absl::Status s = decode ? alloc_.AllocateDecode(dec, absl::MakeSpan(out))
                                  : alloc_.AllocateExtend(ext, absl::MakeSpan(out));
    if (pages_needed > static_cast<int64_t>(model_.free_pages.size())) {
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s << Context();
      ++exhausted_calls_;
      return;  // CheckInvariants() confirms that nothing changed.
    }
    ASSERT_TRUE(s.ok()) << s << Context();
    size_t at = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      ModelRequest& r = model_.requests.at(ids[i]);
      const int64_t len = static_cast<int64_t>(r.slots.size());
      const std::vector<int32_t> want = ExpectSlots(r, len + adds[i], out, at);
      for (size_t k = 0; k < want.size(); ++k) {
        ASSERT_EQ(out[at + k].value(), want[k])
            << "request " << ids[i] << " token " << len + static_cast<int64_t>(k) << Context();
      }
      ASSERT_TRUE(
          pool_.Write(r.row, TokenCount(len), absl::MakeSpan(out).subspan(at, want.size())).ok())
          << Context();
      r.slots.insert(r.slots.end(), want.begin(), want.end());
      for (int32_t slot : want) ++model_.page_live[slot / ps_];
      at += want.size();
    }
    model_.live_tokens += new_tokens;
  }

  std::vector<int> PickRequests(int max_count, int64_t room_needed) {
    std::vector<int> ids;
    for (auto& [id, r] : model_.requests) {
      // A request trimmed in the open free group keeps its freed tail live until the group
      // ends: it cannot continue before then.
      if (frozen_.count(id) != 0) continue;
      if (static_cast<int64_t>(r.slots.size()) + room_needed <= max_context_ && Uniform(0, 2) == 0) {
        ids.push_back(id);
      }
      if (static_cast<int>(ids.size()) == max_count) break;
    }
    return ids;
  }

  void Admit() {
    if (pool_.num_free_rows() == 0) {
      Log("admit: no free row");
      EXPECT_EQ(pool_.Allocate().status().code(), absl::StatusCode::kResourceExhausted)
          << Context();
      return;
    }
    const int id = next_id_++;
    model_.requests[id] = ModelRequest{*pool_.Allocate(), {}};
    Log(absl::StrCat("admit id=", id));
    GrowBatch({id}, {Uniform(0, 3 * ps_ + 5)}, false);
    if (model_.requests[id].slots.empty() && Uniform(0, 1) == 0) FreeWhole(id);
  }

  void Extend() {
    const int64_t max_add = 2 * ps_ + 3;
    std::vector<int> ids = PickRequests(4, max_add);
    if (ids.empty()) return;
    std::vector<int64_t> adds;
    for (size_t i = 0; i < ids.size(); ++i) adds.push_back(Uniform(0, max_add));
    GrowBatch(ids, adds, false);
  }

  void Decode() {
    std::vector<int> ids = PickRequests(kMaxReqs, 1);
    if (ids.empty()) return;
    GrowBatch(ids, std::vector<int64_t>(ids.size(), 1), true);
  }

  void ReleaseModelSlots(const std::vector<int32_t>& freed) {
    // Pages whose last live slot died go to the front of the model's list, ascending.
    std::set<int32_t> released;
    for (int32_t s : freed) {
      if (--model_.page_live[s / ps_] == 0) released.insert(static_cast<int32_t>(s / ps_));
    }
    model_.free_pages.insert(model_.free_pages.begin(), released.begin(), released.end());
    model_.live_tokens -= static_cast<int64_t>(freed.size());
  }

  void FreeWhole(int id) {
    ModelRequest r = model_.requests.at(id);
    Log(absl::StrCat("free id=", id, " tokens=", r.slots.size()));
    std::vector<TokenSlot> slots;
    for (int32_t s : r.slots) slots.push_back(TokenSlot(s));
    ASSERT_TRUE(alloc_.Free(slots).ok()) << Context();
    ASSERT_TRUE(pool_.Free(r.row).ok()) << Context();
    model_.requests.erase(id);
    ModelFree(r.slots);
  }

  // Frees slots in the model now, or at the end of the open free group.
  void ModelFree(const std::vector<int32_t>& slots) {
    if (group_) {
      deferred_.insert(deferred_.end(), slots.begin(), slots.end());
    } else {
      ReleaseModelSlots(slots);
    }
  }

  // Opens a free group, or ends it: the allocator frees every deferred slot at once.
  void ToggleFreeGroup() {
    if (!group_) {
      Log("begin free group");
      ASSERT_TRUE(alloc_.BeginFreeGroup().ok()) << Context();
      group_ = true;
      return;
    }
    Log(absl::StrCat("end free group: ", deferred_.size(), " slots"));
    ASSERT_EQ(alloc_.deferred_tokens().value(), static_cast<int64_t>(deferred_.size())) << Context();
    ASSERT_TRUE(alloc_.EndFreeGroup().ok()) << Context();
    group_ = false;
    if (!deferred_.empty()) ++groups_;
    ReleaseModelSlots(deferred_);
    deferred_.clear();
    frozen_.clear();
  }

  // Opens a checkpoint, or closes it by rolling back (allocator, model and request table back
  // to the checkpoint) or committing.
  void ToggleCheckpoint() {
    if (group_) {
      EXPECT_EQ(alloc_.BeginCheckpoint().code(), absl::StatusCode::kFailedPrecondition) << Context();
      return;
    }
    if (!checkpoint_) {
      Log("checkpoint");
      ASSERT_TRUE(alloc_.BeginCheckpoint().ok()) << Context();
      saved_ = model_;
      checkpoint_ = true;
      return;
    }
    checkpoint_ = false;
    if (Uniform(0, 1) == 0) {
      Log("commit");
      ASSERT_TRUE(alloc_.Commit().ok()) << Context();
      return;
    }
    Log("roll back");
    ASSERT_TRUE(alloc_.RollBack().ok()) << Context();
    ++rollbacks_;
    for (auto& [id, r] : model_.requests) {
      if (saved_.requests.count(id) == 0) {
        ASSERT_TRUE(pool_.Free(r.row).ok()) << Context();
      }
    }
    for (auto& [id, r] : saved_.requests) {
      if (!pool_.IsAllocated(r.row)) {
        ASSERT_TRUE(pool_.AllocateRow(r.row).ok()) << Context();
      }
      std::vector<TokenSlot> slots;
      for (int32_t x : r.slots) slots.push_back(TokenSlot(x));
      ASSERT_TRUE(pool_.Write(r.row, TokenCount(0), slots).ok()) << Context();
    }
    model_ = saved_;
  }

  void FreeRequest() {
    if (model_.requests.empty()) return;
    auto it = model_.requests.begin();
    std::advance(it, Uniform(0, static_cast<int64_t>(model_.requests.size()) - 1));
    FreeWhole(it->first);
  }

  // Frees the last k tokens of a request (rejected draft tokens, a retracted chunk).
  void Trim() {
    if (model_.requests.empty()) return;
    auto it = model_.requests.begin();
    std::advance(it, Uniform(0, static_cast<int64_t>(model_.requests.size()) - 1));
    ModelRequest& r = it->second;
    if (r.slots.empty()) return;
    const int64_t k = Uniform(1, static_cast<int64_t>(r.slots.size()));
    std::vector<int32_t> tail(r.slots.end() - k, r.slots.end());
    Log(absl::StrCat("trim id=", it->first, " k=", k));
    std::vector<TokenSlot> slots;
    for (int32_t s : tail) slots.push_back(TokenSlot(s));
    // Free in a scrambled order: liveness is per slot, not per page.
    std::shuffle(slots.begin(), slots.end(), rng_);
    ASSERT_TRUE(alloc_.Free(slots).ok()) << Context();
    r.slots.resize(r.slots.size() - k);
    if (group_) frozen_.insert(it->first);
    ModelFree(tail);
  }

  // Admits requests until the pool is exhausted (the failing call must change nothing),
  // then frees half of them and checks that allocation works again.
  void ExhaustThenRecover() {
    // Recovery needs the frees to happen now.
    if (group_) return;
    Log("exhaust");
    int guard = 0;
    while (pool_.num_free_rows() > 0 && guard++ < kMaxReqs) {
      const int id = next_id_++;
      model_.requests[id] = ModelRequest{*pool_.Allocate(), {}};
      const int64_t pool_tokens = num_pages_ * ps_;
      GrowBatch({id}, {std::min<int64_t>(max_context_, Uniform(pool_tokens / 8, pool_tokens / 3))},
                false);
      if (HasFailure()) return;
      CheckInvariants();
      if (model_.requests[id].slots.empty()) {
        FreeWhole(id);
        break;
      }
    }
    std::vector<int> ids;
    for (auto& [id, r] : model_.requests) ids.push_back(id);
    for (size_t i = 0; i < ids.size() && !HasFailure(); i += 2) FreeWhole(ids[i]);
    if (HasFailure()) return;
    CheckInvariants();
    if (pool_.num_free_rows() > 0 && !model_.free_pages.empty()) {
      const int id = next_id_++;
      model_.requests[id] = ModelRequest{*pool_.Allocate(), {}};
      GrowBatch({id}, {ps_}, false);
      EXPECT_EQ(model_.requests[id].slots.size(), static_cast<size_t>(ps_))
          << "allocation after recovery failed" << Context();
    }
  }

  // Calls that must fail and change nothing (CheckInvariants() verifies the latter).
  void BadCalls() {
    Log("bad calls");
    // Freeing a slot that is not live: one of a free page.
    if (!model_.free_pages.empty()) {
      const int32_t s = static_cast<int32_t>(model_.free_pages.back() * ps_ + Uniform(0, ps_ - 1));
      EXPECT_EQ(alloc_.Free({TokenSlot(s)}).code(), absl::StatusCode::kInvalidArgument)
          << Context();
    }
    // A slot already freed in the open group.
    if (!deferred_.empty()) {
      EXPECT_EQ(alloc_.Free({TokenSlot(deferred_.back())}).code(),
                absl::StatusCode::kInvalidArgument)
          << Context();
    }
    if (model_.requests.empty()) return;
    const ModelRequest& r = model_.requests.begin()->second;
    if (r.slots.empty()) return;
    // Double free within one call.
    const TokenSlot last(r.slots.back());
    EXPECT_EQ(alloc_.Free({last, last}).code(), absl::StatusCode::kInvalidArgument) << Context();
    // A stale last_loc: one slot short of the real last slot (breaks the page invariant, or
    // points at a live successor).
    const int64_t len = static_cast<int64_t>(r.slots.size());
    // With page_size 1 any live slot satisfies the page invariant and a continuation never
    // reads last_loc, so a stale one is undetectable there (and harmless).
    if (len >= 2 && ps_ > 1) {
      EXPECT_EQ(alloc_
                    .AllocateExtend(
                        {{TokenCount(len), TokenCount(len + 1), TokenSlot(r.slots[len - 2])}})
                    .status()
                    .code(),
                absl::StatusCode::kInvalidArgument)
          << Context();
    }
    // Prefix longer than the sequence.
    EXPECT_EQ(alloc_.AllocateExtend({{TokenCount(len), TokenCount(len - 1), last}}).status().code(),
              absl::StatusCode::kInvalidArgument)
        << Context();
    // Writing past max_context_len.
    EXPECT_EQ(pool_.Write(r.row, TokenCount(max_context_), {last}).code(),
              absl::StatusCode::kOutOfRange)
        << Context();
  }

  // Plain comparisons with a message built only on failure keep 10,000 steps fast.
  void CheckInvariants() {
    if (HasFailure()) return;
    const int64_t pool_slots = alloc_.pool_slots().value();
    std::vector<int> slot_owner(pool_slots, -1);
    std::vector<int> page_owner(num_pages_ + 1, -1);
    int64_t live = 0;
    int64_t pages_used = 0;
    for (auto& [id, r] : model_.requests) {
      auto row = pool_.Read(r.row, TokenCount(0), TokenCount(static_cast<int64_t>(r.slots.size())));
      ASSERT_TRUE(row.ok()) << row.status() << Context();
      for (size_t t = 0; t < r.slots.size(); ++t) {
        const int32_t s = r.slots[t];
        if (s < ps_ || s >= pool_slots) {
          FAIL() << "slot " << s << " of request " << id << " outside the pages handed out"
                 << Context();
        }
        if (slot_owner[s] != -1) {
          FAIL() << "slot " << s << " held by requests " << slot_owner[s] << " and " << id
                 << Context();
        }
        slot_owner[s] = id;
        int& owner = page_owner[s / ps_];
        if (owner == -1) {
          owner = id;
          ++pages_used;
        } else if (owner != id && owner != -2) {
          FAIL() << "page " << s / ps_ << " shared by requests " << owner << " and " << id
                 << Context();
        }
        if (!alloc_.IsLive(TokenSlot(s))) FAIL() << "slot " << s << " not live" << Context();
        if ((*row)[t].value() != s) {
          FAIL() << "req_to_token of request " << id << " position " << t << " holds "
                 << (*row)[t].value() << ", want " << s << Context();
        }
        ++live;
      }
    }
    for (int32_t s : deferred_) {
      if (slot_owner[s] != -1) {
        FAIL() << "slot " << s << " deferred but held by request " << slot_owner[s] << Context();
      }
      slot_owner[s] = -2;
      if (page_owner[s / ps_] == -1) {
        page_owner[s / ps_] = -2;
        ++pages_used;
      }
      if (!alloc_.IsLive(TokenSlot(s))) FAIL() << "deferred slot " << s << " not live" << Context();
      ++live;
    }
    int64_t allocator_live = 0;
    for (int32_t s = 0; s < pool_slots; ++s) allocator_live += alloc_.IsLive(TokenSlot(s));
    ASSERT_EQ(allocator_live, live) << "allocator holds slots no request owns" << Context();
    ASSERT_EQ(alloc_.live_tokens().value(), live) << Context();
    ASSERT_EQ(model_.live_tokens, live) << Context();
    ASSERT_EQ(alloc_.free_pages().value(), static_cast<int64_t>(model_.free_pages.size()))
        << Context();
    ASSERT_EQ(alloc_.used_pages().value(), pages_used) << Context();
    ASSERT_EQ(alloc_.LiveTokensInPage(kPaddingPage), TokenCount(0)) << Context();
    ASSERT_EQ(pool_.num_free_rows(), kMaxReqs - static_cast<int>(model_.requests.size()))
        << Context();
  }

  const int64_t ps_;
  const bool shuffled_;
  const uint64_t seed_;
  std::mt19937_64 rng_;
  const int64_t num_pages_;
  const int64_t max_context_ = 1024;
  PagedTokenAllocator alloc_;
  ReqToTokenPool pool_;
  Model model_;
  bool checkpoint_ = false;
  Model saved_;                  // the model at the open checkpoint
  bool group_ = false;
  std::vector<int32_t> deferred_;  // slots freed in the open group, in order
  std::set<int> frozen_;         // requests trimmed in the open group
  int rollbacks_ = 0;
  int groups_ = 0;
  int next_id_ = 0;
  int exhausted_calls_ = 0;
  int step_ = 0;
  std::deque<std::string> history_;
};

uint64_t SeedFor(int64_t page_size, bool shuffled) {
  if (const char* env = std::getenv("ATTNMETA_MODEL_SEED")) return std::strtoull(env, nullptr, 10);
  return 0x5eed0000u + static_cast<uint64_t>(page_size) * 2 + (shuffled ? 1 : 0);
}

class KvCacheModelTest : public ::testing::TestWithParam<std::tuple<int64_t, bool>> {};

TEST_P(KvCacheModelTest, RandomOperationsAgainstShadowModel) {
  const auto [page_size, shuffled] = GetParam();
  const uint64_t seed = SeedFor(page_size, shuffled);
  KvCacheModelRun run(page_size, shuffled, seed);
  run.Run();
}

INSTANTIATE_TEST_SUITE_P(
    PageSizes, KvCacheModelTest,
    ::testing::Combine(::testing::Values<int64_t>(1, 2, 7, 16, 64), ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<int64_t, bool>>& info) {
      return absl::StrCat("page_size_", std::get<0>(info.param),
                          std::get<1>(info.param) ? "_shuffled" : "_in_order");
    });

}  // namespace
}  // namespace attnmeta
