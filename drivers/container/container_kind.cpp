// The container kind's registry entry: its dsecd flags and how it starts.
#include <CLI/CLI.hpp>

#include "drivers/container/container_driver.hpp"
#include "drivers/registry.hpp"

namespace dsec::drivers {

namespace {

class Container : public Kind {
 public:
  v1::Kind kind() const override { return v1::KIND_CONTAINER; }
  const char* name() const override { return "container"; }
  const KindTraits& traits() const override { return ContainerDriver::Traits(); }

  void AddFlags(CLI::App& app) override {
    app.add_option("--container-idle-freeze", idle_freeze_s_,
                   "seconds without exec, file call or CPU use after which a container is frozen until its next "
                   "call (0: never)")
        ->capture_default_str();
    app.add_option("--container-netns-pool", o_.netns_pool, "network namespaces made ahead of container creation")
        ->capture_default_str();
    app.add_flag("--container-fresh-ns", o_.fresh_netns,
                 "a new network namespace per container instead of one recycled from a removed container "
                 "(~1.2 ms of CPU each)");
    app.add_option("--sandbox-disk-size", o_.disk_size_bytes,
                   "size of the filesystem container sandboxes live on (<data-dir>/sandboxes.img, sparse, made at "
                   "the first start; at most 90% of the free space there): what all of them may write together")
        ->transform(CLI::AsSizeValue(false))
        ->capture_default_str();
    app.add_flag("--no-sandbox-disk", no_disk_, "keep container sandboxes on the data dir's own filesystem: no disk limits");
    app.add_flag("--no-write-watch", no_write_watch_,
                 "do not count containers' writes refused by a read-only path (a task's protected paths): session "
                 "steps then get no write_refused flag, and each open for writing, unlink or rename in a container "
                 "no longer passes through dsec-spawner");
  }

  Result<std::unique_ptr<Driver>> Start(const DriverEnv& env) override {
    ContainerOptions o = o_;
    o.data_dir = env.data_dir;
    o.cgroup_parent = env.cgroup_parent;
    o.idle_freeze_ms = static_cast<int64_t>(idle_freeze_s_ * 1000);
    o.disk_limits = !no_disk_;
    o.watch_writes = !no_write_watch_;
    o.images = env.images;
    o.network = env.network;
    o.network_unavailable = env.network_unavailable;
    o.network_open = env.network_open;
    if (env.log) o.log = env.log(name());
    auto d = ContainerDriver::Start(std::move(o));
    if (!d.ok()) return d.status();
    return std::unique_ptr<Driver>(std::move(*d));
  }

 private:
  ContainerOptions o_;
  double idle_freeze_s_ = 300;
  bool no_disk_ = false;
  bool no_write_watch_ = false;
};

}  // namespace

std::unique_ptr<Kind> ContainerKind() { return std::make_unique<Container>(); }

}  // namespace dsec::drivers
