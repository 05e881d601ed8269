// The verdict of a run, the same for every kind and in the same words: how
// a run's outcome (spawner::Outcome, which the agent's account is put into
// too) becomes the ExecResult a trainer sees.
#pragma once

#include <string>

#include "dsec/v1/types.pb.h"

namespace dsec::spawner {
class Outcome;
}

namespace dsec::drivers {

// `limits` are the run's final limits (named in the error); `argv0` names
// a program that could not be executed.
v1::ExecResult ToExecResult(const spawner::Outcome& o, const v1::Limits& limits, const std::string& argv0);

}  // namespace dsec::drivers
