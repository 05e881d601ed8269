// dsec._core: the C++ SDK (dsec::Client) as a Python extension module. The
// Pythonic surface (keyword arguments, records, exceptions, asyncio) is in
// dsec/*.py; this file only carries calls across.
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

#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include <unistd.h>

#include "convert.hpp"
#include "dsec/client.hpp"
#include "dsec/status_proto.hpp"

namespace dsec::py {
namespace {

using namespace std::chrono_literals;

// dsec._aio._settle, set at import.
pb::object& Settle() {
  static auto* o = new pb::object();
  return *o;
}

bool Finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// Once the interpreter is going away, taking the GIL ends the thread in the
// middle of C++ frames: a thread about to take it back blocks for good
// instead (as CPython 3.14 itself does).
// The main thread's id (threading.main_thread().ident, set at import): only
// there can Ctrl-C interrupt a blocking call, and only there does the
// interpreter finalize.
unsigned long& MainThread() {
  static unsigned long id = 0;
  return id;
}

void ParkIfFinalizing() {
  if (!Finalizing() || PyThread_get_thread_ident() == MainThread()) return;
  for (;;) ::pause();
}

// Set while an SDK thread runs Python code (which may drop the last
// reference to a client: see Core::Close).
// (A thread that already holds the GIL is a Python thread: not marked.)
thread_local int tls_python_on_sdk_thread = 0;
struct OnSdkThread {
  OnSdkThread() : marked(!PyGILState_Check()) { tls_python_on_sdk_thread += marked; }
  ~OnSdkThread() { tls_python_on_sdk_thread -= marked; }
  int marked;
};

// Python objects held by C++ callbacks, which may be destroyed on an SDK
// thread without the GIL.
struct Held {
  explicit Held(pb::object o) : obj(std::move(o)) {}
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
  ~Held() {
    if (!Py_IsInitialized() || Finalizing()) {  // leak rather than crash
      obj.release();
      return;
    }
    OnSdkThread mark;
    pb::gil_scoped_acquire gil;
    obj = pb::object();
  }
  pb::object obj;
};

// The future a call completes (on its event loop).
struct AioTarget {
  Held fut;
  explicit AioTarget(pb::object f) : fut(std::move(f)) {}
  // On the loop's thread, with the GIL.
  void Settle(bool failed, pb::object value) { py::Settle()(fut.obj, failed, std::move(value)); }
};

// Answers waiting for their event loop (one Completer per loop: see
// dsec/_aio.py). It holds its loop weakly, so a loop that is gone takes
// nothing with it.
class Completer;
// Set while a thread holds Core::mu (WithClient): an answer given inline
// there (an error found before anything is sent) is queued, and its
// wake-up, which needs the GIL, waits until the lock is released.
thread_local bool tls_holding_core = false;
thread_local std::vector<std::shared_ptr<Completer>>* tls_deferred_wakes = nullptr;

class Completer : public std::enable_shared_from_this<Completer> {
 public:
  explicit Completer(pb::object loop_ref) : loop_ref_(std::move(loop_ref)) {}

  // Any thread, without the GIL. `item` runs on the loop's thread with the
  // GIL; the loop is woken when the queue was empty.
  void Push(std::function<void()> item) {
    bool schedule, dead, check;
    {
      std::lock_guard<std::mutex> lock(mu_);
      dead = dead_;
      if (!dead) items_.push_back(std::move(item));
      schedule = !dead && !scheduled_;
      scheduled_ = scheduled_ || schedule;
      // A loop closed while its drain was queued never drains: look at it
      // now and then while answers pile up.
      check = !dead && !schedule && items_.size() >= 1024 && (items_.size() & (items_.size() - 1)) == 0;
    }
    if (dead) return Drop(std::move(item));
    if (!schedule && !check) return;
    if (tls_holding_core && tls_deferred_wakes) return tls_deferred_wakes->push_back(shared_from_this());
    Wake(schedule);
  }

  // Wakes the loop (`schedule`), or only checks that it is alive; marks the
  // completer dead and drops what waits when the loop is closed or gone.
  void Wake(bool schedule = true) {
    if (!Py_IsInitialized() || Finalizing()) return;
    OnSdkThread mark;
    pb::gil_scoped_acquire gil;
    bool alive = false, woken = false;
    try {
      pb::object loop = loop_ref_.obj();
      alive = !loop.is_none() && !loop.attr("is_closed")().cast<bool>();
      if (alive && schedule) {
        loop.attr("call_soon_threadsafe")(DrainFn(), pb::cast(shared_from_this()));
        woken = true;
      }
    } catch (pb::error_already_set& e) {
      e.discard_as_unraisable("dsec: waking an event loop for answers");
    }
    if (alive && (woken || !schedule)) return;
    if (alive) {  // the wake-up failed (e.g. MemoryError): the next answer tries again
      std::lock_guard<std::mutex> lock(mu_);
      scheduled_ = false;
      return;
    }
    // The loop is closed or gone, and its callers with it: drop what waits
    // (here, with the GIL) and every answer that comes later.
    std::vector<std::function<void()>> dropped;
    std::lock_guard<std::mutex> lock(mu_);
    dead_ = true;
    scheduled_ = false;
    dropped.swap(items_);
  }

  // The loop's thread, with the GIL.
  void Drain() {
    std::vector<std::function<void()>> items;
    {
      std::lock_guard<std::mutex> lock(mu_);
      items.swap(items_);
      scheduled_ = false;
    }
    for (auto& item : items) {
      try {
        item();
      } catch (pb::error_already_set& e) {
        e.discard_as_unraisable("dsec: settling an async call");
      } catch (const std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        PyErr_WriteUnraisable(nullptr);
      }
    }
  }

  static pb::object& DrainFn() {
    static auto* f = new pb::object();  // _core._drain, set at import
    return *f;
  }

 private:
  // An answer for a loop that is gone: its Python objects go with the GIL.
  static void Drop(std::function<void()> item) {
    if (!Py_IsInitialized() || Finalizing()) return (void)new std::function<void()>(std::move(item));  // leaked
    OnSdkThread mark;
    pb::gil_scoped_acquire gil;
    item = nullptr;
  }

  Held loop_ref_;  // a weakref.ref to the loop
  std::mutex mu_;
  std::vector<std::function<void()>> items_;
  bool scheduled_ = false;
  bool dead_ = false;
};
using CompleterRef = std::shared_ptr<Completer>;

struct Aio {
  std::shared_ptr<AioTarget> target;
  CompleterRef completer;
  explicit operator bool() const { return target != nullptr; }
};

Aio Target(const pb::object& aio) {
  if (aio.is_none()) return {};
  auto t = aio.cast<pb::tuple>();
  if (t.size() != 3) throw pb::type_error("dsec: aio must be (loop, future, completer)");
  auto completer = t[2].cast<CompleterRef>();
  if (!completer) throw pb::type_error("dsec: aio's completer is None");
  if (!py::Settle()) throw pb::type_error("dsec: dsec._aio is not imported (it sets how futures are settled)");
  return {std::make_shared<AioTarget>(t[1]), completer};
}

// Settles `target` with `make()`'s value; an exception from make() fails it.
template <class Make>
void SettleWith(AioTarget& target, Make&& make) {
  try {
    auto [failed, value] = make();
    target.Settle(failed, std::move(value));
  } catch (pb::error_already_set& e) {
    pb::object exc = e.value() ? pb::reinterpret_borrow<pb::object>(e.value()) : pb::none();
    try {
      target.Settle(true, exc);
    } catch (pb::error_already_set& again) {
      again.discard_as_unraisable("dsec: settling a call's future");
    }
  } catch (const std::exception& e) {
    // e.g. a failed cast while making the value: the call fails with it.
    target.Settle(true, pb::reinterpret_borrow<pb::object>(PyExc_RuntimeError)(e.what()));
  }
}

bool IsOk(const Status& s) { return s.ok(); }
template <class T>
bool IsOk(const Result<T>& r) {
  return r.ok();
}
const Status& StatusOf(const Status& s) { return s; }
template <class T>
const Status& StatusOf(const Result<T>& r) {
  return r.status();
}

// The Python client: the C++ client and a lock that keeps it alive while a
// call is being issued (close() waits for those, then destroys it; the
// destruction answers every pending call with Unavailable).
struct Core {
  std::shared_mutex mu;
  std::unique_ptr<Client> client;

  // Nothing else can use the client any more (every user holds the Core).
  ~Core() { Dispose(std::move(client)); }

  // Lock order: the GIL is never waited for while `mu` is held.
  void Close() {
    std::unique_ptr<Client> gone;
    if (Py_IsInitialized() && PyGILState_Check()) {
      pb::gil_scoped_release nogil;
      std::unique_lock<std::shared_mutex> lock(mu);
      gone = std::move(client);
    } else {
      std::unique_lock<std::shared_mutex> lock(mu);
      gone = std::move(client);
    }
    Dispose(std::move(gone));
  }

  // Destroying a client answers its pending calls (Unavailable) and waits
  // for its threads.
  static void Dispose(std::unique_ptr<Client> gone) {
    if (!gone) return;
    if (tls_python_on_sdk_thread > 0) {
      // Python code on one of the client's own threads let it go: waiting
      // for that very thread here would never end.
      std::thread([c = std::move(gone)]() mutable { c.reset(); }).detach();
    } else if (Py_IsInitialized() && PyGILState_Check()) {
      pb::gil_scoped_release nogil;  // pending completions need the GIL
      gone.reset();
    } else {
      gone.reset();
    }
  }
};

// Runs `f(client)` with the GIL released and the client kept open; false
// when the client is closed.
template <class F>
bool WithClient(Core& core, F&& f) {
  bool open = false;
  std::vector<std::shared_ptr<Completer>> wakes;
  pb::gil_scoped_release nogil;
  {
    std::shared_lock<std::shared_mutex> lock(core.mu);
    tls_holding_core = true;
    tls_deferred_wakes = &wakes;
    if (core.client) {
      open = true;
      f(*core.client);
    }
    tls_holding_core = false;
    tls_deferred_wakes = nullptr;
  }
  for (auto& c : wakes) c->Wake();
  return open;
}

using CoreRef = std::shared_ptr<Core>;

// `get(client)`, or `closed` when the client is closed; taken without the
// GIL (see the lock order above).
template <class Get, class T>
T Read(Core& core, Get get, T closed) {
  pb::gil_scoped_release nogil;
  std::shared_lock<std::shared_mutex> lock(core.mu);
  return core.client ? T(get(core.client.get())) : closed;
}
bool Open(Core& core) { return Read(core, [](Client*) { return true; }, false); }

// Completions run on SDK threads: they hold the client weakly, so that the
// last reference is never dropped there (destroying the client waits for
// those very threads).
CoreRef Strong(const std::weak_ptr<Core>& weak) {
  CoreRef core = weak.lock();
  if (!core) Raise(Status::FailedPrecondition("this dsec client is closed"));
  return core;
}

// Issues `start(client, done)` (a callback form) and delivers its result
// through `conv` (called with the GIL): blocking, or to the aio target.
template <class R, class Start, class Conv>
pb::object Issue(const CoreRef& core, const pb::object& aio, Start start, Conv conv) {
  Aio target = Target(aio);
  if (target) {
    bool open = WithClient(*core, [&](Client& c) {
      // Called once: the target moves into the queued item, so its Python
      // objects go on the loop's thread.
      start(c, [t = target.target, completer = target.completer, conv](R r) mutable {
        auto answer = std::make_shared<R>(std::move(r));
        completer->Push([t = std::move(t), conv, answer]() mutable {
          SettleWith(*t, [&]() -> std::pair<bool, pb::object> {
            if (IsOk(*answer)) return {false, conv(*answer)};
            return {true, MakeError(StatusOf(*answer))};
          });
          t.reset();
        });
      });
    });
    if (!open) Raise(Status::FailedPrecondition("this dsec client is closed"));
    return pb::none();
  }
  auto p = std::make_shared<std::promise<R>>();
  auto f = p->get_future();
  if (!WithClient(*core, [&](Client& c) { start(c, [p](R r) { p->set_value(std::move(r)); }); }))
    Raise(Status::FailedPrecondition("this dsec client is closed"));
  bool main = PyThread_get_thread_ident() == MainThread();
  {
    pb::gil_scoped_release nogil;
    if (!main) f.wait();
    while (main && f.wait_for(100ms) != std::future_status::ready) {
      ParkIfFinalizing();
      pb::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() != 0) throw pb::error_already_set();  // Ctrl-C: the call goes on unattended
    }
    ParkIfFinalizing();
  }
  R r = f.get();
  if (!IsOk(r)) Raise(StatusOf(r));
  return conv(r);
}

template <class Msg>
Msg Proto(pb::handle obj, const std::string& path) {
  Msg m;
  try {
    FromPy(obj, &m, path);
  } catch (const ArgumentError& e) {
    Raise(Status::InvalidArgument(e.message));
  }
  return m;
}

pb::object None(const Status&) { return pb::none(); }

struct PySandbox {
  CoreRef core;
  Sandbox sb;
};

struct PySession {
  CoreRef core;
  Session s;
};

// Output of a blocking exec_stream, handed from the SDK thread to the
// iterating Python thread.
struct StreamQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<std::string, std::string>> chunks;  // (stdout, stderr)
  bool done = false;
  Result<v1::ExecResult> result = Status::Unavailable("the stream has not ended");
};
using StreamRef = std::shared_ptr<StreamQueue>;

// The next (stdout, stderr) piece, or None once the exec has ended.
pb::object NextChunk(const StreamRef& q) {
  std::pair<std::string, std::string> chunk;
  bool ended = false;
  bool main = PyThread_get_thread_ident() == MainThread();
  {
    pb::gil_scoped_release nogil;
    std::unique_lock<std::mutex> lock(q->mu);
    while (q->chunks.empty() && !q->done) {
      if (!main) {
        q->cv.wait(lock);
      } else if (q->cv.wait_for(lock, 100ms) == std::cv_status::timeout) {
        lock.unlock();
        ParkIfFinalizing();
        {
          pb::gil_scoped_acquire gil;
          if (PyErr_CheckSignals() != 0) throw pb::error_already_set();  // Ctrl-C
        }
        lock.lock();
      }
    }
    lock.unlock();
    ParkIfFinalizing();
    lock.lock();
    if (q->chunks.empty()) {
      ended = true;
    } else {
      chunk = std::move(q->chunks.front());
      q->chunks.pop_front();
    }
  }
  if (ended) return pb::none();
  return pb::make_tuple(pb::bytes(chunk.first), pb::bytes(chunk.second));
}

pb::object StreamResult(const StreamRef& q) {
  Result<v1::ExecResult> r = Status::Unavailable("x");
  bool done;
  {
    std::lock_guard<std::mutex> lock(q->mu);
    done = q->done;
    if (done) r = q->result;
  }
  if (!done) Raise(Status::FailedPrecondition("the exec is still running: read its output to the end first"));
  if (!r.ok()) Raise(r.status());
  return ToPy(*r);
}

ClientOptions Options(const std::string& address, const std::string& token, const std::string& token_file,
                      const std::string& data_dir, double connect_timeout_s, double rpc_timeout_s, size_t threads) {
  ClientOptions o;
  o.address = address;
  o.token = token;
  o.token_file = token_file;
  o.data_dir = data_dir;
  o.connect_timeout = std::chrono::milliseconds(static_cast<int64_t>(connect_timeout_s * 1000));
  o.rpc_timeout = std::chrono::milliseconds(static_cast<int64_t>(rpc_timeout_s * 1000));
  o.threads = threads;
  return o;
}

}  // namespace
}  // namespace dsec::py

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

  pb::class_<StreamQueue, StreamRef>(m, "Stream")
      .def("next_chunk", &NextChunk)
      .def("result", &StreamResult);

  pb::class_<PySandbox>(m, "Sandbox")
      .def_property_readonly("id", [](const PySandbox& s) { return s.sb.id(); })
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
                   q->chunks.emplace_back(out.stdout(), out.stderr());
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
                       push->obj(pb::bytes(chunk->stdout()), pb::bytes(chunk->stderr()));
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
           [](const PySandbox& s, pb::object aio) {
             return Issue<Status>(s.core, aio, [&s](Client&, DoneStatus d) { s.sb.PauseAsync(std::move(d)); }, None);
           })
      .def("resume",
           [](const PySandbox& s, pb::object aio) {
             return Issue<Status>(s.core, aio, [&s](Client&, DoneStatus d) { s.sb.ResumeAsync(std::move(d)); }, None);
           })
      .def("set_timeout",
           [](const PySandbox& s, uint32_t seconds, pb::object aio) {
             return Issue<Result<v1::SandboxRecord>>(
                 s.core, aio,
                 [&s, seconds](Client&, Done<v1::SandboxRecord> d) { s.sb.SetTimeoutAsync(seconds, std::move(d)); },
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
              pb::object aio) {
             std::string data = content;
             return Issue<Status>(
                 s.core, aio,
                 [&s, path, data, mode, make_parents](Client&, DoneStatus d) {
                   s.sb.WriteFileAsync(path, data, mode, make_parents, std::move(d));
                 },
                 None);
           })
      .def("list_files", [](const PySandbox& s, std::string path, pb::object aio) {
        return Issue<Result<v1::FileReply>>(
            s.core, aio, [&s, path](Client&, Done<v1::FileReply> d) { s.sb.ListFilesAsync(path, std::move(d)); },
            [](Result<v1::FileReply>& r) { return ToPy(*r); });
      });

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
              bool restartable, pb::object aio) {
             auto sp = Proto<v1::SandboxSpec>(spec, "spec");
             SessionOptions o;
             o.lease_s = lease_s;
             o.restartable = restartable;
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
      .def("remove_image", [](const CoreRef& core, std::string name, pb::object aio) {
        return Issue<Status>(core, aio, [name](Client& c, DoneStatus d) { c.RemoveImageAsync(name, std::move(d)); },
                             None);
      });
}
