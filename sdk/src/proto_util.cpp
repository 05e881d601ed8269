#include "dsec/status_proto.hpp"

#include <google/protobuf/descriptor.h>

#include <cctype>

namespace dsec {

namespace {

// "SandboxPhase" -> "SANDBOX_PHASE_".
std::string EnumPrefix(const std::string& type_name) {
  std::string out;
  for (size_t i = 0; i < type_name.size(); ++i) {
    char c = type_name[i];
    if (i > 0 && std::isupper(static_cast<unsigned char>(c))) out.push_back('_');
    out.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  }
  return out + "_";
}

}  // namespace

std::string EnumShortName(const google::protobuf::EnumValueDescriptor* v) {
  if (!v) return "unknown";
  std::string name = v->name();
  std::string prefix = EnumPrefix(v->type()->name());
  if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0) name = name.substr(prefix.size());
  for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

const google::protobuf::EnumValueDescriptor* EnumByName(const google::protobuf::EnumDescriptor* type,
                                                       const std::string& name) {
  std::string upper;
  for (char c : name) upper.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  const auto* v = type->FindValueByName(upper);
  return v ? v : type->FindValueByName(EnumPrefix(type->name()) + upper);
}

Status FromProto(const v1::Status& s) {
  if (s.code() == v1::Status::OK) return Status::Ok();
  if (s.code() < 0 || s.code() > static_cast<int>(Status::Code::kUnauthenticated))  // a newer peer
    return Status::Internal("status code " + std::to_string(s.code()) + ": " + s.message());
  return Status(static_cast<Status::Code>(s.code()), s.message());
}

void ToProto(const Status& s, v1::Status* out) {
  out->set_code(static_cast<v1::Status::Code>(static_cast<int>(s.code())));
  out->set_message(s.message());
}

const char* VerdictName(v1::Verdict v) {
  switch (v) {
    case v1::VERDICT_OK: return "ok";
    case v1::VERDICT_RUNTIME_ERROR: return "runtime_error";
    case v1::VERDICT_TIME_LIMIT: return "time_limit";
    case v1::VERDICT_MEMORY_LIMIT: return "memory_limit";
    case v1::VERDICT_OUTPUT_LIMIT: return "output_limit";
    case v1::VERDICT_PLATFORM_ERROR: return "platform_error";
    default: return "unspecified";
  }
}

const char* KindName(v1::Kind k) {
  switch (k) {
    case v1::KIND_FNCALL: return "fncall";
    case v1::KIND_CONTAINER: return "container";
    case v1::KIND_MICROVM: return "microvm";
    case v1::KIND_VM: return "vm";
    case v1::KIND_AUTO: return "auto";
    default: return "auto";
  }
}

const char* PhaseName(v1::SandboxPhase p) {
  switch (p) {
    case v1::SANDBOX_PHASE_PENDING: return "pending";
    case v1::SANDBOX_PHASE_STARTING: return "starting";
    case v1::SANDBOX_PHASE_RUNNING: return "running";
    case v1::SANDBOX_PHASE_PAUSED: return "paused";
    case v1::SANDBOX_PHASE_STOPPING: return "stopping";
    case v1::SANDBOX_PHASE_STOPPED: return "stopped";
    case v1::SANDBOX_PHASE_FAILED: return "failed";
    default: return "unspecified";
  }
}

bool ParseKind(const std::string& s, v1::Kind* out) {
  static const std::pair<const char*, v1::Kind> kKinds[] = {
      {"fncall", v1::KIND_FNCALL}, {"container", v1::KIND_CONTAINER},
      {"microvm", v1::KIND_MICROVM}, {"vm", v1::KIND_VM}, {"auto", v1::KIND_AUTO}};
  for (const auto& [name, k] : kKinds)
    if (s == name) {
      *out = k;
      return true;
    }
  return false;
}

}  // namespace dsec
