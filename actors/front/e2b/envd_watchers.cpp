// envd's polled watchers (filesystem.CreateWatcher, GetWatcherEvents,
// RemoveWatcher; E2B's Python SDK watches directories with them): a dsec
// watch kept by the door on an actor of its own, whose events wait for the
// client's next poll (docs/e2b.md). Bounded: at most kMaxWatchers at once,
// kMaxEvents waiting per watcher (past them it ends, saying so), and a
// watcher not polled for kIdleMs is removed (its client went away).
#include <caf/all.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "actors/front/e2b/door_internal.hpp"
#include "runtime/clock.hpp"
#include "runtime/files.hpp"

namespace dsec::e2b {
namespace {

using nlohmann::json;

constexpr size_t kMaxWatchers = 1024;
constexpr size_t kMaxEvents = 16384;
constexpr size_t kMaxEventBytes = 1 << 20;  // names waiting, per watcher
constexpr int64_t kIdleMs = 60'000;

struct IdleCheck {};

}  // namespace
}  // namespace dsec::e2b

namespace dsec::e2b {
namespace {

struct Watcher {
  std::string sandbox;
  caf::actor actor;
  std::mutex mu;  // the rest: the watcher's actor adds, the door's takes
  std::vector<json> events;
  size_t bytes = 0;  // of the names waiting
  Status ended;  // how the watch ended (not Ok: told at the next poll)
  bool done = false;
  int64_t polled_ms = 0;
};

// Every watcher of this process's doors, by id.
std::mutex registry_mu;
std::unordered_map<std::string, std::shared_ptr<Watcher>>& Registry() {
  static auto* r = new std::unordered_map<std::string, std::shared_ptr<Watcher>>;
  return *r;
}

std::shared_ptr<Watcher> Take(const std::string& id, const std::string& sandbox, bool remove) {
  std::lock_guard<std::mutex> lk(registry_mu);
  auto it = Registry().find(id);
  if (it == Registry().end() || it->second->sandbox != sandbox) return nullptr;
  auto w = it->second;
  if (remove) Registry().erase(it);
  return w;
}

void Create(caf::event_based_actor* self, const entry_actor& entry, const std::string& sandbox,
            const std::string& path, bool recursive, bool include_entry, std::function<void(Result<json>)> answer) {
  std::string id = "w" + RandomHex(24);
  auto w = std::make_shared<Watcher>();
  w->sandbox = sandbox;
  w->polled_ms = SteadyClockMs();
  {
    std::lock_guard<std::mutex> lk(registry_mu);
    // Watchers whose watch ended and that nobody polled since: gone.
    const int64_t now = SteadyClockMs();
    for (auto it = Registry().begin(); it != Registry().end();) {
      bool stale;
      {
        std::lock_guard<std::mutex> wl(it->second->mu);
        stale = it->second->done && now - it->second->polled_ms > kIdleMs;
      }
      it = stale ? Registry().erase(it) : std::next(it);
    }
    if (Registry().size() >= kMaxWatchers)
      return answer(Status::ResourceExhausted("this door keeps " + std::to_string(kMaxWatchers) +
                                              " watchers already; remove some (RemoveWatcher)"));
  }
  v1::WatchRequest req;
  req.set_sandbox_id(sandbox);
  req.set_path(path);
  req.set_recursive(recursive);
  req.set_stream_id(1);  // its actor's only one
  auto answered = std::make_shared<bool>(false);
  // Its answer once the watch is in place, or its error; after that, the
  // watch's end waits for the next poll.
  auto settle = [id, w, answered, answer](const Status& s) {
    if (!*answered) {
      *answered = true;
      if (s.ok()) return answer(json{{"watcherId", id}});
      {
        std::lock_guard<std::mutex> lk(w->mu);  // swept later if it is published after this
        w->done = true;
        w->ended = s;
      }
      Take(id, w->sandbox, true);
      return answer(s);
    }
    std::lock_guard<std::mutex> lk(w->mu);
    w->done = true;
    if (w->ended.ok()) w->ended = s.ok() ? Status::NotFound("watcher " + id + " ended") : s;
  };
  caf::actor actor = self->spawn([entry, req, settle, w, id, include_entry](caf::event_based_actor* me) mutable
                                 -> caf::behavior {
    // Each event, in order (with its entry when asked for), waits for a poll.
    auto events = WatchEvents(me, entry, req.sandbox_id(), req.path(), include_entry, [w, me, id](json e) {
      std::lock_guard<std::mutex> lk(w->mu);
      if (w->done) return;
      if (w->events.size() >= kMaxEvents || w->bytes > kMaxEventBytes) {
        w->done = true;
        w->ended = Status::ResourceExhausted("watcher " + id + ": more than " + std::to_string(kMaxEvents) +
                                             " events (or 1 MiB of names) waited for a poll; it ended (poll "
                                             "more often)");
        return me->quit();
      }
      w->bytes += e["name"].get_ref<const std::string&>().size() + (e.contains("entry") ? 256 : 16);
      w->events.push_back(std::move(e));
    });
    me->request(entry, caf::infinite, std::move(req))
        .then(
            [settle, me, events](v1::WatchReply& r) {
              Status s = FromProto(r.status());
              events.finish([settle, me, s] {  // the events before its end are kept first
                settle(s);
                me->quit();
              });
            },
            [settle, me](caf::error& e) {
              settle(Status::Unavailable("dsec did not answer: " + caf::to_string(e)));
              me->quit();
            });
    me->delayed_send(me, std::chrono::seconds(10), IdleCheck{});
    return {
        [settle, events](v1::ExecOutput& piece) {
          if (piece.watching()) settle(Status::Ok());
          events.add(piece);
        },
        [w, me, id](IdleCheck) {
          int64_t polled;
          {
            std::lock_guard<std::mutex> lk(w->mu);
            polled = w->polled_ms;
          }
          if (SteadyClockMs() - polled > kIdleMs) {  // its client went away: the watch ends with the actor
            Take(id, w->sandbox, true);
            return me->quit();
          }
          me->delayed_send(me, std::chrono::seconds(10), IdleCheck{});
        },
    };
  });
  std::lock_guard<std::mutex> lk(registry_mu);
  w->actor = actor;
  Registry()[id] = w;
}

}  // namespace

bool ServeWatchers(caf::event_based_actor* self, const entry_actor& entry, const std::string& sandbox,
                   const std::string& method, const json& msg, const std::string& path,
                   std::function<void(Result<json>)> answer) {
  if (method == "CreateWatcher") {
    auto recursive = msg.find("recursive");
    if (recursive != msg.end() && !recursive->is_null() && !recursive->is_boolean())
      return answer(Status::InvalidArgument("recursive is true or false")), true;
    auto include = msg.find("includeEntry");
    Create(self, entry, sandbox, path, recursive != msg.end() && recursive->is_boolean() && recursive->get<bool>(),
           include != msg.end() && include->is_boolean() && include->get<bool>(), std::move(answer));
    return true;
  }
  if (method != "GetWatcherEvents" && method != "RemoveWatcher") return false;
  auto id = msg.find("watcherId");
  if (id == msg.end() || !id->is_string() || id->get<std::string>().empty())
    return answer(Status::InvalidArgument("watcherId (CreateWatcher's) is required")), true;
  auto w = Take(*id, sandbox, method == "RemoveWatcher");
  if (!w) return answer(Status::NotFound("no watcher " + id->get<std::string>().substr(0, 64) + " of this sandbox")), true;
  if (method == "RemoveWatcher") {
    caf::anon_send_exit(w->actor, caf::exit_reason::user_shutdown);  // its watch ends with it
    return answer(json::object()), true;
  }
  std::vector<json> events;
  Status ended;
  {
    std::lock_guard<std::mutex> lk(w->mu);
    events.swap(w->events);
    w->bytes = 0;
    w->polled_ms = SteadyClockMs();
    if (w->done && events.empty()) ended = w->ended;
  }
  if (!ended.ok()) {  // told once; then it is gone
    Take(*id, sandbox, true);
    return answer(ended), true;
  }
  answer(json{{"events", std::move(events)}});
  return true;
}

}  // namespace dsec::e2b
