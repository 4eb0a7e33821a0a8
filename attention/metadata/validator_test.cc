#include "attention/metadata/validator.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "attention/metadata/builders.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

using testing::BatchFixture;

class ValidatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    f_.AddSequence(37, 5);
    f_.AddSequence(0, 20);
    f_.AddSequenceSharingPrefix(0, 32, 33, 2);
    auto m = BuildForwardMetadata(f_.Batch(ForwardMode::kExtend), f_.pool(), f_.page_size());
    ASSERT_TRUE(m.ok()) << m.status();
    good_ = *std::move(m);
    ASSERT_TRUE(Validate(good_).ok()) << Validate(good_);
  }

  ValidationContext Context() const {
    ValidationContext ctx{f_.pool_slots(), f_.page_size(), f_.num_query_rows()};
    ctx.check_slot_ownership = true;
    return ctx;
  }
  absl::Status Validate(const ForwardMetadata& m) const {
    return ValidateForwardMetadata(m.view(), Context());
  }

  // Applies `corrupt` to a copy of the good metadata and expects InvalidArgument whose
  // message starts with `array`.
  void ExpectRejected(const std::string& array, const std::function<void(ForwardMetadata&)>& corrupt) {
    ForwardMetadata m = good_;
    corrupt(m);
    const absl::Status s = Validate(m);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << array;
    EXPECT_EQ(std::string(s.message()).rfind(array + ":", 0), 0u)
        << "message should name " << array << ": " << s.message();
  }

  BatchFixture f_{16, 11};
  ForwardMetadata good_;
};

// A captured graph's variable-row extend leaves rows of the padded query tensor that no
// sequence claims. Only allow_unclaimed_rows accepts them, and never more claimed rows than
// the tensor has (the field bug of a prefill qo_indptr given a 4-row query).
TEST_F(ValidatorTest, UnclaimedQueryRowsOnlyWhenAllowedAndNeverClaimsPastTheTensor) {
  const int64_t claimed = f_.num_query_rows().value();
  ValidationContext tail = Context();
  tail.num_query_rows = TokenCount(claimed + 5);
  const absl::Status strict = ValidateForwardMetadata(good_.view(), tail);
  EXPECT_EQ(strict.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(strict.message(), absl::StrCat("qo_indptr: qo_indptr[bs] = ", claimed,
                                           " but the query tensor has ", claimed + 5, " rows"));
  tail.allow_unclaimed_rows = true;
  EXPECT_TRUE(ValidateForwardMetadata(good_.view(), tail).ok())
      << ValidateForwardMetadata(good_.view(), tail);
  ValidationContext short_tensor = Context();
  short_tensor.allow_unclaimed_rows = true;
  short_tensor.num_query_rows = TokenCount(claimed - 1);
  const absl::Status past = ValidateForwardMetadata(good_.view(), short_tensor);
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(past.message(), absl::StrCat("qo_indptr: qo_indptr[bs] = ", claimed,
                                         " but the query tensor has ", claimed - 1, " rows"));
  // Only extend and draft-extend have a tail: another mode's rows are all claimed.
  ForwardMetadata verify = good_;
  verify.mode = ForwardMode::kTargetVerify;
  const absl::Status other = ValidateForwardMetadata(verify.view(), tail);
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(other.message(), strict.message());
  verify.mode = ForwardMode::kDraftExtend;
  EXPECT_TRUE(ValidateForwardMetadata(verify.view(), tail).ok())
      << ValidateForwardMetadata(verify.view(), tail);
}

TEST_F(ValidatorTest, NamesEachBrokenInvariant) {
  ExpectRejected("mode", [](ForwardMetadata& m) { m.mode = static_cast<ForwardMode>(99); });
  ExpectRejected("kv_indptr", [](ForwardMetadata& m) { m.kv_indptr.pop_back(); });
  ExpectRejected("kv_indptr", [](ForwardMetadata& m) { m.kv_indptr[0] = TokenOffset(1); });
  ExpectRejected("kv_indptr", [](ForwardMetadata& m) { m.kv_indptr[2] = TokenOffset(3); });
  ExpectRejected("kv_indptr", [](ForwardMetadata& m) {
    m.kv_indptr[1] = m.kv_indptr[1] + TokenCount(1);
  });
  ExpectRejected("qo_indptr", [](ForwardMetadata& m) { m.qo_indptr.push_back(TokenOffset(99)); });
  ExpectRejected("qo_indptr", [](ForwardMetadata& m) { m.qo_indptr[1] = TokenOffset(0); });
  ExpectRejected("qo_indptr", [](ForwardMetadata& m) {
    m.qo_indptr.back() = m.qo_indptr.back() + TokenCount(1);
  });
  ExpectRejected("kv_indices", [](ForwardMetadata& m) { m.kv_indices.pop_back(); });
  ExpectRejected("kv_indices", [this](ForwardMetadata& m) {
    m.kv_indices[5] = TokenSlot(static_cast<int32_t>(f_.pool_slots().value()));
  });
  ExpectRejected("kv_indices", [](ForwardMetadata& m) { m.kv_indices[5] = TokenSlot(-1); });
  ExpectRejected("kv_indices", [](ForwardMetadata& m) { m.kv_indices[5] = TokenSlot(3); });
  ExpectRejected("max_kv_len", [](ForwardMetadata& m) { m.max_kv_len += TokenCount(16); });
  ExpectRejected("max_q_len", [](ForwardMetadata& m) { m.max_q_len = TokenCount(1); });
  ExpectRejected("kv_last_page_len", [](ForwardMetadata& m) { m.kv_last_page_len[0] = TokenLength(16); });
  ExpectRejected("kv_last_page_len", [](ForwardMetadata& m) {
    m.kv_last_page_len[0] = TokenLength(m.kv_last_page_len[0].value() - 1);
  });
  // The last sequence's step one longer than its kv_len, with kv_indices long enough.
  ExpectRejected("kv_indptr", [](ForwardMetadata& m) {
    m.kv_indptr.back() = m.kv_indptr.back() + TokenCount(1);
    m.kv_indices.push_back(m.kv_indices.back());
  });
  ExpectRejected("kv_last_page_len", [](ForwardMetadata& m) { m.kv_last_page_len.pop_back(); });
  ExpectRejected("page_table",
                 [](ForwardMetadata& m) { m.page_table = PageTable(3, PageCount(1)); });
  ExpectRejected("page_table", [](ForwardMetadata& m) {
    std::swap(m.page_table.span().row(0)[0], m.page_table.span().row(0)[1]);
  });
  ExpectRejected("page_table", [](ForwardMetadata& m) { m.page_table.span().row(1).back() = PageId(5); });
  // A slot moved to another offset of the right page: the page table check is per token.
  ExpectRejected("page_table", [](ForwardMetadata& m) {
    m.kv_indices[1] = m.kv_indices[0];
  });
  ExpectRejected("mode", [](ForwardMetadata& m) { m.mode = ForwardMode::kIdle; });
  ExpectRejected("qo_indptr", [](ForwardMetadata& m) { m.mode = ForwardMode::kDecode; });
}

TEST_F(ValidatorTest, PoolSizeIsCheckedToo) {
  ValidationContext ctx{TokenCount((int64_t{1} << 31) + 1), f_.page_size(), f_.num_query_rows()};
  EXPECT_EQ(ValidateForwardMetadata(good_.view(), ctx).code(), absl::StatusCode::kInvalidArgument);
  ctx.pool_slots = TokenCount(-1);
  EXPECT_EQ(ValidateForwardMetadata(good_.view(), ctx).code(), absl::StatusCode::kInvalidArgument);
  // A pool smaller than one page holds none of the batch's pages.
  ctx.pool_slots = TokenCount(8);
  const absl::Status s = ValidateForwardMetadata(good_.view(), ctx);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  ctx.pool_slots = TokenCount(int64_t{1} << 31);
  EXPECT_TRUE(ValidateForwardMetadata(good_.view(), ctx).ok());
}

// The padding page where allowed, and there only as a padded row reads it: every slot of the
// sequence on it (a real sequence that reached it would share slots with the padded rows).
TEST_F(ValidatorTest, PaddingPageOnlyWhereAllowed) {
  ForwardMetadata m = good_;
  m.page_table = PageTable();
  const int64_t ps = f_.page_size().tokens();
  const int64_t begin = m.kv_indptr[0].value(), end = m.kv_indptr[1].value();
  ASSERT_GT(end, begin);
  for (int64_t k = begin; k < end; ++k) m.kv_indices[k] = TokenSlot((k - begin) % ps);
  ValidationContext ctx{f_.pool_slots(), f_.page_size(), f_.num_query_rows()};
  EXPECT_EQ(ValidateForwardMetadata(m.view(), ctx).code(), absl::StatusCode::kInvalidArgument);
  ctx.allow_padding_page = true;
  for (bool ownership : {false, true}) {
    ctx.check_slot_ownership = ownership;
    EXPECT_TRUE(ValidateForwardMetadata(m.view(), ctx).ok())
        << ValidateForwardMetadata(m.view(), ctx);
  }
  // One slot of the next sequence on the padding page: refused where the page is allowed too.
  ASSERT_GT(m.kv_indptr[2], m.kv_indptr[1]);
  m.kv_indices[end] = TokenSlot(0);
  const absl::Status s = ValidateForwardMetadata(m.view(), ctx);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("sequence 1 token 0 is in slot 0 of the padding page"),
            absl::string_view::npos)
      << s;
}

TEST_F(ValidatorTest, AbsentPageTableIsFine) {
  ForwardMetadata m = good_;
  m.page_table = PageTable();
  EXPECT_TRUE(Validate(m).ok());
}

TEST_F(ValidatorTest, LongerKvIndicesBufferIsACapacityNotAnError) {
  ForwardMetadata m = good_;
  m.kv_indices.resize(m.kv_indices.size() + 100, TokenSlot(-12345));
  EXPECT_TRUE(Validate(m).ok());
}

// Every bound is checked at exactly the limit, on both paths that check slots (the slot
// range alone without a page table, token by token against the page table with one).
TEST_F(ValidatorTest, SlotBoundsAtTheLimitWithAndWithoutAPageTable) {
  const int32_t pool = static_cast<int32_t>(f_.pool_slots().value());
  const int32_t ps = static_cast<int32_t>(f_.page_size().tokens());
  for (bool with_table : {false, true}) {
    SCOPED_TRACE(with_table ? "with a page table" : "without a page table");
    ForwardMetadata m = good_;
    if (!with_table) m.page_table = PageTable();
    // Token 5 of sequence 0 (cached) moved to the pool's last slot: in range. With a page
    // table, its page moves to the pool's last page (token 5 of 16 sits at offset 5).
    auto place = [&](ForwardMetadata& x, int32_t slot) {
      x.kv_indices[5] = TokenSlot(slot);
      if (with_table) {
        const int32_t page = slot / ps;
        for (int t = 0; t < ps; ++t) x.kv_indices[t] = TokenSlot(page * ps + t);
        x.page_table.span().row(0)[0] = PageId(page);
      }
    };
    ForwardMetadata last = m;
    place(last, with_table ? pool - ps + 5 : pool - 1);
    EXPECT_TRUE(Validate(last).ok()) << Validate(last);
    ForwardMetadata past = m;
    place(past, with_table ? pool + 5 : pool);
    EXPECT_EQ(Validate(past).code(), absl::StatusCode::kInvalidArgument);
    // The first allocatable slot (page 1) is in; the padding page's last slot is out.
    ForwardMetadata first = m;
    place(first, with_table ? ps + 5 : ps);
    EXPECT_TRUE(Validate(first).ok()) << Validate(first);
    ForwardMetadata padding = m;
    place(padding, with_table ? 5 : ps - 1);
    EXPECT_EQ(Validate(padding).code(), absl::StatusCode::kInvalidArgument);
  }
  // kv_indices exactly kv_indptr[bs] long is enough; one shorter is not.
  ForwardMetadata exact = good_;
  ASSERT_EQ(static_cast<int64_t>(exact.kv_indices.size()), exact.kv_indptr.back().value());
  EXPECT_TRUE(Validate(exact).ok());
  exact.kv_indices.pop_back();
  EXPECT_EQ(Validate(exact).code(), absl::StatusCode::kInvalidArgument);
  // A page table exactly as wide as the longest sequence needs is enough; one narrower is not.
  ForwardMetadata narrow = good_;
  const PageCount cols = PagesForTokensCeil(narrow.max_kv_len, f_.page_size());
  ASSERT_EQ(narrow.page_table.cols(), cols);
  PageTable table(narrow.page_table.rows(), cols - PageCount(1));
  narrow.page_table = table;
  EXPECT_EQ(Validate(narrow).code(), absl::StatusCode::kInvalidArgument);
  // As wide as needed but a row short of the batch: refused by its shape, before a row past
  // the table is read.
  ForwardMetadata short_rows = good_;
  const int64_t rows = short_rows.page_table.rows();
  ASSERT_GT(rows, 1);
  PageTable fewer(rows - 1, cols);
  for (int64_t r = 0; r + 1 < rows; ++r) {
    const absl::Span<PageId> from = short_rows.page_table.span().row(r);
    std::copy(from.begin(), from.end(), fewer.span().row(r).begin());
  }
  short_rows.page_table = fewer;
  const absl::Status s = Validate(short_rows);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("the batch needs ["), absl::string_view::npos) << s;
}

// Ownership: a slot written this step may not be used by any other token of the batch, even
// when req_to_token, kv_indices and the page table all agree (a page handed out twice).
// Both filter regimes: a pool of 64 pages (the filter covers every slot: exact) and of 4096
// pages (slots hashed by their low bits).
TEST(ValidatorOwnershipTest, APageHandedOutTwiceIsRejected) {
  for (int64_t pages : {64, 4096})
  for (int64_t ps : {1, 16, 64}) {
    SCOPED_TRACE(::testing::Message() << "page_size " << ps << ", " << pages << " pages");
    BatchFixture f(ps, 21, pages);
    f.AddSequence(3 * ps, 4);  // sequence 0: new tokens 3ps .. 3ps+3 start a fresh page
    f.AddSequence(5 * ps, 4);  // sequence 1: likewise
    f.AddSequence(2 * ps + 1, 1);
    BuildOptions checked;
    checked.check = MetadataCheck{f.pool_slots(), f.num_query_rows()};
    ASSERT_TRUE(BuildForwardMetadata(f.Batch(ForwardMode::kExtend), f.pool(), f.page_size(), checked)
                    .ok());

    // Sequence 1's new tokens are given sequence 0's new page: every array agrees.
    ReqToTokenPool& pool = f.mutable_pool();
    const std::vector<TokenSlot> s0 = f.SlotsOf(0);
    const std::vector<TokenSlot> s1 = f.SlotsOf(1);
    std::vector<TokenSlot> stolen(s0.begin() + 3 * ps, s0.begin() + 3 * ps + 4);
    ASSERT_TRUE(pool.Write(f.rows()[1], TokenCount(5 * ps), stolen).ok());
    BuildOptions unchecked;
    auto m = BuildForwardMetadata(f.Batch(ForwardMode::kExtend), f.pool(), f.page_size(), unchecked);
    ASSERT_TRUE(m.ok()) << m.status();
    ValidationContext ctx{f.pool_slots(), f.page_size(), f.num_query_rows()};
    EXPECT_TRUE(ValidateForwardMetadata(m->view(), ctx).ok()) << "consistent without ownership";
    ctx.check_slot_ownership = true;
    absl::Status s = ValidateForwardMetadata(m->view(), ctx);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("written this step by sequence 0"), absl::string_view::npos) << s;
    EXPECT_EQ(BuildForwardMetadata(f.Batch(ForwardMode::kExtend), f.pool(), f.page_size(), checked)
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument);

    // A new token written over a cached token of another sequence is rejected too: sequence
    // 1's row gets back its own slots, then its new page is sequence 2's first (cached) page.
    ASSERT_TRUE(pool.Write(f.rows()[1], TokenCount(0), s1).ok());
    const std::vector<TokenSlot> s2 = f.SlotsOf(2);
    const std::vector<TokenSlot> cached(s2.begin(), s2.begin() + ps);
    ASSERT_TRUE(pool.Write(f.rows()[1], TokenCount(5 * ps), cached).ok());
    m = BuildForwardMetadata(f.Batch(ForwardMode::kExtend), f.pool(), f.page_size(), unchecked);
    ASSERT_TRUE(m.ok()) << m.status();
    s = ValidateForwardMetadata(m->view(), ctx);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("also holds cached token 0 of sequence 2"), absl::string_view::npos)
        << s;
  }
}

// Every cached token is probed, the last of each 32-token block too: a new token of sequence 0
// written over cached token 31 of sequence 1 (page size 1, so the page table agrees).
TEST(ValidatorOwnershipTest, TheLastTokenOfAProbedBlockIsChecked) {
  BatchFixture f(1, 23, 4096);
  f.AddSequence(8, 4);
  f.AddSequence(40, 1);
  const std::vector<TokenSlot> s1 = f.SlotsOf(1);
  ASSERT_TRUE(f.mutable_pool().Write(f.rows()[0], TokenCount(8), {s1[31]}).ok());
  auto m = BuildForwardMetadata(f.Batch(ForwardMode::kExtend), f.pool(), f.page_size());
  ASSERT_TRUE(m.ok()) << m.status();
  ValidationContext ctx{f.pool_slots(), f.page_size(), f.num_query_rows()};
  EXPECT_TRUE(ValidateForwardMetadata(m->view(), ctx).ok()) << "consistent without ownership";
  ctx.check_slot_ownership = true;
  const absl::Status s = ValidateForwardMetadata(m->view(), ctx);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("also holds cached token 31 of sequence 1"), absl::string_view::npos)
      << s;
}

// The page-table fast paths check each page's range: at page sizes 1, 2 and 4 (token by token)
// and 16 (per page), a page one past the pool whose slots match it is refused; so is a slot
// that does not match its page at the last token of a page of 10 tokens (eight at once, then
// one by one).
TEST(ValidatorPageTableTest, FastPathsCheckEveryPageAndToken) {
  for (int64_t ps : {1, 2, 4, 16}) {
    SCOPED_TRACE(::testing::Message() << "page_size " << ps);
    BatchFixture f(ps, 24, 64);
    f.AddSequence(37, 5);
    f.AddSequence(10, 3);
    auto good = BuildForwardMetadata(f.Batch(ForwardMode::kExtend), f.pool(), f.page_size());
    ASSERT_TRUE(good.ok()) << good.status();
    const ValidationContext ctx{f.pool_slots(), f.page_size(), f.num_query_rows()};
    ASSERT_TRUE(ValidateForwardMetadata(good->view(), ctx).ok());
    // Sequence 1's last page moved one past the pool, its slots with it.
    ForwardMetadata past = *good;
    const int64_t end_page = f.pool_slots().value() / ps;
    const int64_t last = PagesForTokensCeil(TokenCount(13), f.page_size()).value() - 1;
    past.page_table.span().row(1)[last] = PageId(static_cast<int32_t>(end_page));
    for (int64_t t = last * ps; t < 13; ++t) {
      past.kv_indices[past.kv_indptr[1].value() + t] =
          TokenSlot(static_cast<int32_t>(end_page * ps + t % ps));
    }
    const absl::Status s = ValidateForwardMetadata(past.view(), ctx);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(std::string(s.message()).rfind("page_table:", 0), 0u) << s;
  }
  // Page size 16: sequence 0's last page holds tokens 32..41; token 41 moved to the next
  // offset of its page, a slot no token holds.
  BatchFixture f(16, 24, 64);
  f.AddSequence(37, 5);
  auto m = BuildForwardMetadata(f.Batch(ForwardMode::kExtend), f.pool(), f.page_size());
  ASSERT_TRUE(m.ok()) << m.status();
  m->kv_indices[41] = TokenSlot(m->kv_indices[41].value() + 1);
  const ValidationContext ctx{f.pool_slots(), f.page_size(), f.num_query_rows()};
  const absl::Status s = ValidateForwardMetadata(m->view(), ctx);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(std::string(s.message()).rfind("page_table:", 0), 0u) << s;
}

TEST(ValidatorOwnershipTest, SharedPrefixesAreFine) {
  BatchFixture f(16, 22);
  f.AddSequence(40, 3);
  f.AddSequenceSharingPrefix(0, 32, 35, 2);
  f.AddSequenceSharingPrefix(0, 40, 40, 1);
  auto m = BuildForwardMetadata(f.Batch(ForwardMode::kExtend), f.pool(), f.page_size());
  ASSERT_TRUE(m.ok()) << m.status();
  ValidationContext ctx{f.pool_slots(), f.page_size(), f.num_query_rows()};
  ctx.check_slot_ownership = true;
  EXPECT_TRUE(ValidateForwardMetadata(m->view(), ctx).ok());
}

}  // namespace
}  // namespace attnmeta

namespace attnmeta {
namespace {

// Target-verify over three sequences of 5, 20 and 2 query rows; the tree rows of each
// are a chain (row r sees rows 0..r), so the FULL mask is causal and every rule below is isolated.
class MaskValidatorTest : public ValidatorTest {
 protected:
  void SetUp() override {
    ValidatorTest::SetUp();
    for (TokenLength q : f_.q_lens()) {
      for (int r = 0; r < q.value(); ++r) {
        for (int c = 0; c < q.value(); ++c) tree_.push_back(c <= r ? 1 : 0);
      }
    }
  }
  ForwardMetadata Verify(MaskLayout layout) {
    ForwardBatch b = f_.Batch(ForwardMode::kTargetVerify);
    b.tree_mask = tree_;
    BuildOptions o;
    o.mask_layout = layout;
    auto m = BuildForwardMetadata(b, f_.pool(), f_.page_size(), o);
    EXPECT_TRUE(m.ok()) << m.status();
    return *std::move(m);
  }
  std::vector<uint8_t> tree_;
};

TEST_F(MaskValidatorTest, NamesEachBrokenMaskInvariant) {
  ForwardMetadata full = Verify(MaskLayout::kFull);
  ASSERT_TRUE(Validate(full).ok()) << Validate(full);
  auto expect = [&](ForwardMetadata m, const std::string& array,
                    const std::function<void(ForwardMetadata&)>& corrupt) {
    corrupt(m);
    const absl::Status s = Validate(m);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << array;
    EXPECT_EQ(std::string(s.message()).rfind(array + ":", 0), 0u) << s.message();
  };
  // Target-verify without its mask; layout none that still carries mask bytes.
  expect(full, "custom_mask", [](ForwardMetadata& m) {
    m.mask_layout = MaskLayout::kNone;
    m.custom_mask.clear();
    m.mask_indptr.clear();
  });
  expect(full, "custom_mask", [](ForwardMetadata& m) {
    m.mode = ForwardMode::kExtend;
    m.mask_layout = MaskLayout::kNone;
  });
  // A mask where the mode takes none: one query row per sequence, so that only the mode's
  // mask rule can refuse it as decode.
  ForwardBatch single = f_.Batch(ForwardMode::kTargetVerify);
  const std::vector<TokenLength> ones(3, TokenLength(1));
  const std::vector<uint8_t> one_row_trees(3, 1);
  single.q_lens = ones;
  single.tree_mask = one_row_trees;
  BuildOptions full_mask;
  full_mask.mask_layout = MaskLayout::kFull;
  absl::StatusOr<ForwardMetadata> rows =
      BuildForwardMetadata(single, f_.pool(), f_.page_size(), full_mask);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ValidationContext three_rows = Context();
  three_rows.num_query_rows = TokenCount(3);
  ASSERT_TRUE(ValidateForwardMetadata(rows->view(), three_rows).ok());
  rows->mode = ForwardMode::kDecode;
  const absl::Status decode_with_mask = ValidateForwardMetadata(rows->view(), three_rows);
  EXPECT_EQ(decode_with_mask.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(decode_with_mask.message()),
              ::testing::HasSubstr("custom_mask: decode takes no custom mask, got full"));
  // mask_indptr: size, start, a step that is not the layout's block.
  expect(full, "mask_indptr", [](ForwardMetadata& m) { m.mask_indptr.pop_back(); });
  expect(full, "mask_indptr", [](ForwardMetadata& m) { m.mask_indptr[0] = 1; });
  expect(full, "mask_indptr", [](ForwardMetadata& m) { m.mask_indptr[1] -= 1; });
  // An entry whose difference from its predecessor overflows (UBSan's CI run sees it).
  expect(full, "mask_indptr", [](ForwardMetadata& m) { m.mask_indptr.back() = INT64_MIN; });
  expect(full, "mask_indptr", [](ForwardMetadata& m) { m.mask_layout = MaskLayout::kQLenOnly; });
  {
    ForwardMetadata unknown = full;
    unknown.mask_layout = static_cast<MaskLayout>(7);
    const absl::Status s = Validate(unknown);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), "custom_mask: mask layout 7 is not a mask layout");
  }
  // The mask: too short, a byte that is not 0/1, a row that does not see itself.
  expect(full, "custom_mask", [](ForwardMetadata& m) { m.custom_mask.pop_back(); });
  expect(full, "custom_mask", [](ForwardMetadata& m) { m.custom_mask[3] = 2; });
  expect(full, "custom_mask", [&](ForwardMetadata& m) {
    // Sequence 1 (q_len 20, kv_len 20): row 7 at position 7.
    m.custom_mask[m.mask_indptr[1] + 7 * 20 + 7] = 0;
  });
  // A draft tree's row that does not see a committed position or the root. Sequence 0: 37
  // committed tokens, 5 rows over kv_len 42, the root at position 37.
  expect(full, "custom_mask", [](ForwardMetadata& m) { m.custom_mask[m.mask_indptr[0] + 0] = 0; });
  expect(full, "custom_mask",
         [](ForwardMetadata& m) { m.custom_mask[m.mask_indptr[0] + 4 * 42 + 36] = 0; });
  expect(full, "custom_mask",
         [](ForwardMetadata& m) { m.custom_mask[m.mask_indptr[0] + 3 * 42 + 37] = 0; });
  ForwardMetadata bits = Verify(MaskLayout::kBitPacked);
  ASSERT_TRUE(Validate(bits).ok()) << Validate(bits);
  expect(bits, "custom_mask", [](ForwardMetadata& m) {
    // Sequence 0 has 5 rows of 4-byte words (max_q_len 20): clear row 4's own bit.
    m.custom_mask[4 * 4] &= static_cast<uint8_t>(~(1u << 4));
  });
  // Row 2 without the root's bit.
  expect(bits, "custom_mask",
         [](ForwardMetadata& m) { m.custom_mask[2 * 4] &= static_cast<uint8_t>(~1u); });
  ForwardMetadata qlen = Verify(MaskLayout::kQLenOnly);
  EXPECT_TRUE(Validate(qlen).ok()) << Validate(qlen);
  // Sequence 0's [5][5] block: row 1 without the root.
  expect(qlen, "custom_mask", [](ForwardMetadata& m) { m.custom_mask[1 * 5 + 0] = 0; });
  ForwardMetadata no_root = full;
  no_root.custom_mask[no_root.mask_indptr[0] + 3 * 42 + 37] = 0;
  EXPECT_THAT(std::string(Validate(no_root).message()),
              ::testing::HasSubstr("row 3 of sequence 0 does not see the root, position 37"));
  // An extend mask need not be a tree's: the same row is fine there.
  no_root.mode = ForwardMode::kExtend;
  EXPECT_TRUE(Validate(no_root).ok()) << Validate(no_root);
}

}  // namespace
}  // namespace attnmeta
