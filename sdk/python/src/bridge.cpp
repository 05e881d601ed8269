// The non-template half of bridge.hpp: the interpreter's state, the event
// loops' completers, the client's close, and the blocking stream's reader.
#include "bridge.hpp"

#include <thread>

#include <unistd.h>

namespace dsec::py {

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

unsigned long& MainThread() {
  static unsigned long id = 0;
  return id;
}

void ParkIfFinalizing() {
  if (!Finalizing() || PyThread_get_thread_ident() == MainThread()) return;
  for (;;) ::pause();
}

thread_local int tls_python_on_sdk_thread = 0;
thread_local bool tls_holding_core = false;
thread_local std::vector<std::shared_ptr<Completer>>* tls_deferred_wakes = nullptr;

Held::~Held() {
  if (!Py_IsInitialized() || Finalizing()) {  // leak rather than crash
    obj.release();
    return;
  }
  OnSdkThread mark;
  pb::gil_scoped_acquire gil;
  obj = pb::object();
}

void AioTarget::Settle(bool failed, pb::object value) { py::Settle()(fut.obj, failed, std::move(value)); }

void Completer::Push(std::function<void()> item) {
  bool schedule, dead, check;
  std::function<void()> dropped;  // answered out of the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    dead = dead_;
    if (dead) dropped = std::move(item);
    else items_.push_back(std::move(item));
    schedule = !dead && !scheduled_;
    scheduled_ = scheduled_ || schedule;
    // A loop closed while its drain was queued never drains: look at it
    // now and then while answers pile up.
    check = !dead && !schedule && items_.size() >= 1024 && (items_.size() & (items_.size() - 1)) == 0;
  }
  if (dead) return Drop(std::move(dropped));
  if (!schedule && !check) return;
  if (tls_holding_core && tls_deferred_wakes) return tls_deferred_wakes->push_back(shared_from_this());
  Wake(schedule);
}

void Completer::Wake(bool schedule) {
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

void Completer::Drain() {
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

pb::object& Completer::DrainFn() {
  static auto* f = new pb::object();
  return *f;
}

void Completer::Drop(std::function<void()> item) {
  if (!Py_IsInitialized() || Finalizing()) return (void)new std::function<void()>(std::move(item));  // leaked
  OnSdkThread mark;
  pb::gil_scoped_acquire gil;
  item = nullptr;
}

Aio Target(const pb::object& aio) {
  if (aio.is_none()) return {};
  auto t = aio.cast<pb::tuple>();
  if (t.size() != 3) throw pb::type_error("dsec: aio must be (loop, future, completer)");
  auto completer = t[2].cast<CompleterRef>();
  if (!completer) throw pb::type_error("dsec: aio's completer is None");
  if (!py::Settle()) throw pb::type_error("dsec: dsec._aio is not imported (it sets how futures are settled)");
  return {std::make_shared<AioTarget>(t[1]), completer};
}

Core::~Core() { Dispose(std::move(client)); }

void Core::Close() {
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

void Core::Dispose(std::unique_ptr<Client> gone) {
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

bool Open(Core& core) { return Read(core, [](Client*) { return true; }, false); }

CoreRef Strong(const std::weak_ptr<Core>& weak) {
  CoreRef core = weak.lock();
  if (!core) Raise(Status::FailedPrecondition("this dsec client is closed"));
  return core;
}

pb::object None(const Status&) { return pb::none(); }

uint32_t StreamPid(const StreamRef& q, double timeout_s) {
  pb::gil_scoped_release nogil;
  std::unique_lock<std::mutex> lock(q->mu);
  q->cv.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return q->pid != 0 || q->done; });
  return q->pid;
}

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
      } else if (q->cv.wait_for(lock, kSignalCheck) == std::cv_status::timeout) {
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

}  // namespace dsec::py
