// DeviceViolation: the first out-of-bounds input a metadata kernel met in device memory.
//
// The host checks every shape it can see, but lengths, request rows and slots live in device
// memory (a graph replays without the host reading them). Every metadata kernel bounds-checks
// what it reads there, never reads or writes outside a buffer (it clamps, and writes the
// padding page's slot or page instead of a value it could not check), and records the first
// violation here (internal/violation_recorder.h); the launcher's caller fetches it
// (DeviceViolationWord) and gets a Status. Plain types only: no Abseil, no glog, no vendor
// header (host-only launch checks and CPU tests include it).

#ifndef ATTNMETA_ATTENTION_KERNELS_DEVICE_VIOLATION_H_
#define ATTNMETA_ATTENTION_KERNELS_DEVICE_VIOLATION_H_

#include <cstdint>

namespace attnmeta {
namespace kernels {

// Which input broke which bound.
enum ViolationKind : int32_t {
  kNoViolation = 0,
  kRowOutsideTable = 1,    // a request row outside [0, max_reqs) (and not the padded -1)
  kLengthNegative = 2,     // a KV or query length below 0
  kLengthPastRow = 3,      // start + KV length past the row of req_to_token
  kQueryPastKv = 4,        // more query rows than KV tokens
  kTotalPastInt32 = 5,     // an indptr total past INT32_MAX
  kTotalPastCapacity = 6,  // tokens (or mask bytes) past the output buffer
  kSlotOutsidePool = 7,    // a slot of req_to_token or tok_idx outside the KV pool
  kIndptrDecreasing = 8,   // an indptr entry below the one before it
  kPagesPastTable = 9,     // a row needs more page-table columns than the table has
  kOffsetNegative = 10,    // an indptr entry below 0
  // Varlen attention (varlen_attention.h): qo_indptr and the custom mask.
  kQueryIndptrNegative = 11,    // a qo_indptr entry below 0
  kQueryIndptrDecreasing = 12,  // a qo_indptr entry below the one before it
  kQueryRowsPastCapacity = 13,  // a qo_indptr entry past the rows of the query tensor
  kQueryPastMaxQLen = 14,       // a sequence's query rows past the max_q_len a launch covers
  kMaskOutsideBuffer = 15,      // a custom-mask block (mask_indptr) not inside the mask
  kQueryRowsMismatch = 16,      // qo_indptr[0] != 0 or qo_indptr[bs] != the query rows: rows
                                // no sequence claims (a tail the launch declares is not
                                // recorded: varlen_attention.h, zero_unclaimed_rows)
  // The decode attention's split-KV work and reduce items (paged_decode_attention.h); index:
  // the item.
  kWorkItemSequence = 17,                 // a work item's sequence outside the batch
  kWorkItemPartialSlot = 18,              // a work item's partial slot past the partial buffers
  kWorkItemKvBeginNegative = 19,          // a work item's kv_begin below 0
  kWorkItemKvEndPastLength = 20,          // a work item's kv_end past its sequence's KV length
  kWorkItemKvEndBeforeBegin = 21,         // a work item's kv_end below its kv_begin
  kReduceItemSequence = 22,               // a reduce item's sequence outside the batch
  kReduceItemPartialEndPastBuffers = 23,  // a reduce item's partial_end past the partial buffers
  kPartialSlotUnmerged = 24,  // merging in the attention launch: a work item's partial slot
                              // that no reduce item merges
  kReduceItemPartialBeginNegative = 25,   // a reduce item's partial_begin below 0
  kReduceItemPartialEndBeforeBegin = 26,  // a reduce item's partial_end below its partial_begin
  kWorkItemShortOfSequence = 27,  // a work item without a partial slot (it writes the output)
                                  // whose KV range is not its whole sequence: value, the
                                  // tokens it covers; bound, the sequence's KV length
  kStartOutsideRow = 28,          // a kv_start_idx entry outside [0, the row's length]
};

struct DeviceViolation {
  int32_t recorded;  // 0 until the first violation
  int32_t kind;      // ViolationKind
  int64_t index;     // the entry of the array that broke the bound (request or token)
  int64_t value;     // the offending value
  int64_t bound;     // the bound it broke
};

}  // namespace kernels
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_DEVICE_VIOLATION_H_
