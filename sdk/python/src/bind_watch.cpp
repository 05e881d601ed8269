// dsec._core's directory watches (dsec/watch.hpp): Sandbox.watch gives a
// Watch whose events are read one at a time by the Python thread (the
// blocking read of a Stream: next_chunk, here (name, type) pairs), stopped
// by stop() or when it ends by itself.
#include <pybind11/pybind11.h>

#include <memory>
#include <mutex>
#include <string>

#include "bridge.hpp"
#include "dsec/watch.hpp"

namespace dsec::py {

namespace {

// A watch's events as a Stream's chunks (name, type), its end as the count.
struct WatchQueue : StreamQueue {
  CoreRef core;
  std::unique_ptr<DirWatch> handle;
  Result<uint64_t> end = Status::Unavailable("the watch has not ended");
};

const char* TypeName(int t) {
  static const char* kTypes[] = {"unknown", "create", "write", "remove", "rename", "chmod"};
  return kTypes[t >= 0 && t <= 5 ? t : 0];
}

}  // namespace

void BindWatch(pb::module_& m, pb::class_<PySandbox>& sandbox) {
  pb::class_<WatchQueue, std::shared_ptr<WatchQueue>>(m, "Watch")
      .def("next_event", [](const std::shared_ptr<WatchQueue>& q) { return NextChunk(q); })
      .def("stop",
           [](const std::shared_ptr<WatchQueue>& q) {
             Result<uint64_t> r = uint64_t{0};
             // With the client open (a closed one ended its watches).
             bool open = WithClient(*q->core, [&](Client&) {
               if (q->handle) r = q->handle->Stop();
             });
             if (!open) Raise(Status::FailedPrecondition("this dsec client is closed (and its watches ended)"));
             if (!r.ok()) Raise(r.status());
             return *r;
           })
      .def("result", [](const std::shared_ptr<WatchQueue>& q) {
        std::lock_guard<std::mutex> l(q->mu);
        if (!q->done) Raise(Status::FailedPrecondition("the watch is still running: stop it first"));
        if (!q->end.ok()) Raise(q->end.status());
        return *q->end;
      });
  sandbox.def("watch", [](const PySandbox& s, const std::string& path, bool recursive, double timeout_s) {
    auto q = std::make_shared<WatchQueue>();
    q->core = s.core;
    WatchOptions o;
    o.recursive = recursive;
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    o.on_end = [q](const Result<uint64_t>& end) {
      std::lock_guard<std::mutex> l(q->mu);
      q->end = end;
      q->done = true;
      q->cv.notify_all();
    };
    auto on_event = [q](const v1::FsEvent& e) {
      std::lock_guard<std::mutex> l(q->mu);
      q->chunks.emplace_back(e.name(), TypeName(e.type()));
      q->cv.notify_all();
    };
    Result<std::unique_ptr<DirWatch>> w = Status::Ok();
    bool open = WithClient(*s.core, [&](Client&) { w = WatchDir(s.sb, path, on_event, o); });
    if (!open) Raise(Status::FailedPrecondition("this dsec client is closed"));
    if (!w.ok()) Raise(w.status());
    q->handle = std::move(*w);
    return q;
  });
}

}  // namespace dsec::py
