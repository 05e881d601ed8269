// Session.Report(): the misbehaviour report of a rollout session, every
// flag its steps raised (the task guard's, the network policy's), each with
// the step that raised it, read from the session's durable log (steps and
// their flags are written together). A trainer zeroes or discounts the
// reward from it; dsec-replay shows the same flags on the timeline.
#pragma once

#include <cstdint>
#include <vector>

#include "dsec/client.hpp"

namespace dsec {

struct StepFlag {
  uint64_t step = 0;
  v1::Flag flag;  // what ("protected_write", "network_refused", "name_refused") and evidence
};

// Every flag of `session`'s logged steps, in step order.
Result<std::vector<StepFlag>> Report(const Session& session);

}  // namespace dsec
