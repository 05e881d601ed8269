// The image builder against real sources: directories, tarballs (plain, gzip,
// zstd), OCI image layouts and `docker save` layouts (as directories and as
// tarballs), each image read back with `fsck.erofs --extract` and compared
// with what the source says. Hostile archives (climbing out, absolute names,
// writing or whiting out through a symlink, hard links to host files) must
// leave everything outside the unpack tree alone; bad input gets an error
// naming what is wrong.
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
namespace {

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

uint64_t ContentBytes(const Tree& t) {
  uint64_t n = 0;
  for (const auto& [path, what] : t)
    if (what.rfind("file ", 0) == 0) n += what.size() - std::string("file 0644 ").size();
  return n;
}

// --- directories and tarballs ---------------------------------------------------

TEST_F(ImageBuilderTest, DirectoryIsPackedAsIsAndOwnedByRootByDefault) {
  std::string src = base_ + "/src";
  Tree want = img::MakeRootfs(src);
  ASSERT_EQ(img::Snapshot(src), want);
  ASSERT_EQ(::chown((src + "/etc/hostname").c_str(), 1234, 1234), 0);
  std::vector<std::string> progress;
  images::BuildOptions o;
  o.progress = [&](const std::string& s) { progress.push_back(s); };
  auto m = Build(src, "rootfs", o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();

  EXPECT_EQ(m->name(), "rootfs");
  EXPECT_EQ(m->source(), "dir:" + src);
  EXPECT_EQ(m->compression(), "lz4");
  EXPECT_THAT(m->digest(), StartsWith("sha256:"));
  EXPECT_EQ(m->file(), images::ImageFilePath(root_, m->digest()));
  auto digest = images::Sha256File(m->file());
  ASSERT_TRUE(digest.ok());
  EXPECT_EQ(*digest, m->digest());
  struct stat st;
  ASSERT_EQ(::stat(m->file().c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), m->size_bytes());
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  EXPECT_GE(m->files(), want.size());
  EXPECT_EQ(m->content_bytes(), ContentBytes(want));
  EXPECT_GT(m->created_ms(), 0);
  EXPECT_FALSE(progress.empty());

  std::map<std::string, std::string> owners;
  EXPECT_EQ(Contents(*m, &owners), want);
  ASSERT_EQ(owners.size(), want.size());
  for (const auto& [path, owner] : owners) EXPECT_EQ(owner, "0:0") << path;
  // The source is left as it was.
  EXPECT_EQ(img::Snapshot(src), want);
  ExpectOnlyImages(1);
}

TEST_F(ImageBuilderTest, DirectoryWithKeepOwnersKeepsThem) {
  std::string src = base_ + "/src";
  Tree want = img::MakeRootfs(src);
  ASSERT_EQ(::chown((src + "/etc/hostname").c_str(), 1234, 1234), 0);
  ASSERT_EQ(::chown((src + "/empty").c_str(), 1234, 5678), 0);
  ASSERT_EQ(::lchown((src + "/tool-link").c_str(), 4321, 4321), 0);
  images::BuildOptions o;
  o.keep_owners = true;
  auto m = Build(src, "owned", o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::map<std::string, std::string> owners;
  EXPECT_EQ(Contents(*m, &owners), want);
  for (const auto& [path, owner] : owners) {
    if (path == "etc/hostname") EXPECT_EQ(owner, "1234:1234");
    else if (path == "empty") EXPECT_EQ(owner, "1234:5678");
    else if (path == "tool-link") EXPECT_EQ(owner, "4321:4321");
    else EXPECT_EQ(owner, "0:0") << path;
  }
}

TEST_F(ImageBuilderTest, TarballsPlainGzipAndZstdKeepTheirOwners) {
  std::string src = base_ + "/src";
  Tree want = img::MakeRootfs(src);
  ASSERT_EQ(::chown((src + "/bin/tool").c_str(), 1234, 1234), 0);
  struct Case {
    const char* file;
    std::vector<std::string> flags;
  };
  int n = 0;
  for (const Case& c : {Case{"rootfs.tar", {}}, Case{"rootfs.tar.gz", {"-z"}}, Case{"rootfs.tar.zst", {"--zstd"}}}) {
    SCOPED_TRACE(c.file);
    std::string tarball = TarOf(src, base_ + "/" + c.file, c.flags);
    auto m = Build(tarball, "tar-" + std::to_string(++n));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->source(), "tar:" + tarball);
    EXPECT_EQ(m->content_bytes(), ContentBytes(want));
    std::map<std::string, std::string> owners;
    EXPECT_EQ(Contents(*m, &owners), want);
    for (const auto& [path, owner] : owners) EXPECT_EQ(owner, path == "bin/tool" ? "1234:1234" : "0:0") << path;
    ExpectOnlyImages(static_cast<size_t>(n));
  }
}

TEST_F(ImageBuilderTest, RootfsWithManifestOrIndexFilesIsStillARootfs) {
  // An app that keeps a manifest.json (or index.json + blobs/) at / is not an
  // image layout: a directory with usr/, etc/, bin/ ... is packed as is.
  std::string src = base_ + "/src";
  img::MakeRootfs(src);
  img::Put(src + "/manifest.json", R"({"app":"not a docker manifest"})");
  img::Put(src + "/index.json", "{}");
  img::Dir(src + "/blobs");
  img::Put(src + "/oci-layout", "{}");
  Tree want = img::Snapshot(src);
  auto m = Build(src, "app-dir");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->source(), "dir:" + src);
  EXPECT_EQ(Contents(*m), want);
  std::string tarball = TarOf(src, base_ + "/app.tar", {});
  auto t = Build(tarball, "app-tar");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->source(), "tar:" + tarball);
  EXPECT_EQ(Contents(*t), want);
}

TEST_F(ImageBuilderTest, CompressionVariantsHoldTheSameTree) {
  std::string src = base_ + "/src";
  Tree want = img::MakeRootfs(src);
  std::map<std::string, uint64_t> size;
  for (const char* c : {"none", "lz4", "lz4hc"}) {
    SCOPED_TRACE(c);
    images::BuildOptions o;
    o.compression = c;
    auto m = Build(src, std::string("z-") + c, o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->compression(), c);
    EXPECT_EQ(Contents(*m), want);
    size[c] = m->size_bytes();
  }
  // big.txt is 256 KiB of repeated lines: both lz4 kinds must shrink it.
  EXPECT_LT(size["lz4"], size["none"]);
  EXPECT_LT(size["lz4hc"], size["none"]);
  EXPECT_GT(size["none"], 256u << 10);
}

// --- OCI and docker-save layouts ---------------------------------------------------

TEST_F(ImageBuilderTest, OciLayoutAppliesLayersAndWhiteouts) {
  Tree want = MakeLayerDirs();
  std::string layout = OciLayout("oci", LayerTars(true));
  std::vector<std::string> progress;
  images::BuildOptions o;
  o.progress = [&](const std::string& s) { progress.push_back(s); };
  auto m = Build(layout, "oci-dir", o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->source(), "oci:" + layout);
  EXPECT_EQ(Contents(*m), want);
  EXPECT_THAT(progress, ::testing::Contains(HasSubstr("applying layer 3/3")));
  ExpectOnlyImages(1);
}

TEST_F(ImageBuilderTest, OciLayoutAsOneTarball) {
  Tree want = MakeLayerDirs();
  std::string layout = OciLayout("oci", LayerTars(true));
  std::string tarball = TarOf(layout, base_ + "/oci.tar");
  auto m = Build(tarball, "oci-tar");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->source(), "oci:" + tarball);
  EXPECT_EQ(Contents(*m), want);
  ExpectOnlyImages(1);
}

TEST_F(ImageBuilderTest, OciIndexOfIndexesPicksLinuxAmd64) {
  Tree want = MakeLayerDirs();
  auto layers = LayerTars(true);
  std::string layout = NewLayout("oci");
  json amd64 = AddImage(layout, layers);
  json arm64 = AddImage(layout, {layers[0]});  // a different tree: layer 1 only
  arm64["platform"] = {{"architecture", "arm64"}, {"os", "linux"}};
  json inner = {{"schemaVersion", 2},
                {"mediaType", "application/vnd.oci.image.index.v1+json"},
                {"manifests", json::array({arm64, amd64})}};
  WriteIndex(layout, json::array({AddBlob(layout, "application/vnd.oci.image.index.v1+json", inner.dump())}));
  auto m = Build(layout, "multi");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(Contents(*m), want);
}

TEST_F(ImageBuilderTest, DockerSaveLayoutAsDirectoryAndTarball) {
  Tree want = MakeLayerDirs();
  std::string layout = DockerLayout(LayerTars(false));
  auto m = Build(layout, "docker-dir");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->source(), "docker:" + layout);
  EXPECT_EQ(Contents(*m), want);

  std::string tarball = TarOf(layout, base_ + "/docker.tar");
  m = Build(tarball, "docker-tar");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->source(), "docker:" + tarball);
  EXPECT_EQ(Contents(*m), want);
  ExpectOnlyImages(2);
}

// --- hostile archives -------------------------------------------------------------
// Unpacked into <base>/u/root, so anything landing beside it in <base>/u, in
// <base>/host or in /tmp got out.

class HostileArchive : public ImageBuilderTest {
 protected:
  void SetUp() override {
    ImageBuilderTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    img::Dir(base_ + "/u");
    dest_ = base_ + "/u/root";
    img::Dir(dest_);
    host_ = base_ + "/host";
    img::Dir(host_);
    tmp_name_ = "/tmp/dsec-test-img-escape-" + RandomHex(12);
  }
  void TearDown() override {
    if (!tmp_name_.empty()) {
      EXPECT_FALSE(img::PathExists(tmp_name_)) << "an archive wrote " << tmp_name_;
      img::RemoveAll(tmp_name_);
    }
    ImageBuilderTest::TearDown();
  }
  Status Unpack(const img::TarWriter& t, bool whiteouts = false) {
    std::string archive = base_ + "/layer-" + std::to_string(++archives_) + ".tar";
    t.WriteTo(archive);
    return images::Unpack(archive, dest_, whiteouts);
  }
  void ExpectNothingBeside() { EXPECT_EQ(img::Ls(base_ + "/u"), std::vector<std::string>{"root"}); }

  std::string dest_, host_, tmp_name_;
  int archives_ = 0;
};

TEST_F(HostileArchive, MembersClimbingOutAreRefusedByName) {
  std::string deep;
  for (int i = 0; i < 16; ++i) deep += "../";
  deep += tmp_name_.substr(1);
  for (const std::string& evil : {std::string("../escape"), std::string("a/../../escape"), deep}) {
    for (bool whiteouts : {false, true}) {
      SCOPED_TRACE(evil + (whiteouts ? " (layer)" : " (tarball)"));
      Status st = Unpack(img::TarWriter().File("ok.txt", "ok\n").File(evil, "out\n"), whiteouts);
      EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
      EXPECT_THAT(st.message(), HasSubstr("'" + evil + "'"));
      ExpectNothingBeside();
    }
  }
  // Through the builder: the same error, and no scratch or image left.
  std::string tarball = base_ + "/climb.tar";
  img::TarWriter().File("ok.txt", "ok\n").File("../escape", "out\n").WriteTo(tarball);
  auto m = Build(tarball, "climb");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("'../escape'"));
  ExpectOnlyImages(0);
}

TEST_F(HostileArchive, AbsoluteMembersStayInsideTheTree) {
  Status st = Unpack(img::TarWriter().File(tmp_name_, "abs\n").File(host_ + "/abs", "abs\n"));
  if (st.ok()) {
    EXPECT_EQ(img::Slurp(dest_ + tmp_name_), "abs\n");
    EXPECT_EQ(img::Slurp(dest_ + host_ + "/abs"), "abs\n");
  } else {
    EXPECT_THAT(st.message(), HasSubstr(tmp_name_));
  }
  EXPECT_TRUE(img::Ls(host_).empty());
  ExpectNothingBeside();
}

TEST_F(HostileArchive, NothingIsWrittenThroughASymlink) {
  // One archive: a link out, then members through it and onto it.
  auto one = img::TarWriter()
                 .Symlink("last", host_ + "/last-file")
                 .File("last", "replaced\n")
                 .Symlink("evil", host_)
                 .Symlink("evil2", "../../host")
                 .File("evil/pwned", "p\n");
  Status st = Unpack(one);
  // Refused, or the link replaced by a real directory (libarchive's
  // ARCHIVE_EXTRACT_UNLINK): either way the file lands inside.
  if (st.ok()) EXPECT_EQ(img::Slurp(dest_ + "/evil/pwned"), "p\n");
  else EXPECT_THAT(st.message(), HasSubstr("'evil/pwned'"));
  EXPECT_EQ(img::Slurp(dest_ + "/last"), "replaced\n");
  EXPECT_TRUE(img::Ls(host_).empty()) << "written through a symlink: " << ::testing::PrintToString(img::Ls(host_));

  // Two layers: the link comes in layer 1, the write in layer 2.
  img::RemoveAll(dest_);
  img::Dir(dest_);
  ASSERT_TRUE(Unpack(img::TarWriter().Symlink("evil", host_).Symlink("evil2", "../../host"), true).ok());
  st = Unpack(img::TarWriter().File("evil2/pwned2", "p\n").File("evil/pwned", "p\n"), true);
  if (st.ok()) EXPECT_EQ(img::Slurp(dest_ + "/evil/pwned"), "p\n");
  else EXPECT_THAT(st.message(), HasSubstr("'evil2/pwned2'"));
  EXPECT_TRUE(img::Ls(host_).empty()) << "written through a symlink: " << ::testing::PrintToString(img::Ls(host_));
  ExpectNothingBeside();
}

TEST_F(HostileArchive, NothingIsWrittenThroughASymlinkOfAnEarlierOciLayer) {
  std::string l1 = base_ + "/l1.tar", l2 = base_ + "/l2.tar";
  img::TarWriter().Directory("etc").File("etc/ok", "ok\n").Symlink("evil", host_).WriteTo(l1);
  img::TarWriter().File("evil/pwned", "p\n").WriteTo(l2);
  std::string layout = OciLayout("oci", {l1, l2});
  auto m = Build(layout, "evil");
  if (m.ok()) {
    Tree t = Contents(*m);
    EXPECT_EQ(t["evil/pwned"], "file 0644 p\n");
    EXPECT_EQ(t["etc/ok"], "file 0644 ok\n");
  } else {
    EXPECT_THAT(m.status().message(), HasSubstr("'evil/pwned'"));
    EXPECT_THAT(m.status().message(), HasSubstr("layer 2"));
  }
  EXPECT_TRUE(img::Ls(host_).empty()) << "written through a symlink: " << ::testing::PrintToString(img::Ls(host_));
  ExpectOnlyImages(m.ok() ? 1 : 0);
}

TEST_F(HostileArchive, WhiteoutsDoNotActThroughASymlink) {
  img::Put(host_ + "/victim", "v\n");
  img::Dir(host_ + "/sub");
  img::Put(host_ + "/sub/x", "x\n");
  Tree before = img::Snapshot(host_);
  ASSERT_TRUE(Unpack(img::TarWriter().Symlink("evil", host_).Symlink("evil2", "../../host"), true).ok());
  Status st = Unpack(img::TarWriter()
                         .File("evil/.wh.victim", "")
                         .File("evil/sub/.wh.x", "")
                         .File("evil2/.wh..wh..opq", "")
                         .File("evil2/sub/.wh..wh..opq", ""),
                     true);
  EXPECT_EQ(img::Snapshot(host_), before) << st.ToString();
  // Whiting out the link itself removes the link, not what it points at.
  ASSERT_TRUE(Unpack(img::TarWriter().File(".wh.evil", "").File(".wh.evil2", ""), true).ok());
  EXPECT_FALSE(img::PathExists(dest_ + "/evil"));
  EXPECT_FALSE(img::PathExists(dest_ + "/evil2"));
  EXPECT_EQ(img::Snapshot(host_), before);
}

TEST_F(HostileArchive, WhiteoutsOfDotDotOrNothingAreRefused) {
  for (const std::string& wh : {std::string(".wh..."), std::string("sub/.wh..."), std::string(".wh."),
                                std::string("sub/.wh."), std::string("sub/.wh..")}) {
    SCOPED_TRACE(wh);
    img::RemoveAll(dest_);
    img::Dir(dest_);
    ASSERT_TRUE(Unpack(img::TarWriter().File("a", "A\n").Directory("sub").File("sub/b", "B\n"), true).ok());
    Status st = Unpack(img::TarWriter().File(wh, "").File("c", "C\n"), true);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr("'" + wh + "'"));
    // The lower layer is intact and nothing above the tree was touched.
    EXPECT_EQ(img::Slurp(dest_ + "/a"), "A\n");
    EXPECT_EQ(img::Slurp(dest_ + "/sub/b"), "B\n");
    ExpectNothingBeside();
  }
}

TEST_F(HostileArchive, HardLinksCannotReachOutside) {
  std::string secret = host_ + "/secret";
  img::Put(secret, "HOST SECRET\n", 0600);
  auto links = [&] {
    struct stat st;
    return ::stat(secret.c_str(), &st) == 0 ? st.st_nlink : 0;
  };
  // Climbing out with "..": refused by name.
  Status st = Unpack(img::TarWriter().Hardlink("pw", "../../host/secret"));
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("'pw'"));
  // An absolute target is taken inside the tree, where it does not exist.
  st = Unpack(img::TarWriter().Hardlink("pw2", secret));
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("'pw2'"));
  // Through a symlink of the same archive, and of an earlier layer.
  st = Unpack(img::TarWriter().Symlink("l", host_).Hardlink("pw3", "l/secret"));
  if (!st.ok()) {
    EXPECT_THAT(st.message(), HasSubstr("'pw3'"));
  }
  EXPECT_NE(img::Slurp(dest_ + "/pw3"), "HOST SECRET\n");
  st = Unpack(img::TarWriter().Hardlink("pw4", "l/secret"), true);
  if (!st.ok()) {
    EXPECT_THAT(st.message(), HasSubstr("'pw4'"));
  }
  EXPECT_NE(img::Slurp(dest_ + "/pw4"), "HOST SECRET\n");
  EXPECT_EQ(links(), 1u) << "a hard link to a host file was made";
  EXPECT_EQ(img::Ls(host_), (std::vector<std::string>{"secret"}));
  ExpectNothingBeside();
  // A hard link inside the tree still works.
  img::RemoveAll(dest_);
  img::Dir(dest_);
  ASSERT_TRUE(Unpack(img::TarWriter().File("a", "A\n").Hardlink("b", "a").Hardlink("c", "/a")).ok());
  struct stat sa;
  ASSERT_EQ(::stat((dest_ + "/b").c_str(), &sa), 0);
  EXPECT_EQ(sa.st_nlink, 3u);
  EXPECT_EQ(img::Slurp(dest_ + "/c"), "A\n");
}

// --- bad input --------------------------------------------------------------------

TEST_F(ImageBuilderTest, MissingSourceIsNotFoundNamingIt) {
  std::string missing = base_ + "/no-such-rootfs";
  auto m = Build(missing, "x");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr(missing));
}

TEST_F(ImageBuilderTest, CorruptTarballsCannotBeRead) {
  std::string garbage = base_ + "/garbage.tar";
  std::string text;
  while (text.size() < 8192) text += "this is not a tarball, just text\n";
  img::Put(garbage, text);
  auto m = Build(garbage, "x");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kInvalidArgument) << m.status().ToString();
  EXPECT_THAT(m.status().message(), HasSubstr("cannot read " + garbage));

  // A good tarball cut short in the middle of a member.
  std::string src = base_ + "/src";
  img::MakeRootfs(src);
  std::string whole = img::Slurp(TarOf(src, base_ + "/whole.tar"));
  ASSERT_GT(whole.size(), 64u << 10);
  for (const auto& [file, bytes] : {std::pair<std::string, std::string>{"cut.tar", whole.substr(0, 64 << 10)},
                                    {"cut.tar.gz", ""}}) {
    std::string path = base_ + "/" + file;
    if (bytes.empty()) {
      std::string gz = img::Slurp(TarOf(src, base_ + "/whole.tar.gz", {"-z"}));
      img::Put(path, gz.substr(0, gz.size() / 2));
    } else {
      img::Put(path, bytes);
    }
    SCOPED_TRACE(file);
    m = Build(path, "x");
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), Code::kInvalidArgument) << m.status().ToString();
    EXPECT_THAT(m.status().message(), HasSubstr(path));
  }
  ExpectOnlyImages(0);
}

TEST_F(ImageBuilderTest, BadNameOrCompressionIsInvalidArgument) {
  std::string src = base_ + "/src";
  img::MakeRootfs(src);
  for (const char* name : {"Py311", "host", "-x", "a/b", ""}) {
    auto m = Build(src, name);
    ASSERT_FALSE(m.ok()) << name;
    EXPECT_EQ(m.status().code(), Code::kInvalidArgument) << name;
  }
  images::BuildOptions o;
  o.compression = "zstd";
  auto m = Build(src, "z", o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("'zstd'"));
  ExpectOnlyImages(0);
}

TEST_F(ImageBuilderTest, OciLayoutWithMissingBlobsNamesThem) {
  MakeLayerDirs();
  auto layers = LayerTars(true);
  // index.json names a manifest that is not in blobs/.
  std::string layout = NewLayout("no-manifest");
  std::string ghost = "sha256:" + std::string(64, 'a');
  WriteIndex(layout, json::array({{{"mediaType", "application/vnd.oci.image.manifest.v1+json"},
                                   {"digest", ghost},
                                   {"size", 1234}}}));
  auto m = Build(layout, "x");
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr(std::string(64, 'a')));

  // The manifest is there, one of its layers is not.
  layout = OciLayout("no-layer", layers);
  json manifest = json::parse(img::Slurp(layout + "/index.json"))["manifests"][0];
  json image = json::parse(img::Slurp(layout + "/blobs/sha256/" + manifest["digest"].get<std::string>().substr(7)));
  std::string layer2 = image["layers"][1]["digest"];
  ASSERT_EQ(::unlink((layout + "/blobs/sha256/" + layer2.substr(7)).c_str()), 0);
  m = Build(layout, "x");
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr(layer2));

  // A digest that is a path is not followed.
  layout = NewLayout("path-digest");
  WriteIndex(layout, json::array({{{"digest", "sha256:../../../../etc/passwd"}, {"size", 1}}}));
  m = Build(layout, "x");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kInvalidArgument);

  // docker-save: a layer path climbing out, and a layer that is missing.
  std::string docker = DockerLayout(LayerTars(false));
  json dm = json::parse(img::Slurp(docker + "/manifest.json"));
  json saved = dm;
  dm[0]["Layers"][1] = "../../../../etc/passwd";
  img::Put(docker + "/manifest.json", dm.dump());
  m = Build(docker, "x");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kInvalidArgument);
  saved[0]["Layers"][1] = "feed/layer.tar";
  img::Put(docker + "/manifest.json", saved.dump());
  m = Build(docker, "x");
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("feed/layer.tar"));
  ExpectOnlyImages(0);
}

// --- the image store --------------------------------------------------------------

class ImageStoreTest : public ImageBuilderTest {
 protected:
  void SetUp() override {
    ImageBuilderTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto db = state::OpenRocksStore(base_ + "/db");
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    db_ = std::move(*db);
    store_ = std::make_unique<images::ImageStore>(db_.get(), root_);
    src_ = base_ + "/src";
    img::MakeRootfs(src_);
  }
  void TearDown() override {
    store_.reset();
    db_.reset();
    ImageBuilderTest::TearDown();
  }
  // Builds from the rootfs plus a file `marker` (so each build differs).
  v1::ImageManifest BuildOk(const std::string& name, const std::string& marker = "") {
    if (!marker.empty()) img::Put(src_ + "/marker", marker);
    auto m = Build(src_, name);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? *m : v1::ImageManifest();
  }
  void PutSandbox(const std::string& id, const std::string& image, v1::SandboxPhase phase) {
    v1::SandboxRecord r;
    r.set_id(id);
    r.mutable_spec()->set_image(image);
    r.set_phase(phase);
    state::WriteBatch b;
    state::TypedTable<v1::SandboxRecord>(db_.get(), state::Table::kSandboxes).Put(&b, id, r);
    ASSERT_TRUE(db_->Write(b, true).ok());
  }
  void DeleteSandbox(const std::string& id) {
    state::WriteBatch b;
    b.Delete(state::Table::kSandboxes, id);
    ASSERT_TRUE(db_->Write(b, true).ok());
  }
  std::vector<std::string> Names() {
    std::vector<std::string> out;
    auto all = store_->List();
    EXPECT_TRUE(all.ok()) << all.status().ToString();
    if (all.ok())
      for (const auto& m : *all) out.push_back(m.name());
    return out;
  }

  std::unique_ptr<state::Store> db_;
  std::unique_ptr<images::ImageStore> store_;
  std::string src_;
};

TEST_F(ImageStoreTest, RegisterGetListRemove) {
  auto m = BuildOk("py311");
  ASSERT_TRUE(store_->Register(m, false).ok());
  auto got = store_->Get("py311");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->SerializeAsString(), m.SerializeAsString());
  EXPECT_EQ(Names(), std::vector<std::string>{"py311"});
  ASSERT_TRUE(store_->Remove("py311").ok());
  EXPECT_FALSE(img::PathExists(m.file()));
  EXPECT_TRUE(Names().empty());
  ExpectOnlyImages(0);
}

TEST_F(ImageStoreTest, RegisterChecksTheFile) {
  auto m = BuildOk("tamper");
  // Not where the store keeps that digest.
  auto moved = m;
  moved.set_file(base_ + "/elsewhere.erofs");
  Status st = store_->Register(moved, false);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("is not where the store keeps"));
  // One byte more: the size is wrong.
  std::string bytes = img::Slurp(m.file());
  ASSERT_EQ(bytes.size(), m.size_bytes());
  img::Put(m.file(), bytes + "x");
  st = store_->Register(m, false);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr(std::to_string(bytes.size() + 1) + " bytes, the manifest says " +
                                      std::to_string(bytes.size())));
  // Same size, one byte changed: the digest is wrong.
  std::string flipped = bytes;
  flipped[flipped.size() / 2] = static_cast<char>(~flipped[flipped.size() / 2]);
  img::Put(m.file(), flipped);
  st = store_->Register(m, false);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("has digest sha256:"));
  EXPECT_THAT(st.message(), HasSubstr("the manifest says " + m.digest()));
  // No file at all.
  ASSERT_EQ(::unlink(m.file().c_str()), 0);
  st = store_->Register(m, false);
  EXPECT_EQ(st.code(), Code::kNotFound) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr(m.file()));
  // A bad name never gets in.
  m.set_name("Bad Name");
  EXPECT_EQ(store_->Register(m, false).code(), Code::kInvalidArgument);
  EXPECT_TRUE(Names().empty());
}

TEST_F(ImageStoreTest, TakenNameNeedsReplaceAndReplaceDropsTheOldFile) {
  auto first = BuildOk("py", "one");
  ASSERT_TRUE(store_->Register(first, false).ok());
  auto second = BuildOk("py", "two");
  ASSERT_NE(second.digest(), first.digest());
  Status st = store_->Register(second, false);
  EXPECT_EQ(st.code(), Code::kAlreadyExists) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("'py' already exists"));
  EXPECT_THAT(st.message(), HasSubstr("dsec-image rm"));
  EXPECT_THAT(st.message(), HasSubstr("--replace"));
  EXPECT_EQ(store_->Get("py")->digest(), first.digest());

  ASSERT_TRUE(store_->Register(second, true).ok());
  EXPECT_EQ(store_->Get("py")->digest(), second.digest());
  EXPECT_FALSE(img::PathExists(first.file())) << "the replaced, unshared file is left";
  EXPECT_TRUE(img::PathExists(second.file()));
  ExpectOnlyImages(1);
}

TEST_F(ImageStoreTest, NamesOfTheSameContentShareOneFile) {
  auto alpha = BuildOk("alpha", "shared");
  ASSERT_TRUE(store_->Register(alpha, false).ok());
  auto beta = alpha;
  beta.set_name("beta");
  ASSERT_TRUE(store_->Register(beta, false).ok());
  EXPECT_EQ(Names(), (std::vector<std::string>{"alpha", "beta"}));
  ExpectOnlyImages(1);
  // Replacing alpha keeps the file beta still uses.
  auto other = BuildOk("alpha", "other");
  ASSERT_TRUE(store_->Register(other, true).ok());
  EXPECT_TRUE(img::PathExists(beta.file()));
  ASSERT_TRUE(store_->Remove("alpha").ok());
  EXPECT_FALSE(img::PathExists(other.file()));
  // Put alpha back on the shared file; removing one name keeps it.
  ASSERT_TRUE(store_->Register(alpha, false).ok());
  ASSERT_TRUE(store_->Remove("alpha").ok());
  EXPECT_TRUE(img::PathExists(beta.file()));
  EXPECT_TRUE(store_->Get("beta").ok());
  ASSERT_TRUE(store_->Remove("beta").ok());
  EXPECT_FALSE(img::PathExists(beta.file()));
  ExpectOnlyImages(0);
}

TEST_F(ImageStoreTest, UnknownImageSaysHowToListImages) {
  auto m = store_->Get("nope");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr("'nope'"));
  EXPECT_THAT(m.status().message(), HasSubstr("dsec-image ls"));
  Status st = store_->Remove("nope");
  EXPECT_EQ(st.code(), Code::kNotFound);
  EXPECT_THAT(st.message(), HasSubstr("'nope'"));
}

TEST_F(ImageStoreTest, ImageInUseCannotBeRemovedOrReplaced) {
  auto m = BuildOk("busy");
  ASSERT_TRUE(store_->Register(m, false).ok());
  PutSandbox("sb-img-1", "busy", v1::SANDBOX_PHASE_RUNNING);
  PutSandbox("sb-img-2", "busy", v1::SANDBOX_PHASE_PAUSED);
  PutSandbox("sb-img-3", "busy", v1::SANDBOX_PHASE_STOPPED);
  PutSandbox("sb-img-4", "other", v1::SANDBOX_PHASE_RUNNING);
  Status st = store_->Remove("busy");
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("sandbox sb-img-1"));
  EXPECT_THAT(st.message(), HasSubstr("and 1 more"));
  EXPECT_THAT(st.message(), ::testing::Not(HasSubstr("sb-img-3")));
  EXPECT_THAT(st.message(), ::testing::Not(HasSubstr("sb-img-4")));
  auto next = BuildOk("busy", "next");
  st = store_->Register(next, true);
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("sb-img-1"));
  EXPECT_EQ(store_->Get("busy")->digest(), m.digest());
  EXPECT_TRUE(img::PathExists(m.file()));
  ASSERT_EQ(::unlink(next.file().c_str()), 0);

  // Once one is stopped and the other gone, the image can go.
  PutSandbox("sb-img-1", "busy", v1::SANDBOX_PHASE_STOPPED);
  DeleteSandbox("sb-img-2");
  // Live users the table does not know of (a mount) still hold it.
  store_->set_extra_users([](const std::string& name) {
    return name == "busy" ? std::vector<std::string>{"mount on node n1"} : std::vector<std::string>{};
  });
  st = store_->Remove("busy");
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("mount on node n1"));
  store_->set_extra_users(nullptr);
  ASSERT_TRUE(store_->Remove("busy").ok());
  EXPECT_FALSE(img::PathExists(m.file()));
  ExpectOnlyImages(0);
}

TEST(ImageName, Rules) {
  for (const std::string& ok : std::vector<std::string>{"a", "py311", "0day", "a.b_c-d", std::string(128, 'x')})
    EXPECT_TRUE(images::CheckImageName(ok).ok()) << ok;
  for (const std::string& bad : std::vector<std::string>{"", "host", "Py311", "-x", ".x", "_x", "a/b", "a b",
                                                         "caf\xc3\xa9", std::string(129, 'x')}) {
    Status st = images::CheckImageName(bad);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << bad;
    EXPECT_FALSE(st.message().empty());
  }
  EXPECT_THAT(images::CheckImageName("host").message(), HasSubstr("built-in"));
  EXPECT_THAT(images::CheckImageName(std::string(129, 'x')).message(), HasSubstr("128"));
}

}  // namespace
}  // namespace dsec::testing
