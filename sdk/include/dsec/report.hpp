// Session.Report() and Session.Grade(). Report: the misbehaviour report of a rollout session, every
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

// Session.Grade(): grades the session as its step `index` (the log's next)
// in a fresh grade sandbox (SessionOptions::grade, docs/running.md "Grading
// a session"). The step, in role "grade", holds the grader's output and
// meta.reward; a grade already logged is answered from the log.
Result<v1::StepReply> Grade(const Session& session, uint64_t index);
void GradeAsync(const Session& session, uint64_t index, Done<v1::StepReply> done);  // `done` on an SDK thread

}  // namespace dsec
