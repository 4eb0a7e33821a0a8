// PagedTokenAllocator: hands out token slots of a paged KV pool, page by page.
//
// The pool has (num_pages + 1) * page_size slots. Page 0 is the padding page (padded rows of
// a captured graph write there) and is never handed out; pages 1..num_pages are.
//
// A request's tokens fill its pages in order: an extend first continues the request's last,
// partially filled page at last_loc + 1, then takes whole new pages, then a final partial
// page. Slots die one by one (Free); a page returns to the free list when its last live slot
// dies. Every call is all-or-nothing: on any error the allocator is exactly as before.
//
// Not thread-safe; the scheduler owns it.

#ifndef ATTNMETA_KVCACHE_PAGED_TOKEN_ALLOCATOR_H_
#define ATTNMETA_KVCACHE_PAGED_TOKEN_ALLOCATOR_H_

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvcache/units.h"

namespace attnmeta {

// The order in which free pages are handed out.
class FreePagePolicy {
 public:
  // The reference system's order: the free list starts as 1..num_pages; released pages go to
  // the front in ascending order.
  static FreePagePolicy InOrder() { return FreePagePolicy(false, 0); }
  // The free list starts as a seeded permutation of 1..num_pages; released pages go to the
  // front in a seeded random order. Tests use it so that no request is laid out contiguously
  // by accident (which would hide token-vs-page unit bugs).
  static FreePagePolicy Shuffled(uint64_t seed) { return FreePagePolicy(true, seed); }

  bool shuffled() const { return shuffled_; }
  uint64_t seed() const { return seed_; }

 private:
  FreePagePolicy(bool shuffled, uint64_t seed) : shuffled_(shuffled), seed_(seed) {}
  bool shuffled_;
  uint64_t seed_;
};

// One request of an extend batch.
struct ExtendRequest {
  TokenCount prefix_len;  // tokens the request already holds, >= 0
  TokenCount seq_len;     // tokens it holds after the extend, >= prefix_len
  // The slot of token prefix_len - 1, i.e. the request's last slot. Read only when
  // prefix_len > 0; then (last_loc + 1) % page_size == prefix_len % page_size.
  TokenSlot last_loc;
};

// One request of a decode batch: one new token.
struct DecodeRequest {
  TokenCount seq_len;  // tokens the request holds after the decode (counting the new one), >= 1
  TokenSlot last_loc;  // the slot of token seq_len - 2; read only when seq_len >= 2
};

class PagedTokenAllocator {
 public:
  // The pool's slots must stay int32-addressable.
  static constexpr int64_t kMaxSlots = int64_t{1} << 31;

  // InvalidArgument unless num_pages >= 1 and (num_pages + 1) * page_size <= kMaxSlots.
  static absl::StatusOr<PagedTokenAllocator> Create(PageCount num_pages, PageSize page_size,
                                                    FreePagePolicy policy);

  // Allocates seq_len - prefix_len slots for each request, request after request, and writes
  // them to `out`, request-major: out[0 .. sum(seq_len - prefix_len)). Requests are served in
  // batch order, each taking its whole pages first and its final partial page last.
  // Errors (the allocator and `out` are untouched):
  //   InvalidArgument: negative lengths, prefix_len > seq_len, a last_loc outside the pool, in
  //     the padding page, not live, breaking the page-offset invariant, or with a live slot
  //     after it that the extend would need; two requests of the batch continuing the same
  //     partially filled page (a last_loc shared at a page's end, or by a request with no new
  //     tokens, is fine: a shared prefix); a prefix_len beyond the pool's slots;
  //     `out` smaller than the number of new tokens;
  //   ResourceExhausted: a request with more new tokens than the pool has slots, or not
  //     enough free pages for the whole batch (checked after every request is checked for
  //     InvalidArgument, before the output's size).
  //   While a free group is open, a last_loc freed in the group is not live.
  absl::Status AllocateExtend(absl::Span<const ExtendRequest> requests,
                              absl::Span<TokenSlot> out);
  absl::StatusOr<std::vector<TokenSlot>> AllocateExtend(absl::Span<const ExtendRequest> requests);

  // One new slot per request: last_loc + 1, or the first slot of a new page when the new
  // token starts a page. out[i] is request i's slot. Errors as for AllocateExtend.
  absl::Status AllocateDecode(absl::Span<const DecodeRequest> requests, absl::Span<TokenSlot> out);
  absl::StatusOr<std::vector<TokenSlot>> AllocateDecode(absl::Span<const DecodeRequest> requests);

  // Frees `slots`. A page whose last live slot dies returns to the free list.
  // InvalidArgument (and nothing freed) if any slot is outside the pool, not live, or listed
  // twice. While a free group is open, defers them instead (see below).
  absl::Status Free(absl::Span<const TokenSlot> slots);

  // ---- Speculation: checkpoint and roll back ----
  // BeginCheckpoint starts recording; RollBack returns the allocator to exactly the state of
  // the checkpoint (liveness, the free list and its order, the shuffle's random state) and
  // closes it; Commit keeps every change since and closes it. Calls in between work as always
  // and cost one journal entry per slot or page they touch. The draft phase of speculative
  // decoding allocates under a checkpoint; a rejected draft rolls back.
  // FailedPrecondition: Begin with a checkpoint already open; RollBack or Commit without one;
  // Begin or RollBack while a free group is open.
  absl::Status BeginCheckpoint();
  absl::Status RollBack();
  absl::Status Commit();
  bool checkpoint_open() const { return checkpoint_open_; }

  // ---- Grouped frees ----
  // While a free group is open, Free checks its slots as always (and also refuses a slot
  // already deferred in the group) and defers them: they stay live, so nothing allocated in
  // the meantime reuses them. EndFreeGroup frees every deferred slot at once, as one Free
  // of them all in the order they were given (engines free a finished batch at the end of a
  // step). FailedPrecondition: Begin with a group open, End without one.
  absl::Status BeginFreeGroup();
  absl::Status EndFreeGroup();
  bool free_group_open() const { return free_group_open_; }
  // Slots deferred in the open group.
  TokenCount deferred_tokens() const { return TokenCount(static_cast<int64_t>(deferred_.size())); }

  PageSize page_size() const { return page_size_; }
  // Pages that can be handed out (page 0 excluded).
  PageCount total_pages() const { return PageCount(num_pages_); }
  PageCount free_pages() const { return PageCount(static_cast<int64_t>(free_list_.size())); }
  PageCount used_pages() const { return total_pages() - free_pages(); }
  TokenCount live_tokens() const { return TokenCount(live_tokens_); }
  // All slots of the pool, padding page included: (num_pages + 1) * page_size.
  TokenCount pool_slots() const { return TokensInPages(PageCount(num_pages_ + 1), page_size_); }
  bool IsLive(TokenSlot slot) const;
  // The number of live slots in `page`; 0 for a page outside the pool.
  TokenCount LiveTokensInPage(PageId page) const;

 private:
  PagedTokenAllocator(int64_t num_pages, PageSize page_size, FreePagePolicy policy);

  // The shared body of AllocateExtend and AllocateDecode; get(i) returns request i as an
  // ExtendRequest. CheckBatch returns every error of the batch but the output's size, and the
  // number of new tokens; PlaceBatch then serves the checked batch into out[0 .. that number).
  template <typename GetRequest>
  absl::StatusOr<int64_t> CheckBatch(int64_t n, GetRequest get);
  template <typename GetRequest>
  void PlaceBatch(int64_t n, GetRequest get, TokenSlot* out);
  template <typename GetRequest>
  absl::Status AllocateBatch(int64_t n, GetRequest get, absl::Span<TokenSlot> out);
  template <typename GetRequest>
  absl::StatusOr<std::vector<TokenSlot>> AllocateBatch(int64_t n, GetRequest get);
  // Checks one request that continues from (prefix_len, last_loc) to seq_len and returns the
  // number of new pages it needs.
  absl::StatusOr<int64_t> CheckRequest(int64_t index, TokenCount prefix_len, TokenCount seq_len,
                                       TokenSlot last_loc) const;
  // Writes the slots of one validated request; takes its new pages from the free list.
  TokenSlot* Place(TokenCount prefix_len, TokenCount seq_len, TokenSlot last_loc, TokenSlot* out);
  TokenSlot TakeSlot(TokenSlot slot);
  // Returns `pages` (distinct) to the front of the free list: ascending for the in-order
  // policy, in a seeded random order for the shuffled one.
  void Release(std::vector<PageId>& pages);
  // InvalidArgument unless every slot is inside the pool, live, not deferred and listed once.
  // Nothing changes either way.
  absl::Status CheckFree(absl::Span<const TokenSlot> slots);
  // Frees slots CheckFree accepted.
  void FreeChecked(absl::Span<const TokenSlot> slots);

  // What RollBack undoes, newest last.
  enum class JournalOp : uint8_t { kTake, kPop, kFree, kPush };
  struct JournalEntry {
    JournalOp op;
    int32_t value;  // the slot (kTake, kFree), the page (kPop), the page count (kPush)
  };
  void Record(JournalOp op, int64_t value) {
    if (checkpoint_open_) journal_.push_back(JournalEntry{op, static_cast<int32_t>(value)});
  }

  PageSize page_size_;
  int64_t num_pages_;
  bool shuffled_;
  std::mt19937_64 rng_;
  std::vector<PageId> free_list_;      // back() is the front of the list: handed out next
  std::vector<uint8_t> live_;          // [pool_slots], 1 where the slot is live
  std::vector<int32_t> page_live_;     // [num_pages + 1], live slots per page
  std::vector<uint8_t> page_marks_;    // [num_pages + 1], all zero between calls
  int64_t live_tokens_ = 0;
  std::vector<PageId> scratch_pages_;  // reused by Free and the batch checks
  bool checkpoint_open_ = false;
  std::vector<JournalEntry> journal_;  // since the open checkpoint
  std::mt19937_64 checkpoint_rng_;     // rng_ at the checkpoint
  bool free_group_open_ = false;
  std::vector<TokenSlot> deferred_;    // the open group's slots, in order
  std::vector<uint8_t> deferred_mark_; // [pool_slots], 1 where deferred (and while checking)
};

}  // namespace attnmeta

#endif  // ATTNMETA_KVCACHE_PAGED_TOKEN_ALLOCATOR_H_
