// The fake kind's registry entry (tests only): off unless dsecd is started
// with --fake-kind; its boxes are mirrored to <data-dir>/fake so a dsecd
// killed with -9 re-adopts them when it starts again.
#include <CLI/CLI.hpp>

#include "drivers/fake/fake_driver.hpp"
#include "drivers/registry.hpp"
#include "runtime/files.hpp"

namespace dsec::drivers {

namespace {

class Fake : public Kind {
 public:
  v1::Kind kind() const override { return v1::KIND_FAKE; }
  const char* name() const override { return "fake"; }
  const KindTraits& traits() const override {
    static const KindTraits t = FakeDriver::DefaultTraits();
    return t;
  }

  void AddFlags(CLI::App& app) override {
    app.add_flag("--fake-kind", on_,
                 "offer the fake kind (tests only): sandboxes simulated in dsecd, with no isolation at all");
  }

  Result<std::unique_ptr<Driver>> Start(const DriverEnv& env) override {
    if (!on_) return Status::FailedPrecondition("fake sandboxes are for tests: start dsecd with --fake-kind");
    FakeOptions o;
    o.state_dir = env.data_dir + "/fake";
    DSEC_RETURN_IF_ERROR(MakeDirs(o.state_dir, 0700));
    o.lost = env.lost;
    if (env.log) o.log = env.log(name());
    return std::unique_ptr<Driver>(std::make_unique<FakeDriver>(std::move(o)));
  }

 private:
  bool on_ = false;
};

}  // namespace

std::unique_ptr<Kind> FakeKind() { return std::make_unique<Fake>(); }

}  // namespace dsec::drivers
