// dsec._core: the C++ SDK (dsec::Client) as a Python extension module. The
// Pythonic surface (keyword arguments, records, exceptions, asyncio) is in
// dsec/*.py; the extension only carries calls across. This file holds the
// module's functions and the Client class; bind_handles.cpp the Sandbox and
// Session classes; bridge.hpp/.cpp the machinery they share.
//
// Every call takes `aio`: None for a blocking call (the GIL is released
// while it waits; Ctrl-C interrupts the wait), or (event loop, future,
// completer): the call is issued through the SDK's callback form and
// returns at once. Its completion, on an SDK thread, queues the answer on
// the loop's Completer without taking the GIL; the first answer queued
// after a drain schedules the next drain with loop.call_soon_threadsafe.
// The drain, on the loop's thread, makes the Python values and settles the
// futures. Under load one wake-up carries many answers, and SDK threads
// take the GIL once per batch, not once per call. No thread per call.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "bridge.hpp"
#include "dsec/snapshot.hpp"
#include "dsec/status_proto.hpp"

PYBIND11_MODULE(_core, m) {
  using namespace dsec;
  using namespace dsec::py;
  namespace pb = pybind11;
  m.doc() = "dsec's C++ SDK as seen from Python; use the `dsec` package, not this module.";

  pb::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ArgumentError& e) {
      pb::object err = MakeError(Status::InvalidArgument(e.message));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
    }
  });

  m.def("_register_record", &RegisterRecord);
  m.def("_set_error_classes", &SetErrorClasses);
  m.def("_set_settle", [](pb::object f) { Settle() = std::move(f); });
  m.def("_enum_names", [](const std::string& type) {
    const auto* e = google::protobuf::DescriptorPool::generated_pool()->FindEnumTypeByName(type);
    std::vector<std::string> out;
    if (e)
      for (int i = 1; i < e->value_count(); ++i) out.push_back(EnumShortName(e->value(i)));
    return out;
  });
  m.def("_roundtrip", [](const std::string& type, pb::object obj) {
    // Tests: a dict through FromPy and ToPy.
    const auto* d = google::protobuf::DescriptorPool::generated_pool()->FindMessageTypeByName(type);
    if (!d) throw pb::value_error("no message type " + type);
    std::unique_ptr<google::protobuf::Message> msg(
        google::protobuf::MessageFactory::generated_factory()->GetPrototype(d)->New());
    try {
      FromPy(obj, msg.get(), "value");
    } catch (const ArgumentError& e) {
      Raise(Status::InvalidArgument(e.message));
    }
    return ToPy(*msg);
  });

  pb::class_<Completer, CompleterRef>(m, "Completer",
                                     "Answers of async calls waiting for one event loop (dsec._aio keeps one per loop)")
      .def(pb::init<pb::object>(), pb::arg("loop_ref"));
  m.def("_set_main_thread", [](unsigned long id) { MainThread() = id; });
  m.def("_drain", [](const CompleterRef& c) { c->Drain(); }, pb::arg("completer").none(false));
  Completer::DrainFn() = m.attr("_drain");

  BindHandles(m);  // Stream, Sandbox, Session: before Client, whose calls make them

  pb::class_<Core, CoreRef>(m, "Client")
      .def(pb::init([](std::string address, std::string token, std::string token_file, std::string data_dir,
                       double connect_timeout_s, double rpc_timeout_s, size_t threads) {
             auto o = Options(address, token, token_file, data_dir, connect_timeout_s, rpc_timeout_s, threads);
             Result<std::unique_ptr<Client>> c = Status::Unavailable("not connected");
             {
               pb::gil_scoped_release nogil;
               c = Client::Connect(o);
             }
             if (!c.ok()) Raise(c.status());
             auto core = std::make_shared<Core>();
             core->client = std::move(*c);
             return core;
           }),
           pb::arg("address"), pb::arg("token"), pb::arg("token_file"), pb::arg("data_dir"),
           pb::arg("connect_timeout_s"), pb::arg("rpc_timeout_s"), pb::arg("threads"))
      .def("close", &Core::Close)
      .def_property_readonly("closed", [](Core& c) { return !Open(c); })
      .def_property_readonly("client_id",
                             [](Core& c) { return Read(c, [](Client* x) { return x->client_id(); }, std::string()); })
      .def_property_readonly("connected", [](Core& c) { return Read(c, [](Client* x) { return x->connected(); }, false); })
      .def_property_readonly("connections",
                             [](Core& c) { return Read(c, [](Client* x) { return x->connections(); }, uint64_t{0}); })
      .def_property_readonly("address",
                             [](Core& c) { return Read(c, [](Client* x) { return x->options().address; }, std::string()); })
      .def("run",
           [](const CoreRef& core, pb::object spec, pb::object exec, pb::object aio) {
             auto sp = Proto<v1::SandboxSpec>(spec, "spec");
             auto req = Proto<v1::ExecRequest>(exec, "exec");
             return Issue<Result<v1::ExecResult>>(
                 core, aio,
                 [sp, req](Client& c, Done<v1::ExecResult> d) mutable { c.RunAsync(sp, std::move(req), std::move(d)); },
                 [](Result<v1::ExecResult>& r) { return ToPy(*r); });
           })
      .def("create",
           [](const CoreRef& core, pb::object spec, std::string id, bool detached, uint32_t lease_s, pb::object aio) {
             auto sp = Proto<v1::SandboxSpec>(spec, "spec");
             CreateOptions o;
             o.id = id;
             o.detached = detached;
             o.lease_s = lease_s;
             return Issue<Result<Sandbox>>(
                 core, aio, [sp, o](Client& c, Done<Sandbox> d) { c.CreateAsync(sp, o, std::move(d)); },
                 [weak = std::weak_ptr<Core>(core)](Result<Sandbox>& r) { return pb::cast(PySandbox{Strong(weak), *r}); });
           })
      .def("attach",
           [](const CoreRef& core, std::string id, pb::object aio) {
             return Issue<Result<Sandbox>>(
                 core, aio, [id](Client& c, Done<Sandbox> d) { c.AttachAsync(id, std::move(d)); },
                 [weak = std::weak_ptr<Core>(core)](Result<Sandbox>& r) { return pb::cast(PySandbox{Strong(weak), *r}); });
           })
      .def("list_sandboxes",
           [](const CoreRef& core, pb::object filter, pb::object aio) {
             auto req = Proto<v1::ListSandboxesRequest>(filter, "filter");
             return Issue<Result<v1::ListSandboxesReply>>(
                 core, aio,
                 [req](Client& c, Done<v1::ListSandboxesReply> d) { c.ListSandboxesAsync(req, std::move(d)); },
                 [](Result<v1::ListSandboxesReply>& r) { return ToPy(*r); });
           })
      .def("open_session",
           [](const CoreRef& core, std::string name, pb::object spec, pb::dict more, uint32_t lease_s,
              bool restartable, pb::object grade, pb::object aio) {
             auto sp = Proto<v1::SandboxSpec>(spec, "spec");
             SessionOptions o;
             o.lease_s = lease_s;
             o.restartable = restartable;
             if (!grade.is_none()) o.grade = Proto<v1::GradeSpec>(grade, "grade");
             for (auto [role, more_spec] : more) {
               std::string r = role.cast<std::string>();
               o.more_sandboxes.emplace_back(r, Proto<v1::SandboxSpec>(more_spec, "sandboxes['" + r + "']"));
             }
             return Issue<Result<Session>>(
                 core, aio, [name, sp, o](Client& c, Done<Session> d) { c.OpenSessionAsync(name, sp, o, std::move(d)); },
                 [weak = std::weak_ptr<Core>(core)](Result<Session>& r) { return pb::cast(PySession{Strong(weak), *r}); });
           })
      .def("attach_session",
           [](const CoreRef& core, std::string name, pb::object aio) {
             return Issue<Result<Session>>(
                 core, aio, [name](Client& c, Done<Session> d) { c.AttachSessionAsync(name, std::move(d)); },
                 [weak = std::weak_ptr<Core>(core)](Result<Session>& r) { return pb::cast(PySession{Strong(weak), *r}); });
           })
      .def("register_image",
           [](const CoreRef& core, pb::object manifest, bool replace, pb::object aio) {
             auto mf = Proto<v1::ImageManifest>(manifest, "manifest");
             return Issue<Result<v1::ImageManifest>>(
                 core, aio,
                 [mf, replace](Client& c, Done<v1::ImageManifest> d) { c.RegisterImageAsync(mf, replace, std::move(d)); },
                 [](Result<v1::ImageManifest>& r) { return ToPy(*r); });
           })
      .def("get_image",
           [](const CoreRef& core, std::string name, pb::object aio) {
             return Issue<Result<v1::ImageManifest>>(
                 core, aio, [name](Client& c, Done<v1::ImageManifest> d) { c.GetImageAsync(name, std::move(d)); },
                 [](Result<v1::ImageManifest>& r) { return ToPy(*r); });
           })
      .def("list_images",
           [](const CoreRef& core, pb::object aio) {
             return Issue<Result<std::vector<v1::ImageManifest>>>(
                 core, aio, [](Client& c, Done<std::vector<v1::ImageManifest>> d) { c.ListImagesAsync(std::move(d)); },
                 [](Result<std::vector<v1::ImageManifest>>& r) {
                   pb::list out;
                   for (const auto& i : *r) out.append(ToPy(i));
                   return out;
                 });
           })
      .def("remove_image",
           [](const CoreRef& core, std::string name, pb::object aio) {
             return Issue<Status>(core, aio, [name](Client& c, DoneStatus d) { c.RemoveImageAsync(name, std::move(d)); },
                                  None);
           })
      .def("get_snapshot",
           [](const CoreRef& core, std::string name, pb::object aio) {
             return Issue<Result<v1::SnapshotInfo>>(
                 core, aio, [name](Client& c, Done<v1::SnapshotInfo> d) { GetSnapshotAsync(c, name, std::move(d)); },
                 [](Result<v1::SnapshotInfo>& r) { return ToPy(*r); });
           })
      .def("list_snapshots",
           [](const CoreRef& core, pb::object aio) {
             return Issue<Result<std::vector<v1::SnapshotInfo>>>(
                 core, aio, [](Client& c, Done<std::vector<v1::SnapshotInfo>> d) { ListSnapshotsAsync(c, std::move(d)); },
                 [](Result<std::vector<v1::SnapshotInfo>>& r) {
                   pb::list out;
                   for (const auto& i : *r) out.append(ToPy(i));
                   return out;
                 });
           })
      .def("remove_snapshot", [](const CoreRef& core, std::string name, pb::object aio) {
        return Issue<Status>(core, aio, [name](Client& c, DoneStatus d) { RemoveSnapshotAsync(c, name, std::move(d)); },
                             None);
      });
}
