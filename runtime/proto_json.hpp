// The one JSON shape of dsec's records and results, for every `--json` of
// the tools and every console reply (docs/console.md, "JSON shape"):
// field names as in the protos, every field present (a zero exit code is
// 0, not missing), numbers as numbers (64-bit ones too), enums as their
// lower-case short names ("ok", "running", "container"), bytes (stdout,
// stderr) as plain UTF-8 text, unset optional fields as null. Not
// protobuf's JSON mapping, which base64s bytes, quotes 64-bit numbers,
// drops zeros and upper-cases enums.
#pragma once

#include <google/protobuf/message.h>

#include <nlohmann/json.hpp>
#include <string>

namespace dsec {

nlohmann::json ProtoJson(const google::protobuf::Message& m);

// An enum value's short name: its name without the prefix its type gives
// all of them (VERDICT_TIME_LIMIT of Verdict -> "time_limit"), lower case.
std::string EnumJsonName(const google::protobuf::EnumValueDescriptor* v);

// This process's E2B door's answers by call, for the console's overview
// (the status page): [{call, answered, client_errors, server_errors}].
nlohmann::json E2bCallsJson();

// json::dump with invalid UTF-8 replaced (U+FFFD), never thrown on.
std::string DumpJson(const nlohmann::json& j, int indent = -1);

}  // namespace dsec
