// Directory watches (Watch): one inotify instance for the agent (instances
// are counted per user on the host, 128 by default, and every container's
// agent is root there), watch descriptors shared by watches of the same
// directory. Events are named relative to the watched directory and typed
// as fsnotify (which E2B's envd uses) types them: a move away is a rename,
// a move in a create.
#include "drivers/agent/agent_internal.hpp"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <tuple>
#include <vector>

namespace dsec::agent::internal {

namespace {
constexpr uint32_t kMask = IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB |
                           IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW;
// Events for one client are sent in frames of about this size.
constexpr size_t kBatchBytes = 256 << 10;
// Directories one recursive watch may hold (each an inotify watch of the
// host's per-user budget, fs.inotify.max_user_watches).
constexpr size_t kMaxWatchDirs = 8192;
// And all of this agent's watches together: the host's budget is shared by
// every sandbox whose agent is the same host user.
constexpr size_t kMaxAgentWatchDirs = 16384;
// Entries a watch remembers having reported from new directories' first
// listings (WatchRun::listed; forgotten with their directory's watch); past
// it, an entry's own create may be told after its listing told it.
constexpr size_t kMaxListed = 65536;
constexpr int kCreate = 1, kWrite = 2, kRemove = 3, kRename = 4, kChmod = 5;

int TypeOf(uint32_t mask) {
  if (mask & (IN_CREATE | IN_MOVED_TO)) return kCreate;
  if (mask & IN_MODIFY) return kWrite;
  if (mask & IN_DELETE) return kRemove;
  if (mask & IN_MOVED_FROM) return kRename;
  if (mask & IN_ATTRIB) return kChmod;
  return 0;
}

std::string Join(const std::string& rel, const std::string& name) { return rel.empty() ? name : rel + "/" + name; }
}  // namespace

void Agent::OnWatch(Conn& c, uint64_t id, const Watch& req) {
  if (c.watches.count(id) || c.execs.count(id))
    return SendError(c, id, EEXIST, "watch: request id " + std::to_string(id) + " is in use on this connection");
  const std::string& path = req.path();
  if (path.empty() || path[0] != '/' || path.find('\0') != std::string::npos)
    return SendError(c, id, EINVAL, "watch: '" + path + "' is not an absolute path");
  if (!inotify_) {
    inotify_.Reset(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
    if (!inotify_) return SendError(c, id, errno, std::string("watch: inotify: ") + std::strerror(errno));
    WatchFd(inotify_.get(), 0, kInotify, EPOLLIN);
  }
  auto w = std::make_unique<WatchRun>();
  w->key = next_key_++;
  w->conn = c.key;
  w->req_id = id;
  w->root = path.size() > 1 && path.back() == '/' ? path.substr(0, path.size() - 1) : path;
  w->recursive = req.recursive();
  WatchRun& r = *w;
  watches_[r.key] = std::move(w);
  c.watches[id] = r.key;
  std::string why;
  if (!AddWatchDirs(r, "", &why)) {
    c.watches.erase(id);
    int err = errno ? errno : ENOSPC;
    EndWatch(r.key, 0, {});
    return SendError(c, id, err, "watch: " + why);
  }
  Event ev;
  ev.set_id(id);
  ev.mutable_fs_events()->set_watching(true);
  Send(c, ev);
}

bool Agent::AddWatchDirs(WatchRun& w, const std::string& rel, std::string* why,
                         const std::function<void(const std::string&)>& found) {
  std::deque<std::string> todo{rel};
  while (!todo.empty()) {
    std::string dir = std::move(todo.front());
    todo.pop_front();
    std::string full = Join(w.root, dir);
    if (dir.empty()) full = w.root;
    if (w.wds.size() >= kMaxWatchDirs) {
      errno = ENOSPC;
      *why = "more than " + std::to_string(kMaxWatchDirs) + " directories under " + w.root +
             " to watch; watch a smaller tree";
      return false;
    }
    if (wd_users_.size() >= kMaxAgentWatchDirs) {
      errno = ENOSPC;
      *why = "this sandbox's watches hold " + std::to_string(kMaxAgentWatchDirs) +
             " directories already; stop one, or watch a smaller tree";
      return false;
    }
    int wd = ::inotify_add_watch(inotify_.get(), full.c_str(), kMask);
    if (wd < 0) {
      if (!dir.empty()) continue;  // gone, or not a directory, meanwhile: its events would be none
      int e = errno;
      *why = full + ": " + (e == ENOTDIR ? std::string("not a directory")
                            : e == ENOSPC ? std::string("the host's inotify watches are used up "
                                                        "(fs.inotify.max_user_watches)")
                                          : std::string(std::strerror(e)));
      errno = e;
      return false;
    }
    // Watched already: the same directory by two names (a bind mount), or
    // one whose listing was stale, listed now under its new name.
    const bool relist = w.unlisted.erase(wd) > 0;
    if (!w.wds.insert(wd).second && !relist) continue;
    if (!relist) wd_users_[wd].emplace_back(w.key, dir);
    if (!w.recursive) break;
    // What it holds, by name: told (for a new directory) only if `full`
    // still names it once listed. A directory renamed meanwhile (mkdir t;
    // mv t u; touch u/z) would be listed under its old name: it is listed
    // again when its move is read (OnInotify), and what is made in it from
    // now on comes as its events.
    UniqueFd fd(::open(full.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    struct stat listed_st {};
    if (!fd || ::fstat(fd.get(), &listed_st) < 0) continue;
    DIR* d = ::fdopendir(fd.Release());
    if (!d) continue;
    std::vector<std::pair<std::string, bool>> entries;  // (name, a directory)
    while (dirent* e = ::readdir(d)) {
      if (!std::strcmp(e->d_name, ".") || !std::strcmp(e->d_name, "..")) continue;
      entries.emplace_back(e->d_name, e->d_type == DT_DIR);
    }
    ::closedir(d);
    struct stat now_st {};
    if (found && (::lstat(full.c_str(), &now_st) < 0 || now_st.st_ino != listed_st.st_ino ||
                  now_st.st_dev != listed_st.st_dev)) {
      w.unlisted.insert(wd);
      continue;
    }
    for (const auto& [name, is_dir] : entries) {
      if (found) {  // told whatever it remembers; past kMaxListed its own create may be told again
        if (w.listed.size() < kMaxListed) w.listed.emplace(wd, name);
        found(Join(dir, name));
      }
      if (!is_dir) continue;
      todo.push_back(Join(dir, name));
      if (w.wds.size() + todo.size() > kMaxWatchDirs) break;  // past the limit: said once the queue reaches it
    }
  }
  return true;
}

void Agent::EndWatch(uint64_t key, int err, const std::string& why) {
  auto it = watches_.find(key);
  if (it == watches_.end()) return;
  std::unique_ptr<WatchRun> w = std::move(it->second);
  watches_.erase(it);
  for (int wd : w->wds) {
    auto u = wd_users_.find(wd);
    if (u == wd_users_.end()) continue;
    auto& users = u->second;
    for (size_t i = 0; i < users.size();)
      if (users[i].first == key) users.erase(users.begin() + static_cast<long>(i));
      else ++i;
    if (users.empty()) {
      ::inotify_rm_watch(inotify_.get(), wd);
      wd_users_.erase(u);
    }
  }
  if (inotify_paused_) ResumeInotify();  // it may have been the client that backed up
  Conn* c = FindConn(w->conn);
  if (!c || !c->watches.count(w->req_id)) return;  // its client stopped it, or is gone
  c->watches.erase(w->req_id);
  if (err) return SendError(*c, w->req_id, err, "watch " + w->root + ": " + why);
  Event ev;
  ev.set_id(w->req_id);
  ev.mutable_ok();
  Send(*c, ev);
}

void Agent::DropWatchDirs(WatchRun& w, const std::string& rel) {
  std::string under = rel + "/";
  for (auto it = w.wds.begin(); it != w.wds.end();) {
    auto u = wd_users_.find(*it);
    bool gone = false;
    if (u != wd_users_.end()) {
      auto& users = u->second;
      for (size_t i = 0; i < users.size();) {
        const std::string& r = users[i].second;
        if (users[i].first == w.key && (r == rel || r.compare(0, under.size(), under) == 0)) {
          users.erase(users.begin() + static_cast<long>(i));
          gone = true;
        } else {
          ++i;
        }
      }
      if (users.empty()) {
        ::inotify_rm_watch(inotify_.get(), *it);
        wd_users_.erase(u);
      }
    }
    if (gone) {
      w.unlisted.erase(*it);
      for (auto l = w.listed.lower_bound({*it, std::string()}); l != w.listed.end() && l->first == *it;)
        l = w.listed.erase(l);
    }
    it = gone ? w.wds.erase(it) : std::next(it);
  }
}

bool Agent::RenameWatchDirs(WatchRun& w, const std::string& from, const std::string& to) {
  std::string under = from + "/";
  bool renamed = false;
  for (int wd : w.wds) {
    auto u = wd_users_.find(wd);
    if (u == wd_users_.end()) continue;
    for (auto& [key, r] : u->second)
      if (key == w.key && (r == from || r.compare(0, under.size(), under) == 0)) {
        r = to + r.substr(from.size());
        renamed |= r == to;
      }
  }
  return renamed;
}

std::vector<std::string> Agent::UnlistedUnder(const WatchRun& w, const std::string& rel) const {
  std::vector<std::string> rels;
  const std::string under = rel + "/";
  for (int wd : w.unlisted) {
    auto u = wd_users_.find(wd);
    if (u == wd_users_.end()) continue;
    for (const auto& [key, r] : u->second)
      if (key == w.key && (r == rel || r.compare(0, under.size(), under) == 0)) rels.push_back(r);
  }
  std::sort(rels.begin(), rels.end());  // a parent before what it holds
  return rels;
}

void Agent::ResumeInotify() {
  for (auto& [key, w] : watches_)
    if (Conn* c = FindConn(w->conn); c && c->pending() >= kHighWater) return;
  inotify_paused_ = false;
  WatchFd(inotify_.get(), 0, kInotify, EPOLLIN);
  OnInotify();  // what waited in the kernel's queue
}

void Agent::OnInotify() {
  // A client that does not keep up: stop reading (the kernel queues; past
  // its limit the watches end, saying events were lost) until it drains.
  for (auto& [key, w] : watches_) {
    Conn* c = FindConn(w->conn);
    if (c && c->pending() >= kHighWater) {
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, inotify_.get(), nullptr);
      inotify_paused_ = true;
      return;
    }
  }
  alignas(inotify_event) char buf[64 << 10];
  std::unordered_map<uint64_t, std::pair<Event, size_t>> batches;  // per watch: its events, their bytes
  std::vector<std::tuple<uint64_t, int, std::string>> ended;        // (watch, errno, why)
  auto flush = [&](uint64_t key) {
    auto b = batches.find(key);
    auto w = watches_.find(key);
    if (b == batches.end()) return;
    if (w != watches_.end())
      if (Conn* c = FindConn(w->second->conn)) {
        b->second.first.set_id(w->second->req_id);
        Send(*c, b->second.first);
      }
    batches.erase(b);
  };
  auto moved_away = [&] {
    for (auto& [key, rel] : moved_)
      if (auto w = watches_.find(key); w != watches_.end()) DropWatchDirs(*w->second, rel);
    moved_.clear();
  };
  for (int reads = 0; reads < 16; ++reads) {
    ssize_t n = ::read(inotify_.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (char* p = buf; p < buf + n;) {
      auto* e = reinterpret_cast<inotify_event*>(p);
      p += sizeof(inotify_event) + e->len;
      if (!moved_.empty() && !((e->mask & IN_MOVED_TO) && e->cookie == moved_cookie_)) moved_away();
      if (e->mask & IN_Q_OVERFLOW) {  // events were lost: every watch says so rather than miss them
        for (auto& [key, w] : watches_) ended.emplace_back(key, ENOBUFS, "events were lost (the kernel's queue overflowed)");
        continue;
      }
      auto u = wd_users_.find(e->wd);
      if (u == wd_users_.end()) continue;
      std::string name = e->len ? std::string(e->name) : std::string();
      if (e->mask & (IN_IGNORED | IN_MOVE_SELF)) {  // gone, unmounted or (a watch's root) moved away
        bool ignored = e->mask & IN_IGNORED;
        for (auto& [key, rel] : u->second) {
          auto w = watches_.find(key);
          if (w == watches_.end()) continue;
          if (rel.empty()) ended.emplace_back(key, ENOENT, ignored ? "the directory was removed" : "the directory was moved");
          else if (ignored) {
            w->second->wds.erase(e->wd);
            w->second->unlisted.erase(e->wd);
            auto& listed = w->second->listed;
            for (auto l = listed.lower_bound({e->wd, std::string()}); l != listed.end() && l->first == e->wd;)
              l = listed.erase(l);
          }
        }
        if (ignored) wd_users_.erase(u);
        continue;
      }
      int type = TypeOf(e->mask);
      if (!type || name.empty()) continue;  // DELETE_SELF: IGNORED follows
      auto users = u->second;  // AddWatchDirs and DropWatchDirs change wd_users_
      for (const auto& user : users) {
        const uint64_t key = user.first;
        auto w = watches_.find(key);
        if (w == watches_.end()) continue;
        WatchRun& r = *w->second;
        const std::string& rel = user.second;
        std::string child = Join(rel, name);
        auto tell = [&batches, &flush, key](const std::string& what, int how) {
          auto& b = batches[key];
          auto* fe = b.first.mutable_fs_events()->add_events();
          fe->set_name(what);
          fe->set_type(static_cast<uint32_t>(how));
          b.second += what.size() + 8;
          if (b.second >= kBatchBytes) flush(key);
        };
        // Reported already from its new directory's listing; or gone, so
        // a create of that name later is news.
        if (!r.listed.empty() && r.listed.erase({e->wd, name}) && (e->mask & IN_CREATE)) continue;
        tell(child, type);
        if (r.recursive && (e->mask & IN_ISDIR)) {
          std::string why;
          if (e->mask & IN_MOVED_FROM) {
            moved_.emplace_back(key, child);
            moved_cookie_ = e->cookie;
          } else if (e->mask & IN_MOVED_TO) {
            auto from = std::find_if(moved_.begin(), moved_.end(), [&](const auto& m) { return m.first == key; });
            // Renamed within the tree: its watches carry on under the new name. Not watched yet (made and
            // renamed before its create was read: mkdir tmp && mv tmp final), or moved in: watched now, and
            // what it holds is told as created (new to the tree; some may have been made since the move).
            bool within = from != moved_.end();
            bool renamed = within && RenameWatchDirs(r, from->second, child);
            if (within) moved_.erase(from);
            auto told = [&](const std::string& in) { tell(in, kCreate); };
            if (!renamed && !AddWatchDirs(r, child, &why, told)) ended.emplace_back(key, ENOSPC, why);
            // Its directories listed while it still had its old name: listed now, under its new one.
            for (const auto& again : renamed ? UnlistedUnder(r, child) : std::vector<std::string>{})
              if (!AddWatchDirs(r, again, &why, told)) ended.emplace_back(key, ENOSPC, why);
          } else if (type == kCreate && !AddWatchDirs(r, child, &why, [&](const std::string& in) { tell(in, kCreate); })) {
            ended.emplace_back(key, ENOSPC, why);  // new: what it holds already is told as created
          }
        }
      }
    }
    if (static_cast<size_t>(n) < sizeof buf / 2) break;  // drained
  }
  std::vector<uint64_t> keys;
  for (auto& [key, b] : batches) keys.push_back(key);
  for (uint64_t key : keys) flush(key);
  for (auto& [key, err, why] : ended) EndWatch(key, err, why);
}

}  // namespace dsec::agent::internal
