// The verdict of a run, the same for every kind and in the same words: how
// a run's outcome (run::Outcome, drivers/run_outcome.proto: the spawner's
// account of a fncall run, the agent's of an exec) becomes the ExecResult a
// trainer sees.
#pragma once

#include <string>

#include "dsec/v1/types.pb.h"

namespace dsec::run {
class Outcome;
}

namespace dsec::drivers {

// `limits` are the run's final limits (named in the error); `argv0` names
// a program that could not be executed.
v1::ExecResult ToExecResult(const run::Outcome& o, const v1::Limits& limits, const std::string& argv0);

}  // namespace dsec::drivers
