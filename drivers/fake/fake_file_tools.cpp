// The fake shell's file tools: ls stat touch rm mkdir rmdir cp mv chmod
// basename dirname, over the box's FakeFs (under its lock, which waits
// while the box is paused). Messages are coreutils'.
#include <time.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "drivers/fake/fake_shell_internal.hpp"

namespace dsec::drivers::fakesh {

namespace {

std::string ModeString(uint32_t m) {
  std::string s = S_ISDIR(m) ? "d" : S_ISCHR(m) ? "c" : "-";
  for (int shift = 6; shift >= 0; shift -= 3)
    for (int b = 2; b >= 0; --b) s.push_back((m >> (shift + b)) & 1 ? "xwr"[b] : '-');
  if (m & 01000) s[9] = s[9] == 'x' ? 't' : 'T';
  return s;
}

std::string LongLine(const FakeNode& n, const std::string& name) {
  char date[32];
  time_t t = static_cast<time_t>(n.mtime_ms / 1000);
  tm utc{};
  ::gmtime_r(&t, &utc);
  std::strftime(date, sizeof date, "%b %e %H:%M", &utc);
  return ModeString(n.mode) + " 1 root root " +
         std::to_string(n.is_reg()   ? n.data.size()
                        : n.is_dir() ? 4096
                                     : 0) +
         " " + date + " " + name + "\n";
}

int Ls(Shell& sh, const std::vector<std::string>& a) {
  bool all = false, almost = false, lng = false;
  std::vector<std::string> targets;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i].size() > 1 && a[i][0] == '-') {
      for (char f : a[i].substr(1)) {
        if (f == 'a')
          all = true;
        else if (f == 'A')
          almost = true;
        else if (f == 'l')
          lng = true;
        else if (f != '1')
          return Complain(sh, "ls: option -" + std::string(1, f) + " is not supported by the fake shell", 2);
      }
    } else {
      targets.push_back(a[i]);
    }
  }
  if (targets.empty()) targets.push_back(".");
  int status = 0;
  std::string files, dirs;
  size_t ndirs = 0;
  for (const auto& t : targets) {
    int err = 0;
    auto lk = sh.Lock();
    auto n = sh.box->fs().Find(sh.Path(t), &err);
    if (!n) {
      lk.unlock();
      status = Complain(sh, "ls: cannot access '" + t + "': " + ErrnoText(err), 2);
      continue;
    }
    if (!n->is_dir()) {
      files += lng ? LongLine(*n, t) : t + "\n";
      continue;
    }
    std::string block = targets.size() > 1 ? (ndirs++ ? "\n" : "") + t + ":\n" : "";
    if (all) block += lng ? LongLine(*n, ".") + LongLine(*n, "..") : ".\n..\n";
    for (const auto& [name, child] : sh.box->fs().List(sh.Path(t), &err))
      if (name[0] != '.' || all || almost) block += lng ? LongLine(*child, name) : name + "\n";
    dirs += block;
  }
  if (!files.empty() && !dirs.empty()) files += "\n";
  return sh.Out(files + dirs) ? status : 2;
}

int Stat(Shell& sh, const std::vector<std::string>& a) {
  std::string fmt;
  std::vector<std::string> files;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "-c" && i + 1 < a.size())
      fmt = a[++i];
    else if (a[i].compare(0, 9, "--format=") == 0)
      fmt = a[i].substr(9);
    else
      files.push_back(a[i]);
  }
  if (fmt.empty()) return Complain(sh, "stat: the fake shell has only stat -c FORMAT (%a %s %n %F %Y %f)", 1);
  if (files.empty()) return Complain(sh, "stat: missing operand", 1);
  int status = 0;
  std::string out;
  for (const auto& f : files) {
    int err = 0;
    auto lk = sh.Lock();
    auto n = sh.box->fs().Find(sh.Path(f), &err);
    if (!n) {
      lk.unlock();
      status = Complain(sh, "stat: cannot statx '" + f + "': " + ErrnoText(err), 1);
      continue;
    }
    for (size_t i = 0; i < fmt.size(); ++i) {
      if (fmt[i] != '%' || i + 1 >= fmt.size()) {
        out.push_back(fmt[i]);
        continue;
      }
      char c = fmt[++i], buf[32];
      if (c == 'a')
        std::snprintf(buf, sizeof buf, "%o", n->mode & 07777), out += buf;
      else if (c == 's')
        out += std::to_string(n->is_reg() ? n->data.size() : n->is_dir() ? 4096 : 0);
      else if (c == 'n')
        out += f;
      else if (c == 'Y')
        out += std::to_string(n->mtime_ms / 1000);
      else if (c == 'f')
        std::snprintf(buf, sizeof buf, "%x", n->mode), out += buf;
      else if (c == 'F')
        out += n->is_dir()       ? "directory"
               : n->is_dev()     ? "character special file"
               : n->data.empty() ? "regular empty file"
                                 : "regular file";
      else if (c == '%')
        out.push_back('%');
      else
        out += std::string("?") + c;
    }
    out.push_back('\n');
  }
  return sh.Out(out) ? status : 1;
}

int Touch(Shell& sh, const std::vector<std::string>& a) {
  if (a.size() < 2) return Complain(sh, "touch: missing file operand", 1);
  int status = 0;
  for (size_t i = 1; i < a.size(); ++i) {
    int err = 0;
    auto lk = sh.Lock();
    auto& fs = sh.box->fs();
    if (auto n = fs.Find(sh.Path(a[i]), &err)) {
      n->mtime_ms = sh.box->now_ms();
      fs.Changed();
    } else if (!fs.OpenWrite(sh.Path(a[i]), false, 0644, sh.box->now_ms(), &err)) {
      lk.unlock();
      status = Complain(sh, "touch: cannot touch '" + a[i] + "': " + ErrnoText(err), 1);
    }
  }
  return status;
}

// The options of rm, mkdir, cp: letters from `allowed`; the rest operands.
bool Flags(const std::vector<std::string>& a, const std::string& allowed, std::string* flags,
           std::vector<std::string>* operands, std::string* bad) {
  bool done = false;
  for (size_t i = 1; i < a.size(); ++i) {
    if (!done && a[i] == "--")
      done = true;
    else if (!done && a[i].size() > 1 && a[i][0] == '-') {
      for (char f : a[i].substr(1))
        if (allowed.find(f) == std::string::npos) return *bad = a[i], false;
      *flags += a[i].substr(1);
    } else {
      operands->push_back(a[i]);
    }
  }
  return true;
}

int Rm(Shell& sh, const std::vector<std::string>& a) {
  std::string flags, bad;
  std::vector<std::string> ops;
  if (!Flags(a, "frRv", &flags, &ops, &bad)) return BadOption(sh, "rm", bad);
  bool force = flags.find('f') != std::string::npos;
  bool rec = flags.find_first_of("rR") != std::string::npos;
  if (ops.empty() && !force) return Complain(sh, "rm: missing operand", 1);
  int status = 0;
  for (const auto& f : ops) {
    int err;
    {
      auto lk = sh.Lock();
      err = sh.box->fs().Remove(sh.Path(f), rec);
    }
    if (err && !(force && err == ENOENT)) status = Complain(sh, "rm: cannot remove '" + f + "': " + ErrnoText(err), 1);
  }
  return status;
}

int Mkdir(Shell& sh, const std::vector<std::string>& a) {
  std::string flags, bad;
  std::vector<std::string> ops;
  if (!Flags(a, "pv", &flags, &ops, &bad)) return BadOption(sh, "mkdir", bad);
  if (ops.empty()) return Complain(sh, "mkdir: missing operand", 1);
  int status = 0;
  for (const auto& d : ops) {
    int err;
    {
      auto lk = sh.Lock();
      err = sh.box->fs().Mkdir(sh.Path(d), 0755, !flags.empty(), sh.box->now_ms());
    }
    if (err) status = Complain(sh, "mkdir: cannot create directory '" + d + "': " + ErrnoText(err), 1);
  }
  return status;
}

int Rmdir(Shell& sh, const std::vector<std::string>& a) {
  int status = 0;
  for (size_t i = 1; i < a.size(); ++i) {
    int err = 0;
    auto lk = sh.Lock();
    auto& fs = sh.box->fs();
    auto n = fs.Find(sh.Path(a[i]), &err);
    if (n && !n->is_dir())
      err = ENOTDIR;
    else if (n && !fs.List(sh.Path(a[i]), &err).empty())
      err = ENOTEMPTY;
    if (!err) err = fs.Remove(sh.Path(a[i]), true);
    lk.unlock();
    if (err) status = Complain(sh, "rmdir: failed to remove '" + a[i] + "': " + ErrnoText(err), 1);
  }
  return status;
}

// cp and mv: SRC... DEST, DEST a directory when there are several.
int CopyOrMove(Shell& sh, const std::vector<std::string>& a) {
  bool move = FakeBaseName(a[0]) == "mv";
  std::string flags, bad;
  std::vector<std::string> ops;
  if (!Flags(a, move ? "f" : "fp", &flags, &ops, &bad)) return BadOption(sh, a[0], bad);
  if (ops.size() < 2) return Complain(sh, a[0] + ": missing file operand", 1);
  std::string dest = sh.Path(ops.back());
  int status = 0;
  auto lk = sh.Lock();
  auto& fs = sh.box->fs();
  int err = 0;
  auto d = fs.Find(dest, &err);
  bool into = d && d->is_dir();
  if (ops.size() > 2 && !into) {
    lk.unlock();
    return Complain(sh, a[0] + ": target '" + ops.back() + "' is not a directory", 1);
  }
  for (size_t i = 0; i + 1 < ops.size(); ++i) {
    std::string src = sh.Path(ops[i]), to = into ? FakeJoinPath(dest, FakeBaseName(src)) : dest;
    auto s = fs.Find(src, &err);
    std::string what;
    if (!s)
      what = "cannot stat '" + ops[i] + "': " + ErrnoText(err);
    else if (move && (err = fs.Rename(src, to, sh.box->now_ms())))
      what = "cannot move '" + ops[i] + "' to '" + ops.back() + "': " + ErrnoText(err);
    else if (!move && s->is_dir())
      what = "-r not specified; omitting directory '" + ops[i] + "'";
    else if (!move) {
      auto t = fs.OpenWrite(to, true, s->mode & 07777, sh.box->now_ms(), &err);
      if (t) err = fs.Append(t, std::string(s->data), sh.info->file_size_bytes, sh.box->now_ms());
      if (err) what = "cannot create regular file '" + ops.back() + "': " + ErrnoText(err);
    }
    if (!what.empty()) {
      lk.unlock();
      status = Complain(sh, a[0] + ": " + what, 1);
      lk.lock();
    }
  }
  return status;
}

int Chmod(Shell& sh, const std::vector<std::string>& a) {
  if (a.size() < 3) return Complain(sh, "chmod: missing operand", 1);
  const std::string& m = a[1];
  char* end = nullptr;
  long octal = std::strtol(m.c_str(), &end, 8);
  bool is_octal = !m.empty() && *end == '\0' && octal <= 07777;
  size_t op = m.find_first_of("+-=");
  if (!is_octal && (op == std::string::npos || m.find_first_not_of("ugoa") < op ||
                    m.find_first_not_of("rwx", op + 1) != std::string::npos))
    return Complain(sh, "chmod: invalid mode: '" + m + "'", 1);
  int status = 0;
  for (size_t i = 2; i < a.size(); ++i) {
    int err = 0;
    auto lk = sh.Lock();
    auto n = sh.box->fs().Find(sh.Path(a[i]), &err);
    if (!n) {
      lk.unlock();
      status = Complain(sh, "chmod: cannot access '" + a[i] + "': " + ErrnoText(err), 1);
      continue;
    }
    uint32_t perm = n->mode & 07777;
    if (is_octal) {
      perm = static_cast<uint32_t>(octal);
    } else {
      std::string who = m.substr(0, op);
      uint32_t mask = 0, bits = 0;
      if (who.empty() || who.find('a') != std::string::npos) who = "ugo";
      for (char w : who) mask |= w == 'u' ? 0700 : w == 'g' ? 070 : 07;
      for (char b : m.substr(op + 1)) bits |= b == 'r' ? 0444 : b == 'w' ? 0222 : 0111;
      perm = m[op] == '+'   ? perm | (bits & mask)
             : m[op] == '-' ? perm & ~(bits & mask)
                            : (perm & ~mask) | (bits & mask);
    }
    n->mode = (n->mode & ~07777u) | perm;
    sh.box->fs().Changed();
  }
  return status;
}

int Basename(Shell& sh, const std::vector<std::string>& a) {
  if (a.size() < 2) return Complain(sh, "basename: missing operand", 1);
  std::string b = FakeBaseName(a[1]);
  if (a.size() > 2 && b.size() > a[2].size() && b.compare(b.size() - a[2].size(), a[2].size(), a[2]) == 0)
    b.resize(b.size() - a[2].size());
  return sh.Out(b + "\n") ? 0 : 1;
}

int Dirname(Shell& sh, const std::vector<std::string>& a) {
  if (a.size() < 2) return Complain(sh, "dirname: missing operand", 1);
  std::string p = a[1];
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.rfind('/');
  p = slash == std::string::npos ? "." : slash == 0 ? "/" : p.substr(0, slash);
  return sh.Out(p + "\n") ? 0 : 1;
}

}  // namespace

const std::map<std::string, Tool>& FileTools() {
  static const std::map<std::string, Tool> tools = {
      {"ls", Ls},       {"stat", Stat},         {"touch", Touch},    {"rm", Rm},
      {"mkdir", Mkdir}, {"rmdir", Rmdir},       {"cp", CopyOrMove},  {"mv", CopyOrMove},
      {"chmod", Chmod}, {"basename", Basename}, {"dirname", Dirname}};
  return tools;
}

}  // namespace dsec::drivers::fakesh
