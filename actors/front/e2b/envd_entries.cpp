// envd's entries and watch events (docs/e2b.md): dsec's FileInfo as
// envd's EntryInfo, and a watch's events in order, each carrying its entry
// when the client asked for it (envd 0.6.3's include_entry).
#include <sys/stat.h>

#include <deque>
#include <memory>
#include <utility>

#include "actors/front/e2b/door_internal.hpp"
#include "dsec/status_proto.hpp"

namespace dsec::e2b {

using nlohmann::json;

namespace {

// A mode as Go's FileMode.String() writes it ("drwxr-xr-x", "Lrwxrwxrwx"),
// which envd reports as permissions.
std::string Permissions(uint32_t mode) {
  std::string out;
  if (S_ISDIR(mode)) out += 'd';
  if (S_ISLNK(mode)) out += 'L';
  if (S_ISBLK(mode) || S_ISCHR(mode)) out += 'D';
  if (S_ISFIFO(mode)) out += 'p';
  if (S_ISSOCK(mode)) out += 'S';
  if (mode & S_ISUID) out += 'u';
  if (mode & S_ISGID) out += 'g';
  if (S_ISCHR(mode)) out += 'c';
  if (mode & S_ISVTX) out += 't';
  if (out.empty()) out = "-";
  const char* rwx = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) out += (mode & (0400u >> i)) ? rwx[i] : '-';
  return out;
}


}  // namespace

std::string Join(const std::string& dir, const std::string& name) {
  return dir == "/" ? "/" + name : dir + "/" + name;
}

json Entry(const v1::FileInfo& f, const std::string& path) {
  const char* type = S_ISDIR(f.mode())   ? "FILE_TYPE_DIRECTORY"
                     : S_ISLNK(f.mode()) ? "FILE_TYPE_SYMLINK"
                     : S_ISREG(f.mode()) ? "FILE_TYPE_FILE"
                                         : "FILE_TYPE_UNSPECIFIED";
  json e = {{"name", f.name()},
            {"type", type},
            {"path", path},
            {"size", std::to_string(f.size())},
            {"mode", f.mode() & 0777},
            {"permissions", Permissions(f.mode())},
            {"owner", f.owner().empty() ? std::to_string(f.uid()) : f.owner()},
            {"group", f.group().empty() ? std::to_string(f.gid()) : f.group()},
            {"modifiedTime", Rfc3339(f.mtime_ms())}};
  // envd's target is a path (relative ones are taken from the link's directory).
  if (S_ISLNK(f.mode()))
    e["symlinkTarget"] = f.link_target().empty() || f.link_target()[0] == '/'
                             ? f.link_target()
                             : path.substr(0, path.rfind('/') + 1) + f.link_target();
  // envd 0.6.2: its user.e2b.* extended attributes are its metadata.
  for (const auto& [k, v] : f.xattrs())
    if (k.rfind("e2b.", 0) == 0 && k.size() > 4) e["metadata"][k.substr(4)] = v;
  return e;
}


namespace {

// Events in order: each waits for its entry (when asked for), and goes
// out once those before it have. Past kMaxWaiting waiting, events go
// without entries (still in order): a burst does not grow it without end.
class OrderedEvents : public std::enable_shared_from_this<OrderedEvents> {
 public:
  static constexpr size_t kMaxWaiting = 4096;
  OrderedEvents(caf::event_based_actor* self, entry_actor entry, std::string sandbox, std::string dir, bool include,
                std::function<void(json)> out)
      : self_(self), entry_(std::move(entry)), sandbox_(std::move(sandbox)), dir_(std::move(dir)),
        include_(include), out_(std::move(out)) {}

  void Add(const v1::ExecOutput& piece) {
    static const char* kTypes[] = {"EVENT_TYPE_UNSPECIFIED", "EVENT_TYPE_CREATE", "EVENT_TYPE_WRITE",
                                   "EVENT_TYPE_REMOVE", "EVENT_TYPE_RENAME", "EVENT_TYPE_CHMOD"};
    for (const auto& e : piece.events()) {
      int type = e.type() >= 0 && e.type() <= 5 ? e.type() : 0;
      waiting_.push_back({json{{"name", e.name()}, {"type", kTypes[type]}}, true});
      // A remove or a move away leaves nothing at the path to stat.
      if (!include_ || type == v1::FS_EVENT_REMOVE || type == v1::FS_EVENT_RENAME ||
          waiting_.size() > kMaxWaiting)
        continue;
      waiting_.back().ready = false;
      std::string path = Join(dir_, e.name());
      v1::ListFilesRequest req;
      req.set_sandbox_id(sandbox_);
      req.set_path(path);
      auto me = shared_from_this();
      Slot* slot = &waiting_.back();  // deque: stable while it is waiting
      auto done = [me, slot](const v1::FileReply* r, const std::string& path) {
        if (r && FromProto(r->status()).ok()) slot->event["entry"] = Entry(r->info(), path);
        slot->ready = true;
        me->Flush();
      };
      self_->request(entry_, kCallTimeout, std::move(req))
          .then([done, path](v1::FileReply& r) { done(&r, path); },
                [done](caf::error&) { done(nullptr, ""); });
    }
    Flush();
  }
  void Finish(std::function<void()> then) {
    finished_ = std::move(then);
    Flush();
  }

 private:
  struct Slot {
    json event;
    bool ready;
  };
  void Flush() {
    while (!waiting_.empty() && waiting_.front().ready) {
      out_(std::move(waiting_.front().event));
      waiting_.pop_front();
    }
    if (waiting_.empty() && finished_) std::exchange(finished_, nullptr)();
  }
  caf::event_based_actor* self_;
  entry_actor entry_;
  std::string sandbox_, dir_;
  bool include_;
  std::function<void(json)> out_;
  std::deque<Slot> waiting_;
  std::function<void()> finished_;
};

}  // namespace

WatchEventFeed WatchEvents(caf::event_based_actor* self, const entry_actor& entry, const std::string& sandbox,
                           const std::string& dir, bool include_entry, std::function<void(json)> out) {
  auto events = std::make_shared<OrderedEvents>(self, entry, sandbox, dir, include_entry, std::move(out));
  return {[events](const v1::ExecOutput& piece) { events->Add(piece); },
          [events](std::function<void()> then) { events->Finish(std::move(then)); }};
}

}  // namespace dsec::e2b
