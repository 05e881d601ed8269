#include "drivers/container/etc_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "drivers/net/policy.hpp"
#include "runtime/files.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::drivers {

Status WriteEtcFiles(const std::string& base, const std::string& hostname, const v1::NetworkPolicy& net,
                     uint32_t nameserver) {
  std::string dir = base + "/run/etc";
  if (::mkdir(dir.c_str(), 0755) < 0 && errno != EEXIST) return Status::FromErrno(errno, "mkdir " + dir);
  std::string hosts =
      "127.0.0.1\tlocalhost\n"
      "::1\tlocalhost ip6-localhost ip6-loopback\n"
      "fe00::0\tip6-localnet\n"
      "ff00::0\tip6-mcastprefix\n"
      "ff02::1\tip6-allnodes\n"
      "ff02::2\tip6-allrouters\n"
      "127.0.1.1\t" + hostname + "\n";
  // Network off: no name server to ask (a lookup of anything but the
  // names above fails at once instead of timing out).
  // Network on: the gateway answers (every query goes to the node's
  // resolver, whatever address it is sent to).
  std::string resolv = nameserver ? "nameserver " + net::Ipv4Text(nameserver) + "\n"
                                  : "# dsec: this sandbox has no network (spec.network.mode is none)\n";
  (void)net;  // the policy itself is enforced by the kernel, not by this file
  resolv += "options timeout:1 attempts:1\n";
  // Its own machine-id (a fork's differs from its source's): 32 hex digits.
  for (const auto& [name, content] : {std::pair<const char*, std::string>{"hosts", hosts},
                                      {"hostname", hostname + "\n"},
                                      {"resolv.conf", resolv},
                                      {"machine-id", RandomHex(32) + "\n"}}) {
    std::string path = dir + "/" + name;
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!fd || ::write(fd.get(), content.data(), content.size()) != static_cast<ssize_t>(content.size()))
      return Status::FromErrno(errno, "write " + path);
  }
  return Status::Ok();
}

}  // namespace dsec::drivers
