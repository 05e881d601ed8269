#include "drivers/images/snapshot_store.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "drivers/images/image_store.hpp"
#include "drivers/images/layer_dedup.hpp"
#include "runtime/clock.hpp"
#include "runtime/files.hpp"
#include "runtime/unique_fd.hpp"
#include "state/table.hpp"

namespace dsec::images {

namespace {

state::TypedTable<v1::SnapshotInfo> Table(state::Store* s) { return {s, state::Table::kSnapshots}; }

Status FsyncPath(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd || ::fsync(fd.get()) < 0) return Status::FromErrno(errno, "fsync " + path);
  return Status::Ok();
}

std::string Joined(const std::vector<std::string>& v) {
  std::string out;
  for (size_t i = 0; i < v.size() && i < 3; ++i) out += (i ? ", " : "") + v[i];
  if (v.size() > 3) out += " and " + std::to_string(v.size() - 3) + " more";
  return out;
}

}  // namespace

SnapshotStore::SnapshotStore(state::Store* store, std::string root, std::string node_id, uint64_t max_bytes)
    : store_(store),
      root_(std::move(root)),
      node_id_(std::move(node_id)),
      objects_(root_ + "/objects"),
      max_bytes_(max_bytes) {}

std::vector<std::string> SnapshotStore::Load() {
  std::vector<std::string> said;
  if (Status s = MakeDirs(root_, 0700); !s.ok()) said.push_back("snapshots: " + s.message());
  std::set<std::string> dirs;
  state::WriteBatch drop;
  Status scanned = Table(store_).Scan("", [&](const std::string& key, v1::SnapshotInfo&& info) {
    struct stat st;
    if (info.name() != key || info.dir().rfind(root_ + "/", 0) != 0 || ::stat(info.dir().c_str(), &st) != 0 ||
        !S_ISDIR(st.st_mode)) {
      said.push_back("snapshot " + key + ": its layer " + info.dir() + " is gone; its record is dropped");
      Table(store_).Delete(&drop, key);
      return true;
    }
    dirs.insert(info.dir());
    snaps_[key] = std::move(info);
    return true;
  });
  if (!scanned.ok()) said.push_back("snapshots: " + scanned.message());
  if (!drop.empty())
    if (Status w = store_->Write(drop, true); !w.ok()) said.push_back("snapshots: " + w.message());
  // A parent dropped above takes its children with it (they stack on it).
  for (bool again = true; again;) {
    again = false;
    for (auto it = snaps_.begin(); it != snaps_.end();) {
      if (!it->second.parent().empty() && !snaps_.count(it->second.parent())) {
        said.push_back("snapshot " + it->first + ": the snapshot under it (" + it->second.parent() +
                       ") is gone; it is removed");
        state::WriteBatch b;
        Table(store_).Delete(&b, it->first);
        (void)store_->Write(b, true);
        (void)RemoveTree(it->second.dir());
        dirs.erase(it->second.dir());
        it = snaps_.erase(it);
        again = true;
      } else {
        ++it;
      }
    }
  }
  // What no record names: a snapshot a crash cut short (before its record).
  if (DIR* d = ::opendir(root_.c_str())) {
    std::vector<std::string> stray;
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n == "." || n == ".." || root_ + "/" + n == objects_) continue;
      if (!dirs.count(root_ + "/" + n)) stray.push_back(root_ + "/" + n);
    }
    ::closedir(d);
    for (const auto& p : stray) {
      Status rm = RemoveTree(p);
      said.push_back("snapshots: " + p + " was left by a snapshot not finished; " +
                     (rm.ok() ? std::string("removed") : "not removed: " + rm.message()));
    }
  }
  if (size_t n = CollectObjects(objects_))
    said.push_back("snapshots: " + std::to_string(n) + " shared file(s) no snapshot links any more removed");
  return said;
}

Result<SnapshotStore::Pending> SnapshotStore::Begin(const std::string& name, const std::string& parent) {
  DSEC_RETURN_IF_ERROR(CheckObjectName("snapshot", name));
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = snaps_.find(name); it != snaps_.end())
    return Status::AlreadyExists("snapshot '" + name + "' already exists (of sandbox " +
                                 it->second.source_sandbox() + "); pick another name or remove it first");
  if (pending_.count(name)) return Status::AlreadyExists("snapshot '" + name + "' is being taken right now");
  if (!parent.empty()) {
    auto p = snaps_.find(parent);
    if (p == snaps_.end())
      return Status::FailedPrecondition("snapshot '" + name + "': the snapshot its sandbox started from (" + parent +
                                        ") is gone");
    if (p->second.depth() >= kMaxDepth)
      return Status::FailedPrecondition("snapshot '" + name + "' would be " + std::to_string(p->second.depth() + 1) +
                                        " layers deep; at most " + std::to_string(kMaxDepth) +
                                        " are stacked (take it of a sandbox fewer snapshots from its image)");
  }
  uint64_t used = UsedLocked();
  if (max_bytes_ && used >= max_bytes_)
    return Status::ResourceExhausted("this node's snapshots take " + std::to_string(used) + " bytes, its maximum (" +
                                     std::to_string(max_bytes_) +
                                     ", dsecd --snapshot-bytes); remove snapshots first (dsecctl snapshot rm)");
  pending_.insert(name);
  Pending p;
  p.name = name;
  std::string id = RandomHex(16);
  p.dir = root_ + "/" + id;
  p.part = p.dir + ".part";
  p.bytes_left = max_bytes_ ? max_bytes_ - used : 0;
  return p;
}

Result<v1::SnapshotInfo> SnapshotStore::Commit(const Pending& p, v1::SnapshotInfo info) {
  info.set_name(p.name);
  info.set_dir(p.dir);
  info.set_node(node_id_);
  info.set_created_ms(WallClockMs());
  info.clear_users();
  {
    std::lock_guard<std::mutex> lk(mu_);
    info.set_depth(1);
    if (!info.parent().empty()) {
      auto it = snaps_.find(info.parent());
      if (it == snaps_.end()) {
        pending_.erase(p.name);
        (void)RemoveTree(p.part);
        return Status::FailedPrecondition("snapshot '" + p.name + "': the snapshot its sandbox started from (" +
                                          info.parent() + ") is gone");
      }
      info.set_depth(it->second.depth() + 1);
    }
  }
  Status st;
  if (::rename(p.part.c_str(), p.dir.c_str()) < 0) st = Status::FromErrno(errno, "rename " + p.part);
  if (st.ok()) st = FsyncPath(root_);
  if (st.ok()) {
    state::WriteBatch b;
    Table(store_).Put(&b, p.name, info);
    st = store_->Write(b, true);
  }
  std::lock_guard<std::mutex> lk(mu_);
  pending_.erase(p.name);
  if (!st.ok()) {
    (void)RemoveTree(p.part);
    (void)RemoveTree(p.dir);
    return st.Annotate("snapshot '" + p.name + "'");
  }
  snaps_[p.name] = info;
  return info;
}

Result<DedupStats> SnapshotStore::Share(const Pending& p) {
  auto shared = ShareFiles(p.part, objects_);
  if (!shared.ok()) return shared.status().Annotate("snapshot '" + p.name + "': share its files");
  return shared;
}

void SnapshotStore::Abort(const Pending& p) {
  (void)RemoveTree(p.part);
  std::lock_guard<std::mutex> lk(mu_);
  pending_.erase(p.name);
}

std::vector<std::string> SnapshotStore::UsersLocked(const std::string& name) const {
  std::vector<std::string> users;
  for (const auto& [id, n] : held_)
    if (n == name) users.push_back("sandbox " + id);
  for (const auto& [n, s] : snaps_)
    if (s.parent() == name) users.push_back("snapshot " + n);
  return users;
}

v1::SnapshotInfo SnapshotStore::Shown(const v1::SnapshotInfo& s) const {
  v1::SnapshotInfo out = s;
  for (auto& u : UsersLocked(s.name())) out.add_users(std::move(u));
  return out;
}

Result<v1::SnapshotInfo> SnapshotStore::Get(const std::string& name) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = snaps_.find(name);
  if (it == snaps_.end())
    return Status::NotFound("no snapshot named '" + name.substr(0, 128) + "' on this node (dsecctl snapshot ls)");
  return Shown(it->second);
}

std::vector<v1::SnapshotInfo> SnapshotStore::List() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<v1::SnapshotInfo> out;
  for (const auto& [n, s] : snaps_) out.push_back(Shown(s));
  return out;
}

Status SnapshotStore::Remove(const std::string& name) {
  std::vector<v1::SnapshotInfo> gone;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = snaps_.find(name);
    if (it == snaps_.end())
      return Status::NotFound("no snapshot named '" + name.substr(0, 128) + "' on this node (dsecctl snapshot ls)");
    auto users = UsersLocked(name);
    if (!users.empty())
      return Status::FailedPrecondition("snapshot '" + name + "' is in use by " + Joined(users) +
                                        "; remove those first");
    gone.push_back(it->second);
    std::string parent = it->second.parent();
    snaps_.erase(it);
    CollectUnused(parent, &gone);
  }
  for (const auto& g : gone) Drop(g);
  return Status::Ok();
}

void SnapshotStore::CollectUnused(std::string name, std::vector<v1::SnapshotInfo>* gone) {
  // An ephemeral snapshot nothing needs goes, and then maybe its parent.
  while (!name.empty()) {
    auto it = snaps_.find(name);
    if (it == snaps_.end() || !it->second.ephemeral() || !UsersLocked(name).empty()) break;
    gone->push_back(it->second);
    name = it->second.parent();
    snaps_.erase(it);
  }
}

void SnapshotStore::Drop(const v1::SnapshotInfo& gone) {
  // The record first: a crash after it leaves a directory no record
  // names, which the next start removes.
  state::WriteBatch b;
  Table(store_).Delete(&b, gone.name());
  (void)store_->Write(b, true);
  (void)RemoveTree(gone.dir());
  CollectObjects(objects_);
}

Result<v1::SnapshotInfo> SnapshotStore::Resolve(const std::string& name, v1::SnapshotLayers* layers) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = snaps_.find(name);
  if (it == snaps_.end())
    return Status::NotFound("no snapshot named '" + name.substr(0, 128) + "' on this node (dsecctl snapshot ls)");
  layers->Clear();
  layers->set_image_digest(it->second.image_digest());
  for (auto at = it; at != snaps_.end(); at = at->second.parent().empty() ? snaps_.end() : snaps_.find(at->second.parent()))
    layers->add_dirs(at->second.dir());
  return it->second;
}

void SnapshotStore::Hold(const std::string& name, const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  held_[id] = name;
}

std::vector<v1::SnapshotInfo> SnapshotStore::Release(const std::string& id) {
  std::vector<v1::SnapshotInfo> gone;
  std::lock_guard<std::mutex> lk(mu_);
  auto h = held_.find(id);
  if (h == held_.end()) return gone;
  std::string name = h->second;
  held_.erase(h);
  CollectUnused(name, &gone);
  return gone;
}

std::vector<std::string> SnapshotStore::OnImage(const std::string& image) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::string> out;
  for (const auto& [n, s] : snaps_)
    if (s.image() == image) out.push_back("snapshot " + n);
  return out;
}

uint64_t SnapshotStore::used_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return UsedLocked();
}

uint64_t SnapshotStore::UsedLocked() const {
  // A shared file counts once, with the snapshot that stored it first
  // (after that one goes, the others' counts are low by what they shared).
  uint64_t used = 0;
  for (const auto& [n, s] : snaps_) used += s.size_bytes() - std::min(s.shared_bytes(), s.size_bytes());
  return used;
}

}  // namespace dsec::images
