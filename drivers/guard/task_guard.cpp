#include "drivers/guard/task_guard.hpp"

namespace dsec::guard {

Result<ParsedGuard> ParseGuard(const v1::TaskGuard& g) {
  ParsedGuard out;
  auto p = ParseGlobs({g.protected_paths().begin(), g.protected_paths().end()}, "task: protected paths");
  if (!p.ok()) return p.status();
  auto h = ParseGlobs({g.hidden_paths().begin(), g.hidden_paths().end()}, "task: hidden paths");
  if (!h.ok()) return h.status();
  out.protect = std::move(*p);
  out.hide = std::move(*h);
  std::string root = g.root();
  if (root.empty() && !out.active()) return out;
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("task: root '" + root.substr(0, 256) + "' " + why);
  };
  if (root.empty()) return Status::InvalidArgument("task: protected or hidden paths need a root (e.g. /work/repo)");
  if (root[0] != '/') return bad("is not absolute");
  if (root.size() > 1024) return bad("is longer than 1024 bytes");
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  for (size_t at = 1; at < root.size();) {
    size_t slash = root.find('/', at);
    if (slash == std::string::npos) slash = root.size();
    std::string seg = root.substr(at, slash - at);
    if (seg.empty() || seg == "." || seg == "..") return bad("has an empty, '.' or '..' segment");
    at = slash + 1;
  }
  if (root.find('\0') != std::string::npos) return bad("has a NUL byte");
  out.root = root == "/" ? "" : root;
  return out;
}

}  // namespace dsec::guard
