// Hostile archives (climbing out, absolute names, writing or whiting out
// through a symlink, hard links to host files) must leave everything outside
// the unpack tree alone, and are refused naming the member.
#include "tests/integration/images/image_builder_fixture.hpp"

namespace dsec::testing {
namespace {

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

}  // namespace
}  // namespace dsec::testing
