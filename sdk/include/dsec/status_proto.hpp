// Status <-> dsec.v1.Status, for code that handles raw replies.
#pragma once

#include "dsec/status.hpp"
#include "dsec/v1/service.pb.h"

namespace dsec {

Status FromProto(const v1::Status& s);
void ToProto(const Status& s, v1::Status* out);
inline v1::Status ToProto(const Status& s) {
  v1::Status out;
  ToProto(s, &out);
  return out;
}

// Human names: "ok", "time_limit", ...; "fncall", "container", ...
const char* VerdictName(v1::Verdict v);
const char* KindName(v1::Kind k);
const char* PhaseName(v1::SandboxPhase p);
// Parses "fncall" etc.; false when unknown.
bool ParseKind(const std::string& s, v1::Kind* out);

}  // namespace dsec
