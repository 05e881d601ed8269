// The sandbox's users and groups, read by dsec-agent from its own
// /etc/passwd and /etc/group (the agent runs inside the sandbox; a static
// binary, so no NSS: the files are parsed here). Used to run an exec as a
// named user, to own what a file call makes, and to name files' owners.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dsec::agent {

struct UserEntry {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string home;
  std::vector<gid_t> groups;  // the primary group and the groups listing the user
};

// `user` is a name in <etc>/passwd or a number (a number not there is
// taken as uid = gid = it, home "/"). False with `why` saying what is
// missing ("no user 'bob' in /etc/passwd").
bool LookupUser(const std::string& user, UserEntry* out, std::string* why, const std::string& etc = "/etc");

class Exec;  // agent.proto

// An exec's `user` (when its uid and gid are 0) made its uid, gid, `groups`
// (supplementary), HOME, USER and LOGNAME (unless its env has them) and,
// without a cwd, its home as cwd. False with `why` when there is no such user.
bool AsUser(Exec* req, std::vector<gid_t>* groups, std::string* why);

// Names of uids and gids, read once (for listing many files).
class IdNames {
 public:
  explicit IdNames(const std::string& etc = "/etc");
  std::string User(uid_t uid) const;   // "" when the file has none
  std::string Group(gid_t gid) const;

 private:
  std::map<uint32_t, std::string> users_, groups_;
};

}  // namespace dsec::agent
