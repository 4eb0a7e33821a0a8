// The element type of the attention kernels' Q, K, V and out (PagedDecodeParams::dtype,
// DecodeMergeParams::dtype, VarlenAttentionParams::dtype). Plain types only: host launchers
// and device sources include it.

#ifndef ATTNMETA_ATTENTION_KERNELS_ELEMENT_DTYPE_H_
#define ATTNMETA_ATTENTION_KERNELS_ELEMENT_DTYPE_H_

#include <cstdint>

namespace attnmeta {
namespace kernels {

enum ElementDtype : int32_t { kElementBf16 = 0, kElementFp16 = 1 };

}  // namespace kernels
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_ELEMENT_DTYPE_H_
