// The image is shared read-only: what one container does to the files it
// got from the image lands in its own overlay upper, and neither another
// container (made before or after) nor the image file sees it; the shared
// lower mount cannot be written, not even from the host.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/container_fixture.hpp"

namespace dsec::testing {
namespace {

class ContainerImage : public ContainerTest {
 protected:
  // The tools image's manifest, from `dsec-image inspect`.
  static nlohmann::json Manifest() {
    auto r = RunProcess({BinDir() + "/dsec-image", "--data-dir", daemon_->data_dir(), "inspect", kImage});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out, nullptr, false);
  }
};

std::string Sha256(const std::string& host_path) {
  auto r = RunProcess({"/usr/bin/sha256sum", host_path});
  return r.exit_code == 0 ? r.out.substr(0, 64) : "sha256sum failed: " + r.err;
}

// What each container sees of the two files A attacks.
constexpr const char* kLook = "sha256sum /bin/cat /bin/ls 2>&1; ls / > /dev/null && echo ls works";

// Writes that go through in A (root may change its own root), and what A
// then sees: its /bin/cat replaced, its /bin/ls gone.
constexpr const char* kAttack =
    "printf '#!/bin/sh\\necho pwned\\n' > /bin/cat && rm /bin/ls && "
    "/bin/cat; test -e /bin/ls && echo ls still here || echo ls gone";

TEST_F(ContainerImage, ContainerRewritingImageFilesLeavesOtherContainersAlone) {
  auto before = Make();
  auto a = Make();
  ASSERT_TRUE(before.ok() && a.ok()) << before.status().ToString() << a.status().ToString();
  auto original = ShIn(*before, kLook);
  ASSERT_EQ(original.verdict(), v1::VERDICT_OK) << original.stdout() << original.stderr();
  ASSERT_NE(original.stdout().find("  /bin/cat\n"), std::string::npos) << original.stdout();

  auto attack = ShIn(*a, kAttack);
  ASSERT_EQ(attack.verdict(), v1::VERDICT_OK) << attack.error() << "\n" << attack.stderr();
  ASSERT_EQ(attack.stdout(), "pwned\nls gone\n");

  // A container that was already running, and one made afterwards from the
  // same image, still see the image's own files.
  auto after = Make();
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(ShIn(*before, kLook).stdout(), original.stdout());
  EXPECT_EQ(ShIn(*after, kLook).stdout(), original.stdout());

  // A's changes are in A's upper: the new /bin/cat, and a whiteout
  // (a 0/0 character device) where /bin/ls was.
  std::string upper = daemon_->data_dir() + "/sandboxes/" + a->id() + "/upper";
  std::ifstream cat(upper + "/bin/cat");
  std::string content((std::istreambuf_iterator<char>(cat)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "#!/bin/sh\necho pwned\n");
  struct stat st;
  ASSERT_EQ(::lstat((upper + "/bin/ls").c_str(), &st), 0) << std::strerror(errno);
  EXPECT_TRUE(S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0)) << "mode " << st.st_mode;
  Destroy(*a);
  Destroy(*before);
  Destroy(*after);
}

TEST_F(ContainerImage, ImageFileKeepsItsDigestWhenAContainerRewritesItsFiles) {
  auto manifest = Manifest();
  ASSERT_TRUE(manifest.is_object()) << manifest.dump();
  std::string file = manifest.value("file", ""), digest = manifest.value("digest", "");
  ASSERT_EQ(file.rfind(daemon_->data_dir() + "/images/", 0), 0u) << file;
  ASSERT_EQ(digest, "sha256:" + Sha256(file)) << "the image file does not match its manifest to begin with";

  auto a = Make();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto attack = ShIn(*a, kAttack);
  ASSERT_EQ(attack.stdout(), "pwned\nls gone\n") << attack.stderr();
  // While A runs with its changes, and after it is gone.
  EXPECT_EQ("sha256:" + Sha256(file), digest);
  Destroy(*a);
  EXPECT_EQ("sha256:" + Sha256(file), digest);
}

TEST_F(ContainerImage, HostCannotWriteIntoTheSharedLowerMount) {
  auto a = Make();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::string digest = Manifest().value("digest", "");
  ASSERT_EQ(digest.rfind("sha256:", 0), 0u) << digest;
  std::string lower = daemon_->data_dir() + "/run/images/" + digest.substr(7);
  struct stat st;
  ASSERT_EQ(::stat((lower + "/bin/cat").c_str(), &st), 0) << lower << " is not mounted: " << std::strerror(errno);

  // Even root on the host (this test) cannot change it: EROFS is read-only
  // by construction, mounted read-only.
  int fd = ::open((lower + "/bin/cat").c_str(), O_WRONLY);
  int open_errno = errno;
  if (fd >= 0) ::close(fd);
  EXPECT_LT(fd, 0);
  EXPECT_EQ(open_errno, EROFS) << std::strerror(open_errno);
  fd = ::open((lower + "/bin/new").c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  int create_errno = errno;
  if (fd >= 0) ::close(fd);
  EXPECT_LT(fd, 0);
  EXPECT_EQ(create_errno, EROFS) << std::strerror(create_errno);
  int unlinked = ::unlink((lower + "/bin/ls").c_str());
  int unlink_errno = errno;
  EXPECT_EQ(unlinked, -1);
  EXPECT_EQ(unlink_errno, EROFS) << std::strerror(unlink_errno);
  Destroy(*a);
}

}  // namespace
}  // namespace dsec::testing
