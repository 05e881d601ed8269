#include "drivers/registry.hpp"

#include <algorithm>

#include "dsec/status_proto.hpp"

namespace dsec::drivers {

// One entry per kind: its factory, defined in drivers/<kind>/.
std::unique_ptr<Kind> FncallKind();
std::unique_ptr<Kind> ContainerKind();
std::unique_ptr<Kind> MicrovmKind();
std::unique_ptr<Kind> VmKind();
std::unique_ptr<Kind> FakeKind();

std::vector<std::unique_ptr<Kind>> AllKinds() {
  std::vector<std::unique_ptr<Kind>> kinds;
  kinds.push_back(FncallKind());
  kinds.push_back(ContainerKind());
  kinds.push_back(MicrovmKind());
  kinds.push_back(VmKind());
  kinds.push_back(FakeKind());  // tests only: off unless dsecd --fake-kind
  return kinds;
}

namespace {

// The isolation levels in order; unspecified means process.
int Level(v1::Isolation i) { return i == v1::ISOLATION_UNSPECIFIED ? v1::ISOLATION_PROCESS : static_cast<int>(i); }

bool HostImage(const v1::SandboxSpec& spec) { return spec.image().empty() || spec.image() == "host"; }

const char* IsolationName(v1::Isolation i) {
  switch (i) {
    case v1::ISOLATION_CONTAINER: return "container";
    case v1::ISOLATION_KERNEL: return "kernel";
    case v1::ISOLATION_HARDWARE: return "hardware";
    default: return "process";
  }
}

// Kinds the protocol names but this build has none of.
std::vector<v1::Kind> Missing(const std::vector<const Kind*>& have) {
  std::vector<v1::Kind> out;
  for (int k = v1::Kind_MIN; k <= v1::Kind_MAX; ++k) {
    if (!v1::Kind_IsValid(k) || k == v1::KIND_UNSPECIFIED || k == v1::KIND_AUTO) continue;
    if (k == v1::KIND_FAKE) continue;  // a kind for tests is not missing where it was not asked for
    if (std::none_of(have.begin(), have.end(), [&](const Kind* h) { return h->kind() == k; }))
      out.push_back(static_cast<v1::Kind>(k));
  }
  return out;
}

}  // namespace

Result<v1::Kind> ChooseKind(const v1::SandboxSpec& spec, const std::vector<const Kind*>& kinds) {
  if (spec.kind() != v1::KIND_UNSPECIFIED && spec.kind() != v1::KIND_AUTO) return spec.kind();
  const Kind* best = nullptr;
  for (const Kind* k : kinds) {
    const KindTraits& t = k->traits();
    if (t.test_only) continue;  // named, never chosen
    if (Level(t.isolation) < Level(spec.isolation())) continue;
    if (t.host_image && !HostImage(spec)) continue;
    if (!best || Level(t.isolation) < Level(best->traits().isolation)) best = k;
  }
  if (best) return best->kind();
  std::string missing;
  for (v1::Kind k : Missing(kinds)) missing += std::string(missing.empty() ? "" : ", ") + KindName(k);
  return Status::Unavailable(std::string("no sandbox kind of this node gives ") + IsolationName(spec.isolation()) +
                             " isolation" + (missing.empty() ? "" : " (" + missing + ": not implemented yet)"));
}

Registry::Registry(std::vector<std::unique_ptr<Kind>> kinds) {
  for (auto& k : kinds) {
    Entry e;
    e.unavailable = Status::FailedPrecondition(std::string(k->name()) + " was not started");
    e.kind = std::move(k);
    kinds_.push_back(e.kind.get());
    entries_.push_back(std::move(e));
  }
}

Registry::~Registry() { Release(); }

void Registry::AddFlags(CLI::App& app) {
  for (auto& e : entries_) e.kind->AddFlags(app);
}

void Registry::StartAll(const DriverEnv& env, const std::function<void(const std::string&)>& warn) {
  for (auto& e : entries_) {
    auto d = e.kind->Start(env);
    if (d.ok()) {
      e.driver = std::move(*d);
    } else {
      e.unavailable = d.status();
      warn(d.status().message());
    }
  }
}

void Registry::StopAll() {
  for (auto& e : entries_)
    if (e.driver) e.driver->Stop();
}

void Registry::Release() {
  for (auto e = entries_.rbegin(); e != entries_.rend(); ++e) e->driver.reset();
}

void Registry::WrapForFaults() {
  for (auto& e : entries_) {
    if (!e.driver || e.faults) continue;
    auto wrapped = std::make_unique<FaultDriver>(std::move(e.driver));
    e.faults = wrapped.get();
    e.driver = std::move(wrapped);
  }
}

Result<FaultDriver*> Registry::Faults(const std::string& name) const {
  for (auto& e : entries_) {
    if (name != e.kind->name()) continue;
    if (!e.driver) return e.unavailable;
    if (!e.faults) return Status::FailedPrecondition("driver faults need dsecd --test-hooks");
    return e.faults;
  }
  return Status::NotFound("no sandbox kind '" + name + "' in this build");
}

const Registry::Entry* Registry::Find(v1::Kind kind) const {
  for (auto& e : entries_)
    if (e.kind->kind() == kind) return &e;
  return nullptr;
}

Result<Driver*> Registry::DriverFor(const v1::SandboxSpec& spec) const {
  auto kind = ChooseKind(spec, kinds_);
  if (!kind.ok()) return kind.status();
  const Entry* e = Find(*kind);
  if (!e) {
    std::string have;
    for (auto& x : entries_) have += std::string(have.empty() ? "" : ", ") + x.kind->name();
    return Status::Unavailable(std::string("sandbox kind '") + KindName(*kind) +
                               "' is not available on this node yet (available: " + have + ")");
  }
  if (!e->driver) return e->unavailable;
  return e->driver.get();
}

std::vector<Driver*> Registry::Drivers() const {
  std::vector<Driver*> out;
  for (auto& e : entries_)
    if (e.driver) out.push_back(e.driver.get());
  return out;
}

std::vector<std::pair<std::string, Driver*>> Registry::ByName() const {
  std::vector<std::pair<std::string, Driver*>> out;
  for (auto& e : entries_) out.emplace_back(e.kind->name(), e.driver.get());
  return out;
}

void Registry::Kinds(std::vector<std::string>* available, std::vector<std::string>* unavailable) const {
  std::vector<const Kind*> kinds;
  for (auto& e : entries_) {
    kinds.push_back(e.kind.get());
    Status st = e.driver ? e.driver->Available() : e.unavailable;
    if (!st.ok() && e.kind->traits().test_only) continue;  // not a gap of this host: a kind for tests
    if (st.ok()) available->push_back(e.kind->name());
    else unavailable->push_back(std::string(e.kind->name()) + ": " + st.message());
  }
  for (v1::Kind k : Missing(kinds)) unavailable->push_back(std::string(KindName(k)) + ": not implemented yet");
}

}  // namespace dsec::drivers
