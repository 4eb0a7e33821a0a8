// The page table: a page-level view derived from token-level metadata, in its own type and
// its own buffer (never a reinterpretation of a token-level array).
//
// Entry [i][j] is the page holding tokens [j * page_size, (j + 1) * page_size) of sequence i;
// columns past the sequence's ceil(kv_len / page_size) pages hold kPaddingPage.

#ifndef ATTNMETA_ATTENTION_METADATA_PAGE_TABLE_H_
#define ATTNMETA_ATTENTION_METADATA_PAGE_TABLE_H_

#include <cstdint>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kvcache/units.h"

namespace attnmeta {

// A [rows][cols] row-major view over PageId storage; T is PageId or const PageId.
template <typename T>
class PageTableSpan {
  static_assert(std::is_same_v<std::remove_const_t<T>, PageId>);

 public:
  PageTableSpan() = default;
  // InvalidArgument unless rows >= 0, cols >= 0 and storage holds rows * cols entries.
  static absl::StatusOr<PageTableSpan> Create(absl::Span<T> storage, int64_t rows, PageCount cols) {
    const int64_t c = cols.value();
    if (rows < 0 || c < 0 || (c > 0 && rows > static_cast<int64_t>(storage.size()) / c)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "page table [", rows, "][", c, "] does not fit in ", storage.size(), " entries"));
    }
    return PageTableSpan(storage.subspan(0, rows * c), rows, cols);
  }
  // A mutable span converts to a const one.
  template <typename U, typename = std::enable_if_t<std::is_same_v<const U, T>>>
  PageTableSpan(PageTableSpan<U> o) : entries_(o.entries()), rows_(o.rows()), cols_(o.cols()) {}

  int64_t rows() const { return rows_; }
  PageCount cols() const { return cols_; }
  // REQUIRES: 0 <= i < rows().
  absl::Span<T> row(int64_t i) const { return entries_.subspan(i * cols_.value(), cols_.value()); }
  absl::Span<T> entries() const { return entries_; }

 private:
  PageTableSpan(absl::Span<T> entries, int64_t rows, PageCount cols)
      : entries_(entries), rows_(rows), cols_(cols) {}
  absl::Span<T> entries_;
  int64_t rows_ = 0;
  PageCount cols_;
};

// An owned page table.
class PageTable {
 public:
  PageTable() = default;
  // REQUIRES: rows >= 0, cols >= 0. Every entry starts as kPaddingPage.
  PageTable(int64_t rows, PageCount cols)
      : entries_(static_cast<size_t>(rows * cols.value()), kPaddingPage),
        rows_(rows),
        cols_(cols) {}

  int64_t rows() const { return rows_; }
  PageCount cols() const { return cols_; }
  PageTableSpan<PageId> span() {
    return *PageTableSpan<PageId>::Create(absl::MakeSpan(entries_), rows_, cols_);
  }
  PageTableSpan<const PageId> span() const {
    return *PageTableSpan<const PageId>::Create(absl::MakeConstSpan(entries_), rows_, cols_);
  }

 private:
  std::vector<PageId> entries_;  // [rows * cols]
  int64_t rows_ = 0;
  PageCount cols_;
};

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_PAGE_TABLE_H_
