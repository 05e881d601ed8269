// File helpers of the data dir: atomic writes, mkdir -p, the admin token.
#include "runtime/files.hpp"

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

namespace dsec {
namespace {

// A fresh directory under /tmp per test, removed with everything in it.
class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = "/tmp/dsec-files-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << "mkdtemp: " << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;  // best effort: a leftover dir must not fail the test
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  std::string Path(const std::string& rel) const { return dir_ + "/" + rel; }

  static mode_t ModeOf(const std::string& path) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return static_cast<mode_t>(-1);
    return st.st_mode & 07777;
  }
  static bool IsDir(const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }
  static void WritePlain(const std::string& path, const std::string& content, mode_t mode) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
    ::chmod(path.c_str(), mode);
  }
  std::set<std::string> Entries() const {
    std::set<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir_))
      out.insert(e.path().filename().string());
    return out;
  }

  std::string dir_;
};

// Sets the umask for one scope.
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t m) : old_(::umask(m)) {}
  ~ScopedUmask() { ::umask(old_); }

 private:
  mode_t old_;
};

bool IsLowerHex(const std::string& s) {
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

TEST_F(FilesTest, WriteThenReadRoundTripsBinaryContent) {
  std::string content;
  for (int i = 0; i < 50'000; ++i) content += static_cast<char>(i * 13);  // NULs, > one read buffer
  const std::string p = Path("blob");
  ASSERT_TRUE(WriteFileAtomic(p, content).ok());
  auto r = ReadFileToString(p);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->size(), content.size());
  EXPECT_TRUE(*r == content);
}

TEST_F(FilesTest, WriteEmptyFile) {
  const std::string p = Path("empty");
  ASSERT_TRUE(WriteFileAtomic(p, "").ok());
  auto r = ReadFileToString(p);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "");
}

TEST_F(FilesTest, WriteReplacesContentAndLeavesNoTemporaryFile) {
  const std::string p = Path("endpoint");
  ASSERT_TRUE(WriteFileAtomic(p, "a much longer first version\n").ok());
  ASSERT_TRUE(WriteFileAtomic(p, "v2").ok());
  auto r = ReadFileToString(p);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "v2");
  EXPECT_EQ(Entries(), std::set<std::string>{"endpoint"});
}

TEST_F(FilesTest, WriteSetsTheModeWhateverTheUmask) {
  {
    ScopedUmask u(077);  // would narrow 0644 to 0600
    ASSERT_TRUE(WriteFileAtomic(Path("public"), "x", 0644).ok());
  }
  {
    ScopedUmask u(0);  // would leave 0600 alone, but check a wide request too
    ASSERT_TRUE(WriteFileAtomic(Path("secret"), "x", 0600).ok());
    ASSERT_TRUE(WriteFileAtomic(Path("group"), "x", 0640).ok());
  }
  EXPECT_EQ(ModeOf(Path("public")), 0644u);
  EXPECT_EQ(ModeOf(Path("secret")), 0600u);
  EXPECT_EQ(ModeOf(Path("group")), 0640u);
  // The default is 0644.
  ScopedUmask u(027);
  ASSERT_TRUE(WriteFileAtomic(Path("default"), "x").ok());
  EXPECT_EQ(ModeOf(Path("default")), 0644u);
}

TEST_F(FilesTest, RewriteChangesTheMode) {
  const std::string p = Path("f");
  ASSERT_TRUE(WriteFileAtomic(p, "x", 0644).ok());
  ASSERT_TRUE(WriteFileAtomic(p, "y", 0600).ok());
  EXPECT_EQ(ModeOf(p), 0600u);
}

TEST_F(FilesTest, ReadMissingFileIsNotFoundNamingThePath) {
  const std::string p = Path("nope");
  auto r = ReadFileToString(p);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kNotFound);
  EXPECT_NE(r.status().message().find(p), std::string::npos) << r.status().message();
}

TEST_F(FilesTest, WriteIntoMissingDirectoryFailsNamingThePath) {
  const std::string p = Path("no/such/dir/file");
  Status st = WriteFileAtomic(p, "x");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Status::Code::kNotFound);
  EXPECT_NE(st.message().find(Path("no/such/dir")), std::string::npos) << st.message();
}

TEST_F(FilesTest, MakeDirsCreatesNestedDirectories) {
  const std::string p = Path("a/b/c/d");
  ASSERT_TRUE(MakeDirs(p).ok());
  EXPECT_TRUE(IsDir(Path("a")));
  EXPECT_TRUE(IsDir(Path("a/b")));
  EXPECT_TRUE(IsDir(Path("a/b/c")));
  EXPECT_TRUE(IsDir(p));
}

TEST_F(FilesTest, MakeDirsIsIdempotentAndAcceptsATrailingSlash) {
  ASSERT_TRUE(MakeDirs(Path("x/y")).ok());
  EXPECT_TRUE(MakeDirs(Path("x/y")).ok());
  EXPECT_TRUE(MakeDirs(Path("x/y/z/")).ok());
  EXPECT_TRUE(IsDir(Path("x/y/z")));
  EXPECT_TRUE(MakeDirs(dir_).ok());
}

TEST_F(FilesTest, MakeDirsAppliesTheMode) {
  ScopedUmask u(0);
  ASSERT_TRUE(MakeDirs(Path("priv/inner"), 0700).ok());
  EXPECT_EQ(ModeOf(Path("priv")), 0700u);
  EXPECT_EQ(ModeOf(Path("priv/inner")), 0700u);
}

TEST_F(FilesTest, MakeDirsThroughARegularFileFails) {
  WritePlain(Path("file"), "x", 0644);
  Status st = MakeDirs(Path("file/sub"));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(Path("file")), std::string::npos) << st.message();
}

TEST_F(FilesTest, MakeDirsOnAnExistingRegularFileFails) {
  // mkdir -p refuses too: the caller asked for a directory and would fail
  // later, further from the cause, if told it has one.
  WritePlain(Path("file"), "x", 0644);
  Status st = MakeDirs(Path("file"));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(Path("file")), std::string::npos) << st.message();
}

TEST_F(FilesTest, LoadOrCreateTokenCreatesA32HexTokenWithMode0600) {
  ScopedUmask u(0);  // the mode must not come from the umask
  const std::string p = Path("admin.token");
  auto t = LoadOrCreateToken(p);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->size(), 32u);
  EXPECT_TRUE(IsLowerHex(*t)) << *t;
  EXPECT_EQ(ModeOf(p), 0600u);
  auto raw = ReadFileToString(p);
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(*raw, *t + "\n");
}

TEST_F(FilesTest, LoadOrCreateTokenReturnsTheSameTokenTheSecondTime) {
  const std::string p = Path("admin.token");
  auto first = LoadOrCreateToken(p);
  ASSERT_TRUE(first.ok());
  auto second = LoadOrCreateToken(p);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(*second, *first);
}

TEST_F(FilesTest, LoadOrCreateTokenReadsAnExistingTokenWithoutItsNewline) {
  const std::string p = Path("admin.token");
  WritePlain(p, "0123456789abcdef0123456789abcdef\r\n", 0600);
  auto t = LoadOrCreateToken(p);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, "0123456789abcdef0123456789abcdef");
}

TEST_F(FilesTest, LoadOrCreateTokenFixesATooOpenMode) {
  const std::string p = Path("admin.token");
  WritePlain(p, "feedfacefeedfacefeedfacefeedface\n", 0644);
  ASSERT_EQ(ModeOf(p), 0644u);
  auto t = LoadOrCreateToken(p);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(*t, "feedfacefeedfacefeedfacefeedface");
  EXPECT_EQ(ModeOf(p), 0600u);

  ::chmod(p.c_str(), 0660);  // group access alone is too open as well
  ASSERT_TRUE(LoadOrCreateToken(p).ok());
  EXPECT_EQ(ModeOf(p), 0600u);
}

TEST_F(FilesTest, LoadOrCreateTokenRefusesAnEmptyFile) {
  const std::string p = Path("admin.token");
  for (const char* content : {"", "\n", " \r\n"}) {
    WritePlain(p, content, 0600);
    auto t = LoadOrCreateToken(p);
    ASSERT_FALSE(t.ok()) << "content '" << content << "' gave token '" << *t << "'";
    EXPECT_EQ(t.status().code(), Status::Code::kFailedPrecondition);
    const std::string& m = t.status().message();
    EXPECT_NE(m.find(p), std::string::npos) << m;
    EXPECT_NE(m.find("empty"), std::string::npos) << m;
    EXPECT_NE(m.find("delete it"), std::string::npos) << "should say what to do: " << m;
    // Refusing must not silently replace the file with a fresh token.
    auto raw = ReadFileToString(p);
    ASSERT_TRUE(raw.ok());
    EXPECT_EQ(*raw, content);
  }
}

TEST_F(FilesTest, LoadOrCreateTokenInMissingDirectoryFails) {
  auto t = LoadOrCreateToken(Path("missing/admin.token"));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find(Path("missing")), std::string::npos)
      << t.status().message();
}

TEST(RandomHexTest, LengthAndCharset) {
  for (size_t n : {0u, 1u, 2u, 7u, 31u, 32u, 33u, 1000u}) {
    std::string s = RandomHex(n);
    EXPECT_EQ(s.size(), n);
    EXPECT_TRUE(IsLowerHex(s)) << s;
  }
}

TEST(RandomHexTest, DiffersBetweenCalls) {
  // 128 bits: equal values would mean the randomness is broken.
  EXPECT_NE(RandomHex(32), RandomHex(32));
}

TEST(RandomHexTest, UsesEveryHexDigit) {
  std::string s = RandomHex(4096);
  std::set<char> seen(s.begin(), s.end());
  EXPECT_EQ(seen.size(), 16u);
}

TEST(AbsolutePathTest, AbsolutePathIsUnchanged) {
  EXPECT_EQ(AbsolutePath("/var/lib/dsec"), "/var/lib/dsec");
  EXPECT_EQ(AbsolutePath("/"), "/");
}

TEST(AbsolutePathTest, RelativePathIsJoinedToTheWorkingDirectory) {
  char cwd[PATH_MAX];
  ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
  const std::string base = cwd;
  EXPECT_EQ(AbsolutePath("data/dsec"), base + "/data/dsec");
  EXPECT_EQ(AbsolutePath("./data"), base + "/data");
  EXPECT_EQ(AbsolutePath("././x"), base + "/x");
  EXPECT_EQ(AbsolutePath("does-not-exist/at/all"), base + "/does-not-exist/at/all");
  EXPECT_EQ(AbsolutePath("x")[0], '/');
}

}  // namespace
}  // namespace dsec
