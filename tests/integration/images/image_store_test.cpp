// The image store: manifests in the images table, EROFS files on disk,
// names, sharing one file per content, images in use.
#include "dsec/store/v1/records.pb.h"
#include "tests/integration/images/image_builder_fixture.hpp"

namespace dsec::testing {
namespace {

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
    store::v1::SandboxRow row;
    *row.mutable_record() = r;
    state::TypedTable<store::v1::SandboxRow>(db_.get(), state::Table::kSandboxes).Put(&b, id, row);
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
