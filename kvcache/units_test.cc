#include "kvcache/units.h"

#include <type_traits>
#include <utility>

#include "gtest/gtest.h"

namespace attnmeta {
namespace {

TEST(PageSizeTest, RejectsZeroNegativeAndHuge) {
  EXPECT_EQ(PageSize::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PageSize::Create(-16).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PageSize::Create(PageSize::kMaxTokens + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(PageSize::Create(1).ok());
  EXPECT_EQ(PageSize::Create(7)->tokens(), 7);
}

TEST(UnitsTest, ConversionsForNonPowerOfTwoPageSize) {
  const PageSize ps = *PageSize::Create(7);
  EXPECT_EQ(PageOf(TokenSlot(0), ps), PageId(0));
  EXPECT_EQ(PageOf(TokenSlot(6), ps), PageId(0));
  EXPECT_EQ(PageOf(TokenSlot(7), ps), PageId(1));
  EXPECT_EQ(PageOf(TokenSlot(50), ps), PageId(7));
  EXPECT_EQ(OffsetInPage(TokenSlot(50), ps), TokenCount(1));
  EXPECT_EQ(FirstSlotOf(PageId(3), ps), TokenSlot(21));
  EXPECT_EQ(PagesForTokensCeil(TokenCount(0), ps), PageCount(0));
  EXPECT_EQ(PagesForTokensCeil(TokenCount(1), ps), PageCount(1));
  EXPECT_EQ(PagesForTokensCeil(TokenCount(7), ps), PageCount(1));
  EXPECT_EQ(PagesForTokensCeil(TokenCount(8), ps), PageCount(2));
  EXPECT_EQ(TokensInPages(PageCount(3), ps), TokenCount(21));
  EXPECT_EQ(TokenOffsetInPage(TokenCount(15), ps), TokenCount(1));
  // Token n of a padded row stays on the padding page (page 0): slot n % page_size.
  EXPECT_EQ(PaddedRowSlot(TokenCount(0), ps), TokenSlot(0));
  EXPECT_EQ(PaddedRowSlot(TokenCount(15), ps), TokenSlot(1));
  EXPECT_EQ(PaddedRowSlot(TokenCount(15), *PageSize::Create(1)), TokenSlot(0));
}

TEST(UnitsTest, ShiftAndDivideAgree) {
  for (int64_t p = 1; p <= 300; ++p) {
    const PageSize ps = *PageSize::Create(p);
    EXPECT_EQ(ps.log2() >= 0, (p & (p - 1)) == 0) << p;
    for (int32_t s : {0, 1, 5, 63, 64, 65, 1000, 123457, 2147483647}) {
      ASSERT_EQ(PageOf(TokenSlot(s), ps).value(), s / p) << s << " / " << p;
      ASSERT_EQ(OffsetInPage(TokenSlot(s), ps).value(), s % p) << s << " % " << p;
    }
  }
}

TEST(UnitsTest, PageSizeOneMakesSlotsAndPagesCoincide) {
  const PageSize ps = *PageSize::Create(1);
  for (int32_t s : {0, 1, 5, 1000}) {
    EXPECT_EQ(PageOf(TokenSlot(s), ps).value(), s);
    EXPECT_EQ(OffsetInPage(TokenSlot(s), ps), TokenCount(0));
  }
}

TEST(UnitsTest, SlotArithmetic) {
  EXPECT_EQ(TokenSlot(10) + TokenCount(5), TokenSlot(15));
  EXPECT_EQ(TokenSlot(15) - TokenSlot(10), TokenCount(5));
  TokenCount c(3);
  c += TokenCount(4);
  EXPECT_EQ(c, TokenCount(7));
  c -= TokenCount(7);
  EXPECT_EQ(c, TokenCount(0));
  EXPECT_LT(TokenCount(1), TokenCount(2));
  EXPECT_EQ(PageCount(2) + PageCount(3), PageCount(5));
}

// The units do not convert into each other implicitly: mixing them does not compile.
TEST(UnitsTest, NoImplicitConversions) {
  static_assert(!std::is_convertible_v<int32_t, TokenSlot>);
  static_assert(!std::is_convertible_v<int32_t, PageId>);
  static_assert(!std::is_convertible_v<int64_t, TokenCount>);
  static_assert(!std::is_convertible_v<TokenSlot, PageId>);
  static_assert(!std::is_convertible_v<PageId, TokenSlot>);
  static_assert(!std::is_convertible_v<TokenCount, PageCount>);
  static_assert(!std::is_convertible_v<PageCount, TokenCount>);
  static_assert(!std::is_convertible_v<TokenSlot, int32_t>);
  static_assert(!std::is_constructible_v<PageSize, int>);
  // Offsets into flattened arrays and positions within a sequence are different units.
  static_assert(!std::is_convertible_v<TokenOffset, TokenPosition>);
  static_assert(!std::is_convertible_v<TokenPosition, TokenOffset>);
  static_assert(!std::is_convertible_v<TokenLength, TokenCount>);
}

// Whether `a op b` compiles, for the operators a unit may or may not have.
template <typename A, typename B, typename = void>
struct HasPlus : std::false_type {};
template <typename A, typename B>
struct HasPlus<A, B, std::void_t<decltype(std::declval<A>() + std::declval<B>())>>
    : std::true_type {};
template <typename A, typename B, typename = void>
struct HasMinus : std::false_type {};
template <typename A, typename B>
struct HasMinus<A, B, std::void_t<decltype(std::declval<A>() - std::declval<B>())>>
    : std::true_type {};
template <typename A, typename B, typename = void>
struct HasTimes : std::false_type {};
template <typename A, typename B>
struct HasTimes<A, B, std::void_t<decltype(std::declval<A>() * std::declval<B>())>>
    : std::true_type {};
template <typename A, typename B, typename = void>
struct HasDivide : std::false_type {};
template <typename A, typename B>
struct HasDivide<A, B, std::void_t<decltype(std::declval<A>() / std::declval<B>())>>
    : std::true_type {};
template <typename A, typename B, typename = void>
struct HasModulo : std::false_type {};
template <typename A, typename B>
struct HasModulo<A, B, std::void_t<decltype(std::declval<A>() % std::declval<B>())>>
    : std::true_type {};
template <typename A, typename B, typename = void>
struct HasLess : std::false_type {};
template <typename A, typename B>
struct HasLess<A, B, std::void_t<decltype(std::declval<A>() < std::declval<B>())>>
    : std::true_type {};

// Only the operators that mean something (DESIGN.md section 1; field bug row 9: a token-level
// slot has no page arithmetic). The detectors are checked on the operators a unit does have,
// so that a broken detector cannot pass the negative checks.
TEST(UnitsTest, OnlyMeaningfulOperators) {
  // What a slot, an offset and a count do have.
  static_assert(HasPlus<TokenSlot, TokenCount>::value);
  static_assert(HasMinus<TokenSlot, TokenSlot>::value);
  static_assert(HasPlus<TokenCount, TokenCount>::value);
  static_assert(HasPlus<TokenOffset, TokenCount>::value);
  static_assert(HasMinus<TokenPosition, TokenPosition>::value);
  static_assert(HasLess<TokenSlot, TokenSlot>::value);
  static_assert(HasTimes<int, int>::value && HasDivide<int, int>::value &&
                HasModulo<int, int>::value);
  // No page arithmetic on slots, by a page size or by a number.
  static_assert(!HasDivide<TokenSlot, PageSize>::value);
  static_assert(!HasModulo<TokenSlot, PageSize>::value);
  static_assert(!HasDivide<TokenSlot, int>::value);
  static_assert(!HasModulo<TokenSlot, int>::value);
  static_assert(!HasTimes<TokenSlot, int>::value);
  static_assert(!HasTimes<PageId, PageSize>::value);
  static_assert(!HasTimes<PageId, int>::value);
  // Sums of positions in the pool, or of pages, mean nothing; mixing units neither.
  static_assert(!HasPlus<TokenSlot, TokenSlot>::value);
  static_assert(!HasPlus<PageId, PageId>::value);
  static_assert(!HasPlus<TokenSlot, int>::value);
  static_assert(!HasPlus<TokenSlot, PageCount>::value);
  static_assert(!HasPlus<TokenCount, PageCount>::value);
  static_assert(!HasMinus<TokenSlot, PageId>::value);
  static_assert(!HasPlus<TokenOffset, TokenOffset>::value);
  static_assert(!HasPlus<TokenOffset, TokenPosition>::value);
  // Comparisons only within a unit.
  static_assert(!HasLess<TokenSlot, PageId>::value);
  static_assert(!HasLess<TokenCount, PageCount>::value);
  static_assert(!HasLess<TokenSlot, int>::value);
}

}  // namespace
}  // namespace attnmeta
