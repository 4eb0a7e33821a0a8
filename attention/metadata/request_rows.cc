#include "attention/metadata/request_rows.h"

#include <cstddef>

#include "absl/strings/str_cat.h"

namespace attnmeta {

absl::Status CheckDistinctRows(absl::Span<const ReqPoolIndex> rows, absl::Span<uint8_t> marks) {
  // Clears the marks of rows [0, end) and returns `s`.
  const auto clear = [&](size_t end, absl::Status s) {
    for (size_t j = 0; j < end; ++j) marks[rows[j].value()] = 0;
    return s;
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    const int32_t row = rows[i].value();
    if (row < 0 || static_cast<size_t>(row) >= marks.size()) {
      return clear(
          i, absl::OutOfRangeError(absl::StrCat("request ", i, ": req row ", row,
                                                " outside the table's ", marks.size(), " rows")));
    }
    if (marks[row] != 0) {
      size_t first = 0;
      while (rows[first] != rows[i]) ++first;
      return clear(i, absl::InvalidArgumentError(
                          absl::StrCat("requests ", first, " and ", i, " share req row ", row,
                                       " (a row holds one request's tokens)")));
    }
    marks[row] = 1;
  }
  return clear(rows.size(), absl::OkStatus());
}

}  // namespace attnmeta
