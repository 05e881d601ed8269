// The fncall kind's registry entry: its dsecd flags and how it starts.
#include <CLI/CLI.hpp>

#include "drivers/fncall/fncall_driver.hpp"
#include "drivers/registry.hpp"

namespace dsec::drivers {

namespace {

class Fncall : public Kind {
 public:
  v1::Kind kind() const override { return v1::KIND_FNCALL; }
  const char* name() const override { return "fncall"; }
  const KindTraits& traits() const override { return FncallDriver::Traits(); }

  void AddFlags(CLI::App& app) override {
    o_.pool_size = 32;
    app.add_option("--fncall-pool", o_.pool_size, "warm fncall runners kept ready")->capture_default_str();
    app.add_option("--fncall-max-runners", o_.max_runners, "concurrent fncall runs (more queue)")
        ->capture_default_str();
    app.add_flag("--fncall-fresh-ns", o_.fresh_namespaces,
                 "new net and ipc namespaces per run instead of recycled ones (~1.4 ms of CPU each)");
  }

  Result<std::unique_ptr<Driver>> Start(const DriverEnv& env) override {
    FncallOptions o = o_;
    o.uid = env.sandbox_uid;
    o.gid = env.sandbox_gid;
    o.cgroup_parent = env.cgroup_parent;
    if (env.log) o.log = env.log(name());
    auto d = FncallDriver::Start(std::move(o));
    if (!d.ok()) return d.status();
    return std::unique_ptr<Driver>(std::move(*d));
  }

 private:
  FncallOptions o_;
};

}  // namespace

std::unique_ptr<Kind> FncallKind() { return std::make_unique<Fncall>(); }

}  // namespace dsec::drivers
