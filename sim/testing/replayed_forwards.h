// What a simulator test expects of a run's attention-kernel checks, derived from its report.

#ifndef ATTNMETA_SIM_TESTING_REPLAYED_FORWARDS_H_
#define ATTNMETA_SIM_TESTING_REPLAYED_FORWARDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "sim/report.pb.h"
#include "sim/workload.pb.h"

namespace attnmeta {
namespace testing {

// The replayed forwards of run `r` (of `workload`) that have query rows: a draft-decode round
// is one forward per draft step of its scenario; idle forwards have none.
inline int64_t ReplayedForwardsWithQueryRows(const Workload& workload, const RunReport& r) {
  int64_t steps = 0;
  for (const Scenario& s : workload.scenarios()) {
    if (s.name() == r.scenario()) steps = s.backend().speculative().steps();
  }
  int64_t replayed = 0;
  for (const ModeReport& m : r.modes()) {
    if (m.mode() == "draft_decode") {
      replayed += m.replays() * steps;
    } else if (m.mode() != "idle") {
      replayed += m.replays();
    }
  }
  return replayed;
}

// The modes that captured graphs replay (decode and the speculative ones) which run `r` ran
// but never replayed. Extend and mixed batches run eagerly in the simulator.
inline std::vector<std::string> GraphModesNeverReplayed(const RunReport& r) {
  std::vector<std::string> never;
  for (const ModeReport& m : r.modes()) {
    const bool graphed = m.mode() == "decode" || m.mode() == "target_verify" ||
                         m.mode() == "draft_extend" || m.mode() == "draft_decode";
    if (graphed && m.forwards() > 0 && m.replays() == 0) never.push_back(m.mode());
  }
  return never;
}

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_SIM_TESTING_REPLAYED_FORWARDS_H_
