// Protobuf messages to Python objects and back, by reflection, for the
// dsec Python module. Python sees records (dsec.ExecResult, ...: plain
// objects whose attributes are the message's fields; enums as short lower
// case names, "ok", "container"; bytes as bytes; maps as dicts) and passes
// dicts (or records) where the C++ SDK takes a message.
#pragma once

#include <google/protobuf/message.h>
#include <pybind11/pybind11.h>

#include <string>

#include "dsec/status.hpp"

namespace dsec::py {

namespace pb = pybind11;

// The record class for messages of type `full_name` ("dsec.v1.ExecResult"):
// ToPy makes instances of it (its __dict__ holds the fields). Others become
// dicts.
void RegisterRecord(const std::string& full_name, pb::object cls);

// `m` as a Python object (a registered record, else a dict). Needs the GIL.
pb::object ToPy(const google::protobuf::Message& m);

// Fills `m` from a dict, a record (its attributes) or None. `path` names the
// argument in errors ("spec", "spec.limits"). Throws pb::type_error for a
// value of the wrong Python type; ArgumentError for a bad value.
void FromPy(pb::handle obj, google::protobuf::Message* m, const std::string& path);

// A bad argument value: raised to Python as dsec.InvalidArgument.
struct ArgumentError {
  std::string message;
};

// The dsec exception classes by status code (set by dsec/_errors.py).
void SetErrorClasses(pb::dict by_code);
// The exception instance for a non-ok status: dsec.NotFound(message), ...
pb::object MakeError(const Status& st);
// Raises MakeError(st) as the current Python exception.
[[noreturn]] void Raise(const Status& st);


}  // namespace dsec::py
