// DeviceKvSource: where a kernel finds the K/V pool rows of a sequence's positions, as the
// device metadata gives them: token-level kv_indices or the page table. Shared by the
// attention kernels' argument structs and read through internal/kv_source.h, which
// bounds-checks every entry. Plain types only: no Abseil, no glog.

#ifndef ATTNMETA_ATTENTION_KERNELS_DEVICE_KV_SOURCE_H_
#define ATTNMETA_ATTENTION_KERNELS_DEVICE_KV_SOURCE_H_

#include <cstdint>

namespace attnmeta {
namespace kernels {

struct DeviceKvSource {
  int64_t pool_slots;  // <= 2^31; a position whose slot is outside [0, pool_slots) is skipped

  // Which source the kernel reads: 0 token-level, 1 the page table. An explicit flag, not a
  // null pointer: an empty page table's pointer is null too.
  int32_t page_level;

  // Token-level KV (page_level == 0).
  const int32_t* kv_indptr;   // [batch_size + 1], kv_indptr[0] == 0, non-decreasing
  const int32_t* kv_indices;  // [kv_indices_capacity]: position t of sequence i is slot
                              // kv_indices[kv_indptr[i] + t]
  int64_t kv_indices_capacity;  // <= 2^30, >= kv_indptr[batch_size] (else clamped)
  // Page-level KV (page_level == 1).
  const int32_t* page_table;  // [batch_size][page_table_cols] page ids; columns past a
                              // sequence's ceil(kv_len / page_size) pages are not used (a
                              // decode L2 warm-up may load them: any column is in bounds)
  int32_t page_table_cols;    // page_table_cols * page_size <= 2^30
  const int32_t* kv_lens;     // [batch_size], 0 <= kv_lens[i] <= page_table_cols * page_size
                              // (else clamped)
  int32_t page_size;          // >= 1
  int32_t page_size_log2;     // log2(page_size) for a power of two, else -1
};

}  // namespace kernels
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_DEVICE_KV_SOURCE_H_
