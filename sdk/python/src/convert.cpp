#include "convert.hpp"

#include "dsec/status_proto.hpp"

#include <google/protobuf/descriptor.h>

#include <cctype>
#include <limits>
#include <unordered_map>

namespace dsec::py {

using google::protobuf::Descriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

namespace {

// Filled at import, under the GIL; read under the GIL.
std::unordered_map<std::string, pb::object>& Records() {
  static auto* m = new std::unordered_map<std::string, pb::object>();  // never destroyed: lives past finalization
  return *m;
}
pb::dict& ErrorClasses() {
  static auto* d = new pb::dict();
  return *d;
}

pb::str Text(const std::string& s) {
  // dsecd sends UTF-8; a stray byte must not make a reply unreadable.
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (!o) throw pb::error_already_set();
  return pb::reinterpret_steal<pb::str>(o);
}

pb::object Scalar(const Message& m, const Reflection* r, const FieldDescriptor* f, int index) {
  bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return pb::int_(rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f));
    case FieldDescriptor::CPPTYPE_INT64:
      return pb::int_(rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
    case FieldDescriptor::CPPTYPE_UINT32:
      return pb::int_(rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f));
    case FieldDescriptor::CPPTYPE_UINT64:
      return pb::int_(rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return pb::float_(rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return pb::float_(rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f));
    case FieldDescriptor::CPPTYPE_BOOL:
      return pb::bool_(rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f));
    case FieldDescriptor::CPPTYPE_ENUM:
      return pb::str(EnumShortName(rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f)));
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string scratch;
      const std::string& s =
          rep ? r->GetRepeatedStringReference(m, f, index, &scratch) : r->GetStringReference(m, f, &scratch);
      if (f->type() == FieldDescriptor::TYPE_BYTES) return pb::bytes(s);
      return Text(s);
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return ToPy(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f));
  }
  return pb::none();
}

[[noreturn]] void TypeError(const std::string& path, const char* want, pb::handle got) {
  throw pb::type_error("dsec: " + path + " must be " + want + ", not " +
                       std::string(pb::str(pb::type::handle_of(got).attr("__name__"))));
}

// An int (or anything with __index__, e.g. numpy's integers; not a bool) in
// T's range.
template <class T>
T IntIn(pb::handle v, const std::string& path) {
  if (PyBool_Check(v.ptr()) || !PyIndex_Check(v.ptr())) TypeError(path, "an int", v);
  auto i = pb::reinterpret_steal<pb::object>(PyNumber_Index(v.ptr()));
  if (!i) throw pb::error_already_set();
  // The message is made only on the error path (str() of a huge int is slow).
  auto bad = [&](const char* what) {
    std::string shown;
    PyObject* str = PyObject_Str(i.ptr());
    if (str) {
      const char* u = PyUnicode_AsUTF8(str);
      shown = u ? u : "";
      Py_DECREF(str);
    }
    PyErr_Clear();  // a huge int's str() is refused: said without it
    if (shown.empty() || shown.size() > 40) shown = shown.empty() ? "a huge number" : shown.substr(0, 37) + "...";
    return ArgumentError{path + what + " (" + std::to_string(std::numeric_limits<T>::min()) + " to " +
                         std::to_string(std::numeric_limits<T>::max()) + "; it is " + shown + ")"};
  };
  if (std::is_signed<T>::value) {
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    if (overflow == 0 && x == -1 && PyErr_Occurred()) throw pb::error_already_set();
    if (overflow != 0 || x < static_cast<long long>(std::numeric_limits<T>::min()) ||
        x > static_cast<long long>(std::numeric_limits<T>::max()))
      throw bad(" is out of range");
    return static_cast<T>(x);
  }
  int negative = PyObject_RichCompareBool(i.ptr(), pb::int_(0).ptr(), Py_LT);
  if (negative < 0) throw pb::error_already_set();
  if (negative) throw bad(" must not be negative");
  unsigned long long u = PyLong_AsUnsignedLongLong(i.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    throw bad(" is out of range");
  }
  if (u > static_cast<unsigned long long>(std::numeric_limits<T>::max())) throw bad(" is out of range");
  return static_cast<T>(u);
}

// UTF-8 text from a str (no lone surrogates) or UTF-8 bytes.
std::string Utf8(pb::handle v, const std::string& path) {
  if (PyUnicode_Check(v.ptr())) {
    Py_ssize_t n = 0;
    const char* s = PyUnicode_AsUTF8AndSize(v.ptr(), &n);
    if (!s) {
      PyErr_Clear();
      throw ArgumentError{path + " is not valid UTF-8 text (it holds undecodable bytes, e.g. from a non-UTF-8 file "
                                 "name): dsec carries names, paths and arguments as UTF-8"};
    }
    return std::string(s, static_cast<size_t>(n));
  }
  if (PyBytes_Check(v.ptr())) {
    std::string s(PyBytes_AS_STRING(v.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(v.ptr())));
    PyObject* ok = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "strict");
    if (!ok) {
      PyErr_Clear();
      throw ArgumentError{path + " is not valid UTF-8: dsec carries names, paths and arguments as UTF-8"};
    }
    Py_DECREF(ok);
    return s;
  }
  TypeError(path, "a str", v);
}

std::string Bytes(pb::handle v, const std::string& path) {
  if (PyBytes_Check(v.ptr()))
    return std::string(PyBytes_AS_STRING(v.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(v.ptr())));
  if (PyUnicode_Check(v.ptr())) return Utf8(v, path);
  if (PyObject_CheckBuffer(v.ptr())) {
    Py_buffer view;
    if (PyObject_GetBuffer(v.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Clear();
      throw ArgumentError{path + " is a buffer that is not contiguous: pass bytes(...) of it"};
    }
    std::string out(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
    PyBuffer_Release(&view);
    return out;
  }
  TypeError(path, "bytes or str", v);
}

std::string FieldNames(const Descriptor* d) {
  std::string out;
  for (int i = 0; i < d->field_count(); ++i) out += (i ? ", " : "") + d->field(i)->name();
  return out;
}

void SetScalar(Message* m, const Reflection* r, const FieldDescriptor* f, pb::handle v, const std::string& path) {
  bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: {
      auto x = IntIn<int32_t>(v, path);
      return rep ? r->AddInt32(m, f, x) : r->SetInt32(m, f, x);
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      auto x = IntIn<int64_t>(v, path);
      return rep ? r->AddInt64(m, f, x) : r->SetInt64(m, f, x);
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      auto x = IntIn<uint32_t>(v, path);
      return rep ? r->AddUInt32(m, f, x) : r->SetUInt32(m, f, x);
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      auto x = IntIn<uint64_t>(v, path);
      return rep ? r->AddUInt64(m, f, x) : r->SetUInt64(m, f, x);
    }
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: {
      // Any real number (float, int, numpy's); not a bool.
      if (PyBool_Check(v.ptr()) || !(PyFloat_Check(v.ptr()) || PyIndex_Check(v.ptr()) ||
                                     pb::hasattr(v, "__float__")))
        TypeError(path, "a number", v);
      double x = PyFloat_AsDouble(v.ptr());
      if (x == -1.0 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) throw pb::error_already_set();
        PyErr_Clear();
        throw ArgumentError{path + " is too large for a double (" + std::string(pb::str(v)) + ")"};
      }
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT)
        return rep ? r->AddFloat(m, f, static_cast<float>(x)) : r->SetFloat(m, f, static_cast<float>(x));
      return rep ? r->AddDouble(m, f, x) : r->SetDouble(m, f, x);
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      if (!PyBool_Check(v.ptr())) TypeError(path, "True or False", v);
      bool x = v.ptr() == Py_True;
      return rep ? r->AddBool(m, f, x) : r->SetBool(m, f, x);
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      const auto* e = f->enum_type();
      const EnumValueDescriptor* ev = nullptr;
      if (PyUnicode_Check(v.ptr())) {
        ev = EnumByName(e, Utf8(v, path));
      } else if (PyIndex_Check(v.ptr()) && !PyBool_Check(v.ptr())) {
        ev = e->FindValueByNumber(IntIn<int32_t>(v, path));
      } else {
        TypeError(path, "a str", v);
      }
      // 0 (unspecified: the node's default), as records read back carry it.
      if (ev && ev->number() == 0) return;
      if (!ev) {
        std::string names;
        for (int i = 1; i < e->value_count(); ++i) names += (i > 1 ? ", " : "") + EnumShortName(e->value(i));
        throw ArgumentError{path + " " + std::string(pb::repr(v)) + " is not one of: " + names};
      }
      return rep ? r->AddEnum(m, f, ev) : r->SetEnum(m, f, ev);
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string s = f->type() == FieldDescriptor::TYPE_BYTES ? Bytes(v, path) : Utf8(v, path);
      return rep ? r->AddString(m, f, std::move(s)) : r->SetString(m, f, std::move(s));
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return FromPy(v, rep ? r->AddMessage(m, f) : r->MutableMessage(m, f), path);
  }
}

}  // namespace

void RegisterRecord(const std::string& full_name, pb::object cls) { Records()[full_name] = std::move(cls); }


pb::object ToPy(const Message& m) {
  const Descriptor* d = m.GetDescriptor();
  const Reflection* r = m.GetReflection();
  pb::dict out;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    pb::str key(f->name());
    if (f->is_map()) {
      pb::dict map;
      const FieldDescriptor* kf = f->message_type()->map_key();
      const FieldDescriptor* vf = f->message_type()->map_value();
      for (int j = 0, n = r->FieldSize(m, f); j < n; ++j) {
        const Message& entry = r->GetRepeatedMessage(m, f, j);
        map[Scalar(entry, entry.GetReflection(), kf, -1)] = Scalar(entry, entry.GetReflection(), vf, -1);
      }
      out[key] = map;
    } else if (f->is_repeated()) {
      pb::list items;
      for (int j = 0, n = r->FieldSize(m, f); j < n; ++j) items.append(Scalar(m, r, f, j));
      out[key] = items;
    } else if (f->has_optional_keyword() && !r->HasField(m, f)) {
      out[key] = pb::none();  // proto3 `optional`, not set
    } else {
      out[key] = Scalar(m, r, f, -1);
    }
  }
  auto it = Records().find(d->full_name());
  if (it == Records().end()) return std::move(out);
  pb::object rec = it->second.attr("__new__")(it->second);
  rec.attr("__dict__") = out;
  return rec;
}

void FromPy(pb::handle obj, Message* m, const std::string& path) {
  if (obj.is_none()) return;
  pb::dict fields;
  if (PyDict_Check(obj.ptr())) {
    fields = pb::reinterpret_borrow<pb::dict>(obj);
  } else if (pb::hasattr(obj, "__dict__") && !PyType_Check(obj.ptr()) &&
             Records().count(m->GetDescriptor()->full_name()) &&
             pb::isinstance(obj, Records()[m->GetDescriptor()->full_name()])) {
    fields = obj.attr("__dict__");
  } else {
    TypeError(path, ("a dict (the fields of a " + m->GetDescriptor()->name() + ")").c_str(), obj);
  }
  // A copy: the checks below may run Python that changes the dict.
  fields = pb::reinterpret_steal<pb::dict>(PyDict_Copy(fields.ptr()));
  if (!fields) throw pb::error_already_set();
  const Descriptor* d = m->GetDescriptor();
  const Reflection* r = m->GetReflection();
  for (auto item : fields) {
    // Strong references: the checks below may run Python that changes the dict.
    pb::object k = pb::reinterpret_borrow<pb::object>(item.first);
    pb::object v = pb::reinterpret_borrow<pb::object>(item.second);
    if (!PyUnicode_Check(k.ptr())) TypeError(path + " key " + std::string(pb::repr(k)), "a str", k);
    std::string name = Utf8(k, path);
    const FieldDescriptor* f = d->FindFieldByName(name);
    if (!f)
      throw ArgumentError{path + " has no field '" + name + "' (a " + d->name() + " has: " + FieldNames(d) + ")"};
    std::string sub = path + "." + name;
    if (v.is_none()) continue;
    if (f->is_map()) {
      if (!PyDict_Check(v.ptr())) TypeError(sub, "a dict", v);
      const FieldDescriptor* kf = f->message_type()->map_key();
      const FieldDescriptor* vf = f->message_type()->map_value();
      auto map = pb::reinterpret_steal<pb::dict>(PyDict_Copy(v.ptr()));  // stable while Python runs
      if (!map) throw pb::error_already_set();
      for (auto kv : map) {
        pb::object mk = pb::reinterpret_borrow<pb::object>(kv.first);
        pb::object mv = pb::reinterpret_borrow<pb::object>(kv.second);
        Message* entry = r->AddMessage(m, f);
        std::string where = sub + "[" + std::string(pb::repr(mk)) + "]";
        SetScalar(entry, entry->GetReflection(), kf, mk, where);
        SetScalar(entry, entry->GetReflection(), vf, mv, where);
      }
    } else if (f->is_repeated()) {
      if (!PyList_Check(v.ptr()) && !PyTuple_Check(v.ptr())) TypeError(sub, "a list", v);
      size_t i = 0;
      pb::list items(pb::reinterpret_borrow<pb::object>(v));  // a copy: stable while Python runs
      for (auto item : items) SetScalar(m, r, f, item, sub + "[" + std::to_string(i++) + "]");
    } else {
      SetScalar(m, r, f, v, sub);
    }
  }
}

void SetErrorClasses(pb::dict by_code) { ErrorClasses() = std::move(by_code); }

pb::object MakeError(const Status& st) {
  pb::int_ code(static_cast<int>(st.code()));
  pb::object cls = ErrorClasses().contains(code) ? pb::object(ErrorClasses()[code])
                                                  : pb::reinterpret_borrow<pb::object>(PyExc_RuntimeError);
  return cls(Text(st.message()));
}

void Raise(const Status& st) {
  pb::object e = MakeError(st);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(e.ptr())), e.ptr());
  throw pb::error_already_set();
}

}  // namespace dsec::py
