// The registry of sandbox kinds: every kind this build has (one entry each in
// registry.cpp), its dsecd flags, its traits, and the driver it started on
// this host or why it could not. Actors and dsecd know kinds only through
// this: adding a kind is a drivers/<kind>/ folder plus one entry here.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "drivers/images/image_source.hpp"
#include "drivers/driver.hpp"
#include "drivers/fault_driver.hpp"
#include "dsec/status.hpp"

namespace CLI {
class App;
}
namespace dsec::net {
class NodeNetwork;
}

namespace dsec::drivers {

// What dsecd gives every kind when it starts.
struct DriverEnv {
  std::string data_dir;
  std::string cgroup_parent = "dsec";  // groups go under <controller>/<parent>/...
  uint32_t sandbox_uid = 65534;        // programs run as this user ...
  uint32_t sandbox_gid = 65534;        // ... and group
  // Where images come from (the node's store); outlives the drivers.
  const images::ImageSource* images = nullptr;
  // A sandbox ended by itself (a VM's QEMU exited, its guest kernel
  // panicked): the node marks it failed with `why` and destroys what is
  // left. Called from a driver thread; may be empty.
  std::function<void(const std::string& sandbox_id, const std::string& why)> lost;
  // Sandbox networking (null when this node has none: `network_unavailable`
  // says why); `network_open`: mode open is allowed (dsecd --network-open).
  net::NodeNetwork* network = nullptr;
  std::string network_unavailable;
  bool network_open = false;
  // A log callback (level 0 debug .. 3 error) for the driver named `name`.
  std::function<std::function<void(int, const std::string&)>(const std::string& name)> log;
};

// One sandbox kind: its name, traits, flags and how to start its driver.
class Kind {
 public:
  virtual ~Kind() = default;
  virtual v1::Kind kind() const = 0;
  virtual const char* name() const = 0;
  virtual const KindTraits& traits() const = 0;
  // Adds the kind's own dsecd flags (--<name>-...); their values stay here
  // until Start.
  virtual void AddFlags(CLI::App& app) = 0;
  // Starts the driver, or FailedPrecondition saying why this host cannot
  // run the kind.
  virtual Result<std::unique_ptr<Driver>> Start(const DriverEnv& env) = 0;
};

// Every kind of this build, lightest first.
std::vector<std::unique_ptr<Kind>> AllKinds();

// The kind an auto (or unspecified) spec gets: the lightest of `kinds`
// whose isolation meets the spec's and that can run its image (host-image
// kinds only the host's own files: image "" or "host"). A spec that names
// its kind gets that kind. Unavailable when none of `kinds` fits.
Result<v1::Kind> ChooseKind(const v1::SandboxSpec& spec, const std::vector<const Kind*>& kinds);

class Registry {
 public:
  explicit Registry(std::vector<std::unique_ptr<Kind>> kinds = AllKinds());
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  void AddFlags(CLI::App& app);
  // Starts every kind; one that cannot start here keeps its reason, which
  // `warn` is told.
  void StartAll(const DriverEnv& env, const std::function<void(const std::string&)>& warn);
  // Stops every started driver (fncall kills its runs; containers keep
  // running for the next start to re-adopt). The drivers stay allocated.
  void StopAll();
  // Destroys the drivers, last started first (once nothing calls them).
  void Release();
  // Tests only (dsecd --test-hooks): wraps every started driver in a
  // FaultDriver, before anything calls them.
  void WrapForFaults();
  // The FaultDriver of kind `name`, or why there is none.
  Result<FaultDriver*> Faults(const std::string& name) const;

  // The driver for `spec` (auto resolved by ChooseKind), or a status naming
  // the kind and why it cannot run here.
  Result<Driver*> DriverFor(const v1::SandboxSpec& spec) const;
  // Every started driver.
  std::vector<Driver*> Drivers() const;
  // Every kind by name with its driver (null: not started here).
  std::vector<std::pair<std::string, Driver*>> ByName() const;
  // The kinds this node can run now, and "kind: why not" for the others
  // (kinds this build lacks: "not implemented yet").
  void Kinds(std::vector<std::string>* available, std::vector<std::string>* unavailable) const;

 private:
  struct Entry {
    std::unique_ptr<Kind> kind;
    std::unique_ptr<Driver> driver;  // null: not started
    FaultDriver* faults = nullptr;   // `driver` itself, when wrapped
    Status unavailable;              // why, when driver is null
  };
  const Entry* Find(v1::Kind kind) const;
  std::vector<Entry> entries_;
  std::vector<const Kind*> kinds_;  // entries_' kinds, for ChooseKind (no allocation per call)
};

}  // namespace dsec::drivers
