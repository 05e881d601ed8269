#include "tools/dsecd/lazy_node.hpp"

#include <spdlog/spdlog.h>

#include <future>

#include "actors/node/image_worker.hpp"
#include "drivers/images/image_store.hpp"
#include "runtime/files.hpp"
#include "tools/dsecd/daemon.hpp"

namespace dsec::daemon {

namespace {

// A fetch from a lazy images' thread: the relay asks the controller and
// calls `done` with what came back. No blocking actor is involved.
struct FetchJob {
  std::vector<std::string> digests;
  std::function<void(Result<std::vector<std::string>>)> done;
};

}  // namespace
}  // namespace dsec::daemon

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsec::daemon::FetchJob)

namespace dsec::daemon {
namespace {

caf::behavior ChunkRelay(caf::event_based_actor* self, std::shared_ptr<ControllerSlot> slot) {
  auto controller = [slot] {
    std::lock_guard<std::mutex> lk(slot->mu);
    return slot->controller;
  };
  return {
      [self, controller](FetchJob& job) {
        caf::actor c = controller();
        if (!c) return job.done(Status::Unavailable("this node is not connected to its controller (the image service)"));
        auto done = std::move(job.done);
        self->request(c, std::chrono::seconds(10), chunks_atom::value, std::move(job.digests))
            .then([done](std::vector<std::string>& bytes) { done(std::move(bytes)); },
                  [self, done](caf::error& e) { done(Status::Unavailable("the image service: " + self->system().render(e))); });
      },
      [self, controller](prefetch_atom a, cluster::v1::ChunkMap& m) {
        if (caf::actor c = controller()) self->send(c, a, std::move(m));
      },
  };
}

}  // namespace

void StartChunkRelay(caf::actor_system& sys, const std::shared_ptr<ControllerSlot>& slot) {
  caf::actor relay = sys.spawn(ChunkRelay, slot);
  std::lock_guard<std::mutex> lk(slot->mu);
  slot->sys = &sys;
  slot->relay = relay;
}

void StopChunkRelay(const std::shared_ptr<ControllerSlot>& slot) {
  caf::actor relay;
  {
    std::lock_guard<std::mutex> lk(slot->mu);  // no fetch starts from here on
    relay.swap(slot->relay);
    slot->controller = nullptr;
    slot->sys = nullptr;
  }
  if (relay) caf::anon_send_exit(relay, caf::exit_reason::user_shutdown);
}

std::shared_ptr<images::LazyImages> StartLazyImages(const Flags& f, const std::string& data_dir,
                                                    std::shared_ptr<ControllerSlot> slot,
                                                    const images::ImageStore* store,
                                                    std::function<void(const std::string&, const std::string&)> lost,
                                                    std::shared_ptr<spdlog::logger> log) {
  images::LazyOptions o;
  o.data_dir = data_dir;
  o.cache_bytes = static_cast<uint64_t>(f.image_cache_gib * double(1ull << 30));
  o.fetch_timeout_s = f.image_fetch_timeout_s;
  o.record_window_s = f.image_record_s;
  o.lazyfs = SiblingExecutable("DSEC_LAZYFS", "dsec-lazyfs");
  auto peer = [slot](caf::actor* relay) -> caf::actor_system* {
    std::lock_guard<std::mutex> lk(slot->mu);
    *relay = slot->relay;
    return slot->sys;
  };
  o.fetch = [peer](const std::vector<std::string>& digests) -> Result<std::vector<std::string>> {
    caf::actor c;
    caf::actor_system* sys = peer(&c);
    if (!c || !sys) return Status::Unavailable("dsecd is stopping");
    auto answer = std::make_shared<std::promise<Result<std::vector<std::string>>>>();
    auto got = answer->get_future();
    caf::anon_send(c, FetchJob{digests, [answer](Result<std::vector<std::string>> r) { answer->set_value(std::move(r)); }});
    if (got.wait_for(std::chrono::seconds(12)) != std::future_status::ready)
      return Status::Unavailable("the image service did not answer within 12 s");
    return got.get();
  };
  o.record = [peer](const std::string& digest, const std::vector<uint32_t>& order) {
    caf::actor c;
    caf::actor_system* sys = peer(&c);
    if (!c || !sys) return;
    cluster::v1::ChunkMap m;
    m.set_image_digest(digest);
    for (uint32_t i : order) m.add_prefetch(i);
    caf::anon_send(c, prefetch_atom::value, std::move(m));
  };
  o.lost = [store, lost](const std::vector<std::string>& digests, const std::string& why) {
    auto all = store->List();
    if (!all.ok()) return;
    for (const auto& m : *all) {
      if (!m.lazy() || std::find(digests.begin(), digests.end(), m.digest()) == digests.end()) continue;
      for (const auto& user : store->Users(m.name()))
        if (user.rfind("sandbox ", 0) == 0) lost(user.substr(8), "image " + m.name() + ": " + why);
    }
  };
  o.log = [log](int level, const std::string& line) {
    if (level >= 2) log->error("{}", line);
    else if (level == 1) log->warn("{}", line);
    else log->info("{}", line);
  };
  auto lazy = std::make_shared<images::LazyImages>(std::move(o));
  Status started = lazy->Start();
  if (!started.ok()) {
    log->error("lazy images unavailable on this node: {}", started.message());
    if (started.code() != Status::Code::kUnavailable) return nullptr;
    // dsec-lazyfs did not come up: the keeper tries again.
  }
  return lazy;
}

}  // namespace dsec::daemon
