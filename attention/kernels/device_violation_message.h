// The words of a DeviceViolation (device_violation.h): what DeviceViolationWord::Check puts in
// its Status. Host code without a vendor header, so that every kind's wording is tested on the
// CPU.

#ifndef ATTNMETA_ATTENTION_KERNELS_DEVICE_VIOLATION_MESSAGE_H_
#define ATTNMETA_ATTENTION_KERNELS_DEVICE_VIOLATION_MESSAGE_H_

#include <string>

#include "attention/kernels/device_violation.h"

namespace attnmeta {

// Names the array, the entry, the value and the bound of `v`, for example "kv_lens entry 3:
// 9000 is past the row of 4096 positions of req_to_token"; a kind this build does not know is
// named by its number.
std::string DescribeViolation(const kernels::DeviceViolation& v);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_DEVICE_VIOLATION_MESSAGE_H_
