// Copying files in and out of a container (SDK ReadFile/WriteFile and
// `dsecctl cp`) is no way out of it: paths with ".." are refused before they
// reach the sandbox, symlinks resolve inside the container (a link to
// /etc/shadow is the container's own /etc/shadow, never the host's), the
// /proc magic links that point at other roots are refused, FIFOs cannot
// hang the agent, and the agent's own files cannot be replaced.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <gmock/gmock.h>

#include "runtime/files.hpp"
#include "tests/support/container_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

class ContainerFiles : public ContainerTest {};

// `st` is the agent's refusal with `err`: its code, and the errno's text in
// its message (the agent says strerror for what the kernel refused).
void ExpectRefused(const Status& st, Status::Code code, int err, const std::string& what) {
  EXPECT_EQ(st.code(), code) << what << ": " << st.ToString();
  EXPECT_NE(st.message().find(std::strerror(err)), std::string::npos) << what << ": " << st.ToString();
}

// A file only the host has, with known content; removed at the end.
class HostMarker {
 public:
  HostMarker() {
    char tmpl[] = "/tmp/dsec-test-hostfile-XXXXXX";
    dir_ = ::mkdtemp(tmpl) ? tmpl : "";
    path_ = dir_ + "/secret";
    (void)WriteFileAtomic(path_, "host secret\n", 0600);
  }
  ~HostMarker() {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }
  std::string content() const {
    auto c = ReadFileToString(path_);
    return c.ok() ? *c : "<" + c.status().message() + ">";
  }

 private:
  std::string dir_, path_;
};

TEST_F(ContainerFiles, DotDotPathsAreRefusedBeforeReachingTheSandbox) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  for (const char* p : {"/work/../../etc/shadow", "/../etc/shadow", "/work/..", "/work/a/../../../etc/passwd"}) {
    auto r = sb->ReadFile(p);
    EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << p << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(".."), std::string::npos) << r.status().message();
    auto w = sb->WriteFile(p, "x");
    EXPECT_EQ(w.code(), Status::Code::kInvalidArgument) << p << ": " << w.ToString();
  }
  auto rel = sb->ReadFile("etc/shadow");
  EXPECT_EQ(rel.status().code(), Status::Code::kInvalidArgument) << rel.status().ToString();
  // The same through dsecctl cp, both directions.
  char tmpl[] = "/tmp/dsec-test-cp-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string local = std::string(tmpl) + "/out";
  auto out = daemon_->Ctl({"cp", sb->id() + ":/work/../../etc/shadow", local});
  EXPECT_NE(out.exit_code, 0);
  EXPECT_NE(out.err.find(".."), std::string::npos) << out.err;
  struct stat st;
  EXPECT_NE(::stat(local.c_str(), &st), 0) << "cp wrote a file although it was refused";
  ASSERT_TRUE(WriteFileAtomic(local, "payload", 0644).ok());
  auto in = daemon_->Ctl({"cp", local, sb->id() + ":/work/../../../tmp/payload"});
  EXPECT_NE(in.exit_code, 0);
  EXPECT_NE(in.err.find(".."), std::string::npos) << in.err;
  RunProcess({"/bin/rm", "-rf", tmpl});
  Destroy(*sb);
}

TEST_F(ContainerFiles, SymlinksResolveInsideTheContainer) {
  HostMarker host;
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  // Links to the host marker's path (absolute, and climbing with ..), and to
  // /etc/shadow, which the container has its own copy of.
  std::string script = "mkdir -p $(dirname " + host.path() + ") && echo container copy > " + host.path() +
                       " && echo container shadow > /etc/shadow && ln -s " + host.path() +
                       " /work/abs && ln -s ../../../../../.." + host.path() +
                       " /work/climb && ln -s /etc/shadow /work/shadow";
  ASSERT_EQ(ShIn(*sb, script).verdict(), v1::VERDICT_OK);
  for (const char* link : {"/work/abs", "/work/climb"}) {
    auto r = sb->ReadFile(link);
    ASSERT_TRUE(r.ok()) << link << ": " << r.status().ToString();
    EXPECT_EQ(*r, "container copy\n") << link << " reached outside the container";
  }
  auto shadow = sb->ReadFile("/work/shadow");
  ASSERT_TRUE(shadow.ok()) << shadow.status().ToString();
  EXPECT_EQ(*shadow, "container shadow\n");
  // Writing through a link changes the container's file, not the host's.
  ASSERT_TRUE(sb->WriteFile("/work/climb", "overwritten\n").ok());
  EXPECT_EQ(host.content(), "host secret\n");
  EXPECT_EQ(ShIn(*sb, "cat " + host.path()).stdout(), "overwritten\n");
  // dsecctl cp follows the same rules.
  auto cp = daemon_->Ctl({"cp", sb->id() + ":/work/abs", "-"});
  EXPECT_EQ(cp.exit_code, 0) << cp.err;
  EXPECT_EQ(cp.out, "overwritten\n");
  Destroy(*sb);
  EXPECT_EQ(host.content(), "host secret\n");
}

TEST_F(ContainerFiles, ProcMagicLinksAreRefused) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  ASSERT_EQ(ShIn(*sb, "ln -s /proc/1/root/etc/hostname /work/magic; sleep 1000 > /dev/null 2>&1 &").verdict(),
            v1::VERDICT_OK);
  // Each is refused where the path meets the magic link (ELOOP), for
  // reading and for writing (/work/magic: its O_EXCL create finds the link,
  // the plain open then follows it).
  for (const char* p : {"/proc/1/root/etc/hostname", "/proc/self/root/etc/hostname", "/proc/1/cwd/etc/hostname",
                        "/work/magic"}) {
    auto r = sb->ReadFile(p);
    ASSERT_FALSE(r.ok()) << p << " was read: " << *r;
    ExpectRefused(r.status(), Status::Code::kFailedPrecondition, ELOOP, p);
    EXPECT_NE(r.status().message().find("magic link"), std::string::npos) << r.status().message();
    ExpectRefused(sb->WriteFile(p, "x"), Status::Code::kFailedPrecondition, ELOOP, p);
  }
  // An open fd of a process is a magic link too.
  auto fd = sb->ReadFile("/proc/1/fd/0");
  ASSERT_FALSE(fd.ok()) << "/proc/1/fd/0 was read";
  ExpectRefused(fd.status(), Status::Code::kFailedPrecondition, ELOOP, "/proc/1/fd/0");
  Destroy(*sb);
}

TEST_F(ContainerFiles, FifosAndDevicesAreRefusedAndTheAgentKeepsAnswering) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  ASSERT_EQ(ShIn(*sb, "mkfifo /work/pipe").verdict(), v1::VERDICT_OK);
  // Opened without waiting for a writer, then refused for what it is.
  auto r = sb->ReadFile("/work/pipe");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << r.status().ToString();  // EINVAL
  EXPECT_NE(r.status().message().find("is a FIFO, not a regular file"), std::string::npos) << r.status().message();
  // Opened for writing without waiting for a reader: there is none (ENXIO).
  auto w = sb->WriteFile("/work/pipe", "x");
  EXPECT_NE(w.message().find(std::strerror(ENXIO)), std::string::npos) << w.ToString();
  auto dev = sb->ReadFile("/dev/zero");
  ASSERT_FALSE(dev.ok()) << "an endless device was read";
  EXPECT_EQ(dev.status().code(), Status::Code::kInvalidArgument) << dev.status().ToString();  // EINVAL
  EXPECT_NE(dev.status().message().find("is a character device, not a regular file"), std::string::npos)
      << dev.status().message();
  EXPECT_EQ(ShIn(*sb, "echo alive").stdout(), "alive\n");
  Destroy(*sb);
}

TEST_F(ContainerFiles, TheAgentAndItsSocketCannotBeReplaced) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  const std::string script = "#!/bin/sh\necho pwned\n";
  // /run/dsec is mounted read-only: nothing new in it.
  ExpectRefused(sb->WriteFile("/run/dsec/new", script, 0755), Status::Code::kFailedPrecondition, EROFS,
                "/run/dsec/new");
  // The running agent's file: the kernel refuses writers to a running
  // program first where it does (ETXTBSY), else the read-only mount.
  ExpectRefused(sb->WriteFile("/run/dsec/agent", script, 0755), Status::Code::kFailedPrecondition,
                RunningProgramsRefuseWriters() ? ETXTBSY : EROFS, "/run/dsec/agent");
  // A socket cannot be opened at all (ENXIO).
  auto sock = sb->WriteFile("/run/dsec/agent.sock", script, 0755);
  EXPECT_NE(sock.message().find(std::strerror(ENXIO)), std::string::npos) << sock.ToString();
  // Nor removed or renamed from inside: the read-only mount again.
  auto rm = ShIn(*sb, "rm -f /run/dsec/agent.sock; echo rm=$?; mv /run/dsec/agent /run/dsec/agent.old; echo mv=$?");
  EXPECT_EQ(rm.stdout(), "rm=1\nmv=1\n") << rm.stderr();
  EXPECT_EQ(Occurrences(rm.stderr(), std::strerror(EROFS)), 2) << rm.stderr();
  // Still served by the real agent.
  EXPECT_EQ(ShIn(*sb, "echo alive").stdout(), "alive\n");
  EXPECT_EQ(ShIn(*sb, "ls /run/dsec | tr '\\n' ' '").stdout(), "agent agent.sock etc ");
  Destroy(*sb);
}

// A forged request to the agent's socket from inside the sandbox (DSec saw
// agents do it): the agent, the sandbox's PID 1, serves only peers outside
// its pid namespace (dsecd), so the request runs nothing and the caller
// reads EOF. What the agent logs is not in the sandbox's reach either: its
// stderr goes to the host, and /proc/1 is closed to the sandbox.
TEST_F(ContainerFiles, AForgedRequestToTheAgentsSocketRunsNothing) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  // agent.proto's Request{id: 7, exec: {argv: [/bin/sh, -c, touch /tmp/forged]}}, framed.
  const std::string forge =
      "import socket, struct\n"
      "def s(field, b): return bytes([field << 3 | 2, len(b)]) + b\n"
      "exec_ = b''.join(s(1, a) for a in (b'/bin/sh', b'-c', b'touch /tmp/forged'))\n"
      "req = bytes([8, 7]) + s(2, exec_)\n"
      "c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); c.settimeout(5)\n"
      "try:\n"
      "  c.connect('/run/dsec/agent.sock')\n"
      "  c.sendall(struct.pack('<I', len(req)) + req)\n"
      "  print('answer', len(c.recv(4096)))\n"
      "except OSError as e: print(type(e).__name__)\n";
  auto r = ShIn(*sb, "python3 -c \"" + forge + "\"; test -e /tmp/forged && echo RAN || echo nothing");
  EXPECT_THAT(r.stdout(), ::testing::AnyOf(::testing::StartsWith("answer 0\n"), ::testing::StartsWith("ConnectionResetError\n"),
                                           ::testing::StartsWith("BrokenPipeError\n")))
      << "closed at once, no answer: " << r.stdout() << r.stderr();
  EXPECT_THAT(r.stdout(), ::testing::EndsWith("nothing\n")) << "the forged exec ran";
  auto logs = ShIn(*sb, "python3 -c \"import os\nfor f in (lambda: open('/proc/1/fd/2').read(1), "
                       "lambda: os.readlink('/proc/1/fd/2'), lambda: os.readlink('/proc/1/fd/13')):\n"
                       "  try: f(); print('read')\n"
                       "  except OSError as e: print(type(e).__name__)\"");
  EXPECT_EQ(logs.stdout(), "PermissionError\nPermissionError\nPermissionError\n")
      << "the agent's stderr (its log): neither read nor named; nor the seccomp listener it keeps (fd 13)";
  EXPECT_EQ(ShIn(*sb, "echo alive").stdout(), "alive\n") << "dsecd's own connection is still served";
  Destroy(*sb);
}

}  // namespace
}  // namespace dsec::testing
