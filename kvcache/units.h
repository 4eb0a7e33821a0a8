// Unit types of the KV cache: token slots, page ids, token counts, page counts and the page
// size, in the spirit of tcmalloc's PageId/Length. Each is a distinct type with an explicit
// constructor and only the operators that mean something for its unit; crossing units takes
// one of the named conversions at the bottom of this file. A container of `TokenSlot` and a
// container of `PageId` are different types, so token-level and page-level metadata cannot be
// swapped by accident.
//
// Storage: the host's counts (`TokenCount`, `PageCount`) are int64, so that sums over a batch
// cannot overflow silently. What kernels read is int32, one value each (see the
// static_asserts): `TokenSlot` and `PageId`, `TokenLength` (a per-sequence length),
// `TokenOffset` (an indptr entry) and `TokenPosition` (a position within a sequence); they are
// converted to the counts for host arithmetic, and sums are checked against INT32_MAX before
// they are stored back. `PageSize` holds a checked size in [1, 2^20] tokens, a power of two
// or not.

#ifndef ATTNMETA_KVCACHE_UNITS_H_
#define ATTNMETA_KVCACHE_UNITS_H_

#include <cstdint>
#include <ostream>
#include <type_traits>
#include <utility>

#include "absl/status/statusor.h"

namespace attnmeta {
namespace internal {

// What every unit type shares: its stored value and comparisons with its own type (never with
// another unit). Each unit adds only the arithmetic that means something for it.
template <typename Derived, typename Rep>
class Unit {
 public:
  constexpr Rep value() const { return v_; }

  friend constexpr bool operator==(Derived a, Derived b) { return a.v_ == b.v_; }
  friend constexpr bool operator!=(Derived a, Derived b) { return a.v_ != b.v_; }
  friend constexpr bool operator<(Derived a, Derived b) { return a.v_ < b.v_; }
  friend constexpr bool operator<=(Derived a, Derived b) { return a.v_ <= b.v_; }
  friend constexpr bool operator>(Derived a, Derived b) { return a.v_ > b.v_; }
  friend constexpr bool operator>=(Derived a, Derived b) { return a.v_ >= b.v_; }
  template <typename H>
  friend H AbslHashValue(H h, Derived d) {
    return H::combine(std::move(h), d.v_);
  }

 protected:
  constexpr Unit() = default;
  constexpr explicit Unit(Rep v) : v_(v) {}
  Rep v_ = 0;
};

}  // namespace internal

// A number of tokens (a length, a prefix length, a sum of lengths). May be negative only as
// the transient result of a subtraction; validated inputs are >= 0.
class TokenCount : public internal::Unit<TokenCount, int64_t> {
 public:
  constexpr TokenCount() = default;
  constexpr explicit TokenCount(int64_t n) : Unit(n) {}

  constexpr TokenCount& operator+=(TokenCount o) {
    v_ += o.v_;
    return *this;
  }
  constexpr TokenCount& operator-=(TokenCount o) {
    v_ -= o.v_;
    return *this;
  }
  friend constexpr TokenCount operator+(TokenCount a, TokenCount b) { return a += b; }
  friend constexpr TokenCount operator-(TokenCount a, TokenCount b) { return a -= b; }
  friend std::ostream& operator<<(std::ostream& os, TokenCount c) {
    return os << c.value() << " tokens";
  }
};

// A number of pages.
class PageCount : public internal::Unit<PageCount, int64_t> {
 public:
  constexpr PageCount() = default;
  constexpr explicit PageCount(int64_t n) : Unit(n) {}

  constexpr PageCount& operator+=(PageCount o) {
    v_ += o.v_;
    return *this;
  }
  constexpr PageCount& operator-=(PageCount o) {
    v_ -= o.v_;
    return *this;
  }
  friend constexpr PageCount operator+(PageCount a, PageCount b) { return a += b; }
  friend constexpr PageCount operator-(PageCount a, PageCount b) { return a -= b; }
  friend std::ostream& operator<<(std::ostream& os, PageCount c) {
    return os << c.value() << " pages";
  }
};

// The number of token slots in one page: always >= 1 and not necessarily a power of two.
class PageSize {
 public:
  // The largest page size accepted; far above any real kernel's, small enough that page
  // arithmetic on int32 slots cannot overflow an int64 intermediate.
  static constexpr int64_t kMaxTokens = int64_t{1} << 20;

  // InvalidArgument unless 1 <= tokens <= kMaxTokens.
  static absl::StatusOr<PageSize> Create(int64_t tokens);

  constexpr int64_t tokens() const { return tokens_; }
  // log2(tokens) for a power of two, else -1: PageOf and OffsetInPage shift and mask instead
  // of dividing (page size 1, 16 and 64 are the common ones).
  constexpr int log2() const { return log2_; }

  friend constexpr bool operator==(PageSize a, PageSize b) { return a.tokens_ == b.tokens_; }
  friend constexpr bool operator!=(PageSize a, PageSize b) { return a.tokens_ != b.tokens_; }
  friend std::ostream& operator<<(std::ostream& os, PageSize p) {
    return os << "page_size " << p.tokens_;
  }

 private:
  constexpr explicit PageSize(int64_t tokens) : tokens_(tokens), log2_(Log2(tokens)) {}
  static constexpr int Log2(int64_t n) {
    int l = 0;
    while ((int64_t{1} << l) < n) ++l;
    return (int64_t{1} << l) == n ? l : -1;
  }
  int64_t tokens_;
  int log2_;
};

// One row of the KV pool: the K and V of one token of one layer. Slot s lies in page
// s / page_size.
class TokenSlot : public internal::Unit<TokenSlot, int32_t> {
 public:
  constexpr TokenSlot() = default;
  constexpr explicit TokenSlot(int32_t index) : Unit(index) {}

  // REQUIRES: the result fits in int32 (callers have checked it against the pool size).
  friend constexpr TokenSlot operator+(TokenSlot s, TokenCount n) {
    return TokenSlot(static_cast<int32_t>(s.value() + n.value()));
  }
  friend constexpr TokenCount operator-(TokenSlot a, TokenSlot b) {
    return TokenCount(int64_t{a.value()} - b.value());
  }
  friend std::ostream& operator<<(std::ostream& os, TokenSlot s) {
    return os << "slot " << s.value();
  }
};

// A page of the KV pool: slots [id * page_size, (id + 1) * page_size).
class PageId : public internal::Unit<PageId, int32_t> {
 public:
  constexpr PageId() = default;
  constexpr explicit PageId(int32_t id) : Unit(id) {}

  friend std::ostream& operator<<(std::ostream& os, PageId p) { return os << "page " << p.value(); }
};

// A per-sequence length in tokens as kernels read it (seq_lens, kv_last_page_len, q_lens):
// int32, >= 0 once validated. Host arithmetic converts it to TokenCount.
class TokenLength : public internal::Unit<TokenLength, int32_t> {
 public:
  constexpr TokenLength() = default;
  constexpr explicit TokenLength(int32_t n) : Unit(n) {}

  constexpr TokenCount count() const { return TokenCount(value()); }

  friend std::ostream& operator<<(std::ostream& os, TokenLength l) {
    return os << l.value() << " tokens";
  }
};

// An offset into a flattened token-level array: an entry of kv_indptr, qo_indptr or cu_k
// (where a sequence's tokens or query rows begin). int32, as the kernels read it.
class TokenOffset : public internal::Unit<TokenOffset, int32_t> {
 public:
  constexpr TokenOffset() = default;
  constexpr explicit TokenOffset(int32_t offset) : Unit(offset) {}

  friend constexpr TokenCount operator-(TokenOffset a, TokenOffset b) {
    return TokenCount(int64_t{a.value()} - b.value());
  }
  // REQUIRES: the result fits in int32 (callers check sums against INT32_MAX).
  friend constexpr TokenOffset operator+(TokenOffset o, TokenCount n) {
    return TokenOffset(static_cast<int32_t>(o.value() + n.value()));
  }
  friend std::ostream& operator<<(std::ostream& os, TokenOffset o) {
    return os << "offset " << o.value();
  }
};

// A token's position within its own sequence (0-based): a start within a request's row of
// req_to_token (kv_start_idx), a bound of a split-KV range. Not an offset into a flattened
// token array (that is TokenOffset). int32, as kernels read it.
class TokenPosition : public internal::Unit<TokenPosition, int32_t> {
 public:
  constexpr TokenPosition() = default;
  constexpr explicit TokenPosition(int32_t position) : Unit(position) {}

  friend constexpr TokenCount operator-(TokenPosition a, TokenPosition b) {
    return TokenCount(int64_t{a.value()} - b.value());
  }
  friend std::ostream& operator<<(std::ostream& os, TokenPosition p) {
    return os << "position " << p.value();
  }
};

// Page 0 is never handed out: padded rows of a captured graph point their slots at it.
inline constexpr PageId kPaddingPage{0};

// The arrays kernels read are int32; these types are filled into them as-is.
static_assert(sizeof(TokenSlot) == sizeof(int32_t) && std::is_trivially_copyable_v<TokenSlot>);
static_assert(sizeof(PageId) == sizeof(int32_t) && std::is_trivially_copyable_v<PageId>);
static_assert(sizeof(TokenOffset) == sizeof(int32_t) && std::is_trivially_copyable_v<TokenOffset>);
static_assert(sizeof(TokenLength) == sizeof(int32_t) && std::is_trivially_copyable_v<TokenLength>);
static_assert(sizeof(TokenPosition) == sizeof(int32_t) &&
              std::is_trivially_copyable_v<TokenPosition>);

// ---- Named conversions between units ----

// The page holding `slot`.
// REQUIRES: slot.value() >= 0.
constexpr PageId PageOf(TokenSlot slot, PageSize ps) {
  const uint32_t s = static_cast<uint32_t>(slot.value());
  return PageId(static_cast<int32_t>(ps.log2() >= 0 ? s >> ps.log2()
                                                    : s / static_cast<uint32_t>(ps.tokens())));
}

// The position of `slot` within its page, in [0, page_size).
// REQUIRES: slot.value() >= 0.
constexpr TokenCount OffsetInPage(TokenSlot slot, PageSize ps) {
  const uint32_t s = static_cast<uint32_t>(slot.value());
  return TokenCount(ps.log2() >= 0 ? s & static_cast<uint32_t>(ps.tokens() - 1)
                                   : s % static_cast<uint32_t>(ps.tokens()));
}

// The first slot of `page`.
// REQUIRES: the result fits in int32 (the page lies in a pool of int32-addressable slots).
constexpr TokenSlot FirstSlotOf(PageId page, PageSize ps) {
  return TokenSlot(static_cast<int32_t>(int64_t{page.value()} * ps.tokens()));
}

// The number of pages needed to hold `n` tokens: ceil(n / page_size).
// REQUIRES: n >= 0.
constexpr PageCount PagesForTokensCeil(TokenCount n, PageSize ps) {
  return PageCount((n.value() + ps.tokens() - 1) / ps.tokens());
}

// The number of token slots in `n` pages.
constexpr TokenCount TokensInPages(PageCount n, PageSize ps) {
  return TokenCount(n.value() * ps.tokens());
}

// The position of token number `n` (0-based) within its page: n % page_size.
// REQUIRES: n >= 0.
constexpr TokenCount TokenOffsetInPage(TokenCount n, PageSize ps) {
  return TokenCount(n.value() % ps.tokens());
}

// The slot of token `n` (0-based) of a padded row: slot n % page_size of the padding page.
// REQUIRES: n >= 0.
constexpr TokenSlot PaddedRowSlot(TokenCount n, PageSize ps) {
  return FirstSlotOf(kPaddingPage, ps) + TokenOffsetInPage(n, ps);
}

}  // namespace attnmeta

#endif  // ATTNMETA_KVCACHE_UNITS_H_
