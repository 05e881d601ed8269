#include "dsec/watch.hpp"

#include <condition_variable>
#include <mutex>

#include "sdk/src/client_impl.hpp"
#include "sdk/src/extra_calls.hpp"

namespace dsec {

struct DirWatch::State {
  std::mutex mu;
  std::condition_variable cv;
  bool started = false, ended = false;
  uint64_t stream_id = 0;
  Result<uint64_t> end{Status::Internal("the watch has not ended")};
};

Result<std::unique_ptr<DirWatch>> WatchDir(const Sandbox& sandbox, const std::string& path,
                                           std::function<void(const v1::FsEvent&)> on_event, WatchOptions options) {
  auto state = std::make_shared<DirWatch::State>();
  v1::WatchRequest req;
  req.set_path(path);
  req.set_recursive(options.recursive);
  req.set_timeout_ms(static_cast<uint64_t>(options.timeout.count()));
  ExtraCalls::Call<v1::WatchReply>(
      sandbox, std::move(req),
      [state, on_end = options.on_end](Result<v1::WatchReply> r) {
        Result<uint64_t> end = r.ok() ? Result<uint64_t>(r->events()) : Result<uint64_t>(r.status());
        {
          std::lock_guard<std::mutex> lk(state->mu);
          state->ended = true;
          state->end = end;
          state->cv.notify_all();
        }
        if (on_end) on_end(end);
      },
      [state, on_event](const v1::ExecOutput& piece) {
        if (piece.watching()) {
          std::lock_guard<std::mutex> lk(state->mu);
          state->started = true;
          state->stream_id = piece.stream_id();
          state->cv.notify_all();
        }
        if (on_event)
          for (const auto& e : piece.events()) on_event(e);
      });
  std::unique_lock<std::mutex> lk(state->mu);
  state->cv.wait(lk, [&] { return state->started || state->ended; });
  if (!state->started) {
    if (!state->end.ok()) return state->end.status();
    return Status::Internal("the watch of " + path + " ended before it was in place");
  }
  return std::make_unique<DirWatch>(sandbox, state);
}

Result<uint64_t> DirWatch::Stop() {
  uint64_t stream_id;
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    if (state_->ended) return state_->end;
    stream_id = state_->stream_id;
  }
  v1::WatchRequest stop;
  stop.set_stop(true);
  stop.set_stream_id(stream_id);
  auto asked = dsec::Wait<v1::WatchReply>(
      [&](Done<v1::WatchReply> d) { ExtraCalls::Call<v1::WatchReply>(sandbox_, std::move(stop), std::move(d)); });
  if (!asked.ok()) {
    std::lock_guard<std::mutex> lk(state_->mu);
    if (state_->ended) return state_->end;  // it ended meanwhile: how
    return asked.status();
  }
  return Wait();
}

Result<uint64_t> DirWatch::Wait() {
  std::unique_lock<std::mutex> lk(state_->mu);
  state_->cv.wait(lk, [&] { return state_->ended; });
  return state_->end;
}

DirWatch::~DirWatch() { (void)Stop(); }

}  // namespace dsec
