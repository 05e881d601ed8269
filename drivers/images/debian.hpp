// Root filesystems made from Debian's packages, for images a newcomer can
// build without Docker or a registry: debootstrap of a suite with extra
// packages, kept in a cache (one tree per suite, architecture, variant and
// package set), so the second build of the same image is a pack, not a
// download. dsec-image build --debian bookworm --packages python3,git NAME;
// E2B's `base` template (docs/e2b.md): --packages python3,git,curl,sudo,
// ca-certificates --user user base.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dsec/status.hpp"

namespace dsec::images {

struct DebianOptions {
  std::string suite = "bookworm";
  std::vector<std::string> packages;    // beyond the variant's
  std::string variant = "minbase";      // debootstrap --variant
  std::string mirror = "http://deb.debian.org/debian";
  // Users made in the tree (uid 1000, 1001, ... in order; a group of their
  // own, home /home/<name>, bash; with sudo installed, passwordless sudo),
  // as E2B's templates have `user`.
  std::vector<std::string> users;
  // Where trees are kept: $DSEC_DEBIAN_CACHE, else /var/cache/dsec/debian.
  std::string cache_dir;
  std::function<void(const std::string&)> progress;
};

// The cache's tree for these options, made now if it is not there
// (debootstrap, as root; package caches and lists removed). Its path.
// Unavailable when debootstrap is missing (apt-get install debootstrap),
// Internal with debootstrap's last lines when it fails.
Result<std::string> DebianRootfs(const DebianOptions& options);

// The cache key's name for these options (suite-arch-variant-<hash>).
std::string DebianCacheName(const DebianOptions& options);

}  // namespace dsec::images
