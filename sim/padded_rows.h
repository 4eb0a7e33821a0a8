// TrimPaddedRows: the real rows of an attention launch over a padded bucket, once its padded
// rows are found finite. Host code only, so that CPU tests check it on every commit; the GPU
// replay backend calls it after its split-KV decode launch.

#ifndef ATTNMETA_SIM_PADDED_ROWS_H_
#define ATTNMETA_SIM_PADDED_ROWS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace attnmeta {

// `out` ([bucket][row_values]) and `lse` ([bucket][num_q_heads]) as a launch over a bucket of
// `bucket` rows wrote them, the first `real_rows` the batch's. No one reads the padded rows,
// but a graph's kernels run them every step (each over at least one padding slot), so a value
// there that is not finite (NaN, +-inf) is a kernel or metadata bug all the same. Returns:
//  - InternalError naming the first such value (its row, the array, the value), the output's
//    padded rows searched before the lse's; `out` and `lse` left as they were;
//  - InvalidArgument, the arrays left as they were, when real_rows < 0, row_values < 1 or
//    num_q_heads < 1, or when the arrays are not one bucket of at least `real_rows` rows;
//  - else OK, with both cut to the real rows.
// Real rows are not checked here: the caller compares them against its reference.
absl::Status TrimPaddedRows(int64_t real_rows, int64_t row_values, int64_t num_q_heads,
                            std::vector<float>* out, std::vector<float>* lse);

}  // namespace attnmeta

#endif  // ATTNMETA_SIM_PADDED_ROWS_H_
