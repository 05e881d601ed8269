// What every OCI runtime gives a container, and real programs count on:
// its own /etc/hosts (localhost, its hostname), /etc/hostname and
// /etc/resolv.conf whatever the image has; inode numbers that agree between
// readdir and stat across image and container files; files of any size by
// default.
#include <gmock/gmock.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/files.hpp"
#include "tests/support/container_fixture.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class ContainerOs : public ContainerTest {};

TEST_F(ContainerOs, LocalhostAndTheHostnameResolveWithoutTheImageProvidingThem) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto r = ShIn(*sb,
                "hostname; cat /etc/hostname; cat /etc/resolv.conf; "
                "python3 -c 'import socket; print(socket.gethostbyname(\"localhost\")); "
                "print(socket.gethostbyname(socket.gethostname())); "
                "s = socket.create_server((\"localhost\", 0)); c = socket.create_connection((\"localhost\", "
                "s.getsockname()[1])); print(\"connected\")'");
  ASSERT_EQ(r.exit_code(), 0) << r.stdout() << r.stderr();
  std::string short_id = sb->id().substr(0, 63);
  EXPECT_THAT(r.stdout(), HasSubstr(short_id + "\n" + short_id + "\n"));
  EXPECT_THAT(r.stdout(), HasSubstr("no network"));
  EXPECT_THAT(r.stdout(), HasSubstr("127.0.0.1\n127.0.1.1\nconnected\n"));
  // The image's own /etc/hosts (it has one) is not what the container sees,
  // and nothing of this is in the container's changes.
  auto hosts = sb->ReadFile("/etc/hosts");
  ASSERT_TRUE(hosts.ok()) << hosts.status().ToString();
  EXPECT_THAT(*hosts, HasSubstr("127.0.1.1\t" + short_id));
  struct stat st;
  EXPECT_NE(::lstat((daemon_->data_dir() + "/sandboxes/" + sb->id() + "/upper/etc").c_str(), &st), 0)
      << "the /etc files are bound, not written into the upper dir";
}

TEST_F(ContainerOs, AContainersHostsFileIsItsOwn) {
  auto a = Make(), b = Make();
  ASSERT_TRUE(a.ok() && b.ok());
  auto w = ShIn(*a, "echo '10.9.9.9 db.internal' >> /etc/hosts && getent hosts db.internal 2>/dev/null || "
                    "grep db.internal /etc/hosts");
  ASSERT_EQ(w.exit_code(), 0) << w.stderr();
  EXPECT_THAT(w.stdout(), HasSubstr("10.9.9.9"));
  auto other = ShIn(*b, "cat /etc/hosts");
  EXPECT_THAT(other.stdout(), Not(HasSubstr("db.internal")));
  // A removed container's dir is reused: the next one starts with fresh files.
  Destroy(*a);
  auto c = Make();
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(ShIn(*c, "cat /etc/hosts").stdout(), Not(HasSubstr("db.internal")));
}

TEST_F(ContainerOs, ImagesWithoutTheFilesOrWithLinksThereStillWork) {
  // An image with no /etc/hosts and a resolv.conf that is a link to a stub
  // resolver that does not run here (as systemd images have).
  char tmpl[] = "/tmp/dsec-test-rootfs-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string root = tmpl;
  RootfsOptions ro;
  ro.python = false;
  ASSERT_TRUE(MakeRootfs(root, ro).ok());
  ::unlink((root + "/etc/hosts").c_str());
  ASSERT_EQ(::symlink("../run/systemd/resolve/stub-resolv.conf", (root + "/etc/resolv.conf").c_str()), 0);
  auto built = RunProcess({BinDir() + "/dsec-image", "--data-dir", daemon_->data_dir(), "build", root, "bare-etc"});
  RunProcess({"/bin/rm", "-rf", root});
  ASSERT_EQ(built.exit_code, 0) << built.err;
  auto sb = client_->Create(ContainerSpec("bare-etc"));
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  made_.push_back(*sb);
  auto r = ShIn(*sb, "cat /etc/hosts; cat /etc/hostname; ls -l /etc/resolv.conf");
  EXPECT_EQ(r.exit_code(), 0) << r.stderr();
  EXPECT_THAT(r.stdout(), HasSubstr("localhost"));
  EXPECT_THAT(r.stdout(), HasSubstr("stub-resolv.conf")) << "a link that leads nowhere is left as the image has it";
  Destroy(*sb);
  EXPECT_TRUE(client_->RemoveImage("bare-etc").ok());
}

TEST_F(ContainerOs, ReaddirAndStatGiveTheSameInodeNumbers) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok());
  // Image files, files the container made, and an image file it changed
  // (copied up): d_ino from scandir must be st_ino from stat for each
  // (mount points aside: there stat sees the mounted root, as anywhere).
  auto r = ShIn(*sb,
                "echo new > /work/made && echo more >> /etc/passwd && mkdir -p /work/d && "
                "python3 -c '\n"
                "import os\n"
                "bad = []; n = 0\n"
                "for d in [\"/\", \"/bin\", \"/etc\", \"/work\", \"/work/d\", \"/usr/lib\"]:\n"
                "    dev = os.stat(d).st_dev\n"
                "    for e in os.scandir(d):\n"
                "        st = os.stat(e.path, follow_symlinks=False)\n"
                "        if st.st_dev != dev: continue  # a mount point: stat sees what is mounted there, on any system\n"
                "        n += 1\n"
                "        if e.inode() != st.st_ino: bad.append(e.path)\n"
                "print(n, \"entries\", \"mismatched:\", bad)\n"
                "'");
  ASSERT_EQ(r.exit_code(), 0) << r.stderr();
  EXPECT_THAT(r.stdout(), HasSubstr("mismatched: []"));
  EXPECT_THAT(r.stdout(), Not(HasSubstr(" 0 entries")));
}

TEST_F(ContainerOs, FilesOfAnySizeByDefaultAndTheLimitWhenAsked) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok());
  // A sparse 300 MiB file: past the 256 MiB fncall default, no disk used.
  auto r = ShIn(*sb, "ulimit -f; python3 -c 'open(\"/work/big\", \"wb\").truncate(300 << 20)' && stat -c %s /work/big");
  ASSERT_EQ(r.exit_code(), 0) << r.stderr();
  EXPECT_EQ(r.stdout(), "unlimited\n314572800\n");
  v1::Limits small;
  small.set_file_size_bytes(1 << 20);
  auto limited = ShIn(*sb, "python3 -c 'open(\"/work/big2\", \"wb\").truncate(2 << 20)'", small);
  EXPECT_NE(limited.exit_code(), 0) << "a file size limit asked for is still enforced";
}

}  // namespace
}  // namespace dsec::testing
