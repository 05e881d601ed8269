// The vm kind's saved domains (DESIGN.md section 14): pause with memory
// (libvirt's save: the domain ends), snapshots (libvirt's external memory
// snapshot: the domain paused while its memory is written, then running
// on) and guests made from either (libvirt's restore).
//
// A snapshot's guests are new domains, which libvirt does not make of a
// saved one: it checks the XML given at a restore against the saved one,
// UUID included, and no two domains may share a UUID. So the saved file's
// XML is replaced: libvirt's save format is a header (magic, version, the
// length of the XML area, was-running, compression, the cookie's offset),
// the XML area (the domain XML, a NUL, a cookie, padding) and QEMU's
// migration stream. A fork's restore reads from a FIFO that a thread fills
// with a header and XML of its own (name, no UUID: libvirt makes one, the
// fork's dir) and then the snapshot's stream, copied by the kernel
// (sendfile): the snapshot's file is read, never copied on disk. The guest
// keeps its source's SMBIOS UUID (read at its boot, in its memory); its
// hostname, machine-id and RNG are its own (GuestDriver::Reidentify).
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "drivers/fullvm/libvirt_util.hpp"
#include "drivers/fullvm/vm_driver.hpp"
#include "runtime/files.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::drivers {

using vmx::DomainRef;
using vmx::LastError;
using vmx::XmlEscape;

namespace {

constexpr char kSaveMagic[] = "LibvirtQemudSave";  // 16 bytes, no NUL in the file
constexpr size_t kHeaderSize = 16 + 4 * 19;        // magic, 5 fields, 14 unused
constexpr uint32_t kMaxXmlArea = 16u << 20;

uint32_t Field(const std::string& h, int i) {
  uint32_t v;
  std::memcpy(&v, h.data() + 16 + 4 * i, 4);
  return v;  // little-endian, as this host
}
void SetField(std::string* h, int i, uint32_t v) { std::memcpy(h->data() + 16 + 4 * i, &v, 4); }

// Removes the first element <tag>...</tag> of `xml`.
void EraseElement(std::string* xml, const std::string& tag) {
  size_t a = xml->find("<" + tag + ">"), b = xml->find("</" + tag + ">");
  if (a != std::string::npos && b != std::string::npos && b > a) xml->erase(a, b + tag.size() + 3 - a);
}

// The value of attribute `name` in the first element that has it, either quote.
std::string Attribute(const std::string& xml, const std::string& name) {
  for (char q : {'\'', '"'}) {
    size_t a = xml.find(" " + name + "=" + q);
    if (a == std::string::npos) continue;
    a += name.size() + 3;
    size_t b = xml.find(q, a);
    if (b != std::string::npos) return xml.substr(a, b - a);
  }
  return "";
}

void ReplaceAll(std::string* s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (size_t at = s->find(from); at != std::string::npos; at = s->find(from, at + to.size()))
    s->replace(at, from.size(), to);
}

// The header and XML area of saved domain `file` with `xml` in place of
// its own (the cookie kept); *stream: where QEMU's stream starts.
Result<std::string> ReplacedHead(int fd, const std::string& file, const std::string& xml, off_t* stream) {
  std::string head(kHeaderSize, '\0');
  if (::pread(fd, head.data(), head.size(), 0) != static_cast<ssize_t>(head.size()) ||
      head.compare(0, 16, kSaveMagic, 16) != 0)
    return Status::FailedPrecondition(file + " is not a libvirt saved domain");
  uint32_t version = Field(head, 0), len = Field(head, 1), compressed = Field(head, 3), cookie_at = Field(head, 4);
  if (version != 2 || compressed != 0 || len > kMaxXmlArea || cookie_at > len)
    return Status::FailedPrecondition(file + ": a saved domain of format " + std::to_string(version) +
                                      (compressed ? ", compressed" : "") + " (this dsecd reads format 2, raw)");
  std::string area(len, '\0');
  if (::pread(fd, area.data(), len, static_cast<off_t>(kHeaderSize)) != static_cast<ssize_t>(len))
    return Status::FromErrno(errno ? errno : EIO, "read " + file);
  std::string cookie = cookie_at ? std::string(area.c_str() + cookie_at) : "";
  std::string out = xml + '\0';
  uint32_t new_cookie_at = cookie.empty() ? 0 : static_cast<uint32_t>(out.size());
  if (!cookie.empty()) out += cookie + '\0';
  if (out.size() < len) out.resize(len, '\0');
  SetField(&head, 1, static_cast<uint32_t>(out.size()));
  SetField(&head, 4, new_cookie_at);
  *stream = static_cast<off_t>(kHeaderSize + len);
  return head + out;
}

}  // namespace

Status VmDriver::SaveMachine(const Box& box, const std::string& dest, uint64_t, bool stay_stopped, uint64_t* bytes) {
  auto conn = Conn();
  if (!conn.ok()) return conn.status();
  DomainRef dom{virDomainLookupByName(*conn, DomainName(box.mid).c_str())};
  if (!dom.d) return Status::Unavailable("its domain " + DomainName(box.mid) + " is gone");
  const std::string file = dest + "/state";
  if (stay_stopped) {
    if (virDomainSaveFlags(dom.d, file.c_str(), nullptr, VIR_DOMAIN_SAVE_RUNNING) < 0)
      return Status::Internal("libvirt could not save domain " + DomainName(box.mid) + ": " + LastError());
  } else {
    // Its memory only: the image disk (read-only) is the image's.
    char* live = virDomainGetXMLDesc(dom.d, 0);
    bool has_disk = live && std::strstr(live, "dev='vda'") != nullptr;
    std::free(live);
    std::string x = "<domainsnapshot><memory snapshot='external' file='" + XmlEscape(file) + "'/><disks>" +
                    (has_disk ? "<disk name='vda' snapshot='no'/>" : "") + "</disks></domainsnapshot>";
    virDomainSnapshotPtr snap = virDomainSnapshotCreateXML(dom.d, x.c_str(), VIR_DOMAIN_SNAPSHOT_CREATE_NO_METADATA);
    if (!snap)
      return Status::Internal("libvirt could not snapshot domain " + DomainName(box.mid) + ": " + LastError());
    virDomainSnapshotFree(snap);
  }
  UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st;
  if (!fd || ::fsync(fd.get()) < 0 || ::fstat(fd.get(), &st) < 0) return Status::FromErrno(errno, "fsync " + file);
  *bytes = static_cast<uint64_t>(st.st_size);
  return Status::Ok();
}

Result<virDomainPtr> VmDriver::RestoreDomain(virConnectPtr conn, const Box& box, const std::string& dir) {
  const std::string file = dir + "/state", name = DomainName(box.mid);
  char* saved_xml = virDomainSaveImageGetXMLDesc(conn, file.c_str(), VIR_DOMAIN_SAVE_IMAGE_XML_SECURE);
  if (!saved_xml) return Status::Internal("libvirt cannot read the saved domain in " + file + ": " + LastError());
  std::string xml = saved_xml;
  std::free(saved_xml);
  // Less the memory limit it saved (set again once it runs, as at a start).
  EraseElement(&xml, "memtune");
  if (xml.find("<name>" + XmlEscape(name) + "</name>") != std::string::npos) {
    // Its own (a resume): the XML given is checked against the saved one.
    if (virDomainRestoreFlags(conn, file.c_str(), xml.c_str(), VIR_DOMAIN_SAVE_RUNNING) < 0)
      return Status::Internal("libvirt could not restore domain " + name + ": " + LastError());
  } else {
    // Another's (a snapshot's): a new domain, in this sandbox's dir.
    size_t meta = xml.find("sandbox ");  // <dsec:sandbox ...> (libvirt may name the prefix its own way)
    std::string tag = meta == std::string::npos ? "" : xml.substr(meta, xml.find('>', meta) - meta);
    std::string old_dir = Attribute(tag, "dir"), old_mid = Attribute(tag, "machine");
    if (old_dir.empty() || old_mid.empty())
      return Status::FailedPrecondition("the saved domain in " + file + " is not one of dsec's (no dsec:sandbox)");
    size_t a = xml.find("<name>"), b = xml.find("</name>");
    if (a == std::string::npos || b == std::string::npos) return Status::FailedPrecondition(file + ": no <name>");
    xml.replace(a, b + 7 - a, "<name>" + XmlEscape(name) + "</name>");
    EraseElement(&xml, "uuid");
    ReplaceAll(&xml, old_dir + "/", XmlEscape(box.dir) + "/");
    ReplaceAll(&xml, "dir='" + old_dir + "'", "dir='" + XmlEscape(box.dir) + "'");
    ReplaceAll(&xml, "dir=\"" + old_dir + "\"", "dir=\"" + XmlEscape(box.dir) + "\"");
    ReplaceAll(&xml, "machine='" + old_mid + "'", "machine='" + XmlEscape(box.mid) + "'");
    ReplaceAll(&xml, "machine=\"" + old_mid + "\"", "machine=\"" + XmlEscape(box.mid) + "\"");
    UniqueFd in(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
    if (!in) return Status::FromErrno(errno, "open " + file);
    off_t stream = 0;
    auto head = ReplacedHead(in.get(), file, xml, &stream);
    if (!head.ok()) return head.status();
    const std::string fifo = box.dir + "/restore.fifo";
    ::unlink(fifo.c_str());
    if (::mkfifo(fifo.c_str(), 0600) < 0) return Status::FromErrno(errno, "mkfifo " + fifo);
    // The writer: blocks until libvirt opens the FIFO, ends when all is
    // written or libvirt closed its end (EPIPE; SIGPIPE blocked here).
    std::thread writer([&fifo, &head, &in, stream] {
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
      UniqueFd out(::open(fifo.c_str(), O_WRONLY | O_CLOEXEC));
      if (!out) return;
      for (size_t at = 0; at < head->size();) {
        ssize_t n = ::write(out.get(), head->data() + at, head->size() - at);
        if (n <= 0) return;
        at += static_cast<size_t>(n);
      }
      off_t off = stream;
      while (::sendfile(out.get(), in.get(), &off, 1 << 20) > 0) {
      }
    });
    int rc = virDomainRestoreFlags(conn, fifo.c_str(), nullptr, VIR_DOMAIN_SAVE_RUNNING);
    std::string why = rc < 0 ? LastError() : "";
    // A writer still waiting for a reader (libvirt failed first) is let go.
    if (UniqueFd release(::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)); release) release.Reset();
    writer.join();
    ::unlink(fifo.c_str());
    if (rc < 0) return Status::Internal("libvirt could not restore a domain of " + file + " as " + name + ": " + why);
  }
  virDomainPtr dom = virDomainLookupByName(conn, name.c_str());
  if (!dom) return Status::Internal("domain " + name + " restored but not found: " + LastError());
  return dom;
}

}  // namespace dsec::drivers
