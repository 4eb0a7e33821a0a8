#include "attention/metadata/request_rows.h"

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace attnmeta {
namespace {

// The refusal for request `second`, whose row an earlier request holds.
absl::Status Repeated(absl::Span<const ReqPoolIndex> rows, size_t second) {
  size_t first = 0;
  while (rows[first] != rows[second]) ++first;
  return absl::InvalidArgumentError(absl::StrCat("requests ", first, " and ", second,
                                                 " share req row ", rows[second].value(),
                                                 " (a row holds one request's tokens)"));
}

}  // namespace

absl::Status CheckDistinctRows(absl::Span<const ReqPoolIndex> rows) {
  std::vector<std::pair<int32_t, size_t>> order(rows.size());  // (row, request)
  for (size_t i = 0; i < rows.size(); ++i) order[i] = {rows[i].value(), i};
  std::sort(order.begin(), order.end());
  // The earliest request whose row an earlier one holds: the smallest second of a run.
  size_t second = rows.size();
  for (size_t k = 1; k < order.size(); ++k) {
    if (order[k].first == order[k - 1].first && (k == 1 || order[k - 2].first != order[k].first)) {
      second = std::min(second, order[k].second);
    }
  }
  return second == rows.size() ? absl::OkStatus() : Repeated(rows, second);
}

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
    if (marks[row] != 0) return clear(i, Repeated(rows, i));
    marks[row] = 1;
  }
  return clear(rows.size(), absl::OkStatus());
}

}  // namespace attnmeta
