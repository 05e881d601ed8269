#include "drivers/images/git_scrub.hpp"

#include <fcntl.h>
#include <ftw.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <sstream>

#include "runtime/files.hpp"

extern char** environ;

namespace dsec::images {

namespace {

struct Out {
  int code = -1;
  std::string text, err;
};

// Runs git on repository `git_dir` with no user or system configuration.
Out Git(const std::string& git_dir, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/env",
                                   "-i",
                                   "PATH=/usr/bin:/bin",
                                   "HOME=/nonexistent",
                                   "GIT_CONFIG_NOSYSTEM=1",
                                   "GIT_CONFIG_GLOBAL=/dev/null",
                                   "git",
                                   "-c",
                                   "safe.directory=*",
                                   "-c",
                                   "core.fsmonitor=false",
                                   "-c",
                                   "core.hooksPath=/dev/null",
                                   "--git-dir=" + git_dir};
  argv.insert(argv.end(), args.begin(), args.end());
  Out o;
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) < 0) return o;
  if (::pipe2(err, O_CLOEXEC) < 0) {
    ::close(out[0]), ::close(out[1]);
    return o;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  std::vector<char*> av;
  for (auto& a : argv) av.push_back(a.data());
  av.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawn(&pid, av[0], &fa, nullptr, av.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]), ::close(err[1]);
  // stderr is small (git's complaints); stdout is read first, then it.
  char buf[65536];
  for (ssize_t n; rc == 0 && (n = ::read(out[0], buf, sizeof buf)) != 0;)
    if (n > 0) o.text.append(buf, static_cast<size_t>(n)); else if (errno != EINTR) break;
  for (ssize_t n; rc == 0 && (n = ::read(err[0], buf, sizeof buf)) != 0;)
    if (n > 0) o.err.append(buf, static_cast<size_t>(n)); else if (errno != EINTR) break;
  ::close(out[0]), ::close(err[0]);
  if (rc != 0) {
    o.err = std::strerror(rc);
    return o;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

bool IsDir(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool Exists(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}
// A repository's directory: HEAD, objects/ and refs/.
bool IsRepo(const std::string& d) { return Exists(d + "/HEAD") && IsDir(d + "/objects") && IsDir(d + "/refs"); }

std::vector<std::string>* g_found;
int FindOne(const char* path, const struct stat* st, int type, struct FTW* f) {
  if (type != FTW_D) return 0;
  // `.git`, a bare repository, a submodule's (<repo>/.git/modules/<name>).
  if (IsRepo(path)) g_found->push_back(path);
  (void)st, (void)f;
  return 0;
}

size_t CountObjects(const std::string& dir) {
  auto o = Git(dir, {"cat-file", "--batch-all-objects", "--batch-check=%(objectname)"});
  return o.code == 0 ? Lines(o.text).size() : 0;
}

Status ScrubOne(const std::string& dir, const std::string& rel, ScrubbedRepo* r) {
  auto fail = [&](const std::string& what, const Out& o) {
    std::string e = o.err;
    while (!e.empty() && e.back() == '\n') e.pop_back();
    return Status::Internal("git-scrub " + rel + ": git " + what + " exited " + std::to_string(o.code) + ": " + e);
  };
  r->path = rel;
  // Objects borrowed from elsewhere are copied in before the link goes.
  if (Exists(dir + "/objects/info/alternates")) {
    if (auto o = Git(dir, {"repack", "-a", "-d", "-q"}); o.code != 0) return fail("repack", o);
    ::unlink((dir + "/objects/info/alternates").c_str());
    r->removed.push_back("objects/info/alternates");
  }
  r->objects_before = CountObjects(dir);
  auto head = Git(dir, {"rev-parse", "--verify", "-q", "HEAD^{commit}"});
  r->head = head.code == 0 ? Lines(head.text).front() : "";
  auto refs = Git(dir, {"for-each-ref", "--format=%(refname) %(objectname) %(*objectname)"});
  if (refs.code != 0) return fail("for-each-ref", refs);
  for (const auto& line : Lines(refs.text)) {
    std::istringstream in(line);
    std::string name, obj, peeled;
    in >> name >> obj >> peeled;
    std::string target = peeled.empty() ? obj : peeled;
    bool keep = false;
    if (!r->head.empty() && (name.rfind("refs/heads/", 0) == 0 || name.rfind("refs/tags/", 0) == 0)) {
      auto anc = Git(dir, {"merge-base", "--is-ancestor", target, r->head});
      keep = anc.code == 0;  // 1: not an ancestor; other codes: not a commit (a tag of a tree): goes
    }
    if (keep) continue;
    if (auto o = Git(dir, {"update-ref", "--no-deref", "-d", name}); o.code != 0) return fail("update-ref -d " + name, o);
    r->removed.push_back(name);
  }
  // Reflogs, and the files that name commits of an operation under way.
  if (auto o = Git(dir, {"reflog", "expire", "--expire=now", "--expire-unreachable=now", "--all"}); o.code != 0)
    return fail("reflog expire", o);
  for (const char* f : {"logs", "FETCH_HEAD", "ORIG_HEAD", "MERGE_HEAD", "CHERRY_PICK_HEAD", "REVERT_HEAD",
                        "AUTO_MERGE", "BISECT_LOG", "BISECT_START", "BISECT_EXPECTED_REV", "rebase-merge",
                        "rebase-apply", "worktrees", "shallow", "packed-refs.lock"}) {
    std::string p = dir + "/" + f;
    if (!Exists(p)) continue;
    DSEC_RETURN_IF_ERROR(RemoveTree(p).Annotate("git-scrub " + rel));
    r->removed.push_back(f);
  }
  // What no kept ref reaches, pruned (loose and packed).
  if (auto o = Git(dir, {"-c", "gc.reflogExpire=now", "-c", "gc.reflogExpireUnreachable=now", "-c",
                         "gc.auto=0", "gc", "--prune=now", "--quiet"});
      o.code != 0)
    return fail("gc", o);
  r->objects_after = CountObjects(dir);
  // The check: every commit left is the checked-out one or before it.
  auto all = Git(dir, {"cat-file", "--batch-all-objects", "--batch-check=%(objecttype) %(objectname)"});
  if (all.code != 0) return fail("cat-file", all);
  std::set<std::string> reachable;
  if (!r->head.empty()) {
    auto rl = Git(dir, {"rev-list", r->head});
    if (rl.code != 0) return fail("rev-list", rl);
    for (auto& c : Lines(rl.text)) reachable.insert(c);
  }
  for (const auto& line : Lines(all.text))
    if (line.rfind("commit ", 0) == 0 && !reachable.count(line.substr(7)))
      return Status::Internal("git-scrub " + rel + ": commit " + line.substr(7) +
                              " is still there and is not reachable from the checked-out commit");
  return Status::Ok();
}

}  // namespace

Result<std::vector<ScrubbedRepo>> ScrubGitHistory(const std::string& tree) {
  if (::access("/usr/bin/git", X_OK) != 0)
    return Status::Unavailable("--git-scrub needs git on the building host: apt-get install git");
  std::vector<std::string> found;
  g_found = &found;
  int rc = ::nftw(tree.c_str(), FindOne, 64, FTW_PHYS);
  g_found = nullptr;
  if (rc < 0) return Status::FromErrno(errno, "git-scrub: walk " + tree);
  std::sort(found.begin(), found.end());
  std::vector<ScrubbedRepo> out;
  for (const auto& dir : found) {
    ScrubbedRepo r;
    std::string rel = dir.size() > tree.size() ? dir.substr(tree.size() + 1) : dir;
    DSEC_RETURN_IF_ERROR(ScrubOne(dir, rel, &r));
    out.push_back(std::move(r));
  }
  return out;
}

std::string ScrubSummary(const ScrubbedRepo& r) {
  std::string s = "git-scrub " + r.path + ": kept the history of " +
                  (r.head.empty() ? std::string("no commit (nothing is checked out)") : r.head.substr(0, 12)) +
                  "; objects " + std::to_string(r.objects_before) + " -> " + std::to_string(r.objects_after);
  if (r.removed.empty()) return s + "; nothing else to remove";
  s += "; removed";
  for (const auto& x : r.removed) s += " " + x;
  return s;
}

}  // namespace dsec::images
