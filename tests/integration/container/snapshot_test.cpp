// Containers' snapshots and forks through a real dsecd (DESIGN.md section
// 14): a snapshot is what the container changed, as a layer new containers
// stack over the image; a fork is n new containers on one such layer, each
// with its own id, hostname and machine-id; what needs a snapshot keeps it;
// bad input gets a clear error and leaves nothing.
#include <gmock/gmock.h>
#include <sys/stat.h>

#include <future>
#include <set>

#include "dsec/snapshot.hpp"
#include "harness/daemon.hpp"
#include "harness/rootfs.hpp"
#include "runtime/files.hpp"
#include "tests/support/container_fixture.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;

class Snapshots : public ContainerTest {
 protected:
  static v1::SandboxSpec From(const std::string& snapshot) {
    v1::SandboxSpec spec;
    spec.set_snapshot(snapshot);
    return spec;
  }
  Result<Sandbox> MakeFrom(const std::string& snapshot) {
    auto sb = client_->Create(From(snapshot));
    if (sb.ok()) made_.push_back(*sb);
    return sb;
  }
  static bool Exists(const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }
  static std::vector<std::string> Names() {
    std::vector<std::string> out;
    auto all = ListSnapshots(*client_);
    EXPECT_TRUE(all.ok()) << all.status().ToString();
    if (all.ok())
      for (const auto& s : *all) out.push_back(s.name());
    return out;
  }
};

// What it changed, deletions included, and nothing of the image besides.
constexpr const char* kChange =
    "echo state > /work/f && mkdir -p /work/d/e && echo deep > /work/d/e/g && rm /bin/yes && echo done";
constexpr const char* kLook =
    "cat /work/f /work/d/e/g; test -e /bin/yes && echo yes-is-there || echo yes-is-gone";

TEST_F(Snapshots, ASnapshotCarriesTheChangesAndNewContainersStartFromIt) {
  auto a = Make();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(ShIn(*a, kChange).stdout(), "done\n");
  auto snap = Snapshot(*a, "snap-a");
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  EXPECT_EQ(snap->kind(), v1::KIND_CONTAINER);
  EXPECT_EQ(snap->image(), kImage);
  EXPECT_EQ(snap->source_sandbox(), a->id());
  EXPECT_EQ(snap->depth(), 1u);
  EXPECT_EQ(snap->size_bytes(), 11u) << "the two files' bytes: nothing of the image is copied";
  EXPECT_GE(snap->entries(), 5u) << "f, d, d/e, d/e/g and the whiteout of /bin/yes";
  EXPECT_TRUE(Exists(snap->dir()));
  // The source goes on, and what it does next is not in the snapshot.
  EXPECT_EQ(ShIn(*a, "echo later > /work/f; cat /work/f").stdout(), "later\n");

  auto b = MakeFrom("snap-a");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(ShIn(*b, kLook).stdout(), "state\ndeep\nyes-is-gone\n");
  auto who = [](const Sandbox& s) { return ShIn(s, "hostname; cat /etc/machine-id").stdout(); };
  EXPECT_NE(who(*a), who(*b)) << "its own hostname and machine-id";
  // Its changes are its own: a second sandbox of the snapshot does not see them.
  ShIn(*b, "echo b > /work/f");
  auto c = MakeFrom("snap-a");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(ShIn(*c, "cat /work/f").stdout(), "state\n");

  // A snapshot of a sandbox made from one stacks on it.
  auto snap_b = Snapshot(*b, "snap-b");
  ASSERT_TRUE(snap_b.ok()) << snap_b.status().ToString();
  EXPECT_EQ(snap_b->parent(), "snap-a");
  EXPECT_EQ(snap_b->depth(), 2u);
  auto d = MakeFrom("snap-b");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(ShIn(*d, kLook).stdout(), "b\ndeep\nyes-is-gone\n");

  // Needed, it stays: removal names who needs it.
  Status busy = RemoveSnapshot(*client_, "snap-a");
  EXPECT_EQ(busy.code(), Status::Code::kFailedPrecondition) << busy.ToString();
  EXPECT_THAT(busy.message(), HasSubstr("sandbox " + c->id()));
  EXPECT_THAT(busy.message(), HasSubstr("snapshot snap-b"));
  auto shown = GetSnapshot(*client_, "snap-a");
  ASSERT_TRUE(shown.ok());
  EXPECT_EQ(shown->users_size(), 3) << "b, c and snap-b";
  for (const auto* s : {&*b, &*c, &*d}) Destroy(*s);
  EXPECT_TRUE(RemoveSnapshot(*client_, "snap-b").ok());
  EXPECT_TRUE(RemoveSnapshot(*client_, "snap-a").ok());
  EXPECT_FALSE(Exists(snap->dir()));
  EXPECT_FALSE(Exists(snap_b->dir()));
  EXPECT_THAT(Names(), ::testing::IsEmpty());
}

// Past 8 stacked layers a snapshot is flattened: one layer on the image
// with what they all and the sandbox changed (deletions, re-creations and
// opaque directories as the stack showed them), needing none of them.
TEST_F(Snapshots, ASnapshotPastEightLayersIsFlattenedAndShowsTheSameTree) {
  constexpr const char* kTree =
      "ls -R /work; stat -c '%n %A %U' /work/* /work/d/*; cat /work/g* /work/d/*; "
      "test -e /bin/yes && echo yes-is-there || echo yes-is-gone";
  auto first = Make();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  Sandbox cur = *first;
  for (int g = 1; g <= 9; ++g) {
    std::string n = std::to_string(g);
    std::string change = "echo g" + n + " > /work/g" + n;
    if (g == 3) change += " && rm /work/g2 /bin/yes";                                  // deletions
    if (g == 5) change += " && echo back > /work/g2";                                   // made again
    if (g == 6) change += " && mkdir -p /work/d && echo x > /work/d/x";
    if (g == 7) change += " && rm -r /work/d && mkdir /work/d && echo y > /work/d/y";  // opaque
    ASSERT_EQ(ShIn(cur, change + " && echo ok").stdout(), "ok\n") << "generation " << g;
    auto snap = Snapshot(cur, "gen-" + n);
    ASSERT_TRUE(snap.ok()) << snap.status().ToString();
    EXPECT_EQ(snap->depth(), g <= 8 ? static_cast<uint32_t>(g) : 1u) << "generation " << g;
    EXPECT_EQ(snap->parent(), g == 1 || g == 9 ? "" : "gen-" + std::to_string(g - 1));
    auto next = MakeFrom("gen-" + n);
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    cur = *next;
  }
  std::string want = ShIn(cur, kTree).stdout();
  EXPECT_THAT(want, HasSubstr("g1\nback\ng3\n")) << want;  // g2 deleted, then made again
  EXPECT_THAT(want, HasSubstr("g9\ny\nyes-is-gone")) << want;  // /work/d made anew: x is gone
  // It needs none of the eight: they all go, and it still shows the tree.
  auto all = made_;
  for (const auto& sb : all) Destroy(sb);
  for (int g = 8; g >= 1; --g) EXPECT_TRUE(RemoveSnapshot(*client_, "gen-" + std::to_string(g)).ok()) << g;
  auto flat = MakeFrom("gen-9");
  ASSERT_TRUE(flat.ok()) << flat.status().ToString();
  EXPECT_EQ(ShIn(*flat, kTree).stdout(), want);
  Destroy(*flat);
  EXPECT_TRUE(RemoveSnapshot(*client_, "gen-9").ok());
}

// A content hash of /work/repo's tree (paths, modes and bytes), by python.
constexpr const char* kTreeHash =
    "python3 -c \"import hashlib, os\n"
    "h = hashlib.sha256()\n"
    "for d, ds, fs in sorted(os.walk('/work/repo')):\n"
    "  ds.sort()\n"
    "  for f in sorted(fs):\n"
    "    p = os.path.join(d, f); h.update(p.encode() + b'\\\\0' + open(p, 'rb').read())\n"
    "print(h.hexdigest())\"";

// Issue 30's first acceptance: a container on a 10 000-file repository
// with 100 files changed, forked 16 ways.
TEST_F(Snapshots, SixteenForksOfARepositorySeeTheSameTreeAndDivergeAlone) {
  // The image: the tools and a repository of 10 000 files.
  char tmpl[] = "/tmp/dsec-repo-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  ASSERT_TRUE(MakeRootfs(dir).ok());
  auto made = RunProcess({"/bin/sh", "-c", "mkdir -p " + dir + "/work/repo && cd " + dir + "/work/repo && "
                          "for d in $(seq 0 99); do mkdir m$d; for f in $(seq 0 99); do echo \"$d.$f\" > m$d/f$f.py; "
                          "done; done"});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  auto built = RunProcess({BinDir() + "/dsec-image", "--data-dir", daemon_->data_dir(), "build", dir, "repo10k"});
  RunProcess({"/bin/rm", "-rf", dir});
  ASSERT_EQ(built.exit_code, 0) << built.err;
  auto a = client_->Create(ContainerSpec("repo10k"));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  made_.push_back(*a);
  ASSERT_EQ(ShIn(*a, "cd /work/repo && for d in $(seq 0 99); do echo changed > m$d/f7.py; done && rm m3/f8.py && "
                     "echo ok").stdout(), "ok\n");
  std::string hash = ShIn(*a, kTreeHash).stdout();
  ASSERT_EQ(hash.size(), 65u) << hash;

  auto forks = Fork(*a, 16);
  ASSERT_TRUE(forks.ok()) << forks.status().ToString();
  ASSERT_EQ(forks->size(), 16u);
  for (const auto& f : *forks) made_.push_back(f);
  auto shared = GetSnapshot(*client_, Names().at(0));
  ASSERT_TRUE(shared.ok());
  EXPECT_TRUE(shared->ephemeral());
  EXPECT_EQ(shared->users_size(), 16);
  EXPECT_LT(shared->entries(), 250u) << "the changes only, not the 10 000 files";
  std::set<std::string> hosts, machine_ids;
  for (const auto& f : *forks) {
    EXPECT_EQ(ShIn(f, kTreeHash).stdout(), hash) << f.id();
    hosts.insert(ShIn(f, "hostname").stdout());
    machine_ids.insert(ShIn(f, "cat /etc/machine-id").stdout());
  }
  EXPECT_EQ(hosts.size(), 16u);
  EXPECT_EQ(machine_ids.size(), 16u);
  // A write in one fork is its own: not in the others, not in the source.
  ShIn((*forks)[0], "echo mine > /work/repo/m0/f0.py");
  EXPECT_NE(ShIn((*forks)[0], kTreeHash).stdout(), hash);
  EXPECT_EQ(ShIn((*forks)[1], kTreeHash).stdout(), hash);
  EXPECT_EQ(ShIn(*a, kTreeHash).stdout(), hash);
  // A fork of a fork stacks on it, with the first fork's write.
  auto grand = Fork((*forks)[0], 2);
  ASSERT_TRUE(grand.ok()) << grand.status().ToString();
  for (const auto& g : *grand) made_.push_back(g);
  EXPECT_EQ(ShIn((*grand)[1], "cat /work/repo/m0/f0.py /work/repo/m5/f7.py").stdout(), "mine\nchanged\n");
  // The source goes; its forks go on.
  Destroy(*a);
  EXPECT_EQ(ShIn((*forks)[15], kTreeHash).stdout(), hash);
  EXPECT_EQ(ShIn((*grand)[0], "cat /work/repo/m3/f8.py 2>&1 || echo gone").stdout(), "cat: /work/repo/m3/f8.py: No such file or directory\ngone\n");
  // Each fork's snapshot goes with the last sandbox that needs it.
  for (const auto& g : *grand) Destroy(g);
  for (const auto& f : *forks) Destroy(f);
  EXPECT_THAT(Names(), ::testing::IsEmpty());
}

// Layers deduplicated where they are the same: a second snapshot of one
// sandbox stores once the files its first has unchanged (contents and
// metadata), each layer stays whole alone, and what no layer links any
// more goes with the last.
TEST_F(Snapshots, ASecondSnapshotSharesTheUnchangedFilesAndEachStaysWhole) {
  auto a = Make();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(ShIn(*a, "mkdir -p /work/r && for i in $(seq 1 40); do dd if=/dev/urandom of=/work/r/f$i bs=4096 "
                     "count=1 status=none; done && echo one > /work/m && echo c > /work/c && echo ok").stdout(),
            "ok\n");
  const std::string kSums = "cd /work/r && cat f* | sha256sum && cat /work/m /work/c";
  std::string first = ShIn(*a, kSums).stdout();
  auto one = Snapshot(*a, "share-1");
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->shared_bytes(), 0u) << "nothing before it holds these bytes";
  // Changed contents, changed metadata, a copy with a new time and an
  // exact copy (cp -p) within the layer: none of them shared.
  ASSERT_EQ(ShIn(*a, "echo two > /work/m && chmod 600 /work/c && cp /work/r/f1 /work/g1 && "
                     "cp -p /work/r/f2 /work/r/h2 && echo ok").stdout(), "ok\n");
  auto two = Snapshot(*a, "share-2");
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(two->shared_bytes(), 40u * 4096) << "f1..f40, stored once";
  EXPECT_EQ(two->size_bytes(), 42u * 4096 + 4 + 2);
  auto ino = [](const std::string& path) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
    return st.st_ino;
  };
  EXPECT_EQ(ino(one->dir() + "/work/r/f7"), ino(two->dir() + "/work/r/f7"));
  EXPECT_NE(ino(one->dir() + "/work/c"), ino(two->dir() + "/work/c")) << "its mode changed";
  EXPECT_NE(ino(two->dir() + "/work/r/f2"), ino(two->dir() + "/work/r/h2")) << "two paths of one layer stay apart";

  // A sandbox of each sees its own snapshot's tree; a write to a shared
  // file in one is its own.
  auto b = MakeFrom("share-2");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  std::string second = ShIn(*b, kSums).stdout();
  EXPECT_EQ(second, ShIn(*a, kSums).stdout());
  ShIn(*b, "echo mine > /work/r/f7");
  auto c = MakeFrom("share-1");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(ShIn(*c, kSums).stdout(), first);
  Destroy(*c);
  // The first goes: the second keeps the files it shared.
  ASSERT_TRUE(RemoveSnapshot(*client_, "share-1").ok());
  auto d = MakeFrom("share-2");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(ShIn(*d, kSums).stdout(), second);
  Destroy(*d);
  Destroy(*b);
  ASSERT_TRUE(RemoveSnapshot(*client_, "share-2").ok());
  // Nothing links them any more: no stored copy is left.
  std::string objects = one->dir().substr(0, one->dir().rfind('/')) + "/objects";
  auto left = RunProcess({"/bin/sh", "-c", "find " + objects + " -type f | wc -l"});
  EXPECT_EQ(left.out, "0\n") << "files under " << objects;
}

TEST_F(Snapshots, BadInputGetsAClearErrorAndLeavesNothing) {
  auto a = Make();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  for (uint32_t n : {0u, 101u}) {
    auto f = Fork(*a, n);
    EXPECT_EQ(f.status().code(), Status::Code::kInvalidArgument) << n;
    EXPECT_THAT(f.status().message(), HasSubstr("1 to 100"));
  }
  auto bad = Snapshot(*a, "Bad/Name");
  EXPECT_EQ(bad.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("snapshot name 'Bad/Name'"));
  ASSERT_TRUE(Snapshot(*a, "once").ok());
  auto again = Snapshot(*a, "once");
  EXPECT_EQ(again.status().code(), Status::Code::kAlreadyExists);
  EXPECT_THAT(again.status().message(), HasSubstr("snapshot 'once' already exists (of sandbox " + a->id()));
  auto missing = client_->Create(From("no-such-snapshot"));
  EXPECT_EQ(missing.status().code(), Status::Code::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("no snapshot named 'no-such-snapshot'"));
  auto other_image = From("once");
  other_image.set_image("another");
  EXPECT_THAT(client_->Create(other_image).status().message(), HasSubstr("stands on image tools, not another"));
  auto forged = ContainerSpec(kImage);
  forged.mutable_layers()->add_dirs("/");
  auto refused = client_->Create(forged);
  EXPECT_EQ(refused.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("spec.layers is set by the node only"));
  auto fn = client_->Create(FncallSpec());
  ASSERT_TRUE(fn.ok());
  auto no_snap = Snapshot(*fn, "of-a-fncall");
  EXPECT_EQ(no_snap.status().code(), Status::Code::kUnimplemented);
  EXPECT_THAT(no_snap.status().message(), HasSubstr("cannot snapshot"));
  EXPECT_TRUE(fn->Destroy().ok());
  // The image under a snapshot is in use, its sandboxes gone or not.
  Destroy(*a);
  Status image_rm = client_->RemoveImage(kImage);
  EXPECT_THAT(image_rm.message(), HasSubstr("snapshot once"));
  EXPECT_EQ(RemoveSnapshot(*client_, "no-such-snapshot").code(), Status::Code::kNotFound);
  EXPECT_TRUE(RemoveSnapshot(*client_, "once").ok());
  auto removed = client_->Create(From("once"));
  EXPECT_EQ(removed.status().code(), Status::Code::kNotFound) << removed.status().ToString();
  EXPECT_THAT(removed.status().message(), HasSubstr("no snapshot named 'once'"));
  EXPECT_THAT(Names(), ::testing::IsEmpty());
}

// A snapshot of a sandbox being destroyed: it is taken whole before the
// destroy, or refused naming the sandbox; nothing half made either way.
TEST_F(Snapshots, ASnapshotRacingADestroyIsWholeOrRefused) {
  auto a = Make();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  // Enough to copy that the destroy lands during it, most of the time.
  ASSERT_EQ(ShIn(*a, "mkdir /work/many && cd /work/many && for i in $(seq 1 3000); do echo $i > f$i; done; echo ok")
                .stdout(),
            "ok\n");
  std::promise<Result<v1::SnapshotInfo>> taken;
  SnapshotAsync(*a, "racing", [&taken](Result<v1::SnapshotInfo> r) { taken.set_value(std::move(r)); });
  Status gone = a->Destroy();
  made_.clear();
  auto snap = taken.get_future().get();
  EXPECT_TRUE(gone.ok()) << gone.ToString();
  if (snap.ok()) {
    EXPECT_EQ(snap->entries(), 3002u) << "whole: /work, /work/many and its 3000 files";
    EXPECT_TRUE(RemoveSnapshot(*client_, "racing").ok());
  } else {
    EXPECT_THAT(snap.status().message(), HasSubstr(a->id()));
  }
  EXPECT_THAT(Names(), ::testing::IsEmpty());
  EXPECT_THAT(ListSubdirs(daemon_->data_dir() + "/snapshots"), ::testing::ElementsAre("objects"))
      << "a part dir is left";

  // A fork racing its source's destroy is answered too: its forks made
  // (they outlive the source) or none.
  auto b = Make();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(ShIn(*b, "cp -r /work /tmp/w && mv /tmp/w /work/copy && echo ok").stdout(), "ok\n");
  std::promise<Result<std::vector<Sandbox>>> forked;
  ForkAsync(*b, 2, [&forked](Result<std::vector<Sandbox>> r) { forked.set_value(std::move(r)); });
  EXPECT_TRUE(b->Destroy().ok());
  made_.clear();
  auto forks = forked.get_future().get();
  if (forks.ok()) {
    for (const auto& f : *forks) EXPECT_EQ(ShIn(f, "echo alive").stdout(), "alive\n");
    for (const auto& f : *forks) Destroy(f);
  } else {
    EXPECT_THAT(forks.status().message(), HasSubstr(b->id()));
  }
  EXPECT_THAT(Names(), ::testing::IsEmpty());
}

// A fork past what the node holds (dsecd --slots) is refused as a whole,
// saying why; a fork that fits is made.
class SnapshotsOnAFullNode : public ContainerTest {
 protected:
  static void SetUpTestSuite() {
    TestDaemonOptions o;
    o.extra_args = {"--slots", "4"};
    start_ = TryStartContainerDaemon(o, &daemon_, &client_);
  }
};

TEST_F(SnapshotsOnAFullNode, AForkPastTheNodesRoomMakesNoneAndSaysWhy) {
  auto a = Make();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto big = Fork(*a, 8);
  EXPECT_EQ(big.status().code(), Status::Code::kResourceExhausted) << big.status().ToString();
  EXPECT_THAT(big.status().message(), HasSubstr("none is kept"));
  EXPECT_THAT(big.status().message(), HasSubstr("--slots"));
  auto listed = client_->ListSandboxes();
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->sandboxes_size(), 1) << "only the source is left";
  auto fits = Fork(*a, 3);
  ASSERT_TRUE(fits.ok()) << fits.status().ToString();
  for (auto& f : *fits) made_.push_back(f);
  EXPECT_EQ(ShIn((*fits)[2], "echo ok").stdout(), "ok\n");
}

// Whole or not at all across dsecd kill -9: what a snapshot cut short left
// (a part dir, a dir no record names) goes at the next start; snapshots
// and the sandboxes made from them come back, and who needs one is known
// again (a fork's goes with its last sandbox after the restart too).
class SnapshotsAcrossRestarts : public OwnContainerDaemonTest {};

TEST_F(SnapshotsAcrossRestarts, SnapshotsAreWholeOrGoneAfterAKill9AndTheirSandboxesComeBack) {
  auto a = Make();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(ShIn(*a, kChange).stdout(), "done\n");
  ASSERT_TRUE(Snapshot(*a, "kept").ok());
  v1::SandboxSpec from;
  from.set_snapshot("kept");
  auto b = client_->Create(from);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  made_.push_back(*b);
  auto forks = Fork(*a, 2);
  ASSERT_TRUE(forks.ok()) << forks.status().ToString();
  for (const auto& f : *forks) made_.push_back(f);
  std::string root = daemon_->data_dir() + "/snapshots";
  for (const char* d : {"/0123abcd.part", "/4567ef"}) {
    ASSERT_EQ(::mkdir((root + d).c_str(), 0700), 0) << root + d;
    ASSERT_EQ(::mkdir((root + d + "/x").c_str(), 0700), 0);
  }
  // A stored file no layer links any more, and a share cut short.
  ASSERT_TRUE(MakeDirs(root + "/objects/zz", 0700).ok());
  ASSERT_TRUE(WriteFileAtomic(root + "/objects/zz/orphan", "x", 0600).ok());
  ASSERT_TRUE(WriteFileAtomic(root + "/objects/tmp/half", "x", 0600).ok());
  daemon_->Kill9();
  ASSERT_TRUE(daemon_->Restart().ok());

  struct stat st;
  EXPECT_NE(::stat((root + "/0123abcd.part").c_str(), &st), 0) << "a snapshot cut short is removed";
  EXPECT_NE(::stat((root + "/4567ef").c_str(), &st), 0);
  EXPECT_NE(::stat((root + "/objects/zz/orphan").c_str(), &st), 0) << "a file no snapshot links is removed";
  EXPECT_NE(::stat((root + "/objects/tmp/half").c_str(), &st), 0);
  EXPECT_EQ(::stat((root + "/objects").c_str(), &st), 0);
  auto kept = GetSnapshot(*client_, "kept");
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_THAT(kept->users(), ::testing::ElementsAre("sandbox " + b->id()));
  EXPECT_EQ(ShIn(*b, kLook).stdout(), "state\ndeep\nyes-is-gone\n") << "re-adopted on its layers";
  EXPECT_EQ(ShIn((*forks)[1], "cat /work/f").stdout(), "state\n");
  auto c = client_->Create(from);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  made_.push_back(*c);
  EXPECT_EQ(ShIn(*c, "cat /work/f").stdout(), "state\n");
  auto all = ListSnapshots(*client_);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 2u) << "kept and the fork's";
  for (const auto& f : *forks) Destroy(f);
  all = ListSnapshots(*client_);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].name(), "kept");
}

}  // namespace
}  // namespace dsec::testing
