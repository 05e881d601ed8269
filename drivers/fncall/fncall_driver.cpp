#include "drivers/fncall/fncall_driver.hpp"

#include <cerrno>
#include <cstring>
#include <map>
#include <vector>

#include "drivers/spawner/spawner.pb.h"
#include "drivers/verdict.hpp"

namespace dsec::drivers {

const KindTraits& FncallDriver::Traits() {
  static const KindTraits t = [] {
    KindTraits t;
    t.isolation = v1::ISOLATION_PROCESS;
    t.host_image = true;
    return t;
  }();
  return t;
}

FncallDriver::FncallDriver(FncallOptions o) : opts_(std::move(o)) {}

FncallDriver::~FncallDriver() { Stop(); }

Result<std::unique_ptr<FncallDriver>> FncallDriver::Start(FncallOptions options) {
  std::unique_ptr<FncallDriver> d(new FncallDriver(std::move(options)));
  const auto& o = d->opts_;
  SpawnerLinkOptions lo;
  lo.name = "fncall";
  lo.spawner_path = o.spawner_path;
  lo.args = {"--uid", std::to_string(o.uid), "--gid", std::to_string(o.gid), "--pool", std::to_string(o.pool_size),
             "--max-runners", std::to_string(o.max_runners), "--cgroup-parent", o.cgroup_parent,
             "--tmpfs-bytes", std::to_string(o.tmpfs_bytes)};
  if (o.fresh_namespaces) lo.args.push_back("--fresh-namespaces");
  lo.start_timeout_ms = o.start_timeout_ms;
  lo.max_restarts = o.max_restarts;
  lo.restart_window_s = o.restart_window_s;
  lo.log = o.log;
  auto* p = d.get();
  auto link = SpawnerLink::Start(
      std::move(lo), [p](spawner::Event& ev) { p->OnEvent(ev); },
      [p](const std::string& why, bool stopping) { p->OnGone(why, stopping); });
  if (!link.ok()) return link.status();
  d->link_ = std::move(*link);
  return d;
}

void FncallDriver::OnEvent(spawner::Event& ev) {
  if (ev.has_stats()) {
    const auto& s = ev.stats();
    std::string j = "{\"ready\":" + std::to_string(s.ready()) + ",\"running\":" + std::to_string(s.running()) +
                    ",\"starting\":" + std::to_string(s.starting()) + ",\"runs\":" + std::to_string(s.runs()) +
                    ",\"runner_failures\":" + std::to_string(s.runner_failures()) +
                    ",\"netns_free\":" + std::to_string(s.netns_free()) +
                    ",\"netns_total\":" + std::to_string(s.netns_total()) +
                    ",\"ipcns_free\":" + std::to_string(s.ipcns_free()) +
                    ",\"ipcns_total\":" + std::to_string(s.ipcns_total()) + "}";
    std::lock_guard<std::mutex> lk(mu_);
    last_stats_json_ = j;
    return;
  }
  if (!ev.has_finished()) return;
  const auto& o = ev.finished().outcome();
  InFlight f;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = inflight_.find(ev.finished().id());
    if (it == inflight_.end()) return;
    f = std::move(it->second);
    inflight_.erase(it);
    by_run_id_.erase(f.run_id);
  }
  auto res = ToExecResult(o, f.limits, f.argv0);
  res.set_run_id(f.run_id);
  if (res.verdict() == v1::VERDICT_PLATFORM_ERROR) ++runs_failed_;
  ++runs_done_;
  f.done(std::move(res));
}

void FncallDriver::OnGone(const std::string& why, bool stopping) {
  std::unordered_map<uint64_t, InFlight> lost;
  {
    std::lock_guard<std::mutex> lk(mu_);
    lost.swap(inflight_);
    by_run_id_.clear();
  }
  std::string msg = stopping ? std::string("dsecd is shutting down") : why + "; the run's outcome is unknown";
  for (auto& [id, f] : lost) {
    v1::ExecResult r;
    r.set_verdict(v1::VERDICT_PLATFORM_ERROR);
    r.set_error(msg);
    r.set_run_id(f.run_id);
    f.done(std::move(r));
  }
}

Status FncallDriver::Available() const { return link_->Available(); }

Status FncallDriver::CanHandle(const v1::SandboxSpec& spec) const {
  if (!spec.image().empty() && spec.image() != "host")
    return Status::InvalidArgument("fncall runs only on the built-in 'host' image, not '" +
                                   spec.image() + "' (use --kind container for built images)");
  if (spec.limits().disk_bytes())
    return Status::InvalidArgument("fncall sandboxes keep their files in memory (/work and /tmp are tmpfs, "
                                   "within the memory limit): a disk limit is for containers");
  return Available();
}

void FncallDriver::Create(const v1::SandboxRecord& sandbox, CreateCallback done) {
  Status st = CanHandle(sandbox.spec());
  if (st.ok()) done(std::string());
  else done(st);
}

void FncallDriver::Destroy(const v1::SandboxRecord&, const std::string&, StatusCallback done) { done(Status::Ok()); }

void FncallDriver::Exec(const v1::SandboxRecord& sandbox, const std::string& run_id,
                        const v1::ExecRequest& req, ExecCallback done) {
  const v1::Limits& lim = req.limits();
  spawner::Request r;
  auto* run = r.mutable_run();
  for (const auto& a : req.argv()) run->add_argv(a);
  std::map<std::string, std::string> env = {
      {"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
      {"HOME", "/work"},
      {"LANG", "C.UTF-8"},
      {"TMPDIR", "/tmp"},
      {"USER", "sandbox"}};
  for (const auto& [k, v] : sandbox.spec().env()) env[k] = v;
  for (const auto& [k, v] : req.env()) env[k] = v;
  for (const auto& [k, v] : env) run->add_env(k + "=" + v);
  run->set_cwd(!req.cwd().empty() ? req.cwd()
               : !sandbox.spec().workdir().empty() ? sandbox.spec().workdir()
                                                   : "/work");
  run->set_stdin(req.stdin());
  run->set_memory_bytes(lim.memory_bytes());
  run->set_pids(lim.pids());
  run->set_cpu_millis(lim.cpu_millis());
  run->set_timeout_ms(lim.timeout_ms());
  run->set_cpu_time_ms(lim.cpu_time_ms());
  run->set_output_bytes(lim.output_bytes());
  run->set_file_size_bytes(lim.file_size_bytes());
  run->set_open_files(lim.open_files());
  if (r.ByteSizeLong() + 4096 > kMaxFrameBytes) {
    // The spawner would take it for a corrupt stream; callers validate sizes
    // first, so this is a last line of defence.
    done(Status::InvalidArgument("fncall: the run request is " + std::to_string(r.ByteSizeLong()) +
                                 " bytes, above the protocol's limit"));
    return;
  }
  uint64_t id;
  {
    std::lock_guard<std::mutex> lk(mu_);
    id = next_id_++;
    run->set_id(id);
    inflight_[id] = InFlight{std::move(done), lim, req.argv(0), run_id};
    by_run_id_[run_id] = id;
  }
  Status sent = link_->Send(r);
  if (!sent.ok()) {
    InFlight f;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = inflight_.find(id);
      if (it == inflight_.end()) return;  // already failed by OnGone
      f = std::move(it->second);
      inflight_.erase(it);
      by_run_id_.erase(run_id);
    }
    f.done(sent);  // outside the lock: the callback may call back into us
  }
}

Status FncallDriver::Kill(const std::string& run_id, const std::string& reason) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_run_id_.find(run_id);
    if (it == by_run_id_.end()) return Status::NotFound("run " + run_id + " is not in flight");
    id = it->second;
  }
  spawner::Request r;
  r.mutable_kill()->set_id(id);
  r.mutable_kill()->set_reason(reason);
  return link_->Send(r);
}

std::string FncallDriver::StatsJson() const {
  // The link refreshes the spawner's numbers every idle second; this answer
  // carries the latest ones received.
  std::lock_guard<std::mutex> lk(mu_);
  return "{\"spawner_pid\":" + std::to_string(link_->pid()) + ",\"inflight\":" + std::to_string(inflight_.size()) +
         ",\"runs_done\":" + std::to_string(runs_done_.load()) +
         ",\"platform_errors\":" + std::to_string(runs_failed_.load()) + ",\"spawner\":" + last_stats_json_ + "}";
}

void FncallDriver::Stop() {
  if (link_) link_->Stop();
}

}  // namespace dsec::drivers
