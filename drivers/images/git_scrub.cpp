#include "drivers/images/git_scrub.hpp"

#include <dirent.h>
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
#include "runtime/unique_fd.hpp"

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

// The object names of a pack's index (version 2: "\377tOc", 2, a fan-out
// table of 256 counts, then the sorted names), or nothing when unreadable
// or when it has more than `at_most`.
std::vector<std::string> PackNames(const std::string& idx, size_t hash_bytes, size_t at_most) {
  std::vector<std::string> out;
  UniqueFd fd(::open(idx.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st;
  if (!fd || ::fstat(fd.get(), &st) != 0) return out;
  unsigned char head[8 + 256 * 4];
  if (::pread(fd.get(), head, sizeof head, 0) != static_cast<ssize_t>(sizeof head)) return out;
  if (std::memcmp(head, "\377tOc\0\0\0\2", 8) != 0) return out;
  const unsigned char* last = head + 8 + 255 * 4;
  uint32_t n = uint32_t(last[0]) << 24 | uint32_t(last[1]) << 16 | uint32_t(last[2]) << 8 | last[3];
  // More than asked for (it cannot be all future), or more than the file holds.
  if (n > at_most || uint64_t(n) * hash_bytes > uint64_t(st.st_size)) return out;
  std::string names(size_t(n) * hash_bytes, '\0');
  if (n && ::pread(fd.get(), names.data(), names.size(), sizeof head) != static_cast<ssize_t>(names.size())) return out;
  for (uint32_t i = 0; i < n; ++i) out.push_back(HexOf(names.data() + i * hash_bytes, hash_bytes));
  return out;
}

Status WatchOne(const std::string& dir, const std::string& rel, size_t room, WatchedRepo* r) {
  auto fail = [&](const std::string& what, const Out& o) {
    std::string e = o.err;
    while (!e.empty() && e.back() == '\n') e.pop_back();
    return Status::Internal("git " + what + " exited " + std::to_string(o.code) + ": " + e);
  };
  r->path = rel;
  // Refs git cannot read (a broken packed-refs) would pass for no commit.
  if (auto refs = Git(dir, {"for-each-ref", "--format=%(objectname)"}); refs.code != 0)
    return fail("for-each-ref", refs);
  auto head = Git(dir, {"rev-parse", "--verify", "-q", "HEAD^{commit}"});
  r->head = head.code == 0 && !Lines(head.text).empty() ? Lines(head.text).front() : "";
  // The future: what refs, reflogs and the stash reach and the checked-out
  // commit does not (only that is held in memory, not the whole history).
  std::vector<std::string> args = {"rev-list", "--objects", "--all", "--reflog"};
  if (!r->head.empty()) args.insert(args.end(), {"--not", r->head});
  auto rl = Git(dir, args);
  if (rl.code != 0) return fail("rev-list", rl);
  std::set<std::string> future;
  for (const auto& l : Lines(rl.text)) future.insert(l.substr(0, l.find(' ')));
  rl.text.clear();
  // What the index stages is the present too (a bare repository has none).
  auto staged = Git(dir, {"ls-files", "--stage"});
  if (staged.code == 0)
    for (const auto& l : Lines(staged.text)) {
      std::istringstream in(l);
      std::string mode, name;
      in >> mode >> name;
      future.erase(name);
    }
  size_t hash_bytes = r->head.empty() ? (future.empty() ? 20 : future.begin()->size() / 2) : r->head.size() / 2;
  r->past_head = future.size();
  if (future.empty()) return Status::Ok();
  size_t watched = 0;
  auto watch = [&](const std::string& file, size_t objects) {
    if (r->files.size() >= room) return;
    r->files.push_back(rel + "/" + file);
    watched += objects;
  };
  for (const auto& name : future)
    if (Exists(dir + "/objects/" + name.substr(0, 2) + "/" + name.substr(2)))
      watch("objects/" + name.substr(0, 2) + "/" + name.substr(2), 1);
  std::vector<std::string> idx;
  if (DIR* d = ::opendir((dir + "/objects/pack").c_str())) {
    while (auto* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 4 && n.compare(n.size() - 4, 4, ".idx") == 0) idx.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(idx.begin(), idx.end());
  for (const auto& n : idx) {
    auto names = PackNames(dir + "/objects/pack/" + n, hash_bytes, future.size());
    bool only_future = !names.empty();
    for (const auto& o : names) only_future = only_future && future.count(o);
    std::string pack = "objects/pack/" + n.substr(0, n.size() - 4) + ".pack";
    if (only_future && Exists(dir + "/" + pack)) watch(pack, names.size());
  }
  r->unwatched = future.size() > watched ? future.size() - watched : 0;
  return Status::Ok();
}

std::vector<std::string> FindRepos(const std::string& tree, Status* st) {
  std::vector<std::string> found;
  g_found = &found;
  int rc = ::nftw(tree.c_str(), FindOne, 64, FTW_PHYS);
  g_found = nullptr;
  if (rc < 0) *st = Status::FromErrno(errno, "walk " + tree);
  std::sort(found.begin(), found.end());
  return found;
}

std::string Rel(const std::string& tree, const std::string& dir) {
  return dir.size() > tree.size() ? dir.substr(tree.size() + 1) : dir;
}

}  // namespace

Result<std::vector<WatchedRepo>> FindFutureHistory(const std::string& tree, size_t max_files) {
  Status walked;
  auto found = FindRepos(tree, &walked);
  if (!walked.ok()) return walked.Annotate("git-watch");
  std::vector<WatchedRepo> out;
  if (found.empty()) return out;
  if (::access("/usr/bin/git", X_OK) != 0)
    return Status::Unavailable("git-watch needs git on the building host to find a repository's future history "
                               "(apt-get install git; or --git-scrub to remove it, or --no-git-watch)");
  size_t files = 0;
  for (const auto& dir : found) {
    WatchedRepo r;
    if (Status st = WatchOne(dir, Rel(tree, dir), max_files - files, &r); !st.ok()) {
      r = WatchedRepo{};
      r.path = Rel(tree, dir);
      r.error = st.message();
    }
    files += r.files.size();
    if (r.past_head || !r.error.empty()) out.push_back(std::move(r));
  }
  return out;
}

std::string WatchSummary(const WatchedRepo& r) {
  if (!r.error.empty())
    return "git-watch " + r.path + ": not watched, git cannot read it (" + r.error +
           "): a sandbox's read of its history is not flagged";
  std::string s = "git-watch " + r.path + ": " + std::to_string(r.past_head) + " object(s) past " +
                  (r.head.empty() ? std::string("no commit") : r.head.substr(0, 12)) + "; " +
                  std::to_string(r.files.size()) + " file(s) of them watched (a sandbox's read is flagged)";
  if (r.unwatched)
    s += "; " + std::to_string(r.unwatched) + " object(s) in packs with the past or over the limit are not";
  return s + "; --git-scrub removes them";
}

Result<std::vector<ScrubbedRepo>> ScrubGitHistory(const std::string& tree) {
  if (::access("/usr/bin/git", X_OK) != 0)
    return Status::Unavailable("--git-scrub needs git on the building host: apt-get install git");
  Status walked;
  auto found = FindRepos(tree, &walked);
  if (!walked.ok()) return walked.Annotate("git-scrub");
  std::vector<ScrubbedRepo> out;
  for (const auto& dir : found) {
    ScrubbedRepo r;
    DSEC_RETURN_IF_ERROR(ScrubOne(dir, Rel(tree, dir), &r));
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
