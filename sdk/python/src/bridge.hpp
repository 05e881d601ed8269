// Internal to dsec._core: what its bindings (module.cpp, bind_handles.cpp)
// share. A call is issued here, and its answer comes back here: blocking, or
// through its event loop's Completer (module.cpp's header comment tells how).
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "convert.hpp"
#include "dsec/client.hpp"

namespace dsec::py {

// dsec._aio._settle, set at import.
pb::object& Settle();

bool Finalizing();

// The main thread's id (threading.main_thread().ident, set at import): only
// there can Ctrl-C interrupt a blocking call, and only there does the
// interpreter finalize.
unsigned long& MainThread();

// Once the interpreter is going away, taking the GIL ends the thread in the
// middle of C++ frames: a thread about to take it back blocks for good
// instead (as CPython 3.14 itself does).
void ParkIfFinalizing();

// A blocking wait on the main thread looks at pending signals (Ctrl-C) this often.
inline constexpr std::chrono::milliseconds kSignalCheck{100};

// Set while an SDK thread runs Python code (which may drop the last
// reference to a client: see Core::Close).
// (A thread that already holds the GIL is a Python thread: not marked.)
extern thread_local int tls_python_on_sdk_thread;
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
  ~Held();
  pb::object obj;
};

// The future a call completes (on its event loop).
struct AioTarget {
  Held fut;
  explicit AioTarget(pb::object f) : fut(std::move(f)) {}
  // On the loop's thread, with the GIL.
  void Settle(bool failed, pb::object value);
};

// Answers waiting for their event loop (one Completer per loop: see
// dsec/_aio.py). It holds its loop weakly, so a loop that is gone takes
// nothing with it.
class Completer;
// Set while a thread holds Core::mu (WithClient): an answer given inline
// there (an error found before anything is sent) is queued, and its
// wake-up, which needs the GIL, waits until the lock is released.
extern thread_local bool tls_holding_core;
extern thread_local std::vector<std::shared_ptr<Completer>>* tls_deferred_wakes;

class Completer : public std::enable_shared_from_this<Completer> {
 public:
  explicit Completer(pb::object loop_ref) : loop_ref_(std::move(loop_ref)) {}

  // Any thread, without the GIL. `item` runs on the loop's thread with the
  // GIL; the loop is woken when the queue was empty.
  void Push(std::function<void()> item);

  // Wakes the loop (`schedule`), or only checks that it is alive; marks the
  // completer dead and drops what waits when the loop is closed or gone.
  void Wake(bool schedule = true);

  // The loop's thread, with the GIL.
  void Drain();

  static pb::object& DrainFn();  // _core._drain, set at import

 private:
  // An answer for a loop that is gone: its Python objects go with the GIL.
  static void Drop(std::function<void()> item);

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

// `aio` taken apart: empty for None (a blocking call).
Aio Target(const pb::object& aio);

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

inline bool IsOk(const Status& s) { return s.ok(); }
template <class T>
bool IsOk(const Result<T>& r) {
  return r.ok();
}
inline const Status& StatusOf(const Status& s) { return s; }
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
  ~Core();

  // Lock order: the GIL is never waited for while `mu` is held.
  void Close();

  // Destroying a client answers its pending calls (Unavailable) and waits
  // for its threads.
  static void Dispose(std::unique_ptr<Client> gone);
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
bool Open(Core& core);

// Completions run on SDK threads: they hold the client weakly, so that the
// last reference is never dropped there (destroying the client waits for
// those very threads).
CoreRef Strong(const std::weak_ptr<Core>& weak);

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
    while (main && f.wait_for(kSignalCheck) != std::future_status::ready) {
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

// `obj` (a dict, a record or None) as a message; a bad value raises
// dsec.InvalidArgument naming `path`.
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

// The `conv` of a call that answers with a bare Status.
pb::object None(const Status&);

struct PySandbox {
  CoreRef core;
  Sandbox sb;
};

struct PySession {
  CoreRef core;
  Session s;
};

// Output of a blocking exec_stream, from the SDK thread to the iterating Python thread.
struct StreamQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<std::string, std::string>> chunks;  // (stdout, stderr)
  uint32_t pid = 0;  // an interactive exec's, once its first piece came
  bool done = false;
  Result<v1::ExecResult> result = Status::Unavailable("the stream has not ended");
};
using StreamRef = std::shared_ptr<StreamQueue>;

// The next (stdout, stderr) piece, or None once the exec has ended.
pb::object NextChunk(const StreamRef& q);
// An interactive exec's pid once its first piece came (0: none within timeout_s).
uint32_t StreamPid(const StreamRef& q, double timeout_s);
// The exec's result once its output has been read to the end.
pb::object StreamResult(const StreamRef& q);

ClientOptions Options(const std::string& address, const std::string& token, const std::string& token_file,
                      const std::string& data_dir, double connect_timeout_s, double rpc_timeout_s, size_t threads);

// The classes of a sandbox and a session (Stream, Sandbox, Session), added
// to the module by bind_handles.cpp; the Client class comes after them.
void BindHandles(pb::module_& m);

}  // namespace dsec::py
