#include "dsec/status_proto.hpp"

#include <google/protobuf/descriptor.h>

#include <cctype>
#include <string>
#include <unordered_map>

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

namespace {

// Each value's short name (EnumShortName), made once per enum type: the
// names come from the schema, so a new value is named without a switch.
class ShortNames {
 public:
  explicit ShortNames(const google::protobuf::EnumDescriptor* type) {
    for (int i = 0; i < type->value_count(); ++i)
      by_value_.emplace(type->value(i)->number(), EnumShortName(type->value(i)));
  }
  const char* Get(int value) const {
    auto it = by_value_.find(value);
    return it == by_value_.end() ? "unknown" : it->second.c_str();
  }

 private:
  std::unordered_map<int, std::string> by_value_;
};

}  // namespace

const char* VerdictName(v1::Verdict v) {
  static const ShortNames names(v1::Verdict_descriptor());
  return names.Get(v);
}

const char* KindName(v1::Kind k) {
  static const ShortNames names(v1::Kind_descriptor());
  return names.Get(k == v1::KIND_UNSPECIFIED ? v1::KIND_AUTO : k);  // unspecified means auto (types.proto)
}

const char* PhaseName(v1::SandboxPhase p) {
  static const ShortNames names(v1::SandboxPhase_descriptor());
  return names.Get(p);
}

bool ParseKind(const std::string& s, v1::Kind* out) {
  const auto* v = EnumByName(v1::Kind_descriptor(), s);
  if (!v || v->number() == v1::KIND_UNSPECIFIED || s.empty()) return false;
  *out = static_cast<v1::Kind>(v->number());
  return true;
}

}  // namespace dsec
