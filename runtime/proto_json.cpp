#include "runtime/proto_json.hpp"

#include "dsec/status_proto.hpp"
#include "runtime/metrics.hpp"

#include <google/protobuf/descriptor.h>

#include <cctype>

namespace dsec {

namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using nlohmann::json;

json Scalar(const Message& m, const Reflection* r, const FieldDescriptor* f) {
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: return r->GetInt32(m, f);
    case FieldDescriptor::CPPTYPE_INT64: return r->GetInt64(m, f);
    case FieldDescriptor::CPPTYPE_UINT32: return r->GetUInt32(m, f);
    case FieldDescriptor::CPPTYPE_UINT64: return r->GetUInt64(m, f);
    case FieldDescriptor::CPPTYPE_DOUBLE: return r->GetDouble(m, f);
    case FieldDescriptor::CPPTYPE_FLOAT: return r->GetFloat(m, f);
    case FieldDescriptor::CPPTYPE_BOOL: return r->GetBool(m, f);
    case FieldDescriptor::CPPTYPE_ENUM: return EnumJsonName(r->GetEnum(m, f));
    case FieldDescriptor::CPPTYPE_STRING: return r->GetString(m, f);
    case FieldDescriptor::CPPTYPE_MESSAGE: return ProtoJson(r->GetMessage(m, f));
  }
  return nullptr;
}

json RepeatedAt(const Message& m, const Reflection* r, const FieldDescriptor* f, int i) {
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: return r->GetRepeatedInt32(m, f, i);
    case FieldDescriptor::CPPTYPE_INT64: return r->GetRepeatedInt64(m, f, i);
    case FieldDescriptor::CPPTYPE_UINT32: return r->GetRepeatedUInt32(m, f, i);
    case FieldDescriptor::CPPTYPE_UINT64: return r->GetRepeatedUInt64(m, f, i);
    case FieldDescriptor::CPPTYPE_DOUBLE: return r->GetRepeatedDouble(m, f, i);
    case FieldDescriptor::CPPTYPE_FLOAT: return r->GetRepeatedFloat(m, f, i);
    case FieldDescriptor::CPPTYPE_BOOL: return r->GetRepeatedBool(m, f, i);
    case FieldDescriptor::CPPTYPE_ENUM: return EnumJsonName(r->GetRepeatedEnum(m, f, i));
    case FieldDescriptor::CPPTYPE_STRING: return r->GetRepeatedString(m, f, i);
    case FieldDescriptor::CPPTYPE_MESSAGE: return ProtoJson(r->GetRepeatedMessage(m, f, i));
  }
  return nullptr;
}

}  // namespace

std::string EnumJsonName(const google::protobuf::EnumValueDescriptor* v) { return EnumShortName(v); }

json ProtoJson(const Message& m) {
  json out = json::object();
  const auto* d = m.GetDescriptor();
  const auto* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const std::string& key = f->name();
    if (f->is_map()) {
      json obj = json::object();
      for (int k = 0; k < r->FieldSize(m, f); ++k) {
        const Message& entry = r->GetRepeatedMessage(m, f, k);
        const auto* ed = entry.GetDescriptor();
        json kj = Scalar(entry, entry.GetReflection(), ed->field(0));
        obj[kj.is_string() ? kj.get<std::string>() : kj.dump()] = Scalar(entry, entry.GetReflection(), ed->field(1));
      }
      out[key] = std::move(obj);
    } else if (f->is_repeated()) {
      json arr = json::array();
      for (int k = 0; k < r->FieldSize(m, f); ++k) arr.push_back(RepeatedAt(m, r, f, k));
      out[key] = std::move(arr);
    } else if (f->has_presence() && !r->HasField(m, f) && f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) {
      out[key] = nullptr;  // an unset `optional` field
    } else {
      out[key] = Scalar(m, r, f);
    }
  }
  return out;
}

std::string DumpJson(const json& j, int indent) { return j.dump(indent, ' ', false, json::error_handler_t::replace); }

nlohmann::json E2bCallsJson() {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [call, n] : metrics::E2bCalls())
    out.push_back({{"call", call},
                   {"answered", n.answered},
                   {"client_errors", n.client_errors},
                   {"server_errors", n.server_errors}});
  return out;
}

}  // namespace dsec
