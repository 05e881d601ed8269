// The reward guard's path pieces (drivers/guard): the task spec's globs,
// and what a container changed, read from a real overlay's upper
// directory after real writes through the merged mount.
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "drivers/guard/carry.hpp"
#include "drivers/guard/mask_layer.hpp"
#include "drivers/guard/path_glob.hpp"
#include "drivers/guard/task_paths.hpp"
#include "drivers/guard/upper_diff.hpp"
#include "harness/daemon.hpp"

namespace dsec::guard {
namespace {

using ::testing::HasSubstr;

bool M(const std::string& glob, const std::string& path) {
  auto g = PathGlob::Parse(glob);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() && g->Matches(path);
}

TEST(PathGlob, TheTaskSpecsGlobsMatchWhatTheySay) {
  EXPECT_TRUE(M("tests/**", "tests"));
  EXPECT_TRUE(M("tests/**", "tests/test_calc.py"));
  EXPECT_TRUE(M("tests/**", "tests/unit/deep/x.py"));
  EXPECT_FALSE(M("tests/**", "src/tests/x.py"));
  EXPECT_FALSE(M("tests/**", "tests2/x.py"));
  EXPECT_TRUE(M("**/conftest.py", "conftest.py"));
  EXPECT_TRUE(M("**/conftest.py", "a/b/conftest.py"));
  EXPECT_FALSE(M("**/conftest.py", "a/b/conftest.pyc"));
  EXPECT_TRUE(M("pytest.ini", "pytest.ini"));
  EXPECT_FALSE(M("pytest.ini", "sub/pytest.ini"));
  EXPECT_TRUE(M(".git/**", ".git/refs/heads/main"));
  EXPECT_TRUE(M("tests/*", "tests/.hidden")) << "no hidden corner in a protected tree";
  EXPECT_FALSE(M("tests/*", "tests/a/b"));
  EXPECT_TRUE(M("src/*.py", "src/calc.py"));
  EXPECT_TRUE(M("src/[ab]?.py", "src/a1.py"));
  EXPECT_FALSE(M("src/[ab]?.py", "src/c1.py"));
  EXPECT_TRUE(M("a/**/b/**/c", "a/x/b/y/z/c"));
  // Many `**` against a deep path an agent made: a table, not a search
  // (this took exponential time before; it returns at once now).
  std::string deep;
  for (int i = 0; i < 400; ++i) deep += "a/";
  EXPECT_FALSE(M("**/**/**/**/**/**/**/**/**/**/z", deep + "y"));
  EXPECT_TRUE(M("**/**/**/**/**/**/**/**/**/**/z", deep + "z"));
  auto g = PathGlob::Parse("grader/**");
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->MayMatchUnder("")) << "the root leads to it";
  EXPECT_TRUE(g->MayMatchUnder("grader"));
  EXPECT_FALSE(g->MayMatchUnder("src"));
  auto any = PathGlob::Parse("**/secret.txt");
  ASSERT_TRUE(any.ok());
  EXPECT_TRUE(any->MayMatchUnder("src/deep"));
}

TEST(PathGlob, BadGlobsAreRefusedNamingThemAndWhy) {
  struct Bad {
    std::string glob, why;
  };
  for (const auto& b : std::vector<Bad>{{"", "empty"},
                                        {"/work/tests/**", "is absolute"},
                                        {"tests//x", "empty segment"},
                                        {"tests/", "empty segment"},
                                        {"../etc/passwd", "'..' segment"},
                                        {"./x", "'.' segment"},
                                        {"a**/b", "inside a segment"},
                                        {"src/[ab.py", "unclosed '['"},
                                        {std::string(600, 'a'), "longer than 512"}}) {
    auto g = PathGlob::Parse(b.glob);
    ASSERT_FALSE(g.ok()) << b.glob;
    EXPECT_EQ(g.status().code(), Status::Code::kInvalidArgument);
    EXPECT_THAT(g.status().message(), HasSubstr(b.why)) << b.glob;
    if (!b.glob.empty() && b.glob.size() < 100) {
      EXPECT_THAT(g.status().message(), HasSubstr(b.glob));
    }
  }
  auto list = ParseGlobs({"tests/**", "a**"}, "protected paths");
  ASSERT_FALSE(list.ok());
  EXPECT_THAT(list.status().message(), HasSubstr("protected paths"));
  EXPECT_THAT(list.status().message(), HasSubstr("'a**'"));
  EXPECT_FALSE(ParseGlobs(std::vector<std::string>(kMaxGlobs + 1, "x"), "hidden paths").ok());
  auto ok = ParseGlobs({"tests/**", "**/conftest.py"}, "protected paths");
  ASSERT_TRUE(ok.ok());
  ASSERT_NE(FirstMatch(*ok, "a/conftest.py"), nullptr);
  EXPECT_EQ(FirstMatch(*ok, "a/conftest.py")->text(), "**/conftest.py");
  EXPECT_EQ(FirstMatch(*ok, "src/calc.py"), nullptr);
}

void Put(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// The image's paths a task's globs name: matched directories whole, the
// walk only where a glob leads.
TEST(TaskPaths, TheGlobsPathsInAnImageTreeAreFoundWithoutReadingTheRest) {
  char tmpl[] = "/tmp/dsec-task-paths-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string root = tmpl;
  for (const char* d : {"/tests", "/tests/sub", "/src", "/deep", "/deep/er", "/.git", "/big"})
    ASSERT_EQ(::mkdir((root + d).c_str(), 0755), 0);
  for (const char* f : {"/tests/test_a.py", "/tests/sub/x", "/src/a.py", "/src/conftest.py", "/deep/er/conftest.py",
                        "/pytest.ini", "/.git/HEAD"})
    Put(root + f, "x");
  for (int i = 0; i < 500; ++i) Put(root + "/big/f" + std::to_string(i), "");
  auto globs = ParseGlobs({"tests/**", "**/conftest.py", "pytest.ini", ".git/**"}, "protected paths");
  ASSERT_TRUE(globs.ok());
  auto found = FindTaskPaths(root, *globs, 100);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_THAT(found->paths,
              ::testing::ElementsAre(".git", "deep/er/conftest.py", "pytest.ini", "src/conftest.py", "tests"));
  // Without a `**/` glob, only the root and what the globs lead into.
  auto narrow = ParseGlobs({"tests/**", "src/*.py"}, "hidden paths");
  ASSERT_TRUE(narrow.ok());
  found = FindTaskPaths(root, *narrow, 100);
  ASSERT_TRUE(found.ok());
  EXPECT_THAT(found->paths, ::testing::ElementsAre("src/a.py", "src/conftest.py", "tests"));
  EXPECT_LT(found->read_entries, 20u) << "big/ (500 files) was not read";
  auto many = ParseGlobs({"big/*"}, "hidden paths");
  ASSERT_TRUE(many.ok());
  auto over = FindTaskPaths(root, *many, 100);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), Status::Code::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("'big/*'"));
  EXPECT_FALSE(FindTaskPaths(root + "/nope", *globs, 100).ok());
  testing::RunProcess({"/bin/rm", "-rf", root});
}

// A real overlay (lower: an image-like tree; upper and work: the
// container's), written through its merged mount as a container would.
class UpperDiffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (an overlay mount)";
    char tmpl[] = "/tmp/dsec-upper-diff-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    for (const char* d : {"/lower", "/upper", "/work", "/merged", "/lower/tests", "/lower/src", "/lower/old",
                          "/lower/old/sub"})
      ASSERT_EQ(::mkdir((dir_ + d).c_str(), 0755), 0) << d;
    Put(dir_ + "/lower/tests/test_calc.py", "def test_add():\n    assert add(1, 2) == 3\n");
    Put(dir_ + "/lower/src/calc.py", "def add(a, b):\n    return a - b\n");
    Put(dir_ + "/lower/src/same.py", "x = 1\n");
    Put(dir_ + "/lower/old/sub/f", "old\n");
    Put(dir_ + "/lower/pytest.ini", "[pytest]\n");
    std::string opts = "lowerdir=" + dir_ + "/lower,upperdir=" + dir_ + "/upper,workdir=" + dir_ + "/work";
    if (::mount("overlay", (dir_ + "/merged").c_str(), "overlay", 0, opts.c_str()) != 0)
      GTEST_SKIP() << "this kernel cannot mount overlayfs here: " << std::strerror(errno);
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) ::umount2((dir_ + "/merged").c_str(), MNT_DETACH);
    if (!dir_.empty()) testing::RunProcess({"/bin/rm", "-rf", dir_});
  }
  std::string Sh(const std::string& script) {
    auto r = testing::RunProcess({"/bin/sh", "-c", "cd " + dir_ + "/merged && " + script});
    EXPECT_EQ(r.exit_code, 0) << script << ": " << r.err;
    return r.out;
  }
  std::vector<std::string> Diff(size_t limit = 1000, bool* truncated = nullptr) {
    auto d = ReadUpperDiff(dir_ + "/upper", {dir_ + "/lower"}, limit);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    std::vector<std::string> out;
    if (!d.ok()) return out;
    for (const auto& c : d->changes) out.push_back(std::string(ChangeKindName(c.kind)) + " " + c.path + (c.dir ? "/" : ""));
    if (truncated) *truncated = d->truncated;
    return out;
  }
  std::string dir_;
  bool mounted_ = false;
};

TEST_F(UpperDiffTest, CreatedModifiedDeletedAndReplacedAreReadFromTheUpperLayer) {
  EXPECT_THAT(Diff(), ::testing::IsEmpty()) << "a fresh container changed nothing";
  Sh("echo 'def test_add(): assert True' > tests/test_calc.py");  // the classic
  Sh("mkdir -p a/b && echo 'import pytest' > a/b/conftest.py");
  Sh("rm pytest.ini");
  Sh("cat src/same.py > /dev/null && touch -r src/same.py src/same.py");  // copied up (metadata), unchanged
  Sh("rm -r old && mkdir old && echo new > old/g");                       // replaced
  Sh("sed -i 's/a - b/a + b/' src/calc.py && touch -r tests/test_calc.py src/calc.py");
  EXPECT_THAT(Diff(), ::testing::ElementsAre("created a/", "created a/b/", "created a/b/conftest.py",
                                             "replaced old/", "created old/g", "deleted pytest.ini",
                                             "modified src/calc.py", "modified tests/test_calc.py"));
  bool truncated = false;
  EXPECT_EQ(Diff(2, &truncated).size(), 2u);
  EXPECT_TRUE(truncated) << "a bounded read says it is cut";
  EXPECT_FALSE(ReadUpperDiff(dir_ + "/nope", {dir_ + "/lower"}, 10).ok());
}

// A copy-up that changed nothing is not a change; a write that puts the
// old mtime and size back is (the bytes decide).
TEST_F(UpperDiffTest, TheBytesDecideWhenTheMetadataIsTheSame) {
  Sh("chmod 0644 src/same.py");  // copy-up, same mode
  EXPECT_THAT(Diff(), ::testing::IsEmpty());
  Sh("printf 'x = 2\\n' > src/same.py && touch -d @0 src/same.py && touch -r " + dir_ + "/lower/src/same.py src/same.py");
  EXPECT_THAT(Diff(), ::testing::ElementsAre("modified src/same.py"));
  Sh("chmod 0600 src/calc.py");
  EXPECT_THAT(Diff(), ::testing::Contains("modified src/calc.py")) << "a mode change is a change";
}

// The enforcement a container will get, on a real overlay, for a process
// that is root without CAP_SYS_ADMIN (a container's root): hidden paths
// are whiteouts of a mask layer (gone: not read, not listed), protected
// ones a read-only bind mount (not written, removed, renamed or
// unmounted), and the task's directory keeps its owner and mode.
TEST(GuardMounts, HiddenPathsAreGoneAndProtectedOnesReadOnlyEvenForRoot) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (mounts, mknod)";
  if (::access("/usr/bin/setpriv", X_OK) != 0 || ::access("/usr/bin/unshare", X_OK) != 0)
    GTEST_SKIP() << "needs util-linux's setpriv and unshare";
  char tmpl[] = "/tmp/dsec-guard-mounts-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = tmpl, lower = dir + "/lower", merged = dir + "/merged";
  for (const char* d : {"/lower", "/mask", "/upper", "/work", "/merged", "/lower/tests", "/lower/grader", "/lower/src"})
    ASSERT_EQ(::mkdir((dir + d).c_str(), 0755), 0) << d;
  Put(lower + "/tests/test_calc.py", "assert add(1, 2) == 3\n");
  Put(lower + "/tests/secret_answer.py", "return a + b\n");
  Put(lower + "/grader/run.py", "grade\n");
  Put(lower + "/src/calc.py", "return a - b\n");
  ASSERT_EQ(::chown((lower + "/tests").c_str(), 1000, 1000), 0);
  ASSERT_EQ(::chmod((lower + "/tests").c_str(), 0750), 0);
  auto hidden = ParseGlobs({"grader/**", "tests/secret_*"}, "hidden paths");
  ASSERT_TRUE(hidden.ok());
  auto paths = FindTaskPaths(lower, *hidden, 100);
  ASSERT_TRUE(paths.ok()) << paths.status().ToString();
  EXPECT_THAT(paths->paths, ::testing::ElementsAre("grader", "tests/secret_answer.py"));
  Status mask = MakeMaskLayer(dir + "/mask", lower, paths->paths);
  ASSERT_TRUE(mask.ok()) << mask.ToString();
  std::string opts = "lowerdir=" + dir + "/mask:" + lower + ",upperdir=" + dir + "/upper,workdir=" + dir + "/work";
  if (::mount("overlay", merged.c_str(), "overlay", 0, opts.c_str()) != 0) {
    testing::RunProcess({"/bin/rm", "-rf", dir});
    GTEST_SKIP() << "this kernel cannot mount overlayfs here: " << std::strerror(errno);
  }
  // As a container's set-up would: tests/ bound read-only in the
  // container's mount namespace, then root without CAP_SYS_ADMIN.
  std::string agent =
      "cd " + merged + "; try() { if \"$@\" 2>/dev/null; then echo \"$1 ok\"; else echo \"$1 refused\"; fi; }; "
      "try cat grader/run.py; try ls grader; ls; ls tests; try cat tests/secret_answer.py; "
      "try sh -c 'echo x > tests/test_calc.py'; try rm tests/test_calc.py; try mv tests tests2; "
      "try umount tests; try mount -o remount,bind,rw tests; stat -c '%u %a' tests; "
      "echo mine > src/new.py && echo made";
  Put(dir + "/agent.sh", agent);
  auto r = testing::RunProcess(
      {"/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
       "mount --bind " + merged + "/tests " + merged + "/tests && mount -o remount,bind,ro " + merged + "/tests && " +
           "exec /usr/bin/setpriv --bounding-set=-sys_admin -- /bin/sh " + dir + "/agent.sh"});
  EXPECT_EQ(r.out,
            "cat refused\nls refused\nsrc\ntests\ntest_calc.py\ncat refused\nsh refused\nrm refused\nmv refused\n"
            "umount refused\nmount refused\n1000 750\nmade\n")
      << r.err;
  ::umount2(merged.c_str(), MNT_DETACH);
  testing::RunProcess({"/bin/rm", "-rf", dir});
}

// What a grade sandbox gets of an agent that could change anything (no
// read-only mounts: as the layer must cope with whatever an upper dir
// holds): on a real overlay, the changes under the task's root, with its
// protected paths as the image has them, even where the agent removed or
// replaced the directory that held them; nothing outside the root.
TEST(CarryChanges, TheGradeSeesTheAgentsChangesWithTheImagesProtectedPaths) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (overlay mounts)";
  char tmpl[] = "/tmp/dsec-guard-carry-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = tmpl, image = dir + "/image", merged = dir + "/merged";
  for (const char* d : {"/image", "/upper", "/work", "/merged", "/image/repo", "/image/repo/tests", "/image/repo/src",
                        "/image/repo/lib", "/image/repo/pkg", "/image/outside"})
    ASSERT_EQ(::mkdir((dir + d).c_str(), 0755), 0) << d;
  Put(image + "/repo/tests/test_a.py", "original test\n");
  Put(image + "/repo/src/calc.py", "bug\n");
  Put(image + "/repo/src/old.py", "old\n");
  Put(image + "/repo/lib/test_c.py", "lib test\n");
  Put(image + "/repo/lib/other.py", "lib other\n");
  Put(image + "/repo/pkg/test_b.py", "pkg test\n");
  Put(image + "/repo/pkg/util.py", "pkg util\n");
  Put(image + "/outside/x", "image x\n");
  std::string opts = "lowerdir=" + image + ",upperdir=" + dir + "/upper,workdir=" + dir + "/work";
  if (::mount("overlay", merged.c_str(), "overlay", 0, opts.c_str()) != 0) {
    testing::RunProcess({"/bin/rm", "-rf", dir});
    GTEST_SKIP() << "this kernel cannot mount overlayfs here: " << std::strerror(errno);
  }
  auto agent = testing::RunProcess(
      {"/bin/sh", "-c",
       "set -e; cd " + merged + "/repo; echo fixed > src/calc.py; rm src/old.py; echo new > src/new.py; "
       "echo 'assert True' > tests/test_a.py; echo cheat > conftest.py; echo cheat > src/conftest.py; "
       "rm -r pkg; mkdir pkg; echo mine > pkg/util2.py; rm -r lib; ln -s /etc/shadow src/link; "
       "echo agent > ../outside/x; mkfifo src/fifo"});
  ASSERT_EQ(agent.exit_code, 0) << agent.err;
  ::umount2(merged.c_str(), MNT_DETACH);
  CarryOptions carry;
  carry.root = "repo";
  auto globs = ParseGlobs({"**/test_*.py", "**/conftest.py"}, "protected paths");
  ASSERT_TRUE(globs.ok());
  carry.image_wins = *globs;
  auto stats = CarryChanges(dir + "/upper", image, dir + "/changes", carry);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->skipped, 3u) << "test_a.py and the two conftest.py";
  EXPECT_EQ(stats->restored, 2u) << "pkg/test_b.py and lib/test_c.py";
  std::string grade = "lowerdir=" + dir + "/changes:" + image;
  ASSERT_EQ(::mount("overlay", merged.c_str(), "overlay", MS_RDONLY, grade.c_str()), 0) << std::strerror(errno);
  auto seen = testing::RunProcess(
      {"/bin/sh", "-c", "cd " + merged + " && find . | LC_ALL=C sort && cat repo/src/calc.py repo/tests/test_a.py "
                        "repo/pkg/test_b.py repo/lib/test_c.py outside/x && readlink repo/src/link"});
  ::umount2(merged.c_str(), MNT_DETACH);
  EXPECT_EQ(seen.out,
            ".\n./outside\n./outside/x\n./repo\n./repo/lib\n./repo/lib/test_c.py\n./repo/pkg\n./repo/pkg/test_b.py\n"
            "./repo/pkg/util2.py\n./repo/src\n./repo/src/calc.py\n./repo/src/fifo\n./repo/src/link\n"
            "./repo/src/new.py\n./repo/tests\n./repo/tests/test_a.py\n"
            "fixed\noriginal test\npkg test\nlib test\nimage x\n/etc/shadow\n")
      << seen.err;
  testing::RunProcess({"/bin/rm", "-rf", dir});
}

// What an agent's upper dir may hold to hurt the copy, and what the
// copy does: a tree deeper than the limit is an error (no recursion to
// overflow), hard links are copied once, a sparse file counts its size
// against the limit; a directory above the task root made anew or a root
// removed take the image's root with them, but for its protected paths.
TEST(CarryChanges, HostileTreesEndInAClearErrorAndAncestorsAreKept) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (whiteouts, trusted xattrs)";
  char tmpl[] = "/tmp/dsec-guard-hostile-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = tmpl, image = dir + "/image";
  auto sh = [&](const std::string& script) {
    auto r = testing::RunProcess({"/bin/sh", "-c", "set -e; cd " + dir + "; " + script});
    EXPECT_EQ(r.exit_code, 0) << script << ": " << r.err;
  };
  sh("mkdir -p image/work/repo/tests up1/work/repo up2/work/repo up3/work up4/work; "
     "echo t > image/work/repo/tests/test_a.py; echo o > image/work/repo/old.py; "
     "python3 -c \"import os; os.makedirs('up1/work/repo/' + '/'.join(['d'] * 600))\"; "
     "dd if=/dev/zero of=up2/work/repo/big bs=1M count=1 2>/dev/null; "
     "for i in $(seq 500); do ln up2/work/repo/big up2/work/repo/link$i; done; "
     "truncate -s 3M up2/work/repo/sparse; "
     "mkdir -p up3/work/repo && echo n > up3/work/repo/new.py; "
     "python3 -c \"import os; os.setxattr('up3/work', 'trusted.overlay.opaque', b'y')\"; "
     "mknod up4/work/repo c 0 0");
  CarryOptions carry;
  carry.root = "work/repo";
  auto globs = ParseGlobs({"**/test_*.py"}, "protected paths");
  ASSERT_TRUE(globs.ok());
  carry.image_wins = *globs;
  auto deep = CarryChanges(dir + "/up1", image, dir + "/out1", carry);
  ASSERT_FALSE(deep.ok());
  EXPECT_THAT(deep.status().message(), HasSubstr("deeper than 512 levels"));
  carry.max_bytes = 2 << 20;
  auto big = CarryChanges(dir + "/up2", image, dir + "/out2", carry);
  ASSERT_FALSE(big.ok()) << "1 MiB (its 500 links count once) and a 3 MiB sparse file";
  EXPECT_THAT(big.status().message(), HasSubstr("pass 2 MiB"));
  sh("rm up2/work/repo/sparse");
  auto links = CarryChanges(dir + "/up2", image, dir + "/out2b", carry);
  ASSERT_TRUE(links.ok()) << links.status().ToString();
  EXPECT_EQ(links->bytes, 1u << 20) << "copied once";
  struct stat st;
  ASSERT_EQ(::stat((dir + "/out2b/work/repo/link77").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 501u);
  carry.max_bytes = 4ull << 30;
  auto remade = CarryChanges(dir + "/up3", image, dir + "/out3", carry);
  ASSERT_TRUE(remade.ok()) << remade.status().ToString();
  auto gone = CarryChanges(dir + "/up4", image, dir + "/out4", carry);
  ASSERT_TRUE(gone.ok()) << gone.status().ToString();
  auto r = testing::RunProcess({"/bin/sh", "-c", "cd " + dir + " && find out3 out4 | LC_ALL=C sort && "
                                "python3 -c \"import os; print(*(os.getxattr(p, 'trusted.overlay.opaque').decode() for p in "
                                "('out3/work/repo', 'out4/work/repo')), sep='')\""});
  EXPECT_EQ(r.out,
            "out3\nout3/work\nout3/work/repo\nout3/work/repo/new.py\nout3/work/repo/tests\nout3/work/repo/tests/test_a.py\n"
            "out4\nout4/work\nout4/work/repo\nout4/work/repo/tests\nout4/work/repo/tests/test_a.py\nyy\n")
      << r.err;
  testing::RunProcess({"/bin/rm", "-rf", dir});
}

}  // namespace
}  // namespace dsec::guard
