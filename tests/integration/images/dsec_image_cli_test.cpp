// dsec-image end to end, in both of its modes: offline (no dsecd: it opens
// the data dir's database itself) and online (a real dsecd holds the
// database, so dsec-image goes through the SDK). The same scenario runs in
// both; exit codes are 0 done, 1 failed, 2 bad usage.
#include <gmock/gmock.h>

#include <nlohmann/json.hpp>

#include "drivers/images/image_store.hpp"
#include "dsec/client.hpp"
#include "runtime/files.hpp"
#include "state/store.hpp"
#include "dsec/store/v1/records.pb.h"
#include "state/table.hpp"
#include "tests/integration/images/image_support.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using nlohmann::json;

class DsecImageCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = img::SkipReason(); !why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(img::PathExists(Binary())) << Binary() << " is not built";
    base_ = img::MakeTempDir("/tmp/dsec-test-imgcli-");
    ASSERT_FALSE(base_.empty());
    rootfs_ = base_ + "/rootfs";
    img::MakeRootfs(rootfs_);
  }
  void TearDown() override {
    if (!base_.empty()) img::RemoveAll(base_);
  }

  static std::string Binary() { return BinDir() + "/dsec-image"; }
  // dsec-image --data-dir <data> args...
  ProcResult Image(const std::string& data, std::vector<std::string> args) {
    args.insert(args.begin(), {Binary(), "--data-dir", data});
    return RunProcess(args);
  }
  static std::vector<std::string> ImageFiles(const std::string& data) {
    std::vector<std::string> out;
    for (const auto& f : img::Ls(data + "/images"))
      if (f.size() > 6 && f.compare(f.size() - 6, 6, ".erofs") == 0) out.push_back(f);
    return out;
  }

  // build, ls, inspect, a taken name, replace, rm, unknown names: the same
  // in both modes.
  void Scenario(const std::string& data) {
    auto r = Image(data, {"build", rootfs_, "py311"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_THAT(r.out, StartsWith("py311 sha256:"));
    EXPECT_THAT(r.err, HasSubstr("mkfs.erofs"));  // progress goes to stderr

    r = Image(data, {"ls"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("NAME"));
    EXPECT_THAT(r.out, HasSubstr("py311"));
    EXPECT_THAT(r.out, HasSubstr("dir:" + rootfs_));

    r = Image(data, {"inspect", "py311"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    json m = json::parse(r.out, nullptr, false);
    ASSERT_TRUE(m.is_object()) << r.out;
    EXPECT_EQ(m.value("name", ""), "py311");
    EXPECT_EQ(m.value("compression", ""), "lz4");
    EXPECT_EQ(m.value("source", ""), "dir:" + rootfs_);
    std::string digest = m.value("digest", "");
    EXPECT_THAT(digest, StartsWith("sha256:"));
    EXPECT_EQ(m.value("file", ""), images::ImageFilePath(data + "/images", digest));
    EXPECT_TRUE(img::PathExists(m.value("file", "")));
    // The image holds the rootfs.
    EXPECT_EQ(img::ImageContents(m.value("file", ""), base_ + "/extract"), img::Snapshot(rootfs_));

    r = Image(data, {"ls", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    json line = json::parse(r.out.substr(0, r.out.find('\n')), nullptr, false);
    EXPECT_EQ(line.value("name", ""), "py311") << r.out;

    // A taken name: refused, saying how to fix it; nothing changes.
    r = Image(data, {"build", rootfs_, "py311"});
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr("'py311' already exists"));
    EXPECT_THAT(r.err, HasSubstr("dsec-image rm py311"));
    EXPECT_THAT(r.err, HasSubstr("--replace"));
    EXPECT_EQ(ImageFiles(data).size(), 1u);

    img::Put(rootfs_ + "/marker", "second build\n");
    r = Image(data, {"build", "--replace", "--compress", "lz4hc", rootfs_, "py311"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    r = Image(data, {"inspect", "py311"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json::parse(r.out, nullptr, false).value("compression", ""), "lz4hc");
    EXPECT_EQ(ImageFiles(data).size(), 1u) << "the replaced image's file is left";

    r = Image(data, {"build", "--compress", "none", rootfs_, "raw"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    r = Image(data, {"ls"});
    EXPECT_THAT(r.out, HasSubstr("raw"));
    EXPECT_EQ(ImageFiles(data).size(), 2u);

    // Bad builds: a missing source names it; nothing is left behind.
    r = Image(data, {"build", base_ + "/no-such-dir", "ghost"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_THAT(r.err, HasSubstr(base_ + "/no-such-dir"));
    r = Image(data, {"build", "--compress", "zstd", rootfs_, "ghost"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_THAT(r.err, HasSubstr("zstd"));
    r = Image(data, {"build", rootfs_, "Ghost"});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("lowercase"));
    EXPECT_EQ(ImageFiles(data).size(), 2u);
    for (const auto& f : img::Ls(data + "/images")) EXPECT_THAT(f, Not(StartsWith(".build-")));

    // Unknown names.
    r = Image(data, {"rm", "nope"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_THAT(r.err, HasSubstr("'nope'"));
    EXPECT_THAT(r.err, HasSubstr("dsec-image ls"));
    r = Image(data, {"inspect", "nope"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_THAT(r.err, HasSubstr("'nope'"));

    r = Image(data, {"rm", "py311", "raw"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "py311\nraw\n");
    r = Image(data, {"ls"});
    EXPECT_THAT(r.out, Not(HasSubstr("py311")));
    EXPECT_TRUE(ImageFiles(data).empty());
    ::unlink((rootfs_ + "/marker").c_str());
  }

  std::string base_, rootfs_;
};

TEST_F(DsecImageCli, Offline) {
  std::string data = base_ + "/data";
  Scenario(data);
  EXPECT_TRUE(img::PathExists(data + "/db")) << "offline mode opens the data dir's database";
}

// dsec-image push: a file that is not EROFS, a truncated image and a name
// that exists are refused, each saying so, and change nothing; a whole
// EROFS file is registered under its digest.
TEST_F(DsecImageCli, PushRefusesWhatIsNotAWholeErofsImage) {
  std::string data = base_ + "/data", made = base_ + "/made";
  auto r = Image(made, {"build", rootfs_, "src"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(ImageFiles(made).size(), 1u);
  std::string good = made + "/images/" + ImageFiles(made)[0];

  std::string text = base_ + "/not-erofs";
  ASSERT_TRUE(WriteFileAtomic(text, std::string(8192, 'x')).ok());
  r = Image(data, {"push", text, "bad"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("is not an EROFS image"));
  auto whole = ReadFileToString(good);
  ASSERT_TRUE(whole.ok());
  std::string cut = base_ + "/truncated.erofs";
  ASSERT_TRUE(WriteFileAtomic(cut, whole->substr(0, 2048)).ok());  // its superblock, less than its blocks
  r = Image(data, {"push", cut, "cut"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("truncated"));
  EXPECT_TRUE(ImageFiles(data).empty()) << "a refused push left a file";
  EXPECT_EQ(Image(data, {"ls", "--json"}).out, "");

  r = Image(data, {"push", good, "pushed"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("pushed sha256:"));
  r = Image(data, {"push", good, "pushed"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("already exists"));
  EXPECT_EQ(ImageFiles(data).size(), 1u);
  EXPECT_EQ(Image(data, {"push", good, "pushed", "--replace"}).exit_code, 0);
}

TEST_F(DsecImageCli, OfflineImageInUseCannotBeRemoved) {
  std::string data = base_ + "/data";
  auto r = Image(data, {"build", rootfs_, "busy"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto put = [&](v1::SandboxPhase phase) {
    auto db = state::OpenRocksStore(data + "/db");
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    v1::SandboxRecord rec;
    rec.set_id("sb-cli-1");
    rec.mutable_spec()->set_image("busy");
    rec.set_phase(phase);
    state::WriteBatch b;
    store::v1::SandboxRow row;
    *row.mutable_record() = rec;
    state::TypedTable<store::v1::SandboxRow>(db->get(), state::Table::kSandboxes).Put(&b, rec.id(), row);
    ASSERT_TRUE((*db)->Write(b, true).ok());
  };
  put(v1::SANDBOX_PHASE_RUNNING);
  r = Image(data, {"rm", "busy"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("in use by sandbox sb-cli-1"));
  EXPECT_EQ(ImageFiles(data).size(), 1u);
  put(v1::SANDBOX_PHASE_STOPPED);
  r = Image(data, {"rm", "busy"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(ImageFiles(data).empty());
}

TEST_F(DsecImageCli, OnlineThroughDsecd) {
  // dsecd starts on any host the image tests run on (SkipReason): not
  // starting is a failure, not a reason to skip.
  auto d = TestDaemon::Start();
  ASSERT_TRUE(d.ok()) << "dsecd did not start: " << d.status().ToString();
  auto& daemon = *d;
  // dsecd holds the database, so dsec-image must go through it.
  auto held = state::OpenRocksStore(daemon->data_dir() + "/db");
  ASSERT_FALSE(held.ok()) << "dsecd does not hold its database";
  Scenario(daemon->data_dir());

  // What dsec-image registers, the daemon serves over the SDK.
  auto r = Image(daemon->data_dir(), {"build", rootfs_, "seen"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ClientOptions o;
  o.address = daemon->sdk_addr();
  o.data_dir = daemon->data_dir();
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto m = (*c)->GetImage("seen");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->source(), "dir:" + rootfs_);
  c->reset();

  // And it is in the daemon's database: offline mode finds it once dsecd is gone.
  EXPECT_EQ(daemon->Stop(), 0);
  r = Image(daemon->data_dir(), {"ls"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("seen"));
  r = Image(daemon->data_dir(), {"rm", "seen"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(DsecImageCli, UsageErrorsExitTwoAndHelpWorks) {
  std::string data = base_ + "/data";
  for (const auto& args : std::vector<std::vector<std::string>>{
           {}, {"build"}, {"build", rootfs_}, {"frobnicate"}, {"ls", "--bogus"}, {"rm"}, {"inspect"}}) {
    auto r = Image(data, args);
    EXPECT_EQ(r.exit_code, 2) << ::testing::PrintToString(args) << ": " << r.out << r.err;
  }
  EXPECT_FALSE(img::PathExists(data)) << "a usage error touched the data dir";
  auto r = RunProcess({Binary(), "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const char* word : {"build", "ls", "rm", "inspect", "--data-dir"}) EXPECT_THAT(r.out, HasSubstr(word));
  r = RunProcess({Binary(), "build", "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const char* word : {"--compress", "--keep-owners", "--replace"}) EXPECT_THAT(r.out, HasSubstr(word));
}

}  // namespace
}  // namespace dsec::testing
