#include "drivers/driver.hpp"

namespace dsec::drivers {

namespace {

Status NoState(const Driver& d, const char* what) {
  return Status::Unimplemented(std::string(d.name()) + " sandboxes have no " + what +
                               ": each run starts fresh (use a container sandbox)");
}

}  // namespace

void Driver::ExecStreaming(const v1::SandboxRecord&, const std::string&, const v1::ExecRequest&, OutputCallback,
                           ExecCallback done) {
  done(Status::Unimplemented(std::string(name()) + " sandboxes cannot stream output"));
}

Status Driver::CheckExecLimits(const v1::SandboxRecord&, const v1::Limits&) const { return Status::Ok(); }

void Driver::ReadFile(const v1::SandboxRecord&, const v1::ReadFileRequest&, FileCallback done) {
  done(NoState(*this, "files"));
}
void Driver::WriteFile(const v1::SandboxRecord&, const v1::WriteFileRequest&, FileCallback done) {
  done(NoState(*this, "files"));
}
void Driver::ListFiles(const v1::SandboxRecord&, const v1::ListFilesRequest&, FileCallback done) {
  done(NoState(*this, "files"));
}
void Driver::Pause(const v1::SandboxRecord&, bool, StatusCallback done) {
  done(NoState(*this, "processes to pause"));
}

Status CheckSandboxPath(const std::string& path) {
  if (path.empty() || path[0] != '/') return Status::InvalidArgument("path '" + path + "' is not absolute");
  if (path.size() > 4096) return Status::InvalidArgument("path is longer than 4096 bytes");
  if (path.find('\0') != std::string::npos) return Status::InvalidArgument("path has a NUL byte");
  // ".." as a whole component, anywhere.
  for (size_t i = 0; i < path.size();) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    if (path.compare(i, j - i, "..") == 0)
      return Status::InvalidArgument("path '" + path + "' has a '..' component; name the file by its own path");
    i = j + 1;
  }
  return Status::Ok();
}

}  // namespace dsec::drivers
