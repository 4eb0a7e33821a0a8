#include "kvcache/paged_token_allocator.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace attnmeta {

absl::StatusOr<PagedTokenAllocator> PagedTokenAllocator::Create(PageCount num_pages,
                                                                PageSize page_size,
                                                                FreePagePolicy policy) {
  if (num_pages.value() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_pages must be >= 1, got ", num_pages.value()));
  }
  if (num_pages.value() > kMaxSlots / page_size.tokens() - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a pool of ", num_pages.value(), " + 1 pages of ", page_size.tokens(),
        " slots exceeds the int32-addressable limit of ", kMaxSlots, " slots"));
  }
  return PagedTokenAllocator(num_pages.value(), page_size, policy);
}

PagedTokenAllocator::PagedTokenAllocator(int64_t num_pages, PageSize page_size,
                                         FreePagePolicy policy)
    : page_size_(page_size),
      num_pages_(num_pages),
      shuffled_(policy.shuffled()),
      rng_(policy.seed()),
      live_(static_cast<size_t>((num_pages + 1) * page_size.tokens()), 0),
      page_live_(static_cast<size_t>(num_pages + 1), 0),
      page_marks_(static_cast<size_t>(num_pages + 1), 0),
      deferred_mark_(static_cast<size_t>((num_pages + 1) * page_size.tokens()), 0) {
  free_list_.reserve(num_pages);
  for (int64_t p = num_pages; p >= 1; --p) free_list_.push_back(PageId(static_cast<int32_t>(p)));
  if (shuffled_) std::shuffle(free_list_.begin(), free_list_.end(), rng_);
}

bool PagedTokenAllocator::IsLive(TokenSlot slot) const {
  return slot.value() >= 0 && slot.value() < pool_slots().value() && live_[slot.value()] != 0;
}

TokenCount PagedTokenAllocator::LiveTokensInPage(PageId page) const {
  if (page.value() < 0 || page.value() > num_pages_) return TokenCount(0);
  return TokenCount(page_live_[page.value()]);
}

absl::StatusOr<int64_t> PagedTokenAllocator::CheckRequest(int64_t index, TokenCount prefix_len,
                                                         TokenCount seq_len,
                                                         TokenSlot last_loc) const {
  const int64_t pool = pool_slots().value();
  if (prefix_len.value() < 0 || seq_len < prefix_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request ", index, ": need 0 <= prefix_len <= seq_len, got prefix_len ",
        prefix_len.value(), ", seq_len ", seq_len.value()));
  }
  if (prefix_len.value() > pool) {
    return absl::InvalidArgumentError(absl::StrCat("request ", index, ": prefix_len ",
                                                   prefix_len.value(), " exceeds the pool's ",
                                                   pool, " slots"));
  }
  // Past the pool a request cannot be served, but it is checked whole first: a batch with a
  // malformed request is InvalidArgument whatever else it asks for. The bound also keeps the
  // page arithmetic below from overflowing.
  const bool past_pool = (seq_len - prefix_len).value() > pool;
  if (prefix_len.value() > 0) {
    if (last_loc.value() < page_size_.tokens() || last_loc.value() >= pool) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", index, ": last_loc ", last_loc.value(), " outside the allocatable slots [",
          page_size_.tokens(), ", ", pool, ")"));
    }
    if (!live_[last_loc.value()]) {
      return absl::InvalidArgumentError(absl::StrCat("request ", index, ": last_loc ",
                                                     last_loc.value(), " is not live"));
    }
    // Deferred slots stay live only so that nothing reuses them before the group ends.
    if (deferred_mark_[last_loc.value()]) {
      return absl::InvalidArgumentError(absl::StrCat("request ", index, ": last_loc ",
                                                     last_loc.value(),
                                                     " was freed in the open free group"));
    }
    // In 64 bits: last_loc + 1 is 2^31 for the last slot of a pool of kMaxSlots.
    const int64_t next_offset = (int64_t{last_loc.value()} + 1) % page_size_.tokens();
    if (next_offset != TokenOffsetInPage(prefix_len, page_size_).value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", index, ": (last_loc + 1) % page_size must equal prefix_len % page_size; ",
          "last_loc ", last_loc.value(), ", prefix_len ", prefix_len.value(), ", page_size ",
          page_size_.tokens()));
    }
    if (next_offset != 0) {
      const int64_t room = page_size_.tokens() - next_offset;
      const int64_t used = std::min(room, (seq_len - prefix_len).value());
      for (int64_t i = 1; i <= used; ++i) {
        if (live_[last_loc.value() + i]) {
          return absl::InvalidArgumentError(absl::StrCat(
              "request ", index, ": slot ", last_loc.value() + i,
              " after last_loc is already live; the page is shared or last_loc is stale"));
        }
      }
    }
  }
  if (past_pool) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request ", index, ": ", (seq_len - prefix_len).value(),
        " new tokens exceed the pool's ", pool, " slots"));
  }
  return (PagesForTokensCeil(seq_len, page_size_) - PagesForTokensCeil(prefix_len, page_size_))
      .value();
}

template <typename GetRequest>
absl::StatusOr<int64_t> PagedTokenAllocator::CheckBatch(int64_t n, GetRequest get) {
  int64_t pages_needed = 0;
  int64_t tokens_needed = 0;
  absl::Status past_pool;  // the first request larger than the pool
  scratch_pages_.clear();
  for (int64_t i = 0; i < n; ++i) {
    const ExtendRequest r = get(i);
    absl::StatusOr<int64_t> pages = CheckRequest(i, r.prefix_len, r.seq_len, r.last_loc);
    if (pages.status().code() == absl::StatusCode::kResourceExhausted) {
      // Well-formed, only too large: its page still counts for the shared-page check.
      if (past_pool.ok()) past_pool = pages.status();
    } else if (!pages.ok()) {
      return pages.status();
    } else {
      pages_needed += *pages;
      tokens_needed += (r.seq_len - r.prefix_len).value();
    }
    if (TokenOffsetInPage(r.prefix_len, page_size_).value() != 0 && r.seq_len > r.prefix_len) {
      scratch_pages_.push_back(PageOf(r.last_loc, page_size_));
    }
  }
  // Two requests continuing one partially filled page would be handed the same slots.
  // page_marks_ is all zero between calls; a mark per page finds a repeat in linear time.
  PageId repeated = kPaddingPage;
  for (PageId p : scratch_pages_) {
    if (page_marks_[p.value()]) repeated = p;
    page_marks_[p.value()] = 1;
  }
  for (PageId p : scratch_pages_) page_marks_[p.value()] = 0;
  if (repeated != kPaddingPage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "two requests of the batch continue the same partially filled page ", repeated.value()));
  }
  if (!past_pool.ok()) return past_pool;
  if (pages_needed > free_pages().value()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "batch of ", n, " requests needs ", pages_needed, " new pages (", tokens_needed,
        " tokens), only ", free_pages().value(), " of ", num_pages_, " are free"));
  }
  return tokens_needed;
}

template <typename GetRequest>
void PagedTokenAllocator::PlaceBatch(int64_t n, GetRequest get, TokenSlot* out) {
  for (int64_t i = 0; i < n; ++i) {
    const ExtendRequest r = get(i);
    out = Place(r.prefix_len, r.seq_len, r.last_loc, out);
  }
}

template <typename GetRequest>
absl::Status PagedTokenAllocator::AllocateBatch(int64_t n, GetRequest get,
                                                absl::Span<TokenSlot> out) {
  absl::StatusOr<int64_t> tokens = CheckBatch(n, get);
  if (!tokens.ok()) return tokens.status();
  if (*tokens > static_cast<int64_t>(out.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("output span holds ", out.size(), " slots, the batch needs ", *tokens));
  }
  PlaceBatch(n, get, out.data());
  return absl::OkStatus();
}

// Sized by the checked batch, so a batch that cannot be served allocates nothing.
template <typename GetRequest>
absl::StatusOr<std::vector<TokenSlot>> PagedTokenAllocator::AllocateBatch(int64_t n,
                                                                          GetRequest get) {
  absl::StatusOr<int64_t> tokens = CheckBatch(n, get);
  if (!tokens.ok()) return tokens.status();
  std::vector<TokenSlot> out(*tokens);
  PlaceBatch(n, get, out.data());
  return out;
}

TokenSlot PagedTokenAllocator::TakeSlot(TokenSlot slot) {
  Record(JournalOp::kTake, slot.value());
  live_[slot.value()] = 1;
  ++page_live_[PageOf(slot, page_size_).value()];
  ++live_tokens_;
  return slot;
}

TokenSlot* PagedTokenAllocator::Place(TokenCount prefix_len, TokenCount seq_len,
                                      TokenSlot last_loc, TokenSlot* out) {
  const int64_t ps = page_size_.tokens();
  int64_t pos = prefix_len.value();
  const int64_t end = seq_len.value();
  if (pos % ps != 0 && pos < end) {
    const int64_t k = std::min(end - pos, ps - pos % ps);
    for (int64_t i = 1; i <= k; ++i) *out++ = TakeSlot(last_loc + TokenCount(i));
    pos += k;
  }
  while (pos < end) {
    const PageId page = free_list_.back();
    free_list_.pop_back();
    Record(JournalOp::kPop, page.value());
    const TokenSlot first = FirstSlotOf(page, page_size_);
    const int64_t k = std::min(end - pos, ps);
    for (int64_t i = 0; i < k; ++i) *out++ = TakeSlot(first + TokenCount(i));
    pos += k;
  }
  return out;
}

absl::Status PagedTokenAllocator::AllocateExtend(absl::Span<const ExtendRequest> requests,
                                                 absl::Span<TokenSlot> out) {
  return AllocateBatch(
      static_cast<int64_t>(requests.size()), [&](int64_t i) { return requests[i]; }, out);
}

absl::StatusOr<std::vector<TokenSlot>> PagedTokenAllocator::AllocateExtend(
    absl::Span<const ExtendRequest> requests) {
  return AllocateBatch(static_cast<int64_t>(requests.size()),
                       [&](int64_t i) { return requests[i]; });
}

absl::Status PagedTokenAllocator::AllocateDecode(absl::Span<const DecodeRequest> requests,
                                                 absl::Span<TokenSlot> out) {
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].seq_len.value() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "decode request ", i, ": seq_len must be >= 1, got ", requests[i].seq_len.value()));
    }
  }
  return AllocateBatch(
      static_cast<int64_t>(requests.size()),
      [&](int64_t i) {
        const DecodeRequest& d = requests[i];
        return ExtendRequest{d.seq_len - TokenCount(1), d.seq_len, d.last_loc};
      },
      out);
}

absl::StatusOr<std::vector<TokenSlot>> PagedTokenAllocator::AllocateDecode(
    absl::Span<const DecodeRequest> requests) {
  std::vector<TokenSlot> out(requests.size());
  if (absl::Status s = AllocateDecode(requests, absl::MakeSpan(out)); !s.ok()) return s;
  return out;
}

absl::Status PagedTokenAllocator::CheckFree(absl::Span<const TokenSlot> slots) {
  const int64_t pool = pool_slots().value();
  for (size_t i = 0; i < slots.size(); ++i) {
    const int32_t s = slots[i].value();
    if (s < 0 || s >= pool) {
      return absl::InvalidArgumentError(
          absl::StrCat("free: slot ", s, " (entry ", i, ") outside the pool [0, ", pool, ")"));
    }
    if (!live_[s]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "free: slot ", s, " (entry ", i, ") is not live (never allocated or already freed)"));
    }
  }
  // Marks find a slot listed twice, or one already deferred in the open group; the marks of
  // this call are cleared again either way.
  absl::Status status;
  size_t marked = 0;
  for (; marked < slots.size(); ++marked) {
    uint8_t& mark = deferred_mark_[slots[marked].value()];
    if (mark != 0) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "free: slot ", slots[marked].value(), " (entry ", marked, ") is ",
          mark == 1 ? "already freed in the open free group" : "listed twice"));
      break;
    }
    mark = 2;
  }
  for (size_t i = 0; i < marked; ++i) deferred_mark_[slots[i].value()] = 0;
  return status;
}

void PagedTokenAllocator::FreeChecked(absl::Span<const TokenSlot> slots) {
  for (const TokenSlot slot : slots) {
    live_[slot.value()] = 0;
    Record(JournalOp::kFree, slot.value());
  }
  scratch_pages_.clear();
  for (const TokenSlot slot : slots) {
    const PageId page = PageOf(slot, page_size_);
    if (--page_live_[page.value()] == 0) scratch_pages_.push_back(page);
  }
  live_tokens_ -= static_cast<int64_t>(slots.size());
  Release(scratch_pages_);
  if (!scratch_pages_.empty()) Record(JournalOp::kPush, static_cast<int64_t>(scratch_pages_.size()));
}

absl::Status PagedTokenAllocator::Free(absl::Span<const TokenSlot> slots) {
  if (absl::Status s = CheckFree(slots); !s.ok()) return s;
  if (free_group_open_) {
    for (const TokenSlot slot : slots) deferred_mark_[slot.value()] = 1;
    deferred_.insert(deferred_.end(), slots.begin(), slots.end());
    return absl::OkStatus();
  }
  FreeChecked(slots);
  return absl::OkStatus();
}

absl::Status PagedTokenAllocator::BeginFreeGroup() {
  if (free_group_open_) return absl::FailedPreconditionError("a free group is already open");
  free_group_open_ = true;
  return absl::OkStatus();
}

absl::Status PagedTokenAllocator::EndFreeGroup() {
  if (!free_group_open_) return absl::FailedPreconditionError("no free group is open");
  for (const TokenSlot slot : deferred_) deferred_mark_[slot.value()] = 0;
  FreeChecked(deferred_);
  deferred_.clear();
  free_group_open_ = false;
  return absl::OkStatus();
}

absl::Status PagedTokenAllocator::BeginCheckpoint() {
  if (checkpoint_open_) return absl::FailedPreconditionError("a checkpoint is already open");
  if (free_group_open_) {
    return absl::FailedPreconditionError("a free group is open: end it before a checkpoint");
  }
  checkpoint_open_ = true;
  journal_.clear();
  checkpoint_rng_ = rng_;
  return absl::OkStatus();
}

absl::Status PagedTokenAllocator::Commit() {
  if (!checkpoint_open_) return absl::FailedPreconditionError("no checkpoint is open");
  checkpoint_open_ = false;
  journal_.clear();
  return absl::OkStatus();
}

absl::Status PagedTokenAllocator::RollBack() {
  if (!checkpoint_open_) return absl::FailedPreconditionError("no checkpoint is open");
  if (free_group_open_) {
    return absl::FailedPreconditionError("a free group is open: end it before rolling back");
  }
  for (auto it = journal_.rbegin(); it != journal_.rend(); ++it) {
    switch (it->op) {
      case JournalOp::kTake:
        live_[it->value] = 0;
        --page_live_[PageOf(TokenSlot(it->value), page_size_).value()];
        --live_tokens_;
        break;
      case JournalOp::kPop:
        free_list_.push_back(PageId(it->value));
        break;
      case JournalOp::kFree:
        live_[it->value] = 1;
        ++page_live_[PageOf(TokenSlot(it->value), page_size_).value()];
        ++live_tokens_;
        break;
      case JournalOp::kPush:
        free_list_.resize(free_list_.size() - static_cast<size_t>(it->value));
        break;
    }
  }
  rng_ = checkpoint_rng_;
  journal_.clear();
  checkpoint_open_ = false;
  return absl::OkStatus();
}

void PagedTokenAllocator::Release(std::vector<PageId>& pages) {
  if (shuffled_) {
    std::shuffle(pages.begin(), pages.end(), rng_);
  } else if (pages.size() * 16 > static_cast<size_t>(num_pages_)) {
    // Many pages at once (page_size 1 frees one page per token): a scan of a page bitmap
    // sorts them in linear time.
    for (PageId p : pages) page_marks_[p.value()] = 1;
    pages.clear();
    for (int64_t p = 1; p <= num_pages_; ++p) {
      if (page_marks_[p]) pages.push_back(PageId(static_cast<int32_t>(p)));
      page_marks_[p] = 0;
    }
  } else {
    std::sort(pages.begin(), pages.end());
  }
  // free_list_.back() is the front: push in reverse so that pages[0] is handed out first.
  free_list_.insert(free_list_.end(), pages.rbegin(), pages.rend());
}

}  // namespace attnmeta
