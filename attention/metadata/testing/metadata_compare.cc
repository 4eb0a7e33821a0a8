#include "attention/metadata/testing/metadata_compare.h"

#include <vector>

#include "gtest/gtest.h"

namespace attnmeta {
namespace testing {
namespace {

template <typename T>
std::vector<T> Head(absl::Span<const T> s, size_t n) {
  return std::vector<T>(s.begin(), s.begin() + std::min(n, s.size()));
}

}  // namespace

void ExpectSameMetadata(const ForwardMetadataView& got, const ForwardMetadataView& want) {
  EXPECT_EQ(got.mode, want.mode);
  ASSERT_EQ(got.batch_size(), want.batch_size());
  const int64_t bs = want.batch_size();
  EXPECT_EQ(Head(got.kv_indptr, bs + 1), Head(want.kv_indptr, bs + 1));
  EXPECT_EQ(Head(got.qo_indptr, bs + 1), Head(want.qo_indptr, bs + 1));
  EXPECT_EQ(Head(got.kv_lens, bs), Head(want.kv_lens, bs));
  EXPECT_EQ(Head(got.kv_last_page_len, bs), Head(want.kv_last_page_len, bs));
  const size_t tokens = want.kv_indptr.empty() ? 0 : want.kv_indptr[bs].value();
  EXPECT_EQ(Head(got.kv_indices, tokens), Head(want.kv_indices, tokens));
  EXPECT_EQ(got.max_q_len, want.max_q_len);
  EXPECT_EQ(got.max_kv_len, want.max_kv_len);
  EXPECT_EQ(got.custom_mask.layout, want.custom_mask.layout);
  EXPECT_EQ(Head(got.custom_mask.mask_indptr, bs + 1), Head(want.custom_mask.mask_indptr, bs + 1));
  if (!want.custom_mask.mask_indptr.empty()) {
    const size_t bytes = want.custom_mask.mask_indptr[bs];
    EXPECT_EQ(Head(got.custom_mask.mask, bytes), Head(want.custom_mask.mask, bytes));
  }
  EXPECT_EQ(got.page_table.rows() == 0, want.page_table.rows() == 0);
  if (want.page_table.rows() == 0 || got.page_table.rows() == 0) return;
  ASSERT_GE(got.page_table.cols(), want.page_table.cols());
  for (int64_t i = 0; i < bs; ++i) {
    const absl::Span<const PageId> g = got.page_table.row(i);
    const absl::Span<const PageId> w = want.page_table.row(i);
    EXPECT_EQ(Head(g, w.size()), std::vector<PageId>(w.begin(), w.end())) << "page-table row " << i;
    for (size_t j = w.size(); j < g.size(); ++j) {
      EXPECT_EQ(g[j], kPaddingPage) << "page-table row " << i << " column " << j;
    }
  }
}

}  // namespace testing
}  // namespace attnmeta
