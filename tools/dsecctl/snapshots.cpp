// `dsecctl snapshot` and `dsecctl fork` (dsec/snapshot.hpp): a sandbox's
// snapshots taken, listed, inspected and removed; forks made.
#include <cstdio>
#include <iostream>

#include "dsec/snapshot.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/clock.hpp"
#include "tools/dsecctl/cli.hpp"

namespace dsec::ctl {

void AddSnapshotCommands(CLI::App* app, SnapshotFlags* f) {
  f->snapshot = app->add_subcommand("snapshot", "a sandbox's snapshots: take, ls, inspect, rm (node-local)");
  f->snapshot->require_subcommand(1);
  f->take = f->snapshot->add_subcommand(
      "take", "a named, read-only snapshot of a sandbox's state (it is frozen for the copy); new sandboxes start "
              "from it with create --snapshot NAME");
  f->take->add_option("id", f->id, "sandbox id")->required();
  f->take->add_option("name", f->name, "[a-z0-9][a-z0-9._-]*, unique on the node")->required();
  f->ls = f->snapshot->add_subcommand("ls", "every node's snapshots: a table (or --json)");
  f->ls->add_flag("--json", f->json, "one JSON object per line");
  f->inspect = f->snapshot->add_subcommand("inspect", "one snapshot, as JSON (its users too)");
  f->inspect->add_option("name", f->name, "snapshot name")->required();
  f->rm = f->snapshot->add_subcommand("rm", "remove snapshots (refused while sandboxes or snapshots need one)");
  f->rm->add_option("names", f->names, "snapshot names")->required();
  f->fork = app->add_subcommand(
      "fork", "COUNT new sandboxes in a sandbox's current state, on its node (all or none); prints their ids");
  f->fork->add_option("id", f->id, "sandbox id")->required();
  f->fork->add_option("count", f->count, "1 to 100")->required();
}

namespace {

std::string Size(uint64_t b) {
  char buf[32];
  if (b < 10240) std::snprintf(buf, sizeof buf, "%lluB", static_cast<unsigned long long>(b));
  else if (b < (10ull << 20)) std::snprintf(buf, sizeof buf, "%.0fK", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%.0fM", b / 1048576.0);
  return buf;
}

}  // namespace

int RunSnapshotCommand(const Common& c, const SnapshotFlags& f) {
  int rc = 0;
  auto client = ConnectOrDie(c, &rc);
  if (!client) return rc;
  if (*f.fork) {
    auto sb = client->Attach(f.id);
    if (!sb.ok()) return Fail(sb.status());
    auto forks = Fork(*sb, f.count);
    if (!forks.ok()) return Fail(forks.status());
    for (const auto& s : *forks) std::cout << s.id() << "\n";
    return 0;
  }
  if (*f.take) {
    auto sb = client->Attach(f.id);
    if (!sb.ok()) return Fail(sb.status());
    auto info = Snapshot(*sb, f.name);
    if (!info.ok()) return Fail(info.status());
    std::string shared = info->shared_bytes() ? " (" + Size(info->shared_bytes()) + " shared with earlier ones)" : "";
    std::printf("%s: snapshot of %s, %llu entries, %s%s, %u layer(s)\n", info->name().c_str(), f.id.c_str(),
                static_cast<unsigned long long>(info->entries()), Size(info->size_bytes()).c_str(), shared.c_str(),
                info->depth());
    return 0;
  }
  if (*f.inspect) {
    auto info = GetSnapshot(*client, f.name);
    if (!info.ok()) return Fail(info.status());
    std::cout << ToJson(*info);
    return 0;
  }
  if (*f.rm) {
    for (const auto& n : f.names) {
      Status st = RemoveSnapshot(*client, n);
      if (!st.ok()) rc = Fail(st);
      else std::cout << n << "\n";
    }
    return rc;
  }
  auto all = ListSnapshots(*client);
  if (!all.ok()) return Fail(all.status());
  if (f.json) {
    for (const auto& s : *all) std::cout << ToJson(s);
    return 0;
  }
  std::printf("%-32s %-9s %-16s %-20s %-6s %-7s %-6s %s\n", "NAME", "KIND", "IMAGE", "SOURCE", "LAYERS", "SIZE",
              "USERS", "CREATED");
  int64_t now = WallClockMs();
  for (const auto& s : *all) {
    std::string kind = KindName(s.kind());
    std::printf("%-32s %-9s %-16s %-20s %-6u %-7s %-6d %llds ago\n", s.name().c_str(), kind.c_str(),
                s.image().c_str(), s.source_sandbox().c_str(), s.depth(), Size(s.size_bytes()).c_str(),
                s.users_size(), static_cast<long long>((now - s.created_ms()) / 1000));
  }
  return 0;
}

}  // namespace dsec::ctl
