#include "drivers/container/sandbox_disk.hpp"

#include <fcntl.h>
#include <linux/btrfs.h>
#include <linux/btrfs_tree.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "runtime/files.hpp"
#include "runtime/loop_device.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::drivers {

namespace {

constexpr long kBtrfsMagic = 0x9123683E;
// Linux 6.7+: quota groups that account extents where they are made (no
// back-reference walks) and go away with their subvolume's data. Not in
// Debian 12's headers.
constexpr __u64 kQuotaCtlEnableSimple = 4;

// `dir` is the mount point of a btrfs filesystem on a loop device (ours,
// from an earlier start). A btrfs subvolume of the host's own filesystem
// has a device number of its own too, but is not mounted there: the mount
// table says which.
bool IsOurMount(const std::string& dir) {
  std::ifstream mi("/proc/self/mountinfo");
  for (std::string line; std::getline(mi, line);) {
    // id parent major:minor root mount-point options... - fstype source superoptions
    std::istringstream f(line);
    std::string id, parent, dev, root, point;
    f >> id >> parent >> dev >> root >> point;
    if (point != dir) continue;
    auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream tail(line.substr(dash + 3));
    std::string fstype, source;
    tail >> fstype >> source;
    if (fstype == "btrfs" && source.rfind("/dev/loop", 0) == 0 && root == "/") return true;
  }
  return false;
}

bool IsBtrfs(const std::string& dir) {
  struct statfs fs;
  return ::statfs(dir.c_str(), &fs) == 0 && static_cast<long>(fs.f_type) == kBtrfsMagic;
}

std::string FindTool(const char* name) {
  for (const char* d : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    std::string p = std::string(d) + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

Result<UniqueFd> OpenDir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return Status::FromErrno(errno, "open " + dir);
  return fd;
}

btrfs_ioctl_vol_args VolArgs(const std::string& name) {
  btrfs_ioctl_vol_args a{};
  std::strncpy(a.name, name.c_str(), sizeof a.name - 1);
  return a;
}

}  // namespace

void SandboxDisk::Log(int level, const std::string& text) const {
  if (opts_.log) opts_.log(level, text);
}

Result<std::unique_ptr<SandboxDisk>> SandboxDisk::Open(SandboxDiskOptions o) {
  std::unique_ptr<SandboxDisk> d(new SandboxDisk(o));
  const std::string& dir = o.dir;
  DSEC_RETURN_IF_ERROR(MakeDirs(dir, 0700));
  bool mounted_here = false;
  if (!(IsOurMount(dir) && IsBtrfs(dir))) {
    // Never over sandboxes that live in the plain dir (a dsecd from before
    // disk limits left them running): they would vanish from under it.
    for (const auto& name : ListEntries(dir))
      if (name.rfind("free.", 0) != 0)
        return Status::FailedPrecondition(dir + " holds sandboxes made without disk limits (" + name +
                                          " ...); they run on unlimited until removed, after which a restart "
                                          "of dsecd sets the disk up");
    // Kept dirs of an earlier run would only be hidden by the mount.
    for (const auto& name : ListEntries(dir))
      (void)RunToFile({"/bin/rm", "-rf", "--one-file-system", dir + "/" + name}, "/dev/null");  // hidden either way
    struct stat st;
    if (::stat(o.image.c_str(), &st) < 0) {
      std::string mkfs = FindTool("mkfs.btrfs");
      if (mkfs.empty())
        return Status::FailedPrecondition("no mkfs.btrfs to make " + o.image + " (apt-get install btrfs-progs)");
      struct statfs fs;
      std::string parent = o.image.substr(0, o.image.rfind('/'));
      uint64_t size = o.size_bytes;
      if (::statfs(parent.c_str(), &fs) == 0) {
        uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * static_cast<uint64_t>(fs.f_bsize);
        size = std::min(size, free_bytes / 10 * 9);
      }
      if (size < (1ull << 30))
        return Status::ResourceExhausted("too little free space beside " + o.image + " for the sandboxes' disk (" +
                                         std::to_string(size >> 20) + " MiB; 1 GiB at least)");
      // Made aside and renamed into place: an image there is a whole filesystem.
      std::string tmp = o.image + ".tmp";
      ::unlink(tmp.c_str());
      {
        UniqueFd f(::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
        if (!f || ::ftruncate(f.get(), static_cast<off_t>(size)) < 0) {
          Status err = Status::FromErrno(errno, "make " + tmp);
          ::unlink(tmp.c_str());
          return err;
        }
      }
      if (int rc = RunToFile({mkfs, "-q", "-f", tmp}, "/dev/null"); rc != 0) {
        ::unlink(tmp.c_str());
        return Status::Internal("mkfs.btrfs " + tmp + " exited " + std::to_string(rc));
      }
      if (::rename(tmp.c_str(), o.image.c_str()) < 0) {
        Status err = Status::FromErrno(errno, "rename " + tmp + " to " + o.image);
        ::unlink(tmp.c_str());
        return err;
      }
    }
    UniqueFd loop;
    auto dev = AttachLoop(o.image, /*read_only=*/false, &loop);
    if (!dev.ok()) return dev.status();
    // discard: what a removed sandbox held goes back to the host's disk.
    // (Closing `loop` after a failed mount detaches the device again.)
    if (::mount(dev->c_str(), dir.c_str(), "btrfs", MS_NOSUID | MS_NODEV, "discard=async") < 0)
      return Status::FromErrno(errno, "mount " + o.image + " (btrfs, on " + *dev + ") on " + dir);
    mounted_here = true;
  }
  // What fails from here leaves no mount of ours behind.
  auto fail = [&](Status st) {
    if (mounted_here) ::umount2(dir.c_str(), MNT_DETACH);
    return st;
  };
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return fail(Status::FromErrno(errno, "open " + dir));
  btrfs_ioctl_quota_ctl_args q{};
  q.cmd = kQuotaCtlEnableSimple;
  if (::ioctl(fd.get(), BTRFS_IOC_QUOTA_CTL, &q) < 0 && errno != EEXIST) {
    // An older kernel: full quota groups (stale groups of removed sandboxes then stay).
    int simple_err = errno;
    q.cmd = BTRFS_QUOTA_CTL_ENABLE;
    if (::ioctl(fd.get(), BTRFS_IOC_QUOTA_CTL, &q) < 0)
      return fail(Status::FailedPrecondition(std::string("cannot enable btrfs quotas on ") + dir + ": " +
                                             std::strerror(simple_err)));
    d->Log(1, "btrfs simple quotas unavailable (" + std::string(std::strerror(simple_err)) +
                  "); full quota groups instead");
  }
  struct statfs fs;
  if (::statfs(dir.c_str(), &fs) == 0) d->size_ = static_cast<uint64_t>(fs.f_blocks) * static_cast<uint64_t>(fs.f_bsize);
  return d;
}

SandboxDisk::~SandboxDisk() = default;

Status SandboxDisk::MakeDir(const std::string& name) {
  auto fd = OpenDir(opts_.dir);
  if (!fd.ok()) return fd.status();
  auto args = VolArgs(name);
  if (::ioctl(fd->get(), BTRFS_IOC_SUBVOL_CREATE, &args) < 0)
    return Status::FromErrno(errno, "create subvolume " + opts_.dir + "/" + name);
  ::chmod((opts_.dir + "/" + name).c_str(), 0700);
  return Status::Ok();
}

Status SandboxDisk::RemoveDir(const std::string& name) {
  auto fd = OpenDir(opts_.dir);
  if (!fd.ok()) return fd.status();
  auto args = VolArgs(name);
  if (::ioctl(fd->get(), BTRFS_IOC_SNAP_DESTROY, &args) < 0)
    return Status::FromErrno(errno, "delete subvolume " + opts_.dir + "/" + name);
  return Status::Ok();
}

Result<uint64_t> SandboxDisk::SubvolumeId(const std::string& name) const {
  UniqueFd fd(::open((opts_.dir + "/" + name).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return Status::FromErrno(errno, "open " + opts_.dir + "/" + name);
  btrfs_ioctl_ino_lookup_args a{};
  a.treeid = 0;
  a.objectid = BTRFS_FIRST_FREE_OBJECTID;
  if (::ioctl(fd.get(), BTRFS_IOC_INO_LOOKUP, &a) < 0)
    return Status::FromErrno(errno, opts_.dir + "/" + name + " is not a subvolume");
  return static_cast<uint64_t>(a.treeid);
}

Status SandboxDisk::SetLimit(const std::string& name, uint64_t bytes) {
  auto id = SubvolumeId(name);
  if (!id.ok()) return id.status();
  auto fd = OpenDir(opts_.dir);
  if (!fd.ok()) return fd.status();
  btrfs_ioctl_qgroup_limit_args l{};
  l.qgroupid = *id;
  l.lim.flags = BTRFS_QGROUP_LIMIT_MAX_RFER;
  l.lim.max_rfer = bytes;
  if (::ioctl(fd->get(), BTRFS_IOC_QGROUP_LIMIT, &l) < 0)
    return Status::FromErrno(errno, "set the disk limit of " + opts_.dir + "/" + name);
  return Status::Ok();
}

Result<uint64_t> SandboxDisk::Usage(const std::string& name) const {
  auto id = SubvolumeId(name);
  if (!id.ok()) return id.status();
  auto fd = OpenDir(opts_.dir);
  if (!fd.ok()) return fd.status();
  btrfs_ioctl_search_args s{};
  auto& k = s.key;
  k.tree_id = BTRFS_QUOTA_TREE_OBJECTID;
  k.min_objectid = k.max_objectid = 0;
  k.min_type = k.max_type = BTRFS_QGROUP_INFO_KEY;
  k.min_offset = k.max_offset = *id;  // level 0: the subvolume's own group
  k.max_transid = ~0ull;
  k.nr_items = 1;
  if (::ioctl(fd->get(), BTRFS_IOC_TREE_SEARCH, &s) < 0)
    return Status::FromErrno(errno, "read the disk use of " + opts_.dir + "/" + name);
  if (k.nr_items == 0) return uint64_t{0};
  auto* h = reinterpret_cast<const btrfs_ioctl_search_header*>(s.buf);
  if (h->len < sizeof(btrfs_qgroup_info_item)) return uint64_t{0};
  const auto* info = reinterpret_cast<const btrfs_qgroup_info_item*>(s.buf + sizeof *h);
  return static_cast<uint64_t>(info->rfer);
}

void SandboxDisk::Close() {
  if (closed_) return;
  closed_ = true;
  auto left = ListEntries(opts_.dir);
  if (!left.empty()) {
    Log(1, opts_.dir + " stays mounted: " + std::to_string(left.size()) + " sandbox dir(s) in it outlive dsecd");
    return;
  }
  if (::umount2(opts_.dir.c_str(), MNT_DETACH) < 0)
    Log(2, "unmount " + opts_.dir + ": " + std::strerror(errno));
}

}  // namespace dsec::drivers
