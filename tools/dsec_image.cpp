// dsec-image: build, list, inspect and remove images. An image is an EROFS
// file in <data-dir>/images plus a manifest in the node's `images` table.
// With dsecd running on the data dir, the registry is reached through it
// (SDK); without, dsec-image opens the data dir's database itself.
//
// Exit codes: 0 done; 1 failed (the message says why); 2 bad usage.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <map>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "drivers/images/builder.hpp"
#include "drivers/images/debian.hpp"
#include "drivers/images/image_store.hpp"
#include "dsec/client.hpp"
#include "runtime/files.hpp"
#include "runtime/proto_json.hpp"
#include "state/store.hpp"

namespace {

using dsec::Result;
using dsec::Status;

int Fail(const std::string& msg, int code = 1) {
  std::fprintf(stderr, "dsec-image: %s\n", msg.c_str());
  return code;
}

// Where the manifests are: the daemon, or the data dir's database.
class Registry {
 public:
  virtual ~Registry() = default;
  virtual Status Register(const dsec::v1::ImageManifest& m, bool replace) = 0;
  virtual Result<dsec::v1::ImageManifest> Get(const std::string& name) = 0;
  virtual Result<std::vector<dsec::v1::ImageManifest>> List() = 0;
  virtual Status Remove(const std::string& name) = 0;
};

class OfflineRegistry : public Registry {
 public:
  OfflineRegistry(std::unique_ptr<dsec::state::Store> db, std::string root)
      : db_(std::move(db)), store_(db_.get(), std::move(root)) {}
  Status Register(const dsec::v1::ImageManifest& m, bool replace) override { return store_.Register(m, replace); }
  Result<dsec::v1::ImageManifest> Get(const std::string& name) override { return store_.Get(name); }
  Result<std::vector<dsec::v1::ImageManifest>> List() override { return store_.List(); }
  Status Remove(const std::string& name) override { return store_.Remove(name); }

 private:
  std::unique_ptr<dsec::state::Store> db_;
  dsec::images::ImageStore store_;
};

class OnlineRegistry : public Registry {
 public:
  explicit OnlineRegistry(std::unique_ptr<dsec::Client> c) : c_(std::move(c)) {}
  Status Register(const dsec::v1::ImageManifest& m, bool replace) override {
    return c_->RegisterImage(m, replace).status();
  }
  Result<dsec::v1::ImageManifest> Get(const std::string& name) override { return c_->GetImage(name); }
  Result<std::vector<dsec::v1::ImageManifest>> List() override { return c_->ListImages(); }
  Status Remove(const std::string& name) override { return c_->RemoveImage(name); }

 private:
  std::unique_ptr<dsec::Client> c_;
};

Result<std::unique_ptr<Registry>> OpenRegistry(const std::string& data, const std::string& addr_flag) {
  auto db = dsec::state::OpenRocksStore(data + "/db");
  if (db.ok()) return std::unique_ptr<Registry>(new OfflineRegistry(std::move(*db), data + "/images"));
  if (db.status().code() != Status::Code::kFailedPrecondition) return db.status();
  // The database is held: dsecd runs on this data dir. Talk to it.
  dsec::ClientOptions o;
  o.address = addr_flag;  // empty: $DSEC_ADDR, else <data>/dsecd.json
  o.data_dir = data;
  o.threads = 1;
  auto c = dsec::Client::Connect(o);
  if (!c.ok()) return c.status();
  return std::unique_ptr<Registry>(new OnlineRegistry(std::move(*c)));
}

std::string Human(uint64_t bytes) {
  char buf[32];
  if (bytes >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.1fG", bytes / double(1ull << 30));
  else if (bytes >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.1fM", bytes / double(1ull << 20));
  else std::snprintf(buf, sizeof buf, "%.1fK", bytes / 1024.0);
  return buf;
}

std::string ToJson(const google::protobuf::Message& m) { return dsec::DumpJson(dsec::ProtoJson(m), 2) + "\n"; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dsec-image: build, list, inspect and remove dsec images (EROFS)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", DSEC_VERSION);
  const char* env_data = std::getenv("DSEC_DATA_DIR");
  std::string data = env_data && *env_data ? env_data : "./dsec-data", addr;
  app.add_option("--data-dir", data, "the node's data dir; images go to <data-dir>/images ($DSEC_DATA_DIR)")
      ->capture_default_str();
  app.add_option("--addr", addr,
                 "dsecd SDK address (default: $DSEC_ADDR, else <data-dir>/dsecd.json when it runs)");

  std::string src, name, compression = "lz4";
  bool keep_owners = false, replace = false, git_scrub = false, no_git_watch = false;
  dsec::images::DebianOptions deb;
  std::string deb_suite;
  auto* build = app.add_subcommand(
      "build",
      "build an image from a directory, a tarball or an OCI/docker-save layout; or, with --debian, from "
      "Debian's packages (dsec-image build --debian bookworm --packages python3,git py311)");
  build->add_option("source", src,
                    "directory, tarball (.tar, .tar.gz, ...), OCI layout or docker-save archive; with --debian, "
                    "leave it out")
      ->required();
  build->add_option("name", name, "image name: lowercase letters, digits, . _ -");
  build->add_option("--debian", deb_suite,
                    "make the tree with debootstrap from Debian's packages: this suite (bookworm, trixie, ...); "
                    "kept in a cache, so the same image again is only packed");
  build->add_option("--packages", deb.packages, "with --debian: packages beyond the variant's, comma-separated")
      ->delimiter(',');
  build->add_option("--user", deb.users,
                    "with --debian: make these users, comma-separated (uid 1000, 1001, ...; home /home/NAME, bash; "
                    "passwordless sudo when sudo is installed); E2B's base template: --user user")
      ->delimiter(',');
  build->add_option("--variant", deb.variant, "with --debian: debootstrap --variant")->capture_default_str();
  build->add_option("--mirror", deb.mirror, "with --debian: the Debian mirror")->capture_default_str();
  build->add_option("--cache-dir", deb.cache_dir,
                    "with --debian: where trees are kept ($DSEC_DEBIAN_CACHE, else /var/cache/dsec/debian)");
  build->add_option("--compress", compression, "none | lz4 | lz4hc")->capture_default_str();
  build->add_flag("--keep-owners", keep_owners, "directory sources: keep file owners (default: all root)");
  build->add_flag("--replace", replace, "replace an existing, unused image of that name");
  build->add_flag("--git-scrub", git_scrub,
                  "git repositories in the tree keep only the history reachable from their checked-out commit (no "
                  "later commits, branches or tags past it, stashes, remote-tracking refs, reflogs or unreachable "
                  "objects); prints what it removed. A directory source is copied, never changed");
  build->add_flag("--no-git-watch", no_git_watch,
                  "without --git-scrub, each repository's files that hold only history past its checked-out commit "
                  "are watched: a session flags a sandbox's read of one (watched_read). This leaves them unwatched");

  std::string push_file;
  auto* push = app.add_subcommand(
      "push", "register an EROFS image file made elsewhere (checked: an EROFS superblock, not truncated); on a "
              "controller, its nodes then take it on demand (docs/images.md)");
  push->add_option("file", push_file, "the EROFS file")->required();
  push->add_option("name", name, "image name: lowercase letters, digits, . _ -")->required();
  push->add_flag("--replace", replace, "replace an existing, unused image of that name");

  bool json_out = false;
  auto* ls = app.add_subcommand("ls", "list images");
  ls->add_flag("--json", json_out, "one JSON object per image");
  std::vector<std::string> names;
  auto* rm = app.add_subcommand("rm", "remove images (refused while a sandbox uses one)");
  rm->add_option("names", names, "image names (dsec-image ls lists them)")->required();
  std::string one;
  auto* inspect = app.add_subcommand("inspect", "show an image's manifest");
  inspect->add_option("name", one, "an image name (dsec-image ls lists them)")->required();

  std::string guest_dir;
  auto* guest = app.add_subcommand(
      "guest",
      "prepare the guest of the microvm and vm kinds: a kernel from Debian's linux-image-cloud-amd64 package "
      "(apt-get download) and an initramfs (busybox, the modules it needs, /init), in <data-dir>/guest");
  guest->add_option("--dir", guest_dir, "prepare it here instead (dsecd --guest-dir DIR)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  // Usage errors before anything touches the data dir.
  if (*build) {
    // With --debian there is one positional: the name.
    if (!deb_suite.empty()) {
      if (!name.empty()) return Fail("with --debian, give only the image name (the tree comes from Debian)", 2);
      name = src;
      src.clear();
    } else if (name.empty()) {
      return Fail("build needs SOURCE NAME (or --debian SUITE NAME)", 2);
    }
  }
  data = dsec::AbsolutePath(data);
  if (*guest) {
    // tools/guest/dsec-guest-build, installed next to this binary.
    std::string script = dsec::SiblingExecutable("DSEC_GUEST_BUILD", "dsec-guest-build");
    std::string dir = dsec::AbsolutePath(guest_dir.empty() ? data + "/guest" : guest_dir);
    if (::access(script.c_str(), X_OK) != 0) return Fail("the guest builder is missing: " + script);
    ::execl(script.c_str(), script.c_str(), dir.c_str(), static_cast<char*>(nullptr));
    return Fail("run " + script + ": " + std::strerror(errno));
  }
  if (auto st = dsec::MakeDirs(data, 0700); !st.ok()) return Fail(st.message());
  auto reg = OpenRegistry(data, addr);
  if (!reg.ok()) return Fail(reg.status().message());
  auto& r = **reg;

  if (*push || *build) {
    const char* verb = *push ? "push" : "build";
    if (auto st = dsec::images::CheckImageName(name); !st.ok()) return Fail(st.message(), 2);
    auto existing = r.Get(name);
    if (existing.ok() && !replace)
      return Fail("image '" + name + "' already exists (digest " + existing->digest() + "); remove it first (dsec-image rm " +
                  name + ") or " + verb + " with --replace");
    dsec::Result<dsec::v1::ImageManifest> m = dsec::Status::Internal("no image made");
    if (*push) {
      m = dsec::images::PushImage(dsec::AbsolutePath(push_file), name, data + "/images");
    } else {
      dsec::images::BuildOptions o;
      o.compression = compression;
      o.keep_owners = keep_owners;
      o.git_scrub = git_scrub;
      o.git_watch = !no_git_watch;
      o.progress = [](const std::string& s) { std::fprintf(stderr, "dsec-image: %s\n", s.c_str()); };
      if (!deb_suite.empty()) {
        deb.suite = deb_suite;
        deb.progress = o.progress;
        auto tree = dsec::images::DebianRootfs(deb);
        if (!tree.ok()) return Fail(tree.status().message());
        src = *tree;
        o.keep_owners = true;  // the tree's owners are Debian's (root, _apt, man, ...)
      }
      m = dsec::images::BuildImage(src, name, data + "/images", o);
    }
    if (!m.ok()) return Fail(m.status().message());
    if (auto st = r.Register(*m, replace); !st.ok()) {
      // Do not leave an orphan file behind unless another image shares it.
      bool shared = false;
      if (auto all = r.List(); all.ok())
        for (const auto& other : *all) shared = shared || other.digest() == m->digest();
      if (!shared) ::unlink(m->file().c_str());
      return Fail(st.message());
    }
    std::printf("%s %s %s\n", name.c_str(), m->digest().c_str(), Human(m->size_bytes()).c_str());
    return 0;
  }
  if (*ls) {
    auto all = r.List();
    if (!all.ok()) return Fail(all.status().message());
    if (json_out) {
      for (const auto& m : *all) {
        std::printf("%s\n", dsec::DumpJson(dsec::ProtoJson(m)).c_str());
      }
      return 0;
    }
    // HERE: "local" (the whole file is on this dsecd), or how much of a
    // lazy image this node's chunk cache holds (docs/images.md).
    std::printf("%-24s %-20s %8s %8s %12s  %s\n", "NAME", "DIGEST", "SIZE", "CONTENT", "HERE", "SOURCE");
    for (const auto& m : *all) {
      std::string here = "local";
      if (m.lazy())
        here = "lazy " + std::to_string(m.size_bytes() ? m.cached_bytes() * 100 / m.size_bytes() : 0) + "%";
      std::printf("%-24s %-20s %8s %8s %12s  %s\n", m.name().c_str(), m.digest().substr(0, 19).c_str(),
                  Human(m.size_bytes()).c_str(), Human(m.content_bytes()).c_str(), here.c_str(), m.source().c_str());
      // On a controller: what each node that took it lazily holds of it.
      std::map<std::string, uint64_t> on(m.cached_on().begin(), m.cached_on().end());
      for (const auto& [node, bytes] : on)
        std::printf("  on %s: %s cached (%llu%%)\n", node.c_str(), Human(bytes).c_str(),
                    static_cast<unsigned long long>(m.size_bytes() ? bytes * 100 / m.size_bytes() : 0));
    }
    return 0;
  }
  if (*rm) {
    int rc = 0;
    for (const auto& n : names) {
      auto st = r.Remove(n);
      if (!st.ok()) rc = Fail(st.message());
      else std::printf("%s\n", n.c_str());
    }
    return rc;
  }
  if (*inspect) {
    auto m = r.Get(one);
    if (!m.ok()) return Fail(m.status().message());
    std::cout << ToJson(*m);
    return 0;
  }
  return 0;
}
