#include "attention/metadata/validator.h"

#include <functional>
#include <string>

#include "attention/metadata/builders.h"
#include "attention/metadata/testing/batch_fixture.h"
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

  absl::Status Validate(const ForwardMetadata& m) const {
    return ValidateForwardMetadata(
        m.view(), ValidationContext{f_.pool_slots(), f_.page_size(), f_.num_query_rows()});
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

TEST_F(ValidatorTest, NamesEachBrokenInvariant) {
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
  ExpectRejected("kv_last_page_len", [](ForwardMetadata& m) { m.kv_last_page_len.pop_back(); });
  ExpectRejected("page_table", [](ForwardMetadata& m) { m.page_table = PageTable(3, 1); });
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

TEST_F(ValidatorTest, PaddingPageOnlyWhereAllowed) {
  ForwardMetadata m = good_;
  m.page_table = PageTable();
  m.kv_indices[5] = TokenSlot(0);
  ValidationContext ctx{f_.pool_slots(), f_.page_size(), f_.num_query_rows()};
  EXPECT_EQ(ValidateForwardMetadata(m.view(), ctx).code(), absl::StatusCode::kInvalidArgument);
  ctx.allow_padding_page = true;
  EXPECT_TRUE(ValidateForwardMetadata(m.view(), ctx).ok());
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

}  // namespace
}  // namespace attnmeta
