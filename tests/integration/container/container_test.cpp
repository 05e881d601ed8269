// Container sandboxes end to end through a real dsecd: create, exec, state
// kept between execs, verdicts, destroy leaving nothing behind, re-adoption
// after a restart (clean and kill -9), cleanup of what a crash left, and the
// errors a user gets for what cannot work.
#include <gmock/gmock.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "dsec/files.hpp"
#include "runtime/files.hpp"
#include "runtime/unique_fd.hpp"
#include "tests/support/cluster_probes.hpp"
#include "tests/support/container_fixture.hpp"

namespace dsec::testing {
namespace {

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

bool ImageMounted(const std::string& data_dir) {
  std::ifstream mi("/proc/self/mountinfo");
  for (std::string line; std::getline(mi, line);)
    if (line.find(data_dir + "/run/images/") != std::string::npos) return true;
  return false;
}

using Container = ContainerTest;

TEST_F(Container, DsecctlCreateExecRmLeavesNothingBehind) {
  auto created = daemon_->Ctl({"create", "--kind", "container", "--image", kImage});
  ASSERT_EQ(created.exit_code, 0) << created.err;
  std::string id = Trim(created.out);
  ASSERT_EQ(id.rfind("sb-", 0), 0u) << id;
  EXPECT_TRUE(ImageMounted(daemon_->data_dir()));

  auto hello = daemon_->Ctl({"exec", id, "--", "sh", "-c", "echo hello > /work/f; hostname"});
  EXPECT_EQ(hello.exit_code, 0) << hello.err;
  auto again = daemon_->Ctl({"exec", id, "--", "cat", "/work/f"});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, "hello\n");
  auto code = daemon_->Ctl({"exec", id, "--", "sh", "-c", "exit 7"});
  EXPECT_EQ(code.exit_code, 7);
  auto missing = daemon_->Ctl({"exec", id, "--", "no-such-program"});
  EXPECT_EQ(missing.exit_code, 127);

  auto rm = daemon_->Ctl({"rm", id});
  EXPECT_EQ(rm.exit_code, 0) << rm.err;
  EXPECT_EQ(Remains(id), "");
  EXPECT_FALSE(ImageMounted(daemon_->data_dir())) << "the image mount outlived its last container";
  auto gone = daemon_->Ctl({"exec", id, "--", "true"});
  EXPECT_NE(gone.exit_code, 0);
  EXPECT_NE(gone.err.find("not found"), std::string::npos) << gone.err;
}

TEST_F(Container, APausedContainerIsRemovedWithEveryProcessInIt) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  ASSERT_EQ(ShIn(*sb, "sleep 1000 > /dev/null 2>&1 & sleep 1000 > /dev/null 2>&1 &").verdict(), v1::VERDICT_OK);
  // A handle on each of its processes (the agent and the two sleeps) that
  // no pid reuse can fool.
  std::vector<UniqueFd> procs;
  std::ifstream in("/sys/fs/cgroup/memory/dsec-test/c/" + sb->id() + "/cgroup.procs");
  for (pid_t p; in >> p;) {
    procs.emplace_back(static_cast<int>(::syscall(SYS_pidfd_open, p, 0)));
    ASSERT_TRUE(procs.back()) << "pidfd_open " << p << ": " << std::strerror(errno);
  }
  ASSERT_EQ(procs.size(), 3u);
  ASSERT_TRUE(sb->Pause().ok());
  ASSERT_EQ(FreezerState(sb->id()), "FROZEN");
  Destroy(*sb);  // and nothing of it is left on the host
  for (const auto& fd : procs) {
    pollfd p{fd.get(), POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 0), 1) << "a process of the removed container is still alive";
  }
}

// Writes `v` to a cgroup file; false when it cannot.
bool WriteCgroup(const std::string& path, const std::string& v) {
  std::ofstream out(path);
  out << v;
  out.flush();
  return static_cast<bool>(out);
}

// A process of a container that cannot die: a `sleep` of it, moved in the
// freezer hierarchy alone into a group of the test's own and frozen there.
// It stays in the container's memory and pids groups, and a SIGKILL stays
// pending, as for a process stuck in the kernel. Thawed (it then takes a
// pending SIGKILL) and its group removed when this goes, whatever failed.
class StuckSleep {
 public:
  // Freezes the one `sleep` in container `id`'s group; error() says why not.
  explicit StuckSleep(const std::string& id) : dir_("/sys/fs/cgroup/freezer/dsec-test-stuck-" + std::to_string(::getpid())) {
    pid_t sleeper = -1;
    std::ifstream in("/sys/fs/cgroup/memory/dsec-test/c/" + id + "/cgroup.procs");
    for (pid_t p; in >> p;) {
      auto comm = ReadFileToString("/proc/" + std::to_string(p) + "/comm");
      if (comm.ok() && Trim(*comm) == "sleep") sleeper = p;
    }
    if (sleeper <= 0) {
      error_ = "no sleep in the container's group";
      return;
    }
    handle_.Reset(static_cast<int>(::syscall(SYS_pidfd_open, sleeper, 0)));
    if (!handle_ || ::mkdir(dir_.c_str(), 0755) < 0) {
      error_ = std::string("pidfd_open or mkdir ") + dir_ + ": " + std::strerror(errno);
      return;
    }
    if (!WriteCgroup(dir_ + "/cgroup.procs", std::to_string(sleeper)) || !WriteCgroup(dir_ + "/freezer.state", "FROZEN")) {
      error_ = "move the sleep into " + dir_ + " and freeze it";
      return;
    }
    std::string state;
    for (int i = 0; i < 5000 && state != "FROZEN"; ++i) {
      std::ifstream f(dir_ + "/freezer.state");
      f >> state;
      if (state != "FROZEN") ::usleep(1000);  // the freezer settles asynchronously
    }
    if (state != "FROZEN") error_ = "the sleep did not freeze (" + state + ")";
  }
  ~StuckSleep() {
    Thaw();
    for (int i = 0; i < 1000 && ::rmdir(dir_.c_str()) < 0 && errno == EBUSY; ++i) ::usleep(1000);
  }
  const std::string& error() const { return error_; }
  bool Alive() const {
    pollfd p{handle_.get(), POLLIN, 0};
    return ::poll(&p, 1, 0) == 0;
  }
  bool Thaw() { return WriteCgroup(dir_ + "/freezer.state", "THAWED"); }
  // Thaws it and waits (up to 10 s) until it has taken its SIGKILL.
  bool ThawAndWaitGone() {
    pollfd p{handle_.get(), POLLIN, 0};
    return Thaw() && ::poll(&p, 1, 10000) == 1;
  }

 private:
  std::string dir_, error_;
  UniqueFd handle_;
};

// What a destroy that could not stop a container leaves, as the user sees
// it: the record, failed, asking for a destroy again; the container's files.
void ExpectKeptAfterAFailedDestroy(const Sandbox& sb, const Status& destroyed, const std::string& data_dir) {
  EXPECT_FALSE(destroyed.ok()) << "a process of the container is still alive, so the destroy cannot have succeeded";
  EXPECT_NE(destroyed.message().find("still in its cgroup"), std::string::npos) << destroyed.message();
  auto rec = sb.Get();
  ASSERT_TRUE(rec.ok()) << "the record must stay: " << rec.status().ToString();
  EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_FAILED);
  EXPECT_NE(rec->error().find("destroy it again"), std::string::npos) << rec->error();
  struct stat st;
  EXPECT_EQ(::stat((data_dir + "/sandboxes/" + sb.id()).c_str(), &st), 0) << "its files stay while a process of it runs";
}

// A destroy that cannot stop every process of a container is refused,
// saying so, and takes nothing from under what still runs: the sandbox
// stays (failed) with its files and its image; once the process can die, a
// destroy again removes all of it.
TEST_F(Container, ADestroyThatCannotStopEveryProcessFailsAndADestroyAgainFinishes) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  ASSERT_EQ(ShIn(*sb, "sleep 1000 > /dev/null 2>&1 &").verdict(), v1::VERDICT_OK);
  StuckSleep stuck(sb->id());
  ASSERT_EQ(stuck.error(), "");

  ASSERT_NO_FATAL_FAILURE(ExpectKeptAfterAFailedDestroy(*sb, sb->Destroy(), daemon_->data_dir()));
  EXPECT_TRUE(ImageMounted(daemon_->data_dir())) << "its image stays mounted while a process of it runs";
  EXPECT_TRUE(stuck.Alive()) << "the frozen sleep is the process the destroy could not stop";

  ASSERT_TRUE(stuck.ThawAndWaitGone()) << "thawed, the sleep takes its pending SIGKILL";
  Destroy(*sb);  // and nothing of it is left on the host
  EXPECT_FALSE(ImageMounted(daemon_->data_dir()));
}

TEST_F(Container, DsecctlCpPauseResumeAndStreamedExec) {
  auto created = daemon_->Ctl({"create", "--kind", "container", "--image", kImage});
  ASSERT_EQ(created.exit_code, 0) << created.err;
  std::string id = Trim(created.out);
  char tmpl[] = "/tmp/dsec-test-cp-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  ASSERT_TRUE(WriteFileAtomic(dir + "/in.sh", "echo from the host\n", 0750).ok());
  auto in = daemon_->Ctl({"cp", dir + "/in.sh", id + ":/work/in.sh"});
  EXPECT_EQ(in.exit_code, 0) << in.err;
  // The mode came along; stdout and stderr both reach the caller.
  auto run = daemon_->Ctl({"exec", id, "--", "sh", "-c", "stat -c %a /work/in.sh; sh /work/in.sh > /work/out; echo warn >&2"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, "750\n");
  EXPECT_EQ(run.err, "warn\n");
  auto out = daemon_->Ctl({"cp", id + ":/work/out", dir + "/out"});
  EXPECT_EQ(out.exit_code, 0) << out.err;
  auto copied = ReadFileToString(dir + "/out");
  ASSERT_TRUE(copied.ok()) << copied.status().ToString();
  EXPECT_EQ(*copied, "from the host\n");
  auto missing = daemon_->Ctl({"cp", id + ":/work/none", dir + "/none"});
  EXPECT_EQ(missing.exit_code, 125) << "a file the sandbox lacks: dsec could not do it";
  EXPECT_NE(missing.err.find("/work/none"), std::string::npos) << missing.err;
  auto both_local = daemon_->Ctl({"cp", dir + "/a", dir + "/b"});
  EXPECT_EQ(both_local.exit_code, 2);
  EXPECT_NE(both_local.err.find("ID:/"), std::string::npos) << both_local.err;
  // Into a sandbox as a user, its parents made, with extended attributes that fs ls shows.
  auto meta = daemon_->Ctl({"cp", dir + "/in.sh", id + ":/work/m/in.sh", "--parents", "--user", "user", "--xattr",
                            "e2b.k=v", "--xattr", "a=b"});
  EXPECT_EQ(meta.exit_code, 0) << meta.err;
  auto shown = daemon_->Ctl({"fs", "ls", id, "/work/m"});
  EXPECT_NE(shown.out.find(" user "), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find(" in.sh  [a=b, e2b.k=v]\n"), std::string::npos) << shown.out;
  EXPECT_EQ(daemon_->Ctl({"cp", id + ":/work/m/in.sh", dir + "/x", "--xattr", "a=b"}).exit_code, 2)
      << "attributes are for a copy into a sandbox";
  EXPECT_EQ(daemon_->Ctl({"cp", dir + "/in.sh", id + ":/work/m/x", "--xattr", "novalue"}).exit_code, 2);
  // fs mkdir (for a user), mv, ls (owner names from the image), rm; exec --user.
  EXPECT_EQ(daemon_->Ctl({"fs", "mkdir", id, "/work/d/e", "--user", "user"}).exit_code, 0);
  EXPECT_EQ(daemon_->Ctl({"fs", "mv", id, "/work/in.sh", "/work/d/e/moved"}).exit_code, 0);
  auto listed = daemon_->Ctl({"fs", "ls", id, "/work/d"});
  EXPECT_EQ(listed.out.substr(0, listed.out.find(' ', 11) + 1), "drwxr-xr-x user ") << listed.out << listed.err;
  EXPECT_NE(listed.out.find(" e\n"), std::string::npos) << listed.out;
  auto as_user = daemon_->Ctl({"exec", "--user", "user", id, "--", "sh", "-c", "id -un; pwd"});
  EXPECT_EQ(as_user.out, "user\n/home/user\n") << as_user.err;
  EXPECT_EQ(daemon_->Ctl({"exec", "-u", "user", "--cwd", "/work/d", id, "--", "ls", "e"}).out, "moved\n");
  EXPECT_EQ(daemon_->Ctl({"fs", "rm", id, "/work/d"}).exit_code, 0);
  auto gone = daemon_->Ctl({"fs", "ls", id, "/work/d"});
  EXPECT_EQ(gone.exit_code, 125);
  EXPECT_NE(gone.err.find("/work/d"), std::string::npos) << gone.err;

  auto paused = daemon_->Ctl({"pause", id});
  EXPECT_EQ(paused.exit_code, 0) << paused.err;
  auto refused = daemon_->Ctl({"exec", id, "--", "true"});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("paused"), std::string::npos) << refused.err;
  auto resumed = daemon_->Ctl({"resume", id});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(daemon_->Ctl({"exec", id, "--", "cat", "/work/out"}).out, "from the host\n");
  EXPECT_EQ(daemon_->Ctl({"rm", id}).exit_code, 0);
  RunProcess({"/bin/rm", "-rf", dir});
  EXPECT_EQ(Remains(id), "");
}

// dsecctl exec passes a pipe's input on as it comes (the second line is
// written only once the first was answered), and Ctrl-C stops the command
// in the sandbox, not only the client; ps lists running execs, signal
// ends one by pid.
TEST_F(Container, DsecctlExecStreamsStdinPassesCtrlCAndSignalsByPid) {
  auto created = daemon_->Ctl({"create", "--kind", "container", "--image", kImage});
  ASSERT_EQ(created.exit_code, 0) << created.err;
  std::string id = Trim(created.out);
  char tmpl[] = "/tmp/dsec-test-exec-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string fifo = std::string(tmpl) + "/in";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string ctl = BinDir() + "/dsecctl --data-dir " + daemon_->data_dir();
  auto child = Child::Start({"/bin/sh", "-c",
                             "exec " + ctl + " exec " + id + " -- sh -c 'read a; echo got $a; read b; echo got $b' < " +
                                 fifo});
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  {
    std::ofstream in(fifo);  // opens once the shell has opened its end
    in << "one" << std::endl;
    std::string line;
    ASSERT_TRUE((*child)->ReadLine(&line, 60)) << "the first line never reached the command";
    EXPECT_EQ(line, "got one");
    in << "two" << std::endl;
  }
  std::string line;
  ASSERT_TRUE((*child)->ReadLine(&line, 60));
  EXPECT_EQ(line, "got two");
  EXPECT_EQ((*child)->Wait(), 0);

  auto sleeper = Child::Start({"/bin/sh", "-c", "exec " + ctl + " exec " + id + " -- sh -c 'echo ready; exec sleep 600'"});
  ASSERT_TRUE(sleeper.ok()) << sleeper.status().ToString();
  ASSERT_TRUE((*sleeper)->ReadLine(&line, 60));
  ASSERT_EQ(line, "ready");
  auto ps = daemon_->Ctl({"ps", id});
  EXPECT_NE(ps.out.find("sleep 600"), std::string::npos) << ps.out << ps.err;
  ::kill((*sleeper)->pid(), SIGINT);
  EXPECT_EQ((*sleeper)->Wait(), 128 + SIGINT) << "the command ended by Ctrl-C's SIGINT, in the sandbox";
  EXPECT_EQ(daemon_->Ctl({"ps", id}).out.find("sleep 600"), std::string::npos) << "nothing left running";

  auto other = Child::Start({"/bin/sh", "-c", "exec " + ctl + " exec " + id + " -- sh -c 'echo ready; exec sleep 601'"});
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->ReadLine(&line, 60));
  std::string listed = daemon_->Ctl({"ps", id}).out;
  size_t at = listed.find("sleep 601");
  ASSERT_NE(at, std::string::npos) << listed;
  std::string row = listed.substr(listed.rfind('\n', at) + 1);
  EXPECT_EQ(daemon_->Ctl({"signal", id, row.substr(0, row.find(' ')), "-s", "9"}).exit_code, 0);
  EXPECT_EQ((*other)->Wait(), 128 + SIGKILL);
  auto gone = daemon_->Ctl({"signal", id, row.substr(0, row.find(' '))});
  EXPECT_EQ(gone.exit_code, 125) << gone.err;
  RunProcess({"/bin/rm", "-rf", tmpl});
  EXPECT_EQ(daemon_->Ctl({"rm", id}).exit_code, 0);
}

TEST_F(Container, HundredSequentialExecsSeeEachOthersFiles) {
  auto sb = NewContainer();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  for (int i = 0; i < 100; ++i) {
    // Each exec appends to what the ones before it wrote and checks the count.
    auto r = ShIn(*sb, "echo " + std::to_string(i) + " >> /work/log && wc -l < /work/log");
    ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << i << ": " << r.error() << r.stderr();
    ASSERT_EQ(Trim(r.stdout()), std::to_string(i + 1));
  }
  auto all = ShIn(*sb, "cat /work/log | tr '\\n' ' '");
  std::string want;
  for (int i = 0; i < 100; ++i) want += std::to_string(i) + " ";
  EXPECT_EQ(all.stdout(), want);
  EXPECT_TRUE(sb->Destroy().ok());
}

TEST_F(Container, ProcessesAndFilesPersistBetweenExecs) {
  auto sb = NewContainer();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  // A background process started by one exec is still there for the next.
  auto start = ShIn(*sb, "sleep 1000 > /dev/null 2>&1 & echo $! > /tmp/bg");
  ASSERT_EQ(start.verdict(), v1::VERDICT_OK) << start.stderr();
  auto check = ShIn(*sb, "kill -0 $(cat /tmp/bg) && echo alive");
  EXPECT_EQ(check.stdout(), "alive\n") << check.stderr();
  // The environment and working directory are the container's.
  auto where = ShIn(*sb, "pwd; id -u; echo $HOME");
  EXPECT_EQ(where.stdout(), "/work\n0\n/root\n");
  EXPECT_TRUE(sb->Destroy().ok());
  EXPECT_EQ(Remains(sb->id()), "");
}

// Extended attributes through the SDK (dsec::Write, FileInfo.xattrs; E2B's
// file metadata): set with a write, shown by ListFiles and to programs in
// the container, a namespace replaced by a rewrite; bad ones refused
// before anything is written.
TEST_F(Container, AWriteSetsUserExtendedAttributesAndListFilesShowsThem) {
  auto sb = NewContainer();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  v1::WriteFileRequest w;
  w.set_path("/work/x.txt");
  w.set_content("x");
  (*w.mutable_xattrs())["e2b.author"] = "mish";
  (*w.mutable_xattrs())["keep"] = "1";
  ASSERT_TRUE(Write(*sb, w).ok());
  auto info = sb->ListFiles("/work/x.txt");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->info().xattrs().size(), 2u);
  EXPECT_EQ(info->info().xattrs().at("e2b.author"), "mish");
  EXPECT_EQ(ShIn(*sb, "python3 -c \"import os; print(os.getxattr('/work/x.txt', 'user.e2b.author').decode())\"").stdout(),
            "mish\n");
  v1::WriteFileRequest again;
  again.set_path("/work/x.txt");
  again.set_content("y");
  again.set_xattrs_replace("e2b.");
  ASSERT_TRUE(Write(*sb, again).ok());
  info = sb->ListFiles("/work");
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(info->entries_size(), 1);
  EXPECT_EQ(info->entries(0).xattrs().size(), 1u) << "the e2b. namespace was replaced; keep stays";
  EXPECT_EQ(info->entries(0).xattrs().count("keep"), 1u);
  v1::WriteFileRequest bad;
  bad.set_path("/work/bad.txt");
  (*bad.mutable_xattrs())[std::string(201, 'k')] = "v";
  Status refused = Write(*sb, bad);
  EXPECT_EQ(refused.code(), Status::Code::kInvalidArgument) << refused.ToString();
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("1 to 200 bytes"));
  EXPECT_EQ(sb->ListFiles("/work/bad.txt").status().code(), Status::Code::kNotFound) << "nothing written";
  // More attributes than the filesystem keeps for a file (ext4: one block):
  // the write fails with the file as it was, and a new file is not left.
  v1::WriteFileRequest big;
  big.set_content("new");
  for (int i = 0; i < 64; ++i) (*big.mutable_xattrs())["k" + std::to_string(i)] = std::string(4000, 'v');
  auto probe = ShIn(*sb, "python3 -c \"import os; open('/work/p', 'w'); "
                         "[os.setxattr('/work/p', 'user.k%d' % i, b'v' * 4000) for i in range(64)]\"; rm -f /work/p");
  if (probe.exit_code() == 0) {
    std::printf("# this filesystem keeps 256 KB of attributes per file: no failing write to check\n");
  } else {
    big.set_path("/work/x.txt");
    EXPECT_FALSE(Write(*sb, big).ok());
    auto kept = sb->ReadFile("/work/x.txt");
    EXPECT_EQ(kept.ok() ? *kept : kept.status().ToString(), "y") << "its data untouched";
    big.set_path("/work/new.txt");
    EXPECT_FALSE(Write(*sb, big).ok());
    EXPECT_EQ(sb->ListFiles("/work/new.txt").status().code(), Status::Code::kNotFound) << "no empty file left";
  }
  EXPECT_TRUE(sb->Destroy().ok());
}

TEST_F(Container, VerdictsMatchFncall) {
  v1::Limits lim;
  lim.set_memory_bytes(128 << 20);
  auto sb = NewContainer(lim);
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();

  v1::Limits quick;
  quick.set_timeout_ms(500);
  auto slow = ShIn(*sb, "sleep 30", quick);
  EXPECT_EQ(slow.verdict(), v1::VERDICT_TIME_LIMIT) << slow.error();
  EXPECT_LT(slow.wall_us(), 10'000'000u);

  auto hog = Exec(*sb, Command({"python3", "-c", "x = bytearray(512 << 20); print(len(x))"}));
  EXPECT_EQ(hog.verdict(), v1::VERDICT_MEMORY_LIMIT) << hog.error() << hog.stderr();

  v1::Limits small_out;
  small_out.set_output_bytes(4096);
  auto flood = ShIn(*sb, "yes", small_out);
  EXPECT_EQ(flood.verdict(), v1::VERDICT_OUTPUT_LIMIT) << flood.error();
  EXPECT_TRUE(flood.stdout_truncated());
  EXPECT_EQ(flood.stdout().size(), 4096u);

  auto sig = ShIn(*sb, "kill -SEGV $$");
  EXPECT_EQ(sig.verdict(), v1::VERDICT_RUNTIME_ERROR);
  EXPECT_EQ(sig.signal(), SIGSEGV);

  auto missing = Exec(*sb, Command({"definitely-not-here"}));
  EXPECT_EQ(missing.exit_code(), 127);
  EXPECT_TRUE(missing.exec_failed());

  v1::Limits cpu;
  cpu.set_cpu_time_ms(300);
  auto spin = Exec(*sb, Sh("while :; do :; done", cpu));
  EXPECT_EQ(spin.verdict(), v1::VERDICT_TIME_LIMIT) << spin.error();

  // After all that the container still answers.
  auto ok = ShIn(*sb, "echo still here");
  EXPECT_EQ(ok.stdout(), "still here\n");
  EXPECT_TRUE(sb->Destroy().ok());
}

TEST_F(Container, DestroyStopsExecsInFlightAndAnswersThem) {
  auto sb = NewContainer();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto pending = sb->ExecAsync(Sh("touch /work/started; exec sleep 600"));
  // The exec runs in the container when the destroy comes.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!sb->ReadFile("/work/started").ok() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling the container, bounded
  ASSERT_TRUE(sb->ReadFile("/work/started").ok()) << "the exec never started";
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  // The destroy kills it and waits for its answer.
  Status destroyed = sb->Destroy();
  EXPECT_TRUE(destroyed.ok()) << destroyed.ToString();
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(20)), std::future_status::ready) << "the exec was never answered";
  auto r = pending.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->verdict(), v1::VERDICT_PLATFORM_ERROR) << v1::Verdict_Name(r->verdict()) << ": " << r->error();
  EXPECT_NE(r->error().find("sandbox " + sb->id() + " was destroyed"), std::string::npos) << r->error();
  EXPECT_EQ(Remains(sb->id()), "");
}

TEST_F(Container, UnknownImageAndWrongUsesSayWhatToDo) {
  auto none = client_->Create(ContainerSpec("no-such-image"));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Status::Code::kNotFound);
  EXPECT_NE(none.status().message().find("no-such-image"), std::string::npos) << none.status().ToString();
  EXPECT_NE(none.status().message().find("dsec-image ls"), std::string::npos) << none.status().ToString();

  auto host = client_->Create(ContainerSpec(""));
  ASSERT_FALSE(host.ok());
  EXPECT_EQ(host.status().code(), Status::Code::kInvalidArgument) << host.status().ToString();

  // One-shot runs are fncall's.
  auto run = client_->Run(ContainerSpec(kImage), Command({"true"}));
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.status().message().find("create a sandbox"), std::string::npos) << run.status().ToString();

  // An image in use cannot be removed.
  auto sb = NewContainer();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto rm = RunProcess({BinDir() + "/dsec-image", "--data-dir", daemon_->data_dir(), "rm", kImage});
  EXPECT_EQ(rm.exit_code, 1);
  EXPECT_NE(rm.err.find("in use"), std::string::npos) << rm.err;
  EXPECT_TRUE(sb->Destroy().ok());
}

TEST_F(Container, AutoKindPicksContainerForABuiltImage) {
  v1::SandboxSpec spec;
  spec.set_kind(v1::KIND_AUTO);
  spec.set_image(kImage);
  auto sb = client_->Create(spec);
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto rec = sb->Get();
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->spec().kind(), v1::KIND_CONTAINER);
  EXPECT_EQ(rec->spec().limits().memory_bytes(), 512ull << 20) << "the record shows the limits in force";
  EXPECT_TRUE(sb->Destroy().ok());
}

// --- restarts: each test has its own daemon, which it stops and starts ------------

using ContainerRestart = OwnContainerDaemonTest;

TEST_F(ContainerRestart, CleanRestartReadoptsRunningContainers) {
  auto sb = NewContainer();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  ASSERT_EQ(ShIn(*sb, "echo kept > /work/state; sleep 1000 > /dev/null 2>&1 &").verdict(), v1::VERDICT_OK);
  ASSERT_EQ(daemon_->Stop(), 0);
  ASSERT_TRUE(daemon_->Restart().ok());
  auto r = ShIn(*sb, "cat /work/state; ps -e | grep -c 'sleep'");
  EXPECT_EQ(r.stdout(), "kept\n1\n") << r.stderr() << r.error();
  EXPECT_TRUE(sb->Destroy().ok());
  EXPECT_EQ(Remains(sb->id()), "");
}

TEST_F(ContainerRestart, Kill9ReadoptsAndAGoneAgentIsMarkedFailedAndCleanedUp) {
  auto keep = NewContainer();
  auto lose = NewContainer();
  ASSERT_TRUE(keep.ok() && lose.ok());
  ASSERT_EQ(ShIn(*keep, "echo kept > /work/state").verdict(), v1::VERDICT_OK);
  auto pid = ShIn(*lose, "echo $PPID");  // the agent's pid, in the container's namespace: 1
  EXPECT_EQ(pid.stdout(), "1\n");
  // The agent of `lose` dies while dsecd is down: kill every process in its cgroup.
  daemon_->Kill9();
  std::ifstream procs("/sys/fs/cgroup/memory/dsec-test/c/" + lose->id() + "/cgroup.procs");
  int n = 0;
  for (pid_t p; procs >> p; ++n) ::kill(p, SIGKILL);
  ASSERT_GT(n, 0);
  ASSERT_TRUE(daemon_->Restart().ok());

  auto r = ShIn(*keep, "cat /work/state");
  EXPECT_EQ(r.stdout(), "kept\n");
  auto rec = lose->Get();
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_FAILED);
  EXPECT_NE(rec->error().find("not re-adopted"), std::string::npos) << rec->error();
  EXPECT_EQ(Remains(lose->id()), "") << "a container whose agent is gone is cleaned up";
  auto dead = lose->Exec(Command({"true"}));
  EXPECT_TRUE(!dead.ok() || dead->verdict() != v1::VERDICT_OK);
  // Destroying the failed one gives back no hold on the image (this dsecd
  // never held one for it): the image stays mounted for `keep`, and a new
  // container on it has its files. (It was given back, and the image
  // unmounted under creations in flight: "overlay lowerdir: No such file",
  // or a container without /bin/sh.)
  EXPECT_TRUE(lose->Destroy().ok());  // removes the failed record
  auto mounts = daemon_->Admin("stats")["container"]["image_mounts"];
  ASSERT_EQ(mounts.size(), 1u) << mounts.dump();
  EXPECT_EQ(mounts.begin()->get<int>(), 1) << "holders of the image: " << mounts.dump();
  auto fresh = NewContainer();
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_EQ(ShIn(*fresh, "echo ok").stdout(), "ok\n");
  EXPECT_TRUE(fresh->Destroy().ok());
  EXPECT_TRUE(keep->Destroy().ok());
  EXPECT_EQ(daemon_->Admin("stats")["container"]["image_mounts"].size(), 0u) << "the last holder gave it back";
  EXPECT_EQ(Remains(keep->id()), "");
}

// The same across a restart: dsecd comes back with the failed sandbox not
// re-adopted (failed records are not) and the process still stuck; neither
// its start (which removes what it does not re-adopt) nor a destroy again
// takes the files from under it. Once it can die, a destroy removes all.
TEST_F(ContainerRestart, AContainerThatCouldNotBeStoppedKeepsItsFilesAcrossARestart) {
  auto sb = NewContainer();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  ASSERT_EQ(ShIn(*sb, "sleep 1000 > /dev/null 2>&1 &").verdict(), v1::VERDICT_OK);
  StuckSleep stuck(sb->id());
  ASSERT_EQ(stuck.error(), "");
  ASSERT_NO_FATAL_FAILURE(ExpectKeptAfterAFailedDestroy(*sb, sb->Destroy(), daemon_->data_dir()));

  ASSERT_EQ(daemon_->Stop(), 0);
  ASSERT_TRUE(daemon_->Restart().ok());
  ASSERT_NO_FATAL_FAILURE(ExpectKeptAfterAFailedDestroy(*sb, sb->Destroy(), daemon_->data_dir()));
  EXPECT_TRUE(stuck.Alive());

  ASSERT_TRUE(stuck.ThawAndWaitGone()) << "thawed, the sleep takes its pending SIGKILL";
  EXPECT_TRUE(sb->Destroy().ok());
  made_.clear();
  EXPECT_EQ(Remains(sb->id()), "");
}

TEST_F(ContainerRestart, LeftoversOfACutShortCreationAreRemovedAtStart) {
  // What a crash in the middle of a creation leaves: a sandbox dir and a
  // cgroup with a process in it, and no record.
  ASSERT_EQ(daemon_->Stop(), 0);
  std::string id = "sb-000000leftover";
  std::string dir = daemon_->data_dir() + "/sandboxes/" + id;
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  std::string cg = "/sys/fs/cgroup/memory/dsec-test/c/" + id;
  ASSERT_EQ(RunProcess({"/bin/mkdir", "-p", cg}).exit_code, 0);
  pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  std::ofstream(cg + "/cgroup.procs") << child;
  // Reap it the moment it is killed: a zombie still counts as a member of
  // its cgroup on some kernels, and the sweep could not remove the group.
  int status = 0;
  pid_t reaped = -1;
  std::thread reaper([&] { reaped = ::waitpid(child, &status, 0); });
  Status started = daemon_->Restart();
  if (!started.ok()) ::kill(child, SIGKILL);
  reaper.join();
  ASSERT_TRUE(started.ok()) << started.ToString();
  EXPECT_EQ(reaped, child);
  EXPECT_TRUE(WIFSIGNALED(status)) << "the process in the leftover cgroup was killed";
  // The sweep removes leftovers on the driver's thread after the restore
  // (dsecd answers meanwhile): gone within its deadline, not at ready.
  EXPECT_TRUE(WaitUntil([&] { return Remains(id).empty(); }, std::chrono::seconds(20))) << Remains(id);
}

}  // namespace
}  // namespace dsec::testing
