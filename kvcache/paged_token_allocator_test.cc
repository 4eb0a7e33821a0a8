#include "kvcache/paged_token_allocator.h"

#include <vector>

#include "gtest/gtest.h"
#include "tools/bench/heap_counter.h"

namespace attnmeta {
namespace {

std::vector<int32_t> Raw(absl::Span<const TokenSlot> slots) {
  std::vector<int32_t> out;
  for (TokenSlot s : slots) out.push_back(s.value());
  return out;
}

PagedTokenAllocator MakeInOrder(int64_t num_pages, int64_t page_size) {
  return *PagedTokenAllocator::Create(PageCount(num_pages), *PageSize::Create(page_size),
                                      FreePagePolicy::InOrder());
}

// Everything observable about an allocator, to check that a failed call changed nothing: its
// counts, each slot's liveness, each page's live tokens, and the order in which it would hand
// out its free pages next (what a copy of it allocates when asked for all of them).
struct State {
  int64_t free_pages;
  int64_t live_tokens;
  std::vector<bool> live;
  std::vector<int64_t> page_live;
  std::vector<TokenSlot> next_slots;
  bool operator==(const State& o) const {
    return free_pages == o.free_pages && live_tokens == o.live_tokens && live == o.live &&
           page_live == o.page_live && next_slots == o.next_slots;
  }
};
State Snapshot(const PagedTokenAllocator& a) {
  State s{a.free_pages().value(), a.live_tokens().value(), {}, {}, {}};
  for (int32_t i = 0; i < a.pool_slots().value(); ++i) s.live.push_back(a.IsLive(TokenSlot(i)));
  for (int64_t p = 0; p <= a.total_pages().value(); ++p) {
    s.page_live.push_back(a.LiveTokensInPage(PageId(p)).value());
  }
  if (s.free_pages > 0) {
    PagedTokenAllocator copy = a;
    const TokenCount all = TokensInPages(copy.free_pages(), copy.page_size());
    absl::StatusOr<std::vector<TokenSlot>> next =
        copy.AllocateExtend({{TokenCount(0), all, TokenSlot(0)}});
    if (next.ok()) {
      s.next_slots = *std::move(next);
    } else {
      ADD_FAILURE() << "allocating every free page of a copy: " << next.status();
    }
  }
  return s;
}

TEST(PagedTokenAllocatorTest, CreateRejectsBadSizes) {
  const PageSize ps = *PageSize::Create(16);
  EXPECT_EQ(PagedTokenAllocator::Create(PageCount(0), ps, FreePagePolicy::InOrder()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      PagedTokenAllocator::Create(PageCount(-4), ps, FreePagePolicy::InOrder()).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PagedTokenAllocator::Create(PageCount(int64_t{1} << 28), ps, FreePagePolicy::InOrder())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PagedTokenAllocator::Create(PageCount(INT64_MAX), ps, FreePagePolicy::InOrder())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The first refused size: 2^27 pages of 16 and the padding page are 2^31 + 16 slots, past
  // int32 (2^27 - 1 pages end at slot 2^31 - 1).
  const absl::Status s =
      PagedTokenAllocator::Create(PageCount(int64_t{1} << 27), ps, FreePagePolicy::InOrder())
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("int32-addressable"), absl::string_view::npos) << s;
}

// The reference system's in-order layout (DESIGN.md section 2b), worked by hand for
// page_size 4: the free list is 1, 2, 3, ...
TEST(PagedTokenAllocatorTest, InOrderExtendMatchesReferenceLayout) {
  PagedTokenAllocator a = MakeInOrder(8, 4);
  // Request 0: 6 new tokens -> page 1 full, page 2 partial. Request 1: 3 -> page 3 partial.
  auto first = a.AllocateExtend({{TokenCount(0), TokenCount(6), TokenSlot(0)},
                                 {TokenCount(0), TokenCount(3), TokenSlot(0)}});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(Raw(*first), (std::vector<int32_t>{4, 5, 6, 7, 8, 9, 12, 13, 14}));
  EXPECT_EQ(a.free_pages(), PageCount(5));
  EXPECT_EQ(a.live_tokens(), TokenCount(9));

  // Request 0 continues at last_loc 9 + 1: slots 10, 11, then page 4 fully, then page 5.
  // Request 1 continues at 14 + 1 = 15 only.
  auto second = a.AllocateExtend({{TokenCount(6), TokenCount(13), TokenSlot(9)},
                                  {TokenCount(3), TokenCount(4), TokenSlot(14)}});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(Raw(*second), (std::vector<int32_t>{10, 11, 16, 17, 18, 19, 20, 15}));

  // Decode: request 0 at seq 14 continues (20 + 1); request 1 at seq 5 crosses into page 6.
  auto decode = a.AllocateDecode({{TokenCount(14), TokenSlot(20)}, {TokenCount(5), TokenSlot(15)}});
  ASSERT_TRUE(decode.ok()) << decode.status();
  EXPECT_EQ(Raw(*decode), (std::vector<int32_t>{21, 24}));
  EXPECT_EQ(a.free_pages(), PageCount(2));
}

TEST(PagedTokenAllocatorTest, PaddingPageIsNeverHandedOut) {
  for (int64_t ps : {1, 3, 16}) {
    PagedTokenAllocator a = MakeInOrder(5, ps);
    auto all = a.AllocateExtend({{TokenCount(0), TokenCount(5 * ps), TokenSlot(0)}});
    ASSERT_TRUE(all.ok());
    for (TokenSlot s : *all) EXPECT_GE(s.value(), ps) << "page_size " << ps;
    EXPECT_EQ(a.free_pages(), PageCount(0));
  }
}

TEST(PagedTokenAllocatorTest, PageReturnsWhenItsLastLiveSlotDies) {
  PagedTokenAllocator a = MakeInOrder(4, 4);
  auto slots = a.AllocateExtend({{TokenCount(0), TokenCount(4), TokenSlot(0)}});
  ASSERT_TRUE(slots.ok());
  EXPECT_EQ(a.free_pages(), PageCount(3));
  ASSERT_TRUE(a.Free({(*slots)[1], (*slots)[3]}).ok());
  EXPECT_EQ(a.free_pages(), PageCount(3)) << "page 1 still has live slots";
  EXPECT_EQ(a.LiveTokensInPage(PageId(1)), TokenCount(2));
  EXPECT_EQ(a.LiveTokensInPage(PageId(5)), TokenCount(0)) << "outside the pool";
  // The last page of the pool counts too.
  PagedTokenAllocator full = MakeInOrder(2, 4);
  ASSERT_TRUE(full.AllocateExtend({{TokenCount(0), TokenCount(7), TokenSlot(0)}}).ok());
  EXPECT_EQ(full.LiveTokensInPage(PageId(1)), TokenCount(4));
  EXPECT_EQ(full.LiveTokensInPage(PageId(2)), TokenCount(3));
  EXPECT_EQ(full.LiveTokensInPage(PageId(3)), TokenCount(0)) << "outside the pool";
  EXPECT_EQ(a.LiveTokensInPage(PageId(-1)), TokenCount(0)) << "outside the pool";
  ASSERT_TRUE(a.Free({(*slots)[0], (*slots)[2]}).ok());
  EXPECT_EQ(a.free_pages(), PageCount(4));
  EXPECT_EQ(a.live_tokens(), TokenCount(0));
}

TEST(PagedTokenAllocatorTest, ReleasedPagesGoToTheFrontInAscendingOrder) {
  PagedTokenAllocator a = MakeInOrder(6, 2);
  auto slots = a.AllocateExtend({{TokenCount(0), TokenCount(8), TokenSlot(0)}});
  ASSERT_TRUE(slots.ok());
  // Pages 1..4 are in use; free pages 4 and 2 (listed in that order).
  ASSERT_TRUE(a.Free({TokenSlot(8), TokenSlot(9), TokenSlot(4), TokenSlot(5)}).ok());
  auto next = a.AllocateExtend({{TokenCount(0), TokenCount(6), TokenSlot(0)}});
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(Raw(*next), (std::vector<int32_t>{4, 5, 8, 9, 10, 11}));
}

TEST(PagedTokenAllocatorTest, ExhaustionIsAllOrNothing) {
  PagedTokenAllocator a = MakeInOrder(4, 4);
  ASSERT_TRUE(a.AllocateExtend({{TokenCount(0), TokenCount(5), TokenSlot(0)}}).ok());
  const State before = Snapshot(a);
  // Needs 1 + 2 pages; only 2 are free. The first request alone would fit.
  auto r = a.AllocateExtend({{TokenCount(0), TokenCount(4), TokenSlot(0)},
                             {TokenCount(0), TokenCount(5), TokenSlot(0)}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Snapshot(a) == before);
  // A request asking for more than the whole pool.
  EXPECT_EQ(a.AllocateExtend({{TokenCount(0), TokenCount(int64_t{1} << 40), TokenSlot(0)}})
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Snapshot(a) == before);
  // The same through the span API, with a small output: capacity is reported, not the span.
  std::vector<TokenSlot> out(4);
  EXPECT_EQ(a.AllocateExtend({{TokenCount(0), TokenCount(int64_t{1} << 40), TokenSlot(0)}},
                             absl::MakeSpan(out))
                .code(),
            absl::StatusCode::kResourceExhausted);
  // Lengths whose differences and sums would overflow int64.
  EXPECT_EQ(a.AllocateExtend({{TokenCount(-1), TokenCount(INT64_MAX), TokenSlot(0)}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.AllocateExtend({{TokenCount(0), TokenCount(INT64_MAX), TokenSlot(0)},
                              {TokenCount(0), TokenCount(INT64_MAX), TokenSlot(0)}})
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Snapshot(a) == before);
  // Recovery: what fits still works.
  EXPECT_TRUE(a.AllocateExtend({{TokenCount(0), TokenCount(8), TokenSlot(0)}}).ok());
  EXPECT_EQ(a.free_pages(), PageCount(0));
}

TEST(PagedTokenAllocatorTest, BadRequestsChangeNothing) {
  PagedTokenAllocator a = MakeInOrder(8, 4);
  auto slots = a.AllocateExtend({{TokenCount(0), TokenCount(6), TokenSlot(0)}});
  ASSERT_TRUE(slots.ok());  // slots 4..9, last_loc 9
  const State before = Snapshot(a);
  auto code = [&](std::vector<ExtendRequest> reqs) {
    return a.AllocateExtend(reqs).status().code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  // Prefix longer than the sequence; negative lengths.
  EXPECT_EQ(code({{TokenCount(6), TokenCount(5), TokenSlot(9)}}), kInvalid);
  EXPECT_EQ(code({{TokenCount(-1), TokenCount(5), TokenSlot(9)}}), kInvalid);
  // last_loc breaking (last_loc + 1) % ps == prefix_len % ps.
  EXPECT_EQ(code({{TokenCount(6), TokenCount(8), TokenSlot(8)}}), kInvalid);
  // last_loc in the padding page, outside the pool, or not live.
  EXPECT_EQ(code({{TokenCount(6), TokenCount(8), TokenSlot(1)}}), kInvalid);
  EXPECT_EQ(code({{TokenCount(6), TokenCount(8), TokenSlot(1000)}}), kInvalid);
  EXPECT_EQ(code({{TokenCount(2), TokenCount(3), TokenSlot(13)}}), kInvalid);
  // A last_loc that satisfies the page invariant but has a live slot after it: another
  // request's tokens (slots 4..9 are live; claim prefix 2 ending at slot 5).
  EXPECT_EQ(code({{TokenCount(2), TokenCount(3), TokenSlot(5)}}), kInvalid);
  // A prefix longer than the pool's 36 slots, with a last_loc that fits it (slot 9 is live and
  // (9 + 1) % 4 == 38 % 4).
  const absl::Status past =
      a.AllocateExtend({{TokenCount(38), TokenCount(39), TokenSlot(9)}}).status();
  EXPECT_EQ(past.code(), kInvalid) << past;
  EXPECT_NE(past.message().find("prefix_len 38 exceeds the pool's 36 slots"),
            absl::string_view::npos)
      << past;
  // Two requests continuing the same partial page.
  EXPECT_EQ(code({{TokenCount(6), TokenCount(7), TokenSlot(9)},
                  {TokenCount(6), TokenCount(7), TokenSlot(9)}}),
            kInvalid);
  // A valid request followed by an invalid one: nothing of the first is taken.
  EXPECT_EQ(code({{TokenCount(0), TokenCount(4), TokenSlot(0)},
                  {TokenCount(3), TokenCount(1), TokenSlot(9)}}),
            kInvalid);
  // A request larger than the pool beside a malformed one: the malformed one is named, in
  // either order (a scheduler retries ResourceExhausted; it must not retry a bad batch).
  EXPECT_EQ(code({{TokenCount(0), TokenCount(int64_t{1} << 40), TokenSlot(0)},
                  {TokenCount(5), TokenCount(3), TokenSlot(0)}}),
            kInvalid);
  EXPECT_EQ(code({{TokenCount(5), TokenCount(3), TokenSlot(0)},
                  {TokenCount(0), TokenCount(int64_t{1} << 40), TokenSlot(0)}}),
            kInvalid);
  EXPECT_EQ(code({{TokenCount(6), TokenCount(int64_t{1} << 40), TokenSlot(8)}}), kInvalid)
      << "a bad last_loc on the oversized request itself";
  EXPECT_EQ(code({{TokenCount(6), TokenCount(7), TokenSlot(9)},
                  {TokenCount(6), TokenCount(int64_t{1} << 40), TokenSlot(9)}}),
            kInvalid)
      << "an oversized request continuing a page another request continues";
  // Output span too small.
  std::vector<TokenSlot> small(1);
  EXPECT_EQ(a.AllocateExtend({{TokenCount(0), TokenCount(2), TokenSlot(0)}}, absl::MakeSpan(small))
                .code(),
            kInvalid);
  // Decode with seq_len 0.
  EXPECT_EQ(a.AllocateDecode({{TokenCount(0), TokenSlot(0)}}).status().code(), kInvalid);
  EXPECT_TRUE(Snapshot(a) == before);
}

TEST(PagedTokenAllocatorTest, BadFreesChangeNothing) {
  PagedTokenAllocator a = MakeInOrder(4, 4);
  auto slots = a.AllocateExtend({{TokenCount(0), TokenCount(6), TokenSlot(0)}});
  ASSERT_TRUE(slots.ok());
  const State before = Snapshot(a);
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(a.Free({TokenSlot(4), TokenSlot(10)}).code(), kInvalid) << "never allocated";
  EXPECT_EQ(a.Free({TokenSlot(4), TokenSlot(-1)}).code(), kInvalid) << "outside the pool";
  EXPECT_EQ(a.Free({TokenSlot(4), TokenSlot(1000)}).code(), kInvalid) << "outside the pool";
  EXPECT_EQ(a.Free({TokenSlot(0)}).code(), kInvalid) << "padding page";
  EXPECT_EQ(a.Free({TokenSlot(4), TokenSlot(5), TokenSlot(4)}).code(), kInvalid) << "listed twice";
  EXPECT_TRUE(Snapshot(a) == before);
  ASSERT_TRUE(a.Free({TokenSlot(4)}).ok());
  EXPECT_EQ(a.Free({TokenSlot(4)}).code(), kInvalid) << "double free";
  EXPECT_EQ(a.live_tokens(), TokenCount(5));
}

TEST(PagedTokenAllocatorTest, ShuffledPolicyIsSeededAndNotContiguous) {
  const PageSize ps = *PageSize::Create(4);
  auto run = [&](uint64_t seed) {
    PagedTokenAllocator a =
        *PagedTokenAllocator::Create(PageCount(64), ps, FreePagePolicy::Shuffled(seed));
    return Raw(*a.AllocateExtend({{TokenCount(0), TokenCount(64), TokenSlot(0)}}));
  };
  const std::vector<int32_t> x = run(7);
  EXPECT_EQ(x, run(7));
  EXPECT_NE(x, run(8));
  int page_jumps = 0;
  for (size_t i = 4; i < x.size(); i += 4) page_jumps += (x[i] != x[i - 1] + 1);
  EXPECT_GT(page_jumps, 8) << "pages should not be laid out contiguously";
  // Within a page the slots are still consecutive.
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i] % 4, static_cast<int32_t>(i % 4));
  // Pages given back are shuffled too: after every page is freed, the next allocation takes
  // them in neither the order they were freed nor its reverse, and in the same order for the
  // same seed.
  auto reuse = [&](uint64_t seed) {
    PagedTokenAllocator a =
        *PagedTokenAllocator::Create(PageCount(64), ps, FreePagePolicy::Shuffled(seed));
    const std::vector<TokenSlot> first =
        *a.AllocateExtend({{TokenCount(0), TokenCount(256), TokenSlot(0)}});
    EXPECT_TRUE(a.Free(first).ok());
    std::vector<int32_t> freed, again;
    for (size_t i = 0; i < first.size(); i += 4) freed.push_back(first[i].value() / 4);
    const std::vector<TokenSlot> next =
        *a.AllocateExtend({{TokenCount(0), TokenCount(256), TokenSlot(0)}});
    for (size_t i = 0; i < next.size(); i += 4) again.push_back(next[i].value() / 4);
    EXPECT_NE(again, freed);
    EXPECT_NE(again, std::vector<int32_t>(freed.rbegin(), freed.rend()));
    return again;
  };
  EXPECT_EQ(reuse(7), reuse(7));
}

// The ops a draft phase runs: extends, decodes and frees, the same on any allocator.
std::vector<int32_t> DraftPhase(PagedTokenAllocator& a, int64_t ps, TokenSlot last) {
  auto ext = a.AllocateExtend({{TokenCount(ps + 3), TokenCount(3 * ps + 5), last},
                               {TokenCount(0), TokenCount(2 * ps + 1), TokenSlot(0)}});
  EXPECT_TRUE(ext.ok()) << ext.status();
  std::vector<int32_t> out = Raw(*ext);
  auto dec = a.AllocateDecode({{TokenCount(3 * ps + 6), ext->at(2 * ps + 1)}});
  EXPECT_TRUE(dec.ok()) << dec.status();
  out.push_back(dec->at(0).value());
  // A rejected draft's tokens and a whole request freed inside the phase.
  EXPECT_TRUE(a.Free({ext->back(), dec->at(0)}).ok());
  std::vector<TokenSlot> second(ext->begin() + 2 * ps + 2, ext->end() - 1);
  EXPECT_TRUE(a.Free(second).ok());
  return out;
}

// RollBack returns the allocator to exactly its checkpoint: liveness, the free list and its
// order, and the shuffle's random state, so that what it hands out next is what a copy taken
// at the checkpoint hands out.
TEST(PagedTokenAllocatorCheckpointTest, RollBackRestoresExactly) {
  for (int64_t ps : {1, 7, 16}) {
    for (bool shuffled : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "page_size " << ps << (shuffled ? " shuffled" : ""));
      PagedTokenAllocator a = *PagedTokenAllocator::Create(
          PageCount(40), *PageSize::Create(ps),
          shuffled ? FreePagePolicy::Shuffled(9) : FreePagePolicy::InOrder());
      auto prefix = a.AllocateExtend({{TokenCount(0), TokenCount(ps + 3), TokenSlot(0)},
                                      {TokenCount(0), TokenCount(2 * ps), TokenSlot(0)}});
      ASSERT_TRUE(prefix.ok());
      ASSERT_TRUE(a.Free({prefix->back()}).ok());  // a page back in the free list
      const TokenSlot last = prefix->at(ps + 2);
      const PagedTokenAllocator at_checkpoint = a;
      const State before = Snapshot(a);
      ASSERT_TRUE(a.BeginCheckpoint().ok());
      DraftPhase(a, ps, last);
      EXPECT_FALSE(Snapshot(a) == before);
      ASSERT_TRUE(a.RollBack().ok());
      EXPECT_FALSE(a.checkpoint_open());
      EXPECT_TRUE(Snapshot(a) == before);
      for (int32_t p = 0; p <= 40; ++p) {
        ASSERT_EQ(a.LiveTokensInPage(PageId(p)), at_checkpoint.LiveTokensInPage(PageId(p))) << p;
      }
      PagedTokenAllocator copy = at_checkpoint;
      EXPECT_EQ(DraftPhase(a, ps, last), DraftPhase(copy, ps, last));
      EXPECT_TRUE(Snapshot(a) == Snapshot(copy));
      // The pages the phase released went back in the same order (the shuffle's state too).
      const std::vector<ExtendRequest> more = {{TokenCount(0), TokenCount(6 * ps), TokenSlot(0)}};
      EXPECT_EQ(Raw(*a.AllocateExtend(more)), Raw(*copy.AllocateExtend(more)));
    }
  }
}

TEST(PagedTokenAllocatorCheckpointTest, CommitKeepsAndStatesAreChecked) {
  PagedTokenAllocator a = MakeInOrder(20, 4);
  EXPECT_EQ(a.RollBack().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.Commit().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a.BeginCheckpoint().ok());
  EXPECT_EQ(a.BeginCheckpoint().code(), absl::StatusCode::kFailedPrecondition);
  auto slots = a.AllocateExtend({{TokenCount(0), TokenCount(9), TokenSlot(0)}});
  ASSERT_TRUE(slots.ok());
  const State after = Snapshot(a);
  ASSERT_TRUE(a.Commit().ok());
  EXPECT_TRUE(Snapshot(a) == after);
  EXPECT_EQ(a.RollBack().code(), absl::StatusCode::kFailedPrecondition);
  // No checkpoint around an open free group, and no roll back while one is open.
  ASSERT_TRUE(a.BeginFreeGroup().ok());
  EXPECT_EQ(a.BeginCheckpoint().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a.EndFreeGroup().ok());
  ASSERT_TRUE(a.BeginCheckpoint().ok());
  ASSERT_TRUE(a.BeginFreeGroup().ok());
  EXPECT_EQ(a.RollBack().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a.Free({slots->at(0)}).ok());
  ASSERT_TRUE(a.EndFreeGroup().ok());
  ASSERT_TRUE(a.RollBack().ok());
  EXPECT_TRUE(Snapshot(a) == after) << "the group's free was rolled back too";
}

// Grouped frees: deferred slots stay live (nothing reuses them) until the group ends, which
// frees them all as one Free; each deferring call is all-or-nothing.
TEST(PagedTokenAllocatorFreeGroupTest, DeferredUntilTheEndOfTheStep) {
  PagedTokenAllocator a = MakeInOrder(6, 4);
  auto slots = a.AllocateExtend({{TokenCount(0), TokenCount(8), TokenSlot(0)},
                                 {TokenCount(0), TokenCount(4), TokenSlot(0)}});
  ASSERT_TRUE(slots.ok());
  EXPECT_EQ(Raw(*slots), (std::vector<int32_t>{4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(a.EndFreeGroup().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a.BeginFreeGroup().ok());
  EXPECT_EQ(a.BeginFreeGroup().code(), absl::StatusCode::kFailedPrecondition);
  // Request 1 (page 3) and the second page of request 0 (page 2).
  ASSERT_TRUE(a.Free({TokenSlot(12), TokenSlot(13), TokenSlot(14), TokenSlot(15)}).ok());
  ASSERT_TRUE(a.Free({TokenSlot(8), TokenSlot(9), TokenSlot(10), TokenSlot(11)}).ok());
  EXPECT_EQ(a.deferred_tokens(), TokenCount(8));
  EXPECT_TRUE(a.IsLive(TokenSlot(12)));
  EXPECT_EQ(a.live_tokens(), TokenCount(12));
  const State before = Snapshot(a);
  // Refused, nothing deferred: a slot already deferred, a slot twice, a slot not live.
  EXPECT_EQ(a.Free({TokenSlot(5), TokenSlot(12)}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Free({TokenSlot(5), TokenSlot(5)}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Free({TokenSlot(5), TokenSlot(16)}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.deferred_tokens(), TokenCount(8));
  EXPECT_TRUE(Snapshot(a) == before);
  // Allocation meanwhile takes fresh pages (4, 5), not the deferred ones.
  auto fresh = a.AllocateExtend({{TokenCount(0), TokenCount(5), TokenSlot(0)}});
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(Raw(*fresh), (std::vector<int32_t>{16, 17, 18, 19, 20}));
  ASSERT_TRUE(a.EndFreeGroup().ok());
  EXPECT_FALSE(a.free_group_open());
  EXPECT_FALSE(a.IsLive(TokenSlot(12)));
  EXPECT_EQ(a.live_tokens(), TokenCount(9));
  // Pages 2 and 3 went back together, ascending: page 2 is handed out first.
  auto next = a.AllocateExtend({{TokenCount(0), TokenCount(5), TokenSlot(0)}});
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(Raw(*next), (std::vector<int32_t>{8, 9, 10, 11, 12}));
  // Slot 5 was never freed.
  EXPECT_TRUE(a.IsLive(TokenSlot(5)));
}

// A request freed in the open group is gone for extends, though its slots stay reserved.
TEST(PagedTokenAllocatorFreeGroupTest, AFreedLastLocIsStale) {
  PagedTokenAllocator a = MakeInOrder(4, 4);
  auto slots = a.AllocateExtend({{TokenCount(0), TokenCount(3), TokenSlot(0)}});
  ASSERT_TRUE(slots.ok());
  EXPECT_EQ(Raw(*slots), (std::vector<int32_t>{4, 5, 6}));
  const ExtendRequest more{TokenCount(3), TokenCount(4), TokenSlot(6)};
  ASSERT_TRUE(a.BeginFreeGroup().ok());
  ASSERT_TRUE(a.Free(*slots).ok());
  const State before = Snapshot(a);
  const absl::StatusOr<std::vector<TokenSlot>> r = a.AllocateExtend({more});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("freed in the open free group"), absl::string_view::npos)
      << r.status();
  EXPECT_TRUE(Snapshot(a) == before);
  ASSERT_TRUE(a.EndFreeGroup().ok());
  EXPECT_EQ(a.live_tokens(), TokenCount(0));
}

// The vector form sizes its output only for a batch the pool can serve: a request for far more
// tokens than are free fails without allocating an output for them.
TEST(PagedTokenAllocatorTest, VectorFormRefusesBeforeSizingItsOutput) {
  if (!bench::HeapCounterIsLive()) GTEST_SKIP() << "a sanitizer owns operator new";
  PagedTokenAllocator a = MakeInOrder(int64_t{1} << 16, 16);  // 2^20 slots
  ASSERT_TRUE(a.AllocateExtend({{TokenCount(0), TokenCount(16), TokenSlot(0)}}).ok());
  const int64_t live = bench::HeapLiveBytes();
  bench::ResetHeapPeak();
  const auto r = a.AllocateExtend({{TokenCount(0), TokenCount(int64_t{1} << 20), TokenSlot(0)}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  // An output sized by the pool would be 4 MiB.
  EXPECT_LT(bench::HeapPeakBytes() - live, 64 << 10);
}

// Requests that start new pages have no partially filled page to add room: 64 of them on a
// full pool must not size an output for the room they do not have.
TEST(PagedTokenAllocatorTest, VectorFormRefusesManyNewPageRequestsBeforeSizing) {
  if (!bench::HeapCounterIsLive()) GTEST_SKIP() << "a sanitizer owns operator new";
  PagedTokenAllocator a = MakeInOrder(1, 1 << 16);
  ASSERT_TRUE(a.AllocateExtend({{TokenCount(0), TokenCount(1 << 16), TokenSlot(0)}}).ok());
  const State before = Snapshot(a);
  const std::vector<ExtendRequest> reqs(
      64, ExtendRequest{TokenCount(0), TokenCount((1 << 16) - 1), TokenSlot(0)});
  const int64_t live = bench::HeapLiveBytes();
  bench::ResetHeapPeak();
  const auto r = a.AllocateExtend(reqs);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  // 16 MiB if each request counted a page's room.
  EXPECT_LT(bench::HeapPeakBytes() - live, 64 << 10);
  EXPECT_TRUE(Snapshot(a) == before);
}

// Requests forking from one cached prefix share its last_loc. Where the prefix ends a page,
// or a request adds nothing, no two of them take the same slots: the batch is served.
TEST(PagedTokenAllocatorTest, SharedPrefixAtAPageEndIsServed) {
  PagedTokenAllocator a = MakeInOrder(8, 4);
  const std::vector<TokenSlot> prefix =
      *a.AllocateExtend({{TokenCount(0), TokenCount(8), TokenSlot(0)}});
  const TokenSlot last = prefix.back();
  const auto forks = a.AllocateExtend({{TokenCount(8), TokenCount(10), last},
                                       {TokenCount(8), TokenCount(9), last},
                                       {TokenCount(8), TokenCount(8), last}});
  ASSERT_TRUE(forks.ok()) << forks.status();
  ASSERT_EQ(forks->size(), 3u);
  EXPECT_NE(PageOf((*forks)[0], *PageSize::Create(4)), PageOf((*forks)[2], *PageSize::Create(4)));
  const auto decode = a.AllocateDecode({{TokenCount(9), last}, {TokenCount(9), last}});
  ASSERT_TRUE(decode.ok()) << decode.status();
  EXPECT_NE((*decode)[0], (*decode)[1]);
  // Mid-page, a request that adds nothing shares last_loc with one that continues the page.
  PagedTokenAllocator b = MakeInOrder(8, 4);
  const TokenSlot mid = b.AllocateExtend({{TokenCount(0), TokenCount(6), TokenSlot(0)}})->back();
  const auto one =
      b.AllocateExtend({{TokenCount(6), TokenCount(7), mid}, {TokenCount(6), TokenCount(6), mid}});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, std::vector<TokenSlot>{mid + TokenCount(1)});
  // In a later call too: the slot after last_loc is live now, but a request that adds nothing
  // claims none of the page.
  const auto none = b.AllocateExtend({{TokenCount(6), TokenCount(6), mid}});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace attnmeta
