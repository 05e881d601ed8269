#include "drivers/agent/passwd.hpp"

#include "drivers/agent/agent.pb.h"

#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <fstream>

namespace dsec::agent {

namespace {

// The colon-separated fields of each line of a passwd-format file.
std::vector<std::vector<std::string>> Lines(const std::string& file) {
  std::vector<std::vector<std::string>> out;
  std::ifstream in(file);
  std::string line;
  size_t read = 0;
  while (std::getline(in, line) && (read += line.size()) < (16u << 20)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> fields;
    size_t at = 0;
    for (;;) {
      size_t colon = line.find(':', at);
      fields.push_back(line.substr(at, colon == std::string::npos ? std::string::npos : colon - at));
      if (colon == std::string::npos) break;
      at = colon + 1;
    }
    out.push_back(std::move(fields));
  }
  return out;
}

bool Number(const std::string& s, uint32_t* out) {
  if (s.empty() || s.size() > 10 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  unsigned long v = std::strtoul(s.c_str(), nullptr, 10);
  if (v > 0xfffffffeul) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

}  // namespace

bool LookupUser(const std::string& user, UserEntry* out, std::string* why, const std::string& etc) {
  uint32_t num = 0;
  bool numeric = Number(user, &num);
  bool found = false;
  for (const auto& f : Lines(etc + "/passwd")) {
    uint32_t uid = 0, gid = 0;
    if (f.size() < 6 || !Number(f[2], &uid) || !Number(f[3], &gid)) continue;
    if (numeric ? uid != num : f[0] != user) continue;
    out->name = f[0];
    out->uid = uid;
    out->gid = gid;
    out->home = f[5].empty() ? "/" : f[5];
    found = true;
    break;
  }
  if (!found) {
    if (!numeric) {
      *why = "no user '" + user.substr(0, 64) + "' in " + etc + "/passwd (add it to the image, or give a uid)";
      return false;
    }
    out->name = user;
    out->uid = out->gid = num;
    out->home = "/";
  }
  out->groups = {out->gid};
  for (const auto& f : Lines(etc + "/group")) {
    uint32_t gid = 0;
    if (f.size() < 4 || !Number(f[2], &gid) || gid == out->gid) continue;
    const std::string& members = f[3];
    for (size_t at = 0; at < members.size();) {
      size_t comma = std::min(members.find(',', at), members.size());
      if (members.compare(at, comma - at, out->name) == 0 && comma - at == out->name.size()) {
        out->groups.push_back(gid);
        break;
      }
      at = comma + 1;
    }
  }
  return true;
}

bool AsUser(Exec* req, std::vector<gid_t>* groups, std::string* why) {
  if (req->user().empty() || req->uid() != 0 || req->gid() != 0) return true;
  if (req->user().find('\0') != std::string::npos) {
    *why = "a user name with a NUL byte";
    return false;
  }
  UserEntry u;
  if (!LookupUser(req->user(), &u, why)) return false;
  req->set_uid(u.uid);
  req->set_gid(u.gid);
  *groups = u.groups;
  auto has = [req](const char* key) {
    size_t n = std::strlen(key);
    for (const auto& e : req->env())
      if (e.size() > n && e.compare(0, n, key) == 0 && e[n] == '=') return true;
    return false;
  };
  if (!has("HOME")) req->add_env("HOME=" + u.home);
  if (!has("USER")) req->add_env("USER=" + u.name);
  if (!has("LOGNAME")) req->add_env("LOGNAME=" + u.name);
  if (req->cwd().empty()) req->set_cwd(u.home);
  return true;
}

IdNames::IdNames(const std::string& etc) {
  for (const auto& f : Lines(etc + "/passwd")) {
    uint32_t id = 0;
    if (f.size() >= 3 && Number(f[2], &id)) users_.emplace(id, f[0]);
  }
  for (const auto& f : Lines(etc + "/group")) {
    uint32_t id = 0;
    if (f.size() >= 3 && Number(f[2], &id)) groups_.emplace(id, f[0]);
  }
}

std::string IdNames::User(uid_t uid) const {
  auto it = users_.find(uid);
  return it == users_.end() ? "" : it->second;
}

std::string IdNames::Group(gid_t gid) const {
  auto it = groups_.find(gid);
  return it == groups_.end() ? "" : it->second;
}

}  // namespace dsec::agent
