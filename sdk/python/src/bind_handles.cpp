// dsec._core's handle classes: Stream (a blocking exec_stream's output),
// Sandbox (its watches: bind_watch.cpp) and Session. Their calls go
// through Issue (bridge.hpp), blocking or onto an event loop, as the
// Client's do (module.cpp).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <string>
#include <shared_mutex>
#include <thread>

#include "bridge.hpp"
#include "dsec/files.hpp"
#include "dsec/processes.hpp"
#include "dsec/snapshot.hpp"

namespace dsec::py {

void BindWatch(pb::module_& m, pb::class_<PySandbox>& sandbox);  // bind_watch.cpp

void BindHandles(pb::module_& m) {
  pb::class_<StreamQueue, StreamRef>(m, "Stream")
      .def("next_chunk", &NextChunk)
      .def("pid", &StreamPid)
      .def("result", &StreamResult);

  pb::class_<PySandbox> sandbox(m, "Sandbox");
  sandbox.def_property_readonly("id", [](const PySandbox& s) { return s.sb.id(); })
      .def("exec",
           [](const PySandbox& s, pb::object exec, pb::object aio) {
             auto req = Proto<v1::ExecRequest>(exec, "exec");
             return Issue<Result<v1::ExecResult>>(
                 s.core, aio,
                 [&s, req](Client&, Done<v1::ExecResult> d) mutable { s.sb.ExecAsync(std::move(req), std::move(d)); },
                 [](Result<v1::ExecResult>& r) { return ToPy(*r); });
           })
      .def("exec_stream",
           [](const PySandbox& s, pb::object exec) {
             auto req = Proto<v1::ExecRequest>(exec, "exec");
             auto q = std::make_shared<StreamQueue>();
             bool open = WithClient(*s.core, [&](Client&) {
               s.sb.ExecStreamAsync(
                   std::move(req),
                   [q](const v1::ExecOutput& out) {
                     std::lock_guard<std::mutex> l(q->mu);
                     if (out.pid()) q->pid = out.pid();
                     else q->chunks.emplace_back(out.stdout() + out.pty(), out.stderr());  // a terminal's: pty
                     q->cv.notify_all();
                   },
                   [q](Result<v1::ExecResult> r) {
                     std::lock_guard<std::mutex> l(q->mu);
                     q->result = std::move(r);
                     q->done = true;
                     q->cv.notify_all();
                   });
             });
             if (!open) Raise(Status::FailedPrecondition("this dsec client is closed"));
             return q;
           })
      .def("exec_stream_async",
           [](const PySandbox& s, pb::object exec, pb::object on_chunk, pb::object aio) {
             auto req = Proto<v1::ExecRequest>(exec, "exec");
             Aio target = Target(aio);
             if (!target) throw pb::type_error("dsec: exec_stream_async needs (loop, future, completer)");
             auto push = std::make_shared<Held>(std::move(on_chunk));
             bool open = WithClient(*s.core, [&](Client&) {
               auto completer = target.completer;
               s.sb.ExecStreamAsync(
                   std::move(req),
                   [completer, push](const v1::ExecOutput& out) {
                     auto chunk = std::make_shared<v1::ExecOutput>(out);
                     completer->Push([push, chunk] {
                       push->obj(pb::bytes(chunk->stdout() + chunk->pty()), pb::bytes(chunk->stderr()));
                     });
                   },
                   // Called once: the target moves into the queued item.
                   [t = target.target, completer](Result<v1::ExecResult> r) mutable {
                     auto answer = std::make_shared<Result<v1::ExecResult>>(std::move(r));
                     completer->Push([t = std::move(t), answer]() mutable {
                       SettleWith(*t, [&]() -> std::pair<bool, pb::object> {
                         if (answer->ok()) return {false, ToPy(**answer)};
                         return {true, MakeError(answer->status())};
                       });
                       t.reset();
                     });
                   });
             });
             if (!open) Raise(Status::FailedPrecondition("this dsec client is closed"));
           })
      .def("get",
           [](const PySandbox& s, pb::object aio) {
             return Issue<Result<v1::SandboxRecord>>(
                 s.core, aio, [&s](Client&, Done<v1::SandboxRecord> d) { s.sb.GetAsync(std::move(d)); },
                 [](Result<v1::SandboxRecord>& r) { return ToPy(*r); });
           })
      .def("destroy",
           [](const PySandbox& s, pb::object aio) {
             return Issue<Status>(s.core, aio, [&s](Client&, DoneStatus d) { s.sb.DestroyAsync(std::move(d)); }, None);
           })
      .def("pause",
           [](const PySandbox& s, bool memory, pb::object aio) {
             return Issue<Status>(
                 s.core, aio, [&s, memory](Client&, DoneStatus d) { s.sb.PauseAsync(std::move(d), memory); }, None);
           })
      .def("resume",
           [](const PySandbox& s, pb::object aio) {
             return Issue<Status>(s.core, aio, [&s](Client&, DoneStatus d) { s.sb.ResumeAsync(std::move(d)); }, None);
           })
      .def("snapshot",
           [](const PySandbox& s, std::string name, pb::object aio) {
             return Issue<Result<v1::SnapshotInfo>>(
                 s.core, aio, [&s, name](Client&, Done<v1::SnapshotInfo> d) { SnapshotAsync(s.sb, name, std::move(d)); },
                 [](Result<v1::SnapshotInfo>& r) { return ToPy(*r); });
           })
      .def("fork",
           [](const PySandbox& s, uint32_t count, pb::object aio) {
             return Issue<Result<std::vector<Sandbox>>>(
                 s.core, aio, [&s, count](Client&, Done<std::vector<Sandbox>> d) { ForkAsync(s.sb, count, std::move(d)); },
                 [weak = std::weak_ptr<Core>(s.core)](Result<std::vector<Sandbox>>& r) {
                   pb::list out;
                   for (const auto& sb : *r) out.append(pb::cast(PySandbox{Strong(weak), sb}));
                   return out;
                 });
           })
      .def("set_timeout",
           [](const PySandbox& s, uint32_t seconds, pb::object aio) {
             return Issue<Result<v1::SandboxRecord>>(
                 s.core, aio,
                 [&s, seconds](Client&, Done<v1::SandboxRecord> d) { s.sb.SetTimeoutAsync(seconds, std::move(d)); },
                 [](Result<v1::SandboxRecord>& r) { return ToPy(*r); });
           })
      .def("set_network",
           [](const PySandbox& s, pb::object policy, const std::string& change, pb::object aio) {
             auto p = Proto<v1::NetworkPolicy>(policy, "network");
             v1::NetworkChange c = change == "replace" ? v1::NETWORK_CHANGE_REPLACE
                                   : change == "add"   ? v1::NETWORK_CHANGE_ADD
                                                       : v1::NETWORK_CHANGE_UNSPECIFIED;
             if (c == v1::NETWORK_CHANGE_UNSPECIFIED)
               throw pb::value_error("dsec: change is 'replace' or 'add', not '" + change + "'");
             return Issue<Result<v1::SandboxRecord>>(
                 s.core, aio,
                 [&s, p, c](Client&, Done<v1::SandboxRecord> d) { s.sb.SetNetworkAsync(p, c, std::move(d)); },
                 [](Result<v1::SandboxRecord>& r) { return ToPy(*r); });
           })
      .def("read_file",
           [](const PySandbox& s, std::string path, uint64_t max_bytes, pb::object aio) {
             return Issue<Result<std::string>>(
                 s.core, aio,
                 [&s, path, max_bytes](Client&, Done<std::string> d) {
                   s.sb.ReadFileAsync(path, max_bytes, std::move(d));
                 },
                 [](Result<std::string>& r) { return pb::bytes(*r); });
           })
      .def("write_file",
           [](const PySandbox& s, std::string path, pb::bytes content, uint32_t mode, bool make_parents,
              std::string user, std::map<std::string, std::string> xattrs, std::string xattrs_replace,
              pb::object aio) {
             v1::WriteFileRequest req;
             req.set_path(path);
             req.set_content(std::string(content));
             req.set_mode(mode);
             req.set_make_parents(make_parents);
             req.set_user(user);
             for (auto& [k, v] : xattrs) (*req.mutable_xattrs())[k] = v;
             req.set_xattrs_replace(xattrs_replace);
             return Issue<Status>(
                 s.core, aio, [&s, req](Client&, DoneStatus d) { WriteAsync(s.sb, req, std::move(d)); }, None);
           })
      .def("list_files",
           [](const PySandbox& s, std::string path, pb::object aio) {
             return Issue<Result<v1::FileReply>>(
                 s.core, aio, [&s, path](Client&, Done<v1::FileReply> d) { s.sb.ListFilesAsync(path, std::move(d)); },
                 [](Result<v1::FileReply>& r) { return ToPy(*r); });
           })
      .def("process",
           [](const PySandbox& s, std::string op, uint32_t pid, int signal, pb::bytes input, pb::object aio) {
             v1::ProcessRequest req;
             req.set_op(op == "list"          ? v1::PROCESS_OP_LIST
                        : op == "signal"      ? v1::PROCESS_OP_SIGNAL
                        : op == "input"       ? v1::PROCESS_OP_INPUT
                        : op == "close_stdin" ? v1::PROCESS_OP_CLOSE_STDIN
                                              : v1::PROCESS_OP_UNSPECIFIED);
             req.set_pid(pid);
             req.set_signal(signal);
             req.set_input(std::string(input));
             return Issue<Result<v1::ProcessReply>>(
                 s.core, aio, [&s, req](Client&, Done<v1::ProcessReply> d) { ProcessAsync(s.sb, req, std::move(d)); },
                 [](Result<v1::ProcessReply>& r) {
                   pb::list out;
                   for (const auto& p : r->processes()) out.append(ToPy(p));
                   return pb::object(std::move(out));
                 });
           })
      .def("resize",
           [](const PySandbox& s, uint32_t pid, uint32_t cols, uint32_t rows, pb::object aio) {
             v1::ProcessRequest req;
             req.set_op(v1::PROCESS_OP_RESIZE);
             req.set_pid(pid);
             req.mutable_size()->set_cols(cols);
             req.mutable_size()->set_rows(rows);
             return Issue<Result<v1::ProcessReply>>(
                 s.core, aio, [&s, req](Client&, Done<v1::ProcessReply> d) { ProcessAsync(s.sb, req, std::move(d)); },
                 [](Result<v1::ProcessReply>&) { return pb::none(); });
           })
      .def("usage",
           [](const PySandbox& s, pb::object aio) {
             return Issue<Result<v1::UsageReply>>(
                 s.core, aio,
                 [&s](Client&, Done<v1::UsageReply> d) { UsageAsync(s.sb, std::move(d)); },
                 [](Result<v1::UsageReply>& r) { return ToPy(r->usage()); });
           })
      .def("path_op", [](const PySandbox& s, std::string op, std::string path, std::string dest, std::string user,
                         pb::object aio) {
        v1::PathOpRequest req;
        req.set_op(op == "make_dir" ? v1::PATH_OP_MAKE_DIR
                   : op == "move"   ? v1::PATH_OP_MOVE
                   : op == "remove" ? v1::PATH_OP_REMOVE
                                    : v1::PATH_OP_UNSPECIFIED);
        req.set_path(path);
        req.set_destination(dest);
        req.set_user(user);
        return Issue<Result<v1::FileReply>>(
            s.core, aio, [&s, req](Client&, Done<v1::FileReply> d) { PathOpAsync(s.sb, req, std::move(d)); },
            [op](Result<v1::FileReply>& r) { return op == "remove" ? pb::none() : ToPy(r->info()); });
      });
  BindWatch(m, sandbox);

  pb::class_<PySession>(m, "Session")
      .def_property_readonly("name", [](const PySession& s) { return s.s.name(); })
      .def_property_readonly("record", [](const PySession& s) { return ToPy(s.s.record()); })
      .def("step",
           [](const PySession& s, uint64_t index, pb::object exec, std::string role, pb::object meta,
              bool not_replayable, pb::object aio) {
             auto req = Proto<v1::ExecRequest>(exec, "exec");
             StepOptions o;
             o.sandbox = role;
             o.not_replayable = not_replayable;
             o.meta = Proto<v1::StepMeta>(meta, "meta");
             return Issue<Result<v1::StepReply>>(
                 s.core, aio,
                 [&s, index, req, o](Client&, Done<v1::StepReply> d) mutable {
                   s.s.StepAsync(index, std::move(req), o, std::move(d));
                 },
                 [](Result<v1::StepReply>& r) { return ToPy(*r); });
           })
      .def("fork",
           [](const PySession& s, uint32_t count, std::vector<std::string> names, pb::object aio) {
             // ForkSession waits on calls of its own: on a thread of its own,
             // which keeps the client open (a close waits for it).
             return Issue<Result<std::vector<Session>>>(
                 s.core, aio,
                 [&s, count, names](Client&, Done<std::vector<Session>> d) {
                   std::thread([core = s.core, session = s.s, count, names, d = std::move(d)]() mutable {
                     std::shared_lock<std::shared_mutex> open(core->mu);
                     if (!core->client) return d(Status::FailedPrecondition("this dsec client is closed"));
                     d(ForkSession(*core->client, session, count, names));
                   }).detach();
                 },
                 [weak = std::weak_ptr<Core>(s.core)](Result<std::vector<Session>>& r) {
                   pb::list out;
                   for (const auto& one : *r) out.append(pb::cast(PySession{Strong(weak), one}));
                   return out;
                 });
           })
      .def("grade",
           [](const PySession& s, uint64_t index, pb::object aio) {
             return Issue<Result<v1::StepReply>>(
                 s.core, aio, [&s, index](Client&, Done<v1::StepReply> d) { GradeAsync(s.s, index, std::move(d)); },
                 [](Result<v1::StepReply>& r) { return ToPy(*r); });
           })
      .def("annotate",
           [](const PySession& s, uint64_t index, pb::object meta, pb::object aio) {
             auto m = Proto<v1::StepMeta>(meta, "meta");
             return Issue<Result<v1::StepMeta>>(
                 s.core, aio,
                 [&s, index, m](Client&, Done<v1::StepMeta> d) { s.s.AnnotateAsync(index, m, std::move(d)); },
                 [](Result<v1::StepMeta>& r) { return ToPy(*r); });
           })
      .def("steps",
           [](const PySession& s, uint64_t from, uint32_t limit, pb::object aio) {
             return Issue<Result<v1::StepsReply>>(
                 s.core, aio,
                 [&s, from, limit](Client&, Done<v1::StepsReply> d) { s.s.StepsAsync(from, limit, std::move(d)); },
                 [](Result<v1::StepsReply>& r) { return ToPy(*r); });
           })
      .def("get",
           [](const PySession& s, pb::object aio) {
             return Issue<Result<v1::SessionRecord>>(
                 s.core, aio, [&s](Client&, Done<v1::SessionRecord> d) { s.s.GetAsync(std::move(d)); },
                 [](Result<v1::SessionRecord>& r) { return ToPy(*r); });
           })
      .def("sandbox",
           [](const PySession& s, std::string role, pb::object aio) {
             std::weak_ptr<Core> core = s.core;
             return Issue<Result<Sandbox>>(
                 s.core, aio, [&s, role](Client&, Done<Sandbox> d) { s.s.SandboxAsync(role, std::move(d)); },
                 [weak = std::weak_ptr<Core>(core)](Result<Sandbox>& r) { return pb::cast(PySandbox{Strong(weak), *r}); });
           })
      .def("close", [](const PySession& s, pb::object aio) {
        return Issue<Status>(s.core, aio, [&s](Client&, DoneStatus d) { s.s.CloseAsync(std::move(d)); }, None);
      });
}

}  // namespace dsec::py
