// `dsec-image build --git-scrub`: the git repositories of an image's tree
// keep only the history reachable from their checked-out commit, so an
// agent cannot read a task's answer from the repository's future (a later
// commit, a branch or tag past it, a stash, a remote-tracking ref, a
// reflog entry, an unreachable object). DESIGN.md section 13.
//
// Per repository (every directory of the tree with HEAD, objects/ and
// refs/: a `.git`, a bare repository, a submodule's under .git/modules/):
// refs under refs/heads and refs/tags
// whose commit is the checked-out one or an ancestor stay; every other ref
// goes (other branches, later tags, refs/remotes, refs/stash, notes,
// replace refs, filter-branch's refs/original); reflogs, FETCH_HEAD,
// ORIG_HEAD and the other state files that name commits go; linked
// worktrees' records go; objects borrowed through alternates are copied
// in; then every object the kept refs do not reach is pruned. The result
// is checked: no commit object is left that the checked-out commit does
// not reach.
#pragma once

#include <string>
#include <vector>

#include "dsec/status.hpp"

namespace dsec::images {

struct ScrubbedRepo {
  std::string path;                  // the .git directory, relative to the tree
  std::string head;                  // the checked-out commit ("" when none)
  std::vector<std::string> removed;  // refs and state files removed
  size_t objects_before = 0, objects_after = 0;
};

// Scrubs every repository under `tree` (which it changes in place: the
// builder gives it a copy). Fails naming the repository and the git
// command when git cannot read one, or when the check finds a commit left
// past the checked-out one; Unavailable when git is missing.
Result<std::vector<ScrubbedRepo>> ScrubGitHistory(const std::string& tree);

// One line per repository for the user: what went.
std::string ScrubSummary(const ScrubbedRepo& r);

// An unscrubbed image's git-watch (the build's default): the files of each
// repository that hold only objects its checked-out commit (and its index)
// does not reach, so a sandbox's read of one is a read of the task's
// future (ImageManifest.watched; drivers/guard/read_watch.hpp flags it).
// Loose objects, and packs of nothing else; future objects in a pack with
// the past are counted, not watched (a read of the pack is not told apart).
struct WatchedRepo {
  std::string path;                // the .git directory, relative to the tree
  std::string head;                // the checked-out commit ("" when none)
  size_t past_head = 0;            // objects the checked-out commit and the index do not reach
  std::vector<std::string> files;  // watched, relative to the tree
  size_t unwatched = 0;            // of past_head, in packs with the past, elsewhere, or past max_files
  std::string error;               // git could not read it: nothing of it is watched
};

// Bounds the manifest (every sandbox creation reads it): about 250 KiB.
constexpr size_t kMaxWatchedFiles = 4096;

// The repositories under `tree` with objects past their checked-out
// commit (or that git cannot read: `error`), at most `max_files` watched
// files in all. Unavailable without git (the build goes on, saying so).
Result<std::vector<WatchedRepo>> FindFutureHistory(const std::string& tree, size_t max_files);

// One line per repository for the user.
std::string WatchSummary(const WatchedRepo& r);

}  // namespace dsec::images
