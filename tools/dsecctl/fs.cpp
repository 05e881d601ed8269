// `dsecctl fs ls|mkdir|mv|rm` (dsec/files.hpp): a sandbox's tree listed
// and changed, and `exec --user`'s user. Kinds with state only.
#include <sys/stat.h>

#include <cstdio>
#include <iostream>
#include <map>

#include "dsec/files.hpp"
#include "tools/dsecctl/cli.hpp"

namespace dsec::ctl {

void AddFsCommands(CLI::App* app, FsFlags* f) {
  f->fs = app->add_subcommand("fs", "a sandbox's files: ls, mkdir, mv, rm (container, microvm, vm)");
  f->fs->require_subcommand(1);
  f->ls = f->fs->add_subcommand("ls", "a directory's entries (or a file): mode, owner, group, size, name, and "
                                      "[its user.* extended attributes] when it has some");
  f->mkdir = f->fs->add_subcommand("mkdir", "make a directory and the parents it lacks (fails when it exists)");
  f->mv = f->fs->add_subcommand("mv", "rename a path inside the sandbox (a file at the destination is replaced)");
  f->rm = f->fs->add_subcommand("rm", "remove a file, or a directory with all it holds");
  for (auto* sub : {f->ls, f->mkdir, f->mv, f->rm}) {
    sub->add_option("id", f->id, "sandbox id")->required();
    sub->add_option("path", f->path, "absolute path in the sandbox")->required();
  }
  f->mv->add_option("destination", f->destination, "absolute path in the sandbox")->required();
  f->mkdir->add_option("--user", f->user, "the directories made belong to this user of the sandbox's /etc/passwd");
}

namespace {

std::string Mode(uint32_t m) {
  std::string out = S_ISDIR(m) ? "d" : S_ISLNK(m) ? "l" : S_ISREG(m) ? "-" : "?";
  const char* rwx = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) out += (m & (0400u >> i)) ? rwx[i] : '-';
  return out;
}

void Line(const v1::FileInfo& f) {
  std::string owner = f.owner().empty() ? std::to_string(f.uid()) : f.owner();
  std::string group = f.group().empty() ? std::to_string(f.gid()) : f.group();
  // Its user.* extended attributes, sorted, after the name: "  [k=v, k2=v2]".
  std::map<std::string, std::string> attrs(f.xattrs().begin(), f.xattrs().end());
  std::string shown;
  for (const auto& [k, v] : attrs) shown += (shown.empty() ? "  [" : ", ") + k + "=" + v;
  if (!shown.empty()) shown += "]";
  std::printf("%s %-8s %-8s %10llu %s%s%s\n", Mode(f.mode()).c_str(), owner.c_str(), group.c_str(),
              static_cast<unsigned long long>(f.size()), f.name().c_str(),
              f.link_target().empty() ? "" : (" -> " + f.link_target()).c_str(), shown.c_str());
}

}  // namespace

int RunFsCommand(const Common& c, const FsFlags& f) {
  int rc = 0;
  auto client = ConnectOrDie(c, &rc);
  if (!client) return rc;
  auto sb = client->Attach(f.id);
  if (!sb.ok()) return Fail(sb.status());
  if (*f.ls) {
    auto r = sb->ListFiles(f.path);
    if (!r.ok()) return Fail(r.status());
    if (!S_ISDIR(r->info().mode())) Line(r->info());
    for (const auto& e : r->entries()) Line(e);
    return 0;
  }
  if (*f.mkdir) {
    auto r = MakeDir(*sb, f.path, f.user);
    return r.ok() ? 0 : Fail(r.status());
  }
  if (*f.mv) {
    auto r = Move(*sb, f.path, f.destination);
    return r.ok() ? 0 : Fail(r.status());
  }
  Status s = Remove(*sb, f.path);
  return s.ok() ? 0 : Fail(s);
}

}  // namespace dsec::ctl
