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

// Any enum value's short name: its name without the prefix its type gives
// all of them (VERDICT_TIME_LIMIT of Verdict -> "time_limit"), lower case;
// "unknown" for null.
std::string EnumShortName(const google::protobuf::EnumValueDescriptor* v);
// The value of `type` named `name`: a short name as above or the full one,
// in any case; null when there is none.
const google::protobuf::EnumValueDescriptor* EnumByName(const google::protobuf::EnumDescriptor* type,
                                                       const std::string& name);

}  // namespace dsec
