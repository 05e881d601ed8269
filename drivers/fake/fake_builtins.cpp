// The fake shell's own builtins (: true false echo printf exit pwd cd
// export unset read wait break continue shift eval test [ env printenv
// sleep, and sh itself), how a command name becomes a tool, a script or
// "not found", and the helpers the tools share. The messages are dash's
// and coreutils', without dash's line numbers.
#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "drivers/fake/fake_shell_internal.hpp"

namespace dsec::drivers::fakesh {

namespace {

std::string Join(const std::vector<std::string>& v, size_t from, const char* sep = " ") {
  std::string s;
  for (size_t i = from; i < v.size(); ++i) s += (i > from ? sep : "") + v[i];
  return s;
}

bool ParseInt(const std::string& s, long long* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  *v = std::strtoll(s.c_str(), &end, 10);
  return *end == '\0' && errno == 0;
}

// Backslash escapes of echo (dash) and printf formats; `stop` set at \c.
std::string Unescape(const std::string& s, bool* stop) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 >= s.size()) {
      out.push_back(s[i]);
      continue;
    }
    char c = s[++i];
    switch (c) {
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'c':
        if (stop) *stop = true;
        return out;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '0':
      case '1':
      case '2':
      case '3':
      case '4':
      case '5':
      case '6':
      case '7': {
        int v = 0, n = 0;
        if (c == '0')
          ++i;  // \0NNN
        else
          c = 0;
        for (; n < 3 && i < s.size() && s[i] >= '0' && s[i] <= '7'; ++n, ++i) v = v * 8 + (s[i] - '0');
        --i;
        out.push_back(static_cast<char>(v));
        break;
      }
      default:
        out.push_back('\\');
        out.push_back(c);
        break;
    }
  }
  return out;
}

int Echo(Shell& sh, const std::vector<std::string>& a) {
  size_t i = 1;
  bool newline = true, stop = false;
  if (a.size() > 1 && a[1] == "-n") newline = false, i = 2;
  std::string out = Unescape(Join(a, i), &stop);
  if (newline && !stop) out.push_back('\n');
  return sh.Out(out) ? 0 : 1;
}

int Printf(Shell& sh, const std::vector<std::string>& a) {
  if (a.size() < 2) return Complain(sh, "printf: usage: printf format [arg ...]", 2);
  const std::string& f = a[1];
  size_t next = 2;
  int status = 0;
  std::string out;
  do {
    size_t first = next;
    for (size_t i = 0; i < f.size(); ++i) {
      if (f[i] == '\\' && i + 1 < f.size()) {
        size_t j = i + 2;
        if (f[i + 1] >= '0' && f[i + 1] <= '7')  // \NNN, \0NNN
          while (j < f.size() && j < i + (f[i + 1] == '0' ? 5 : 4) && f[j] >= '0' && f[j] <= '7') ++j;
        bool stop = false;
        out += Unescape(f.substr(i, j - i), &stop);
        if (stop) return sh.Out(out) ? status : 1;
        i = j - 1;
        continue;
      }
      if (f[i] != '%' || i + 1 >= f.size()) {
        out.push_back(f[i]);
        continue;
      }
      size_t j = i + 1;
      while (j < f.size() && std::strchr("-+ #0123456789.", f[j])) ++j;
      if (j >= f.size()) break;
      std::string spec = f.substr(i, j - i);
      char conv = f[j];
      i = j;
      if (conv == '%') {
        out.push_back('%');
        continue;
      }
      std::string arg = next < a.size() ? a[next++] : "";
      char buf[512];
      if (conv == 's' || conv == 'b' || conv == 'c') {
        if (conv == 'b') arg = Unescape(arg, nullptr);
        if (conv == 'c') arg = arg.substr(0, 1);
        std::snprintf(buf, sizeof buf, (spec + "s").c_str(), arg.c_str());
        out += buf;
      } else if (std::strchr("diouxX", conv)) {
        long long v = 0;
        if (!arg.empty() && !ParseInt(arg, &v)) {
          status = 1;
          (void)sh.Err("printf: " + arg + ": invalid number\n");
        }
        std::snprintf(buf, sizeof buf, (spec + "ll" + conv).c_str(), v);
        out += buf;
      } else {
        return Complain(sh, std::string("printf: %") + conv + ": invalid directive", 1);
      }
    }
    if (next == first) break;  // no argument used: the format is not repeated
  } while (next < a.size());
  return sh.Out(out) ? status : 1;
}

int Exit(Shell& sh, const std::vector<std::string>& a) {
  long long v = sh.status;
  if (a.size() > 1 && !ParseInt(a[1], &v)) {
    sh.exiting = true;
    return Complain(sh, "sh: exit: Illegal number: " + a[1], 2);
  }
  sh.exiting = true;
  return static_cast<int>(v & 0xff);
}

// exec CMD ARGS: the command takes the shell's place (here: it runs, and
// the shell ends with its status). Without a command: nothing to replace.
int ExecTool(Shell& sh, const std::vector<std::string>& a) {
  if (a.size() < 2) return 0;
  int status = RunCommand(sh, std::vector<std::string>(a.begin() + 1, a.end()));
  sh.exiting = true;
  return status;
}

int Cd(Shell& sh, const std::vector<std::string>& a) {
  std::string dir = a.size() > 1 ? a[1] : sh.Var("HOME");
  std::string path = sh.Path(dir);
  int err = 0;
  bool ok;
  {
    auto lk = sh.Lock();
    auto n = sh.box->fs().Find(path, &err);
    ok = n && n->is_dir();
  }
  if (!ok) return Complain(sh, "sh: cd: can't cd to " + dir, 2);
  sh.cwd = path;
  if (sh.vars.count("PWD")) (void)sh.SetVar("PWD", path);
  return 0;
}

int Export(Shell& sh, const std::vector<std::string>& a) {
  for (size_t i = 1; i < a.size(); ++i) {
    size_t eq = a[i].find('=');
    std::string name = a[i].substr(0, eq);
    if (eq != std::string::npos && !sh.SetVar(name, a[i].substr(eq + 1))) return 1;
    sh.exported.insert(name);
  }
  return 0;
}

int Unset(Shell& sh, const std::vector<std::string>& a) {
  for (size_t i = 1; i < a.size(); ++i) sh.Unset(a[i]);
  return 0;
}

int Read(Shell& sh, const std::vector<std::string>& a) {
  size_t i = 1;
  bool raw = a.size() > 1 && a[1] == "-r";
  if (raw) ++i;
  std::string line;
  bool eof = true;
  // A byte at a time: what follows the line is the next command's, as with a pipe.
  for (;;) {
    std::string c;
    long n = sh.Get(sh.in, &c, 1);
    if (n < 0) return 1;
    if (n == 0) break;
    if (c[0] == '\n') {
      eof = false;
      break;
    }
    if (!raw && c[0] == '\\') {
      std::string d;
      if (sh.Get(sh.in, &d, 1) <= 0) break;
      if (d[0] != '\n') line += d;
      continue;
    }
    line += c;
  }
  std::vector<std::string> names(a.begin() + static_cast<long>(i), a.end());
  if (names.empty()) names.push_back("REPLY");
  size_t pos = 0;
  auto blank = [](char c) { return c == ' ' || c == '\t'; };
  for (size_t k = 0; k < names.size(); ++k) {
    while (pos < line.size() && blank(line[pos])) ++pos;
    size_t end = pos;
    if (k + 1 == names.size()) {
      end = line.size();
      while (end > pos && blank(line[end - 1])) --end;
    } else {
      while (end < line.size() && !blank(line[end])) ++end;
    }
    if (!sh.SetVar(names[k], line.substr(pos, end - pos))) return 1;
    pos = end;
  }
  return eof ? 1 : 0;  // a last line without its newline is read, and says so
}

int Wait(Shell& sh, const std::vector<std::string>& a) {
  int status = 0;
  for (auto it = sh.jobs.begin(); it != sh.jobs.end();) {
    if (a.size() > 1 && std::find(a.begin() + 1, a.end(), std::to_string(it->first)) == a.end()) {
      ++it;
      continue;
    }
    int s;
    while ((s = it->second->WaitFinished(5)) < 0)
      if (!sh.Check()) return 1;
    status = s;
    it = sh.jobs.erase(it);
  }
  return status;
}

int Break(Shell& sh, const std::vector<std::string>& a) {
  long long n = 1;
  if (a.size() > 1 && (!ParseInt(a[1], &n) || n < 1))
    return Complain(sh, "sh: " + a[0] + ": Illegal number: " + a[1], 2);
  if (sh.loops == 0) return 0;
  sh.breaks = static_cast<int>(std::min<long long>(n, sh.loops));
  sh.continuing = a[0] == "continue";
  return 0;
}

int Shift(Shell& sh, const std::vector<std::string>& a) {
  long long n = 1;
  if (a.size() > 1 && !ParseInt(a[1], &n)) return Complain(sh, "sh: shift: Illegal number: " + a[1], 2);
  if (n < 0 || static_cast<size_t>(n) + 1 > std::max<size_t>(sh.args.size(), 1))
    return Complain(sh, "sh: shift: can't shift that many", 2);
  sh.args.erase(sh.args.begin() + 1, sh.args.begin() + 1 + n);
  return 0;
}

int Eval(Shell& sh, const std::vector<std::string>& a) { return RunScript(sh, Join(a, 1), "sh"); }

// sh [-c SCRIPT [NAME [ARG...]]] | sh FILE [ARG...] | sh (the script on stdin):
// a new shell with only the exported variables.
int Sh(Shell& sh, const std::vector<std::string>& a) {
  Shell child(sh);
  child.vars = sh.Environ();
  child.exported.clear();
  for (const auto& [k, v] : child.vars) child.exported.insert(k);
  size_t i = 1;
  bool c = false;
  for (; i < a.size() && a[i].size() > 1 && a[i][0] == '-'; ++i) {
    if (a[i] == "--") {
      ++i;
      break;
    }
    if (a[i] != "-c") return Complain(sh, "sh: " + a[i] + ": option not supported by the fake shell (only -c)", 2);
    c = true;
  }
  std::string script;
  if (c) {
    if (i >= a.size()) return Complain(sh, "sh: -c requires an argument", 2);
    script = a[i++];
    child.args = {i < a.size() ? a[i++] : a[0]};
  } else if (i < a.size()) {
    int err = 0;
    auto r = OpenRead(sh, sh.Path(a[i]), &err);
    if (!r)
      return Complain(sh, "sh: cannot open " + a[i] + ": " + (err == ENOENT ? "No such file" : ErrnoText(err)), 2);
    if (!ReadAll(sh, r, &script)) return 1;
    sh.ctl->Charge(-static_cast<int64_t>(script.size()));
    child.args = {a[i++]};
  } else {
    if (!ReadAll(sh, sh.in, &script)) return 1;
    sh.ctl->Charge(-static_cast<int64_t>(script.size()));
    child.args = {a[0]};
  }
  child.args.insert(child.args.end(), a.begin() + static_cast<long>(i), a.end());
  int status = RunScript(child, script, "sh");
  return child.sigpipe ? 128 + SIGPIPE : status;
}

// test / [: POSIX's primaries, !, -a, -o and parentheses.
class Test {
 public:
  Test(Shell& sh, const std::string& name, std::vector<std::string> args) : sh_(sh), name_(name), a_(std::move(args)) {}
  int Run() {
    if (a_.empty()) return 1;
    bool v = Or();
    if (error_.empty() && i_ < a_.size()) error_ = a_[i_] + ": unexpected operator";
    if (!error_.empty()) return Complain(sh_, "sh: " + name_ + ": " + error_, 2);
    return v ? 0 : 1;
  }

 private:
  bool More(size_t n = 1) const { return i_ + n <= a_.size(); }
  bool Or() {
    bool v = And();
    while (error_.empty() && More() && a_[i_] == "-o") ++i_, v = And() || v;
    return v;
  }
  bool And() {
    bool v = Not();
    while (error_.empty() && More() && a_[i_] == "-a") ++i_, v = Not() && v;
    return v;
  }
  bool Not() {
    if (More(2) && a_[i_] == "!") return ++i_, !Not();
    return Primary();
  }
  static bool IsBinary(const std::string& op) {
    for (const char* b : {"=", "!=", "-eq", "-ne", "-lt", "-le", "-gt", "-ge"})
      if (op == b) return true;
    return false;
  }
  long long Number(const std::string& s) {
    long long v = 0;
    std::string t = s;
    while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.pop_back();
    size_t b = t.find_first_not_of(" \t");
    if (b == std::string::npos || !ParseInt(t.substr(b), &v)) error_ = "Illegal number: " + s;
    return v;
  }
  bool Primary() {
    if (!More()) {
      error_ = "argument expected";
      return false;
    }
    if (More(3) && IsBinary(a_[i_ + 1])) {
      const std::string &l = a_[i_], &op = a_[i_ + 1], &r = a_[i_ + 2];
      i_ += 3;
      if (op == "=") return l == r;
      if (op == "!=") return l != r;
      long long x = Number(l), y = Number(r);
      return op == "-eq"   ? x == y
             : op == "-ne" ? x != y
             : op == "-lt" ? x < y
             : op == "-le" ? x <= y
             : op == "-gt" ? x > y
                           : x >= y;
    }
    if (a_[i_] == "(" && More(3)) {
      ++i_;
      bool v = Or();
      if (!More() || a_[i_] != ")")
        error_ = "closing paren expected";
      else
        ++i_;
      return v;
    }
    const std::string& op = a_[i_];
    if (More(2) && op.size() == 2 && op[0] == '-' && std::strchr("efdsrwxznLhcpt", op[1])) {
      const std::string& arg = a_[i_ + 1];
      i_ += 2;
      if (op == "-z") return arg.empty();
      if (op == "-n") return !arg.empty();
      if (op == "-t") return false;
      int err = 0;
      auto lk = sh_.Lock();
      auto n = sh_.box->fs().Find(sh_.Path(arg), &err);
      if (!n || arg.empty()) return false;
      switch (op[1]) {
        case 'f':
          return n->is_reg();
        case 'd':
          return n->is_dir();
        case 's':
          return n->is_reg() && !n->data.empty();
        case 'c':
          return n->is_dev();
        case 'x':
          return (n->mode & 0111) != 0;
        case 'L':
        case 'h':
        case 'p':
          return false;
        default:
          return true;  // -e -r -w: root may
      }
    }
    return !a_[i_++].empty();
  }

  Shell& sh_;
  std::string name_;
  std::vector<std::string> a_;
  size_t i_ = 0;
  std::string error_;
};

int TestTool(Shell& sh, const std::vector<std::string>& a) {
  std::vector<std::string> args(a.begin() + 1, a.end());
  if (a[0] == "[") {
    if (args.empty() || args.back() != "]") return Complain(sh, "sh: [: missing ]", 2);
    args.pop_back();
  }
  return Test(sh, a[0], std::move(args)).Run();
}

int Env(Shell& sh, const std::vector<std::string>& a) {
  size_t i = 1;
  std::map<std::string, std::string> env = sh.Environ();
  for (; i < a.size() && a[i].find('=') != std::string::npos && a[i][0] != '='; ++i)
    env[a[i].substr(0, a[i].find('='))] = a[i].substr(a[i].find('=') + 1);
  if (i < a.size()) {
    Shell child(sh);
    child.vars = env;
    child.exported.clear();
    for (const auto& [k, v] : env) child.exported.insert(k);
    int status = RunCommand(child, std::vector<std::string>(a.begin() + static_cast<long>(i), a.end()));
    return child.sigpipe ? 128 + SIGPIPE : status;  // env is a process of its own
  }
  std::string out;
  for (const auto& [k, v] : env) out += k + "=" + v + "\n";
  return sh.Out(out) ? 0 : 1;
}

int Printenv(Shell& sh, const std::vector<std::string>& a) {
  auto env = sh.Environ();
  if (a.size() < 2) return Env(sh, {"env"});
  int status = 0;
  std::string out;
  for (size_t i = 1; i < a.size(); ++i) {
    auto it = env.find(a[i]);
    if (it == env.end())
      status = 1;
    else
      out += it->second + "\n";
  }
  return sh.Out(out) ? status : 1;
}

// sleep N[smhd]...: really waits, in 5 ms steps (stops and pauses act within one).
int Sleep(Shell& sh, const std::vector<std::string>& a) {
  if (a.size() < 2) return Complain(sh, "sleep: missing operand", 1);
  double secs = 0;
  for (size_t i = 1; i < a.size(); ++i) {
    char* end = nullptr;
    double v = std::strtod(a[i].c_str(), &end);
    std::string unit = end;
    double mult = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : unit == "d" ? 86400 : -1;
    if (end == a[i].c_str() || mult < 0 || !(v >= 0) || std::isinf(v))
      return Complain(sh, "sleep: invalid time interval '" + a[i] + "'", 1);
    secs += v * mult;
  }
  auto until =
      std::chrono::steady_clock::now() + std::chrono::microseconds(static_cast<int64_t>(std::min(secs, 1e9) * 1e6));
  for (;;) {
    if (!sh.Check()) return 1;
    auto now = std::chrono::steady_clock::now();
    if (now >= until) return 0;
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(until - now, std::chrono::milliseconds(5)));
  }
}

int True(Shell&, const std::vector<std::string>&) { return 0; }
int False(Shell&, const std::vector<std::string>&) { return 1; }
int Pwd(Shell& sh, const std::vector<std::string>&) { return sh.Out(sh.cwd + "\n") ? 0 : 1; }

const std::map<std::string, Tool>& ShellTools() {
  static const std::map<std::string, Tool> tools = {
      {":", True},        {"true", True},      {"false", False},       {"echo", Echo},
      {"printf", Printf}, {"exit", Exit},      {"pwd", Pwd},           {"cd", Cd},
      {"export", Export}, {"unset", Unset},    {"read", Read},         {"wait", Wait},
      {"break", Break},   {"continue", Break}, {"shift", Shift},       {"eval", Eval},
      {"sh", Sh},         {"bash", Sh},        {"dash", Sh},           {"test", TestTool},
      {"[", TestTool},    {"env", Env},        {"printenv", Printenv}, {"sleep", Sleep},
      {"exec", ExecTool}};
  return tools;
}

}  // namespace

Tool FindTool(const std::string& name) {
  std::string n = name;
  for (const char* dir : {"/usr/bin/", "/bin/"})
    if (n.compare(0, std::strlen(dir), dir) == 0) n = n.substr(std::strlen(dir));
  if (n.empty() || (n != name && n.find('/') != std::string::npos)) return nullptr;
  if (n != name && ShellTools().count(n) &&
      (n == "exit" || n == "cd" || n == "break" || n == "continue" || n == "export" || n == "unset" || n == "shift" ||
       n == "eval" || n == "exec"))
    return nullptr;  // special builtins have no file in /bin
  if (auto it = ShellTools().find(n); it != ShellTools().end()) return it->second;
  if (auto it = TextTools().find(n); it != TextTools().end()) return it->second;
  if (auto it = FileTools().find(n); it != FileTools().end()) return it->second;
  return nullptr;
}

int Complain(Shell& sh, const std::string& text, int status) {
  (void)sh.Err(text + "\n");
  return status;
}

int BadOption(Shell& sh, const std::string& tool, const std::string& opt) {
  return Complain(sh, tool + ": option " + opt + " is not supported by the fake shell", 1);
}

bool Pump(Shell& sh, const ReaderPtr& r) {
  std::string buf;
  for (;;) {
    buf.clear();
    long n = sh.Get(r, &buf, 64 << 10);
    if (n < 0) return false;
    if (n == 0) return true;
    if (!sh.Out(buf)) return false;
  }
}

bool ReadAll(Shell& sh, const ReaderPtr& r, std::string* out) {
  for (;;) {
    size_t before = out->size();
    long n = sh.Get(r, out, 64 << 10);
    if (n < 0) return false;
    if (n == 0) return true;
    if (!sh.ctl->Charge(static_cast<int64_t>(out->size() - before))) return false;
  }
}

int RunCommand(Shell& sh, const std::vector<std::string>& argv) {
  const std::string& name = argv[0];
  uint64_t token = sh.box->AddRunning(Join(argv, 0));
  int status;
  if (Tool tool = FindTool(name)) {
    sh.write_errno = 0;
    status = tool(sh, argv);
    if (sh.sigpipe) status = 128 + SIGPIPE;
    if (sh.write_errno) {
      (void)sh.Err(FakeBaseName(name) + ": write error: " + ErrnoText(sh.write_errno) + "\n");
      sh.write_errno = 0;
      status = 1;
    }
  } else if (name.find('/') != std::string::npos) {
    int err = 0;
    FakeNodePtr prog;
    {
      auto lk = sh.Lock();
      prog = sh.box->fs().Find(sh.Path(name), &err);
    }
    if (!prog) {
      status = Complain(sh, "sh: " + name + ": not found", 127);
    } else if (!prog->is_reg() || !(prog->mode & 0111)) {
      status = Complain(sh, "sh: " + name + ": Permission denied", 126);
    } else if (prog->data.compare(0, 2, "#!") != 0) {
      status = Complain(sh, "sh: " + name + ": Exec format error (the fake shell runs only #! scripts)", 126);
    } else {
      std::vector<std::string> sh_argv = {"sh"};
      sh_argv.insert(sh_argv.end(), argv.begin(), argv.end());
      status = Sh(sh, sh_argv);
    }
  } else {
    status = Complain(sh, "sh: " + name + ": not found", 127);
  }
  sh.box->RemoveRunning(token);
  return status;
}

}  // namespace dsec::drivers::fakesh

namespace dsec::drivers {

bool IsFakeTool(const std::string& name) { return fakesh::FindTool(name) != nullptr; }

}  // namespace dsec::drivers
