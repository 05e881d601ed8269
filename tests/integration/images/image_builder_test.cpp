// The image builder against real sources: directories, tarballs (plain, gzip,
// zstd), OCI image layouts and `docker save` layouts (as directories and as
// tarballs), each image read back with `fsck.erofs --extract` and compared
// with what the source says; bad input gets an error naming what is wrong.
// (Hostile archives: hostile_archive_test.cpp; the store: image_store_test.cpp.)
#include <sys/stat.h>

#include "tests/integration/images/image_builder_fixture.hpp"

namespace dsec::testing {
namespace {

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
    // What the file takes on disk: every image is padded to a 2 MiB
    // multiple for virtio-pmem, sparsely.
    struct stat st;
    ASSERT_EQ(::stat(m->file().c_str(), &st), 0);
    EXPECT_EQ(m->size_bytes() % (2u << 20), 0u) << "not padded to 2 MiB";
    size[c] = static_cast<uint64_t>(st.st_blocks) * 512;
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

}  // namespace
}  // namespace dsec::testing
