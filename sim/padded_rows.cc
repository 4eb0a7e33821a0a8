#include "sim/padded_rows.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"

namespace attnmeta {

absl::Status TrimPaddedRows(int64_t real_rows, int64_t row_values, int64_t num_q_heads,
                            std::vector<float>* out, std::vector<float>* lse) {
  if (real_rows < 0 || row_values < 1 || num_q_heads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("padded rows: need real_rows >= 0, row_values >= 1 and num_q_heads >= 1, got ",
                     real_rows, ", ", row_values, ", ", num_q_heads));
  }
  const int64_t out_size = static_cast<int64_t>(out->size());
  const int64_t lse_size = static_cast<int64_t>(lse->size());
  const int64_t bucket = out_size / row_values;
  // Divisions, not products: no count can overflow.
  if (out_size % row_values != 0 || lse_size % num_q_heads != 0 ||
      lse_size / num_q_heads != bucket || real_rows > bucket) {
    return absl::InvalidArgumentError(
        absl::StrCat("padded rows: an output of ", out_size, " values and an lse of ", lse_size,
                     " are not one bucket of rows of ", row_values, " and ", num_q_heads,
                     " values with ", real_rows, " real rows"));
  }
  struct Array {
    const std::vector<float>* values;  // [bucket][per_row]
    int64_t per_row;
    const char* name;
  };
  for (const Array& a : {Array{out, row_values, "output"}, Array{lse, num_q_heads, "lse"}}) {
    for (int64_t e = real_rows * a.per_row; e < bucket * a.per_row; ++e) {
      const float v = (*a.values)[e];
      if (!std::isfinite(v)) {
        return absl::InternalError(
            absl::StrCat("padded row ", e / a.per_row, " of the bucket: ", v, " in its ", a.name));
      }
    }
  }
  out->resize(real_rows * row_values);
  lse->resize(real_rows * num_q_heads);
  return absl::OkStatus();
}

}  // namespace attnmeta
