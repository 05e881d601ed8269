// dsec-image build --git-scrub (drivers/images/git_scrub.hpp): a task's
// repository whose answer sits in its future (a later commit on another
// branch, a tag, a stash, a remote-tracking ref, notes, the reflog of a
// reset) keeps only the history of its checked-out commit in the image,
// and the source directory is left as it was. Real git, a real image read
// back with fsck.erofs.
#include "tests/integration/images/image_builder_fixture.hpp"

namespace dsec::testing {
namespace {

class GitScrubTest : public ImageBuilderTest {
 protected:
  void SetUp() override {
    ImageBuilderTest::SetUp();
    if (IsSkipped()) return;
    if (::access("/usr/bin/git", X_OK) != 0) GTEST_SKIP() << "needs git: apt-get install git";
  }
  // git in `dir` (a work tree), its stdout; a failure fails the test.
  std::string Git(const std::string& dir, const std::string& args, bool must = true) {
    auto r = img::Run("sh", {"-c", "cd '" + dir + "' && git -c user.name=t -c user.email=t@t -c safe.directory='*' " +
                                       args + " 2>&1"});
    if (must) {
      EXPECT_EQ(r.exit_code, 0) << "git " << args << ": " << r.out;
    }
    while (!r.out.empty() && r.out.back() == '\n') r.out.pop_back();
    return must || r.exit_code == 0 ? r.out : "FAILED";
  }
  // The task: c1 has the bug (checked out), c2 fixes it and is reachable
  // from everywhere but c1's history.
  void MakeTask(const std::string& repo) {
    ASSERT_EQ(::mkdir(repo.c_str(), 0755), 0);
    Git(repo, "init -q -b main");
    img::Put(repo + "/calc.py", "def add(a, b):\n    return a - b\n");
    Git(repo, "add calc.py");
    Git(repo, "commit -q -m bug");
    c1_ = Git(repo, "rev-parse HEAD");
    Git(repo, "tag v1");
    img::Put(repo + "/calc.py", "def add(a, b):\n    return a + b\n");
    Git(repo, "commit -q -am fix");
    c2_ = Git(repo, "rev-parse HEAD");
    Git(repo, "tag -a v2 -m 'the fix'");
    Git(repo, "branch future");
    Git(repo, "update-ref refs/remotes/origin/main HEAD");
    Git(repo, "notes add -m 'answer: a + b' HEAD");
    Git(repo, "reset -q --hard " + c1_);  // the reflog remembers c2
    img::Put(repo + "/calc.py", "def add(a, b):\n    return a + b  # stashed\n");
    Git(repo, "stash -q");
  }
  std::string c1_, c2_;
};

TEST_F(GitScrubTest, OnlyTheCheckedOutCommitsHistoryIsInTheImage) {
  std::string src = base_ + "/src";
  ASSERT_EQ(::mkdir(src.c_str(), 0755), 0);
  MakeTask(src + "/repo");
  std::vector<std::string> said;
  images::BuildOptions o;
  o.git_scrub = true;
  o.progress = [&](const std::string& s) { said.push_back(s); };
  auto m = Build(src, "task", o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();

  std::string x = base_ + "/x", repo = x + "/repo";
  auto ex = img::Run("fsck.erofs", {"--extract=" + x, m->file()});
  ASSERT_EQ(ex.exit_code, 0) << ex.err;
  EXPECT_EQ(Git(repo, "rev-parse HEAD"), c1_) << "the checkout is the task's";
  EXPECT_EQ(Git(repo, "log --all --reflog --format=%s"), "bug") << "no later commit by any way git has";
  EXPECT_EQ(Git(repo, "cat-file -t " + c2_, false), "FAILED") << "the fix's commit object is gone";
  EXPECT_EQ(Git(repo, "for-each-ref --format='%(refname)'"), "refs/heads/main\nrefs/tags/v1");
  EXPECT_EQ(Git(repo, "stash list"), "");
  EXPECT_EQ(Git(repo, "reflog"), "");
  EXPECT_EQ(Git(repo, "grep -c 'a + b' $(git rev-list --all) -- .", false), "FAILED") << "no blob of the fix";
  EXPECT_EQ(img::Slurp(repo + "/calc.py"), "def add(a, b):\n    return a - b\n");
  EXPECT_EQ(Git(repo, "fsck --no-progress --no-dangling"), "") << "a sound repository";
  std::string all;
  for (const auto& s : said) all += s + "\n";
  for (const char* removed : {"refs/heads/future", "refs/tags/v2", "refs/remotes/origin/main", "refs/stash",
                              "refs/notes/commits", "logs"})
    EXPECT_THAT(all, HasSubstr(" " + std::string(removed))) << "says what it removed";
  EXPECT_THAT(all, HasSubstr("git-scrub repo/.git: kept the history of " + c1_.substr(0, 12)));

  // The source directory is not changed; without the flag, the future
  // stays (what the flag is for).
  EXPECT_EQ(Git(src + "/repo", "rev-parse future"), c2_);
  auto plain = Build(src, "task-plain");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  img::RemoveAll(x);
  ASSERT_EQ(img::Run("fsck.erofs", {"--extract=" + x, plain->file()}).exit_code, 0);
  EXPECT_EQ(Git(repo, "cat-file -t " + c2_), "commit");
  img::RemoveAll(x);
  ExpectOnlyImages(2);
}

// Without --git-scrub, git-watch lists the files that hold only history
// past the checked-out commit: loose objects (not the staged ones) and a
// pack of future objects only; the future in a pack shared with the past
// is counted, not listed; a repository git cannot read is said, not fatal.
TEST_F(GitScrubTest, WithoutScrubTheFuturesOwnFilesAreWatched) {
  std::string src = base_ + "/src", repo = src + "/repo";
  ASSERT_EQ(::mkdir(src.c_str(), 0755), 0);
  MakeTask(repo);
  img::Put(repo + "/staged.py", "staged = True\n");
  Git(repo, "add staged.py");
  std::string staged = Git(repo, "rev-parse :staged.py");
  auto loose = [&](const std::string& obj) { return "repo/.git/objects/" + obj.substr(0, 2) + "/" + obj.substr(2); };
  std::vector<std::string> said;
  images::BuildOptions o;
  o.progress = [&](const std::string& s) { said.push_back(s); };
  auto m = Build(src, "watched", o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::vector<std::string> watched(m->watched().begin(), m->watched().end());
  EXPECT_THAT(watched, ::testing::Contains(loose(c2_))) << "the fix's commit";
  EXPECT_THAT(watched, ::testing::Contains(loose(Git(repo, "rev-parse " + c2_ + ":calc.py")))) << "the fix's blob";
  EXPECT_THAT(watched, ::testing::Not(::testing::Contains(loose(c1_)))) << "the checked-out commit";
  EXPECT_THAT(watched, ::testing::Not(::testing::Contains(loose(staged)))) << "what the index stages";
  EXPECT_THAT(said, ::testing::Contains(HasSubstr("git-watch repo/.git: ")));

  // The future packed alone: its pack is watched. Packed with the past:
  // nothing is (a read of the pack is not told apart), and it says so.
  Git(repo, "rev-list --objects --all --reflog --not HEAD | cut -d' ' -f1 | git pack-objects -q .git/objects/pack/pack "
            ">/dev/null && git prune-packed");
  auto alone = Build(src, "alone", o);
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();
  std::vector<std::string> packs(alone->watched().begin(), alone->watched().end());
  ASSERT_EQ(packs.size(), 1u) << ::testing::PrintToString(packs);
  EXPECT_THAT(packs[0], ::testing::MatchesRegex("repo/\\.git/objects/pack/pack-[0-9a-f]+\\.pack"));
  Git(repo, "gc -q");
  said.clear();
  auto mixed = Build(src, "mixed", o);
  ASSERT_TRUE(mixed.ok()) << mixed.status().ToString();
  EXPECT_EQ(mixed->watched_size(), 0);
  EXPECT_THAT(said, ::testing::Contains(HasSubstr("in packs with the past or over the limit are not")));

  auto off = o;
  off.git_watch = false;
  auto none = Build(src, "off", off);
  ASSERT_TRUE(none.ok());
  img::Put(repo + "/.git/packed-refs", "# pack-refs with: peeled\nnot-a-hash refs/heads/x\n");
  said.clear();
  auto broken = Build(src, "broken", o);
  ASSERT_TRUE(broken.ok()) << "an unreadable repository does not stop a build: " << broken.status().ToString();
  EXPECT_THAT(said, ::testing::Contains(HasSubstr("git-watch repo/.git: not watched, git cannot read it")));
  ExpectOnlyImages(5);
}

// A repository with nothing checked out keeps nothing; a tree with no
// repository says so; a corrupt one is an error naming it, and no image.
TEST_F(GitScrubTest, EmptyMissingAndBrokenRepositories) {
  std::string src = base_ + "/src";
  ASSERT_EQ(::mkdir(src.c_str(), 0755), 0);
  img::Put(src + "/f", "x");
  std::vector<std::string> said;
  images::BuildOptions o;
  o.git_scrub = true;
  o.progress = [&](const std::string& s) { said.push_back(s); };
  ASSERT_TRUE(Build(src, "none", o).ok());
  EXPECT_THAT(said, ::testing::Contains("git-scrub: no git repository in the tree"));

  MakeTask(src + "/repo");
  Git(src + "/repo", "checkout -q --orphan fresh");  // an unborn branch: no commit checked out
  said.clear();
  auto m = Build(src, "unborn", o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::string x = base_ + "/x";
  ASSERT_EQ(img::Run("fsck.erofs", {"--extract=" + x, m->file()}).exit_code, 0);
  EXPECT_EQ(Git(x + "/repo", "rev-list --all --reflog"), "") << "nothing is reachable from no commit";
  img::RemoveAll(x);

  img::Put(src + "/repo/.git/HEAD", "ref: refs/heads/main\n");
  img::Put(src + "/repo/.git/packed-refs", "# pack-refs with: peeled\nnot-a-hash refs/heads/x\n");
  auto broken = Build(src, "broken", o);
  ASSERT_FALSE(broken.ok());
  EXPECT_THAT(broken.status().message(), HasSubstr("git-scrub repo/.git"));
  ExpectOnlyImages(2);
}

}  // namespace
}  // namespace dsec::testing
