// The fixture of the image builder and image store tests: a scratch dir,
// sources made in it (trees, tarballs, OCI and docker-save layouts), a build
// and the image read back as a tree.
#pragma once

#include <gmock/gmock.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "drivers/images/builder.hpp"
#include "drivers/images/image_store.hpp"
#include "state/store.hpp"
#include "state/table.hpp"
#include "tests/integration/images/image_support.hpp"

namespace dsec::testing {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using img::Tree;
using nlohmann::json;
using Code = Status::Code;

class ImageBuilderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = img::SkipReason(); !why.empty()) GTEST_SKIP() << why;
    base_ = img::MakeTempDir();
    ASSERT_FALSE(base_.empty()) << "mkdtemp: " << std::strerror(errno);
    root_ = base_ + "/images";
    char cwd[4096];
    ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
    cwd_ = cwd;
  }
  void TearDown() override {
    if (base_.empty()) return;
    img::RemoveAll(base_);
    // Unpack works from the unpack dir; it must always go back.
    char cwd[4096];
    ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
    EXPECT_EQ(cwd, cwd_);
  }

  Result<v1::ImageManifest> Build(const std::string& source, const std::string& name,
                                  images::BuildOptions o = {}) {
    return images::BuildImage(source, name, root_, o);
  }
  Tree Contents(const v1::ImageManifest& m, std::map<std::string, std::string>* owners = nullptr) {
    return img::ImageContents(m.file(), base_ + "/extract", owners);
  }
  // A failed or finished build leaves only image files in the store root.
  void ExpectOnlyImages(size_t images) {
    size_t n = 0;
    for (const auto& f : img::Ls(root_)) {
      EXPECT_EQ(f.rfind(".build-", 0), std::string::npos) << "scratch left behind: " << root_ << "/" << f;
      n += f.size() > 6 && f.compare(f.size() - 6, 6, ".erofs") == 0;
    }
    EXPECT_EQ(n, images) << "in " << root_;
  }
  // `tar` of everything in `dir`, sorted by name; `flags` pick compression.
  std::string TarOf(const std::string& dir, const std::string& out, std::vector<std::string> flags = {}) {
    std::vector<std::string> args = {"--sort=name", "-C", dir, "-cf", out};
    args.insert(args.end(), flags.begin(), flags.end());
    args.push_back(".");
    auto r = img::Run("tar", args);
    EXPECT_EQ(r.exit_code, 0) << "tar " << out << ": " << r.err;
    return out;
  }

  // Adds `content` to <layout>/blobs/sha256 named by its digest.
  json AddBlob(const std::string& layout, const std::string& media_type, const std::string& content) {
    std::string tmp = layout + "/blob.tmp";
    img::Put(tmp, content);
    auto digest = images::Sha256File(tmp);
    EXPECT_TRUE(digest.ok()) << digest.status().ToString();
    std::string hex = digest->substr(std::string("sha256:").size());
    EXPECT_EQ(::rename(tmp.c_str(), (layout + "/blobs/sha256/" + hex).c_str()), 0);
    return json{{"mediaType", media_type}, {"digest", *digest}, {"size", content.size()}};
  }
  // An image manifest (with a config) listing `layers` (files, bottom first).
  json AddImage(const std::string& layout, const std::vector<std::string>& layers) {
    json manifest = {{"schemaVersion", 2}, {"mediaType", "application/vnd.oci.image.manifest.v1+json"}};
    json diff_ids = json::array();
    for (const auto& l : layers) {
      bool gz = l.size() > 3 && l.compare(l.size() - 3, 3, ".gz") == 0;
      json d = AddBlob(layout, gz ? "application/vnd.oci.image.layer.v1.tar+gzip"
                                  : "application/vnd.oci.image.layer.v1.tar",
                       img::Slurp(l));
      manifest["layers"].push_back(d);
      diff_ids.push_back(d["digest"]);
    }
    json config = {{"architecture", "amd64"}, {"os", "linux"}, {"rootfs", {{"type", "layers"}, {"diff_ids", diff_ids}}}};
    manifest["config"] = AddBlob(layout, "application/vnd.oci.image.config.v1+json", config.dump());
    json d = AddBlob(layout, "application/vnd.oci.image.manifest.v1+json", manifest.dump());
    d["platform"] = {{"architecture", "amd64"}, {"os", "linux"}};
    return d;
  }
  // An OCI image layout at `layout` whose index lists `manifests`.
  void WriteIndex(const std::string& layout, const json& manifests) {
    img::Put(layout + "/index.json", json{{"schemaVersion", 2}, {"manifests", manifests}}.dump());
    img::Put(layout + "/oci-layout", R"({"imageLayoutVersion":"1.0.0"})");
  }
  std::string NewLayout(const std::string& name) {
    std::string layout = base_ + "/" + name;
    img::Dir(layout);
    img::Dir(layout + "/blobs");
    img::Dir(layout + "/blobs/sha256");
    return layout;
  }
  std::string OciLayout(const std::string& name, const std::vector<std::string>& layers) {
    std::string layout = NewLayout(name);
    WriteIndex(layout, json::array({AddImage(layout, layers)}));
    return layout;
  }

  // Three layer trees. Layer 2 deletes a file and a directory of layer 1,
  // makes /opt opaque (its lower content goes, its own new file stays) and
  // changes a file; layer 3 deletes a file in a directory layer 1 made and
  // brings back a name layer 2 deleted. Returns the final tree.
  Tree MakeLayerDirs() {
    std::string l = base_ + "/layers";
    img::Dir(l);
    for (const char* d : {"/1", "/2", "/3"}) img::Dir(l + d);
    img::Dir(l + "/1/etc");
    img::Put(l + "/1/etc/hostname", "layer1\n");
    img::Put(l + "/1/etc/passwd", "root:x:0:0::/root:/bin/sh\n");
    img::Dir(l + "/1/opt");
    img::Put(l + "/1/opt/old1", "old 1\n");
    img::Dir(l + "/1/opt/sub");
    img::Put(l + "/1/opt/sub/old2", "old 2\n");
    img::Dir(l + "/1/keep");
    img::Put(l + "/1/keep/k", "k\n");
    img::Put(l + "/1/keep/k1", "k1\n");
    img::Put(l + "/1/gone.txt", "bye\n");
    img::Dir(l + "/1/gonedir");
    img::Put(l + "/1/gonedir/x", "x\n");
    img::Dir(l + "/1/usr");
    img::Dir(l + "/1/usr/bin");
    img::Put(l + "/1/usr/bin/sh", "not really a shell\n", 0755);
    (void)::symlink("usr/bin", (l + "/1/bin").c_str());

    img::Put(l + "/2/.wh.gone.txt", "");
    img::Put(l + "/2/.wh.gonedir", "");
    img::Dir(l + "/2/opt");
    img::Put(l + "/2/opt/.wh..wh..opq", "");
    img::Put(l + "/2/opt/new", "new in layer 2\n");
    img::Dir(l + "/2/etc");
    img::Put(l + "/2/etc/hostname", "layer2\n");

    img::Dir(l + "/3/keep");
    img::Put(l + "/3/keep/.wh.k", "");
    img::Put(l + "/3/keep/k3", "k3\n", 0600);
    img::Put(l + "/3/gone.txt", "back in layer 3\n");
    return Tree{
        {"bin", "link -> usr/bin"},
        {"etc", "dir 0755"},
        {"etc/hostname", "file 0644 layer2\n"},
        {"etc/passwd", "file 0644 root:x:0:0::/root:/bin/sh\n"},
        {"gone.txt", "file 0644 back in layer 3\n"},
        {"keep", "dir 0755"},
        {"keep/k1", "file 0644 k1\n"},
        {"keep/k3", "file 0600 k3\n"},
        {"opt", "dir 0755"},
        {"opt/new", "file 0644 new in layer 2\n"},
        {"usr", "dir 0755"},
        {"usr/bin", "dir 0755"},
        {"usr/bin/sh", "file 0755 not really a shell\n"},
    };
  }
  // The layer trees as tarballs: gzip (OCI) or plain (`docker save`).
  std::vector<std::string> LayerTars(bool gzip) {
    std::vector<std::string> out;
    for (const char* n : {"1", "2", "3"}) {
      std::string f = base_ + "/layer" + n + (gzip ? ".tar.gz" : ".tar");
      out.push_back(TarOf(base_ + "/layers/" + n, f, gzip ? std::vector<std::string>{"-z"} : std::vector<std::string>{}));
    }
    return out;
  }
  // A `docker save` layout: <hex>/layer.tar per layer and a manifest.json.
  std::string DockerLayout(const std::vector<std::string>& layers) {
    std::string layout = base_ + "/docker";
    img::Dir(layout);
    json paths = json::array();
    for (const auto& l : layers) {
      std::string hex = images::Sha256File(l)->substr(7);
      img::Dir(layout + "/" + hex);
      img::Put(layout + "/" + hex + "/layer.tar", img::Slurp(l));
      paths.push_back(hex + "/layer.tar");
    }
    img::Put(layout + "/config.json", R"({"architecture":"amd64","os":"linux"})");
    img::Put(layout + "/manifest.json",
             json::array({{{"Config", "config.json"}, {"RepoTags", {"test:latest"}}, {"Layers", paths}}}).dump());
    return layout;
  }

  std::string base_, root_, cwd_;
};

inline uint64_t ContentBytes(const Tree& t) {
  uint64_t n = 0;
  for (const auto& [path, what] : t)
    if (what.rfind("file ", 0) == 0) n += what.size() - std::string("file 0644 ").size();
  return n;
}

}  // namespace dsec::testing
