#include "drivers/container/container_driver.hpp"
#include "drivers/container/container_box.hpp"


#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "drivers/container/etc_files.hpp"
#include "drivers/guard/read_watch.hpp"
#include "drivers/spawner/spawner.pb.h"
#include "drivers/images/image_store.hpp"
#include "drivers/net/node_network.hpp"
#include "drivers/net/policy.hpp"
#include "runtime/clock.hpp"
#include "runtime/files.hpp"
#include "runtime/proto_json.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::drivers {

const KindTraits& ContainerDriver::Traits() {
  static const KindTraits t = [] {
    KindTraits k = StatefulTraits(v1::ISOLATION_CONTAINER);
    k.own_disk = true;  // its upper layer, on the sandbox disk (sandbox_disk.hpp)
    k.network = true;   // a veth link and the node's rules (drivers/net/), where the node has them
    k.guard = true;     // a mask layer and read-only mounts (drivers/guard/), ContainerGuard
    k.carry = true;     // its upper dir into a grade sandbox's layers (CarryLayers)
    k.snapshot = true;  // its upper dir, copied: a layer for new containers (container_snapshot.cpp)
    k.fork = true;      // a snapshot and new containers on it
    k.pause_memory = true;  // frozen, then its group's memory reclaimed (container_snapshot.cpp)
    return k;
  }();
  return t;
}

namespace {

using nlohmann::json;

std::string CgroupRel(const std::string& parent, const std::string& id) { return parent + "/c/" + id; }

}  // namespace

std::string SandboxDir(const std::string& data_dir, const std::string& id) { return data_dir + "/sandboxes/" + id; }


ContainerDriver::ContainerDriver(ContainerOptions o) : BoxDriver("container", o.log), opts_(std::move(o)) {
  if (opts_.agent_path.empty()) opts_.agent_path = SiblingExecutable("DSEC_AGENT", "dsec-agent");
  UseNetwork({opts_.network, opts_.network_unavailable, opts_.network_open});
}

ContainerDriver::~ContainerDriver() { Stop(); }

Result<std::unique_ptr<ContainerDriver>> ContainerDriver::Start(ContainerOptions options) {
  std::unique_ptr<ContainerDriver> d(new ContainerDriver(std::move(options)));
  if (::access(d->opts_.agent_path.c_str(), X_OK) < 0)
    return Status::FailedPrecondition("container not available: no dsec-agent at " + d->opts_.agent_path +
                                      " (build it, or point $DSEC_AGENT at it)");
  auto groups = cgroup::Groups::Discover();
  if (!groups.ok())
    return Status::FailedPrecondition("container not available on this host: " + groups.status().message());
  d->groups_ = std::move(*groups);
  d->mounts_ = std::make_unique<images::ImageMounts>(d->opts_.data_dir + "/run/images");
  d->mounts_->Adopt();
  DSEC_RETURN_IF_ERROR(MakeDirs(d->opts_.data_dir + "/sandboxes", 0700));
  if (d->opts_.disk_limits) {
    SandboxDiskOptions so;
    so.dir = d->opts_.data_dir + "/sandboxes";
    so.image = d->opts_.data_dir + "/sandboxes.img";
    so.size_bytes = d->opts_.disk_size_bytes;
    so.log = d->opts_.log;
    auto disk = SandboxDisk::Open(so);
    if (disk.ok()) {
      d->disk_ = std::move(*disk);
      d->Log(1, "sandbox disk: btrfs with quota groups, " + std::to_string(d->disk_->size_bytes() >> 30) +
                    " GiB, on " + so.dir);
    } else {
      d->disk_status_ = disk.status();
      d->Log(2, "container disk limits unavailable: " + disk.status().message() +
                    "; containers run without a disk limit");
    }
  } else {
    d->disk_status_ = Status::FailedPrecondition("off (dsecd --no-sandbox-disk)");
  }
  // The bottom layer of every container: the mount points and directories
  // the container init needs, so it finds them instead of creating them in
  // the container's upper dir (a dozen inodes per creation otherwise). The
  // image, above it, wins where both have a path.
  std::string skel = d->opts_.data_dir + "/run/skeleton";
  for (const char* sub : {"", "/proc", "/dev", "/run", "/run/dsec", "/tmp", "/work", "/etc"})
    DSEC_RETURN_IF_ERROR(MakeDirs(skel + sub, 0755));
  ::chmod((skel + "/tmp").c_str(), 01777);
  // Mount points of the container's own /etc/hosts, /etc/hostname,
  // /etc/resolv.conf and /etc/machine-id, for images that have none.
  for (const char* f : kEtcFiles)
    if (UniqueFd fd(::open((skel + "/etc/" + f).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644)); !fd)
      return Status::FromErrno(errno, "create " + skel + "/etc/" + f);
  d->skeleton_ = skel;
  char tag[16];
  std::snprintf(tag, sizeof tag, "f%08zx", std::hash<std::string>{}(d->opts_.data_dir) & 0xffffffffu);
  d->group_tag_ = tag;
  d->SweepLastRun();
  SpawnerLinkOptions lo;
  lo.name = "container";
  lo.spawner_path = d->opts_.spawner_path;
  lo.args = {"--containers", "--pool", "0", "--container-netns", std::to_string(d->opts_.netns_pool), "--cgroup-parent",
             d->opts_.cgroup_parent};
  if (d->opts_.fresh_netns) lo.args.push_back("--fresh-namespaces");
  if (!d->opts_.watch_writes) lo.args.push_back("--no-write-watch");
  lo.log = d->opts_.log;
  auto* p = d.get();
  lo.on_restarted = [p] {
    for (const auto& b : p->BoxesAs<Box>()) p->AdoptListener(*b);
  };
  auto link = SpawnerLink::Start(
      std::move(lo), [p](spawner::Event& ev) { p->OnEvent(ev); },
      [p](const std::string& why, bool) {
        // Creations in flight fail; containers themselves live on.
        std::unordered_map<uint64_t, std::promise<Result<int>>> lost;
        std::unordered_map<uint64_t, std::promise<void>> unflushed;
        {
          std::lock_guard<std::mutex> lk(p->mu_);
          lost.swap(p->creating_);
          unflushed.swap(p->flushing_);
        }
        for (auto& [id, prom] : lost) prom.set_value(Status::Unavailable(why));
        for (auto& [id, prom] : unflushed) prom.set_value();
      });
  if (!link.ok()) return link.status();
  d->link_ = std::move(*link);
  // Creations wait on the spawner and the agent's handshake, removals on the
  // container's exit: with only 4, churn queued behind those waits.
  d->StartWorkers(16);
  auto reads = guard::ReadWatch::Start(d->opts_.log);
  if (reads.ok()) d->reads_ = std::move(*reads);
  else d->Log(2, "reads of images' watched files (git-watch) are not flagged on this node: " + reads.status().message());
  if (d->opts_.idle_freeze_ms > 0 && d->groups_->CanFreeze())
    d->StartIdleScan(std::chrono::milliseconds(std::clamp<int64_t>(d->opts_.idle_freeze_ms / 4, 10, 1000)));
  return d;
}

void ContainerDriver::Stop() {
  if (stopping_.exchange(true)) return;
  StopWorkers();
  StopIdleScan();
  // Containers keep running (that is the point); only our ends close, with
  // mu_ released (closing waits for the agent I/O thread, whose callbacks
  // take mu_).
  for (auto& b : BoxesAs<Box>())
    if (b->agent) b->agent->Close();
  if (link_) link_->Stop();
  std::vector<std::string> dirs;  // kept sandbox dirs
  {
    std::lock_guard<std::mutex> lk(mu_);
    dirs.swap(free_dirs_);
  }
  for (const auto& name : dirs) Removed(RemoveSandboxDir(name), "a kept sandbox dir " + name);
  // The disk goes when no sandbox is left on it (containers outlive dsecd).
  if (disk_) disk_->Close();
  // The groups' parents go when no container is left in them (rmdir refuses
  // otherwise, which is what we want); the recycled groups go first.
  if (groups_) {
    std::vector<FreeGroup> free;
    {
      std::lock_guard<std::mutex> lk(mu_);
      free.swap(free_groups_);
    }
    for (const auto& g : free) groups_->RemoveDirs(g.rel);
    groups_->RemoveDirs(opts_.cgroup_parent + "/c");
    groups_->RemoveDirs(opts_.cgroup_parent);
  }
}

void ContainerDriver::OnEvent(spawner::Event& ev) {
  if (ev.has_denied()) {
    if (auto box = Find(ev.denied().sandbox_id())) {
      std::lock_guard<std::mutex> lk(box->denied_mu);
      for (const auto& [name, n] : ev.denied().calls()) box->denied[name] += n;
      constexpr size_t kMaxWrites = 256;  // distinct paths kept per container
      for (const auto& [what, n] : ev.denied().writes())
        box->writes[box->writes.count(what) || box->writes.size() < kMaxWrites ? what : "(more paths)"] += n;
    }
    return;
  }
  if (ev.has_flushed()) {
    std::promise<void> done;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = flushing_.find(ev.flushed().id());
      if (it == flushing_.end()) return;
      done = std::move(it->second);
      flushing_.erase(it);
    }
    done.set_value();
    return;
  }
  if (!ev.has_container_created()) return;
  const auto& c = ev.container_created();
  std::promise<Result<int>> prom;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = creating_.find(c.id());
    if (it == creating_.end()) return;
    prom = std::move(it->second);
    creating_.erase(it);
  }
  if (!c.error().empty()) prom.set_value(Status::Internal(c.error()));
  else prom.set_value(c.pid());
}

Status ContainerDriver::Available() const { return link_->Available(); }

Status ContainerDriver::CanHandle(const v1::SandboxSpec& spec) const {
  if (spec.image().empty() || spec.image() == images::kHostImage)
    return Status::InvalidArgument(
        "container sandboxes need a built image (dsec-image build DIR NAME, then --image NAME); "
        "the built-in host image serves fncall runs");
  auto image = opts_.images->Get(spec.image());
  if (!image.ok()) return image.status();
  DSEC_RETURN_IF_ERROR(CheckNetwork(spec));
  return Available();
}

std::shared_ptr<ContainerDriver::Box> ContainerDriver::Find(const std::string& id) const { return FindAs<Box>(id); }

Status ContainerDriver::ConnectAgent(Box& box) const {
  auto log = opts_.log;
  return AgentDriver::ConnectAgent(box, SandboxDir(opts_.data_dir, box.id) + "/run/agent.sock", opts_.agent_timeout_ms,
                                   [log](const std::string& t) {
                                     if (log) log(2, t);
                                   });
}

void ContainerDriver::Create(const v1::SandboxRecord& sb, CreateCallback done) {
  Answer(std::move(done), [this, sb] { return CreateNow(sb); });
}

Result<std::string> ContainerDriver::CreateNow(const v1::SandboxRecord& sb) {
  const std::string& id = sb.id();
  auto image = opts_.images->Get(sb.spec().image());
  if (!image.ok()) return image.status();
  auto box = std::make_shared<Box>();
  box->id = id;
  box->digest = image->digest();
  auto file = opts_.images->Open(*image);
  if (!file.ok()) return file.status();
  box->image_file = *file;
  image->set_file(*file);  // what the mount below uses
  box->cgroup_rel = CgroupRel(opts_.cgroup_parent, id);
  box->limits = sb.spec().limits();
  box->layers.assign(sb.spec().layers().dirs().begin(), sb.spec().layers().dirs().end());
  // A creation of this id that a crash cut short left its dir (a session
  // creates its sandboxes under ids it chose first): removed before anew.
  if (ClaimLeftover(id)) {
    Log(1, "container " + id + ": left over from a creation cut short by a restart; removed before creating it again");
    Removed(DestroyNow(id, ""), "container " + id + "'s leftover");
  }
  auto lower = mounts_->Acquire(*image);
  if (!lower.ok()) return lower.status();
  auto undo = [&](const Status& why) -> Result<std::string> {
    Log(2, "container " + id + ": creation failed: " + why.message());
    Removed(DestroyNow(id, box->digest), "what container " + id + "'s creation left");
    return why.Annotate("sandbox " + id);
  };
  std::string base = SandboxDir(opts_.data_dir, id);
  if (Status st = TakeDir(id); !st.ok()) return undo(st);
  if (disk_ && sb.spec().limits().disk_bytes())
    if (Status st = disk_->SetLimit(id, sb.spec().limits().disk_bytes()); !st.ok()) return undo(st);
  std::string hostname = id.substr(0, 63);
  auto policy = net::ParsePolicy(sb.spec().network());
  if (!policy.ok()) return undo(policy.status());
  bool networked = NeedsLink(*policy);
  net::SandboxNet link;
  if (networked) {
    if (!opts_.network) return undo(Status::FailedPrecondition("container networking is unavailable on this node"));
    auto reserved = opts_.network->Reserve(id);
    if (!reserved.ok()) return undo(reserved.status());
    link = *reserved;
  }
  if (Status st = WriteEtcFiles(base, hostname, sb.spec().network(), networked ? link.gateway : 0); !st.ok())
    return undo(st);

  auto held = TakeGroup(box->cgroup_rel);
  if (!held.ok()) return undo(held.status());
  box->groups = groups_.get();
  box->group_limits = *held;
  const v1::Limits& lim = sb.spec().limits();
  cgroup::GroupLimits want;
  want.memory = static_cast<int64_t>(lim.memory_bytes() ? lim.memory_bytes() : 512ull << 20);
  want.pids = lim.pids() ? static_cast<int64_t>(lim.pids()) + 1 : -1;  // +1: the agent
  want.cpu_quota = lim.cpu_millis() ? static_cast<int64_t>(lim.cpu_millis()) * 100 : -1;
  Status st = groups_->ApplyLimits(box->cgroup_rel, want, &box->group_limits);
  if (!st.ok()) return undo(st);

  spawner::Request req;
  auto* c = req.mutable_create_container();
  uint64_t rid;
  std::future<Result<int>> created;
  {
    std::lock_guard<std::mutex> lk(mu_);
    rid = next_id_++;
    created = creating_[rid].get_future();
  }
  c->set_id(rid);
  c->set_sandbox_id(id);
  auto guarded = GuardMounts(id, base, *lower, sb.spec().task());
  if (!guarded.ok()) return undo(guarded.status());
  std::string above = guarded->mask.empty() ? "" : guarded->mask + ":";
  if (!sb.spec().carry().sandbox_id().empty()) {
    auto layers = CarryLayers(id, base, *lower, box->digest, sb.spec().carry());
    if (!layers.ok()) return undo(layers.status());
    above = *layers;
  }
  // A snapshot's layers above all (they hold what its source changed, the
  // mask's paths included), then the mask, the image, the skeleton. A
  // grade sandbox has them in its carried layers instead, filtered.
  auto snap = sb.spec().carry().sandbox_id().empty() ? SnapshotLayers(sb.spec(), box->digest)
                                                     : Result<std::string>(std::string());
  if (!snap.ok()) return undo(snap.status());
  c->set_lower(*snap + above + *lower + ":" + skeleton_);
  for (const auto& ro : guarded->read_only) c->add_read_only(ro);
  // Tries to write to its protected paths are flagged (a guarded task's).
  c->set_watch_writes(!sb.spec().task().protected_paths().empty());
  c->set_upper(base + "/upper");
  c->set_work(base + "/work");
  c->set_run_dir(base + "/run");
  c->set_agent_path(opts_.agent_path);
  c->set_hostname(hostname);
  for (const auto& p : groups_->ProcsPaths(box->cgroup_rel)) c->add_cgroup_procs(p);
  auto t_sent = std::chrono::steady_clock::now();
  if (st = link_->Send(req); !st.ok()) {
    std::lock_guard<std::mutex> lk(mu_);
    creating_.erase(rid);
    return undo(st);
  }
  if (created.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    std::lock_guard<std::mutex> lk(mu_);
    creating_.erase(rid);
    return undo(Status::DeadlineExceeded("the spawner did not create the container within 30 s"));
  }
  auto pid = created.get();
  if (!pid.ok()) return undo(pid.status());
  box->init_pid = *pid;
  if (networked) {
    // Its link into the init's network namespace, and its rules.
    UniqueFd ns(::open(("/proc/" + std::to_string(*pid) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC));
    if (!ns) return undo(Status::FromErrno(errno, "open the container's network namespace"));
    if (st = opts_.network->Attach(id, ns.get(), *policy); !st.ok()) return undo(st);
  }
  auto t_spawned = std::chrono::steady_clock::now();
  if (st = ConnectAgent(*box); !st.ok()) return undo(st);
  WatchReads(*box, *image);
  {
    // Slow creations say where the time went (the spawner is one lane for
    // every creation on the node; the agent's answer is per container).
    auto ms = [](auto d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
    auto t_done = std::chrono::steady_clock::now();
    if (ms(t_done - t_sent) >= 1000)
      Log(2, "container " + id + ": creation took " + std::to_string(ms(t_done - t_sent)) + " ms (spawner " +
                 std::to_string(ms(t_spawned - t_sent)) + " ms, agent handshake " +
                 std::to_string(ms(t_done - t_spawned)) + " ms)");
  }
  box->last_active_ms = SteadyClockMs();
  PutBox(box);
  ++created_;
  container::ContainerState state;
  state.set_digest(box->digest);
  state.set_image_file(box->image_file);
  state.set_cgroup(box->cgroup_rel);
  state.set_init_pid(box->init_pid);
  if (networked) {
    state.set_network(true);
    state.set_net_slot(link.slot);
  }
  return state.SerializeAsString();
}

Result<std::shared_ptr<AgentBox>> ContainerDriver::RunningBox(const std::string& id) const {
  auto box = Find(id);
  if (!box || !box->agent || !box->agent->connected())
    return Status::Unavailable("container " + id + " is not running on this node (its agent is not connected)");
  if (Status woke = Wake(*box); !woke.ok()) return woke.Annotate("container " + id + ": thaw after idling");
  return std::shared_ptr<AgentBox>(box);
}

Status ContainerDriver::Wake(Box& b) {
  std::lock_guard<std::mutex> lk(b.idle_mu);
  b.last_active_ms = SteadyClockMs();
  if (!b.idle_frozen) return Status::Ok();
  b.idle_frozen = false;
  return b.groups->Freeze(b.cgroup_rel, false);
}

void ContainerDriver::ScanIdle(const std::shared_ptr<AgentBox>& agent_box, int64_t now) {
  auto* b = static_cast<Box*>(agent_box.get());
  const int64_t idle = opts_.idle_freeze_ms;
  std::lock_guard<std::mutex> lk(b->idle_mu);
  if (b->idle_frozen || b->user_paused || b->carrying || b->active > 0 || !b->groups) return;
  // Background work (a build started with &) keeps a container awake:
  // idle means under 1% of a CPU over the idle period.
  uint64_t cpu = groups_->CpuUsageNs(b->cgroup_rel);
  bool busy = cpu - b->cpu_ns_at_check > static_cast<uint64_t>(idle) * 10'000;  // 1% of idle, in ns
  if (busy || b->cpu_ns_at_check == 0) {
    b->cpu_ns_at_check = cpu ? cpu : 1;
    if (busy) b->last_active_ms = now;
    return;
  }
  if (now - b->last_active_ms < idle) return;
  if (groups_->Freeze(b->cgroup_rel, true).ok()) {
    b->idle_frozen = true;
    ++idle_freezes_;
    // Frozen, its page cache can go: the next call thaws it and reads
    // back what it needs.
    if (groups_->ReclaimMemory(b->cgroup_rel).ok()) ++idle_reclaims_;
  }
}

void ContainerDriver::Pause(const v1::SandboxRecord& sb, bool paused, StatusCallback done) {
  auto box = Find(sb.id());
  if (!box || !box->groups) return done(Status::Unavailable("container " + sb.id() + " is not running on this node"));
  // Freezing waits for the kernel to settle: off the caller's thread.
  Work([this, box, paused, done] {
    Status st;
    {
      std::lock_guard<std::mutex> lk(box->idle_mu);
      st = groups_->Freeze(box->cgroup_rel, paused);
      if (st.ok()) {
        box->user_paused = paused;
        box->idle_frozen = false;
        box->last_active_ms = SteadyClockMs();
      }
    }
    if (st.ok() && paused) ++paused_;
    done(st.Annotate("container " + box->id));
  });
}

void ContainerDriver::Destroy(const v1::SandboxRecord& sb, const std::string&, StatusCallback done) {
  // The image's hold goes with the box (DestroyNow): a container this
  // process never held (not re-adopted, or destroyed before) has none to
  // give back, whatever its record says.
  Answer(std::move(done), [this, id = sb.id()] { return DestroyNow(id, ""); });
}

// `held_digest`: the image a caller holds for a container that is not (or
// not yet) in boxes_, a creation's own; a box found there gives back its own,
// exactly once, whoever asks first.
Status ContainerDriver::DestroyNow(const std::string& id, const std::string& held_digest) {
  auto box = std::static_pointer_cast<Box>(TakeBox(id));
  if (box && box->agent) box->agent->Close("it was destroyed");
  if (reads_) reads_->Forget(id);
  // Killing every process of the container's cgroup ends its namespaces and
  // with them its overlay; then its files go, then its hold on the image.
  std::string rel = box ? box->cgroup_rel : CgroupRel(opts_.cgroup_parent, id);
  bool stopped = ReleaseGroup(rel, box.get());
  if (!stopped) {
    // Something of it still runs: its files, its image hold and its box (if
    // this process has one) stay for the next destroy (the sandbox is failed
    // until then; after a restart the dir stays a leftover and a destroy
    // finds it by id), not taken from under processes that are still there.
    if (box) {
      {
        std::lock_guard<std::mutex> lk(box->idle_mu);
        box->groups = nullptr;  // the idle timer leaves it alone (it would not freeze)
      }
      if (!PutBox(box, /*if_absent=*/true))
        Log(3, "container " + id + ": a box of the same id appeared during its destroy; the kept one is dropped");
    }
    Log(2, "container " + id + ": destroy: processes left in cgroup " + rel + " after SIGKILL");
    return Status::Unavailable("container " + id + ": processes are still in its cgroup " + rel +
                               " after SIGKILL (a process stuck in the kernel?); destroy it again");
  }
  ReleaseDir(id, stopped);
  // Its link went with its namespace; its rules and slot go here.
  if (opts_.network) Removed(opts_.network->Release(id), "the network of container " + id);
  std::string digest = box ? box->digest : held_digest;
  if (!digest.empty()) mounts_->Release(digest);
  ++destroyed_;
  return Status::Ok();
}

Result<container::ContainerState> ContainerDriver::ParseState(const std::string& raw) {
  container::ContainerState state;
  if (raw.empty()) return Status::FailedPrecondition("no driver state in its record");
  // dsec before 0.1 (2026-12) wrote a JSON object; such records still come back.
  if (raw.front() == '{') {
    auto j = json::parse(raw, nullptr, false);
    if (!j.is_object()) return Status::FailedPrecondition("its driver state is neither protobuf nor JSON");
    state.set_digest(j.value("digest", ""));
    state.set_image_file(j.value("image_file", ""));
    state.set_cgroup(j.value("cgroup", ""));
    state.set_init_pid(j.value("init_pid", 0));
    return state;
  }
  if (!state.ParseFromString(raw)) return Status::FailedPrecondition("its driver state is not a ContainerState");
  return state;
}

std::string ContainerDriver::DescribeState(const std::string& driver_state) const {
  auto state = ParseState(driver_state);
  return state.ok() ? DumpJson(ProtoJson(*state)) : std::string();
}

void ContainerDriver::Readopt(const v1::SandboxRecord& sb, const std::string& driver_state, StatusCallback done) {
  Answer(std::move(done), [this, sb, driver_state] { return ReadoptNow(sb, driver_state); });
}

Status ContainerDriver::ReadoptNow(const v1::SandboxRecord& sb, const std::string& driver_state) {
  // Unreadable: its dir stays a leftover, which RestoredNow removes.
  auto state = ParseState(driver_state);
  if (!state.ok()) return state.status().Annotate("container " + sb.id());
  (void)ClaimLeftover(sb.id());  // its dir is its own from here, kept or removed
  auto box = std::make_shared<Box>();
  box->id = sb.id();
  box->digest = state->digest();
  box->image_file = state->image_file();
  box->cgroup_rel = state->cgroup().empty() ? CgroupRel(opts_.cgroup_parent, sb.id()) : state->cgroup();
  box->init_pid = state->init_pid();
  box->limits = sb.spec().limits();
  box->layers.assign(sb.spec().layers().dirs().begin(), sb.spec().layers().dirs().end());
  auto fail = [&](const Status& why) {
    // Gone or broken: clean up what is left of it; the record is marked failed.
    Removed(DestroyNow(sb.id(), ""), "what is left of container " + sb.id());
    return why;
  };
  v1::ImageManifest image;
  image.set_name(sb.spec().image());
  image.set_digest(box->digest);
  image.set_file(box->image_file);
  auto lower = mounts_->Acquire(image);
  if (!lower.ok()) return fail(lower.status());
  box->groups = groups_.get();
  if (groups_->Pids(box->cgroup_rel).empty()) {
    mounts_->Release(box->digest);
    return fail(Status::Unavailable("container " + sb.id() + " has no process left"));
  }
  // A paused container's agent cannot answer: thaw it for the handshake,
  // then freeze it again.
  // Frozen by Pause: frozen again after the handshake. Frozen by the idle
  // timer of the dsecd before: left thawed (the timer freezes it again).
  bool frozen = groups_->Frozen(box->cgroup_rel);
  if (frozen) (void)groups_->Freeze(box->cgroup_rel, false);  // one still frozen fails the handshake, saying so
  // Its listener first: an agent stuck in a call its filter notifies (a
  // write) answers the handshake once the spawner has it.
  AdoptListener(*box);
  Status connected = ConnectAgent(*box);
  if (connected.ok() && state->network()) {
    // The node's table was made anew at this start: its rules again.
    auto policy = net::ParsePolicy(sb.spec().network());
    if (!opts_.network) connected = Status::FailedPrecondition("its network: this node has none now");
    else if (!policy.ok()) connected = policy.status();
    else connected = opts_.network->Readopt(sb.id(), opts_.network->ForSlot(state->net_slot()), *policy);
  }
  bool paused = sb.phase() == v1::SANDBOX_PHASE_PAUSED;
  if (paused && connected.ok()) connected = groups_->Freeze(box->cgroup_rel, true);
  box->user_paused = paused;
  box->last_active_ms = SteadyClockMs();
  if (!connected.ok()) {
    mounts_->Release(box->digest);
    return fail(connected);
  }
  if (auto image = opts_.images->Get(sb.spec().image()); image.ok() && image->digest() == box->digest)
    WatchReads(*box, *image);
  PutBox(box);
  return Status::Ok();
}

bool ContainerDriver::ReleaseGroup(const std::string& rel, Box* box) {
  std::string to;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (free_groups_.size() < kMaxFreeGroups && groups_->CanRename())
      to = opts_.cgroup_parent + "/c/" + group_tag_ + "." + std::to_string(next_free_++);
  }
  if (!groups_->Exists(rel)) {
    groups_->KillAndRemove(rel);  // whatever a failed creation made elsewhere
    return true;
  }
  bool frozen = false;
  cgroup::GroupLimits limits;  // unknown unless the box says
  if (box) {
    std::lock_guard<std::mutex> lk(box->idle_mu);
    frozen = box->user_paused || box->idle_frozen;
    limits = box->group_limits;
  }
  bool empty = box && box->init_pid > 0 ? groups_->StopContainer(rel, box->init_pid, frozen) : groups_->Empty(rel);
  // A group with subgroups (only root on the host can make them) is not
  // recycled: KillAndRemove empties and removes the whole tree.
  if (empty && !to.empty() && groups_->List(rel).empty() && groups_->Rename(rel, to).ok()) {
    std::lock_guard<std::mutex> lk(mu_);
    free_groups_.push_back({to, limits});
    return true;
  }
  groups_->KillAndRemove(rel);
  // KillAndRemove kills again (the subgroups too, which `empty` did not
  // look at) and waits: stopped when the group is gone.
  return !groups_->Exists(rel);
}

void ContainerDriver::SweepLastRun() {
  // Nothing of this run exists yet: what the last run kept for recycling
  // goes or is taken over, and the sandbox dirs it left are leftovers until
  // a Readopt claims one.
  for (const auto& name : ListSubdirs(opts_.data_dir + "/sandboxes")) {
    if (name.rfind("free.", 0) == 0) Removed(RemoveSandboxDir(name), "a kept sandbox dir " + name);
    else NoteLeftover(name);
  }
  std::string prefix = group_tag_ + ".";
  for (const auto& name : groups_->List(opts_.cgroup_parent + "/c")) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    std::string rel = opts_.cgroup_parent + "/c/" + name;
    uint64_t n = std::strtoull(name.c_str() + prefix.size(), nullptr, 10);
    next_free_ = std::max(next_free_, n + 1);
    bool ok = groups_->Empty(rel);  // its limits are unknown: the next container writes them all
    if (ok && free_groups_.size() < kMaxFreeGroups) free_groups_.push_back({rel, cgroup::GroupLimits()});
    else groups_->KillAndRemove(rel);
  }
}

void ContainerDriver::Restored() {
  Work([this] { RestoredNow(); });
}

void ContainerDriver::RestoredNow() {
  // Whatever a crash left half-made: the sandbox dirs of the last run that
  // no Readopt claimed (and no creation of the same id took over meanwhile),
  // then image mounts nobody uses any more. Only what our data dir names:
  // another dsecd on this host may share the cgroup parent, and its
  // containers are not ours to judge. (Creation makes the dir before the
  // cgroup and removal drops the cgroup first, so no cgroup of ours is
  // without its dir.)
  // One at a time: a creation of the same id meanwhile waits for its
  // removal (ClaimLeftover).
  SweepLeftovers([this](const std::string& id) { return DestroyNow(id, ""); },
                 "left over from before the restart with no running record");
  mounts_->DropUnused();
}

std::vector<std::string> ContainerDriver::ImageUsers(const std::string& digest) const {
  std::vector<std::string> users;
  for (const auto& b : BoxesAs<Box>())
    if (b->digest == digest) users.push_back("container " + b->id);
  return users;
}

std::string ContainerDriver::StatsJson() const {
  size_t containers = BoxCount();
  std::lock_guard<std::mutex> lk(mu_);
  json mounts = json::object();
  for (const auto& [digest, n] : mounts_->Snapshot()) mounts[digest] = n;
  return json{{"spawner_pid", link_->pid()},
              {"cgroup", groups_->version()},
              {"containers", containers},
              {"created", created_.load()},
              {"destroyed", destroyed_.load()},
              {"pauses", paused_.load()},
              {"idle_freezes", idle_freezes_.load()},
              {"idle_reclaims", idle_reclaims_.load()},
              {"free_cgroups", free_groups_.size()},
              {"free_dirs", free_dirs_.size()},
              {"disk", disk_ ? json{{"filesystem", "btrfs"}, {"size_bytes", disk_->size_bytes()}}
                             : json{{"unavailable", disk_status_.message()}}},
              {"execs_in_flight", RunsInFlight()},
              {"image_mounts", mounts}}
      .dump();
}

Result<guard::UpperDiff> ContainerDriver::Changes(const v1::SandboxRecord& sb) const {
  auto box = Find(sb.id());
  if (!box) return Status::NotFound("container " + sb.id() + " is not on this node");
  std::string base = SandboxDir(opts_.data_dir, sb.id());
  std::vector<std::string> lowers;
  struct stat st;
  for (const auto& d : sb.spec().layers().dirs()) lowers.push_back(d);
  if (::stat((base + "/mask").c_str(), &st) == 0) lowers.push_back(base + "/mask");
  lowers.push_back(mounts_->PathFor(box->digest));
  lowers.push_back(skeleton_);
  return guard::ReadUpperDiff(base + "/upper", lowers, kMaxChanges);
}

}  // namespace dsec::drivers
