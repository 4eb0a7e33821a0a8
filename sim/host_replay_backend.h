// The "cpu" ReplayBackend: HostDeviceMemory (canaries around every buffer) and the host
// metadata writer.

#ifndef ATTNMETA_SIM_HOST_REPLAY_BACKEND_H_
#define ATTNMETA_SIM_HOST_REPLAY_BACKEND_H_

#include <memory>

#include "sim/replay_backend.h"

namespace attnmeta {

std::unique_ptr<ReplayBackend> MakeHostReplayBackend();

}  // namespace attnmeta

#endif  // ATTNMETA_SIM_HOST_REPLAY_BACKEND_H_
