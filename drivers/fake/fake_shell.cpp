// The fake shell's interpreter: expansions, redirections, the compound
// commands, and one exec from start to verdict (streams and the shell's
// state: fake_streams.cpp). Pipeline stages run on threads of their
// own joined before the pipeline ends, as processes a shell waits for;
// background jobs on threads of the box, which joins them when it ends.
// Every step passes Shell::Check, where stops, deadlines and pauses act.
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>

#include "drivers/fake/fake_shell_internal.hpp"

namespace dsec::drivers::fakesh {

namespace {

uint64_t ThreadCpuUs() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000 + static_cast<uint64_t>(ts.tv_nsec) / 1000;
}

std::string Join(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

// --- expansion -------------------------------------------------------------------

std::string Param(Shell& sh, const std::string& name) {
  if (name == "?") return std::to_string(sh.status);
  if (name == "#") return std::to_string(sh.args.empty() ? 0 : sh.args.size() - 1);
  if (name == "$") return "1";
  if (name == "!") return sh.last_pid ? std::to_string(sh.last_pid) : "";
  if (name == "-") return "";
  if (name == "@" || name == "*") {
    std::vector<std::string> rest(sh.args.size() > 1 ? sh.args.begin() + 1 : sh.args.end(), sh.args.end());
    return Join(rest);
  }
  if (std::isdigit(static_cast<unsigned char>(name[0]))) {
    size_t i = static_cast<size_t>(name[0] - '0');
    return i < sh.args.size() ? sh.args[i] : "";
  }
  return sh.Var(name);
}

bool IsSet(Shell& sh, const std::string& name) {
  if (name.size() == 1 && std::isdigit(static_cast<unsigned char>(name[0])))
    return static_cast<size_t>(name[0] - '0') < sh.args.size();
  return sh.vars.count(name) || !std::isalpha(static_cast<unsigned char>(name[0]));
}

// $(...): its output without trailing newlines; false when the run stopped.
bool Substitute(Shell& sh, const Node& cmd, std::string* out) {
  Shell sub(sh);
  auto cap = std::make_shared<Capture>();
  sub.out = cap;
  RunNode(sub, cmd);
  sh.subst_status = sub.status;
  *out = cap->Take();
  while (!out->empty() && out->back() == '\n') out->pop_back();
  return sh.Check();
}

bool Expand(Shell& sh, const Word& w, std::vector<std::string>* fields, bool split);

// One part's text; false when the run stopped or the shell must exit.
bool PartText(Shell& sh, const WordPart& p, std::string* text) {
  switch (p.kind) {
    case WordPart::kLit:
      *text = p.text;
      return true;
    case WordPart::kCmd:
      return Substitute(sh, *p.cmd, text);
    case WordPart::kArith: {
      int64_t v = 0;
      std::string err;
      if (!EvalArith(
              p.text, [&](const std::string& n) { return Param(sh, n); }, &v, &err)) {
        (void)sh.Err("sh: " + err + "\n");
        sh.status = 2;
        sh.exiting = true;
        return false;
      }
      *text = std::to_string(v);
      return true;
    }
    case WordPart::kParam: {
      *text = Param(sh, p.text);
      if (p.length) *text = std::to_string(text->size());
      if (p.has_alt && (!IsSet(sh, p.text) || (p.alt_if_empty && text->empty()))) {
        auto alt = ParseQuotedText(p.alt);
        if (!alt.ok()) {
          (void)sh.Err("sh: " + alt.status().message() + "\n");
          sh.status = 2;
          sh.exiting = true;
          return false;
        }
        std::vector<std::string> one;
        if (!Expand(sh, *alt, &one, false)) return false;
        *text = one.empty() ? "" : one[0];
      }
      return true;
    }
  }
  return true;
}

// Splits unquoted expansions on blanks (IFS is always " \t\n"); quoted
// parts and literals stay whole. `split` false: one field, whatever it holds.
bool Expand(Shell& sh, const Word& w, std::vector<std::string>* fields, bool split) {
  std::string cur;
  bool have = false;
  for (size_t i = 0; i < w.parts.size(); ++i) {
    const WordPart& p = w.parts[i];
    std::string text;
    if (p.kind == WordPart::kParam && p.text == "@" && p.quoted && split && !p.has_alt && !p.length) {
      for (size_t a = 1; a < sh.args.size(); ++a) {  // "$@": one field per argument
        if (a > 1) fields->push_back(std::move(cur)), cur.clear();
        cur += sh.args[a];
        have = true;
      }
      continue;
    }
    if (!PartText(sh, p, &text)) return false;
    if (i == 0 && p.kind == WordPart::kLit && !p.quoted && !text.empty() && text[0] == '~' &&
        (text.size() == 1 || text[1] == '/'))
      text = sh.Var("HOME") + text.substr(1);
    if (p.kind == WordPart::kLit || p.quoted || !split) {
      cur += text;
      have = have || p.quoted || !text.empty();
      continue;
    }
    for (char c : text) {
      if (c == ' ' || c == '\t' || c == '\n') {
        if (have) fields->push_back(std::move(cur));
        cur.clear();
        have = false;
      } else {
        cur.push_back(c);
        have = true;
      }
    }
  }
  if (have || !split) fields->push_back(std::move(cur));
  return !sh.exiting && sh.Check();
}

bool ExpandOne(Shell& sh, const Word& w, std::string* out) {
  std::vector<std::string> f;
  if (!Expand(sh, w, &f, false)) return false;
  *out = f.empty() ? "" : f[0];
  return true;
}

// --- redirections ------------------------------------------------------------------

struct SavedIo {
  explicit SavedIo(Shell& sh) : sh_(sh), in_(sh.in), out_(sh.out), err_(sh.err) {}
  ~SavedIo() {
    sh_.in = std::move(in_);
    sh_.out = std::move(out_);
    sh_.err = std::move(err_);
  }
  Shell& sh_;
  ReaderPtr in_;
  WriterPtr out_, err_;
};

// Applies `redirs` left to right; false (the message said, status 2) when
// one fails.
bool Redirect(Shell& sh, const std::vector<Redir>& redirs) {
  for (const auto& r : redirs) {
    std::string target;
    if (!ExpandOne(sh, r.target, &target)) return false;
    auto fail = [&](const std::string& msg) {
      (void)sh.Err("sh: " + msg + "\n");
      sh.status = 2;
      return false;
    };
    if (r.fd > 2) return fail(std::to_string(r.fd) + ": only descriptors 0-2 exist in the fake shell");
    if (r.op == Redir::kDup) {
      if (target == "-") {
        if (r.fd == 0)
          sh.in = NullReader();
        else
          (r.fd == 1 ? sh.out : sh.err) = NullWriter();
        continue;
      }
      if (target != "0" && target != "1" && target != "2") return fail(target + ": Bad file descriptor");
      int m = target[0] - '0';
      if ((r.fd == 0) != (m == 0)) return fail(target + ": Bad file descriptor");
      if (r.fd == 1) sh.out = m == 1 ? sh.out : sh.err;
      if (r.fd == 2) sh.err = m == 1 ? sh.out : sh.err;
      continue;
    }
    int err = 0;
    if (r.op == Redir::kIn) {
      auto in = OpenRead(sh, sh.Path(target), &err);
      if (!in) return fail("cannot open " + target + ": " + (err == ENOENT ? "No such file" : ErrnoText(err)));
      if (r.fd != 0) return fail(std::to_string(r.fd) + "<: only standard input reads in the fake shell");
      sh.in = in;
      continue;
    }
    auto out = OpenWrite(sh, sh.Path(target), r.op == Redir::kAppend, &err);
    if (!out)
      return fail("cannot create " + target + ": " + (err == ENOENT ? "Directory nonexistent" : ErrnoText(err)));
    if (r.fd == 0) return fail("0>: standard input cannot be written");
    (r.fd == 1 ? sh.out : sh.err) = out;
  }
  return true;
}

void SyncBox(Shell& sh) {
  if (!sh.box->Sync().ok()) {
    // The driver sees the same failure on its next Sync and reports it; a
    // command cannot do anything about it.
  }
}

// --- commands ------------------------------------------------------------------------

int RunSimple(Shell& sh, const Node& n) {
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> assigns;
  sh.subst_status = -1;  // a bare assignment's status is its last $(...)'s
  for (const auto& w : n.words)
    if (!Expand(sh, w, &argv, true)) return sh.status;
  for (const auto& [name, w] : n.assigns) {
    std::string v;
    if (!ExpandOne(sh, w, &v)) return sh.status;
    assigns.emplace_back(name, std::move(v));
  }
  int subst_status = sh.subst_status < 0 ? 0 : sh.subst_status;
  SavedIo saved(sh);
  int status;
  if (!Redirect(sh, n.redirs)) {
    status = sh.status;
  } else if (argv.empty()) {
    for (const auto& [name, v] : assigns)
      if (!sh.SetVar(name, v)) break;
    status = subst_status;
  } else {
    // NAME=V before a command: in its environment only.
    std::vector<std::pair<std::string, std::optional<std::string>>> old;
    for (const auto& [name, v] : assigns) {
      auto it = sh.vars.find(name);
      old.emplace_back(name, it == sh.vars.end() ? std::nullopt : std::optional<std::string>(it->second));
      (void)sh.SetVar(name, v);
    }
    std::vector<std::string> newly_exported;
    for (const auto& [name, v] : assigns)
      if (sh.exported.insert(name).second) newly_exported.push_back(name);
    status = RunCommand(sh, argv);
    for (const auto& [name, v] : old) {
      if (v)
        (void)sh.SetVar(name, *v);
      else
        sh.Unset(name);
    }
    for (const auto& name : newly_exported) sh.exported.erase(name);
  }
  SyncBox(sh);
  sh.status = status;
  return status;
}

void StartJob(Shell& sh, const NodePtr& node) {
  auto ctl = std::make_shared<FakeRunControl>(sh.ctl);
  ctl->set_memory_limit(sh.ctl->memory_limit());
  auto job = std::make_shared<Shell>(sh);
  job->ctl = ctl;
  job->in = NullReader();  // a non-interactive shell's & jobs read /dev/null
  job->jobs.clear();
  int pid = sh.info->next_pid++;
  // The job is a forked shell: it shows as its exec's command from the fork on.
  uint64_t token = sh.box->AddRunning(sh.info->command);
  bool started = sh.box->StartJob(ctl, [job, node, ctl, token]() mutable {
    RunNode(*job, *node);
    job->box->RemoveRunning(token);
    SyncBox(*job);
    int status = job->status;
    job.reset();  // lets go of pipes and files before `wait` hears of it
    ctl->Finish(status);
  });
  if (!started) {
    sh.box->RemoveRunning(token);
    return;
  }
  sh.last_pid = pid;
  sh.jobs.emplace_back(pid, ctl);
}

// After a loop's body: true when the loop goes on.
bool LoopGoesOn(Shell& sh) {
  if (sh.breaks == 0) return sh.Go();
  if (--sh.breaks > 0) return false;  // an outer loop's break or continue
  bool cont = sh.continuing;
  sh.continuing = false;
  return cont && sh.Go();
}

int RunPipeline(Shell& sh, const Node& n) {
  size_t count = n.kids.size();
  std::vector<std::unique_ptr<Shell>> stages;
  for (size_t i = 0; i < count; ++i) stages.push_back(std::make_unique<Shell>(sh));
  for (size_t i = 0; i + 1 < count; ++i) {
    auto [in, out] = MakePipe();
    stages[i]->out = std::move(out);
    stages[i + 1]->in = std::move(in);
  }
  std::vector<int> status(count, 0);
  auto run = [&](size_t i) {
    RunNode(*stages[i], *n.kids[i]);
    status[i] = stages[i]->status;
    stages[i].reset();  // its pipe ends close: EOF downstream, EPIPE upstream
  };
  std::vector<std::thread> threads;
  for (size_t i = 0; i + 1 < count; ++i)
    threads.emplace_back([&, i, ctl = sh.ctl] {
      uint64_t cpu0 = ThreadCpuUs();
      run(i);
      ctl->AddCpuUs(ThreadCpuUs() - cpu0);
    });
  run(count - 1);
  for (auto& t : threads) t.join();
  int last = status.back();
  return n.negate ? (last == 0 ? 1 : 0) : last;
}

}  // namespace

// --- running trees -------------------------------------------------------------------

int RunNode(Shell& sh, const Node& n) {
  if (!sh.Go()) return sh.status;
  switch (n.kind) {
    case Node::kSimple:
      return RunSimple(sh, n);
    case Node::kList:
      for (size_t i = 0; i < n.kids.size() && sh.Go(); ++i) {
        if (n.flags[i]) {
          StartJob(sh, n.kids[i]);
          sh.status = 0;
        } else {
          RunNode(sh, *n.kids[i]);
        }
      }
      return sh.status;
    case Node::kAndOr:
      RunNode(sh, *n.kids[0]);
      for (size_t i = 1; i < n.kids.size() && sh.Go(); ++i)
        if ((n.flags[i - 1] == 1) == (sh.status == 0)) RunNode(sh, *n.kids[i]);
      return sh.status;
    case Node::kPipeline:
      if (n.kids.size() == 1) {
        RunNode(sh, *n.kids[0]);
        if (n.negate) sh.status = sh.status == 0 ? 1 : 0;
      } else {
        sh.status = RunPipeline(sh, n);
      }
      return sh.status;
    case Node::kSubshell: {
      Shell sub(sh);
      if (Redirect(sub, n.redirs)) RunNode(sub, *n.kids[0]);
      return sh.status = sub.status;
    }
    default:
      break;
  }
  // The compound commands that run in this shell, with their redirections.
  SavedIo saved(sh);
  if (!Redirect(sh, n.redirs)) return sh.status;
  int status = 0;
  if (n.kind == Node::kGroup) {
    status = RunNode(sh, *n.kids[0]);
  } else if (n.kind == Node::kIf) {
    size_t i = 0;
    for (; i + 1 < n.kids.size(); i += 2) {
      RunNode(sh, *n.kids[i]);
      if (!sh.Go()) return sh.status;
      if (sh.status == 0) break;
    }
    if (i + 1 < n.kids.size())
      status = RunNode(sh, *n.kids[i + 1]);
    else if (i < n.kids.size())
      status = RunNode(sh, *n.kids[i]);
  } else if (n.kind == Node::kWhile || n.kind == Node::kUntil) {
    ++sh.loops;
    for (;;) {
      RunNode(sh, *n.kids[0]);
      if (!sh.Go()) {
        if (!LoopGoesOn(sh)) break;
        continue;
      }
      if ((sh.status == 0) == (n.kind == Node::kUntil)) break;
      status = RunNode(sh, *n.kids[1]);
      if (!LoopGoesOn(sh)) break;
    }
    --sh.loops;
  } else if (n.kind == Node::kFor) {
    std::vector<std::string> items;
    if (!n.has_items) items.assign(sh.args.size() > 1 ? sh.args.begin() + 1 : sh.args.end(), sh.args.end());
    for (const auto& w : n.items)
      if (!Expand(sh, w, &items, true)) return sh.status;
    ++sh.loops;
    for (const auto& item : items) {
      if (!sh.SetVar(n.var, item)) break;
      status = RunNode(sh, *n.kids[0]);
      if (!LoopGoesOn(sh)) break;
    }
    --sh.loops;
  }
  if (!sh.exiting) sh.status = status;
  return sh.status;
}

int RunScript(Shell& sh, const std::string& script, const std::string& name) {
  auto tree = Parse(script);
  if (!tree.ok()) {
    (void)sh.Err(name + ": " + tree.status().message() + "\n");
    return sh.status = 2;
  }
  RunNode(sh, **tree);
  return sh.status;
}

}  // namespace dsec::drivers::fakesh

namespace dsec::drivers {

using fakesh::Shell;

FakeResult RunFakeExec(FakeBox& box, const FakeExec& exec, const std::shared_ptr<FakeRunControl>& ctl) {
  FakeResult res;
  auto start = std::chrono::steady_clock::now();
  uint64_t cpu0 = fakesh::ThreadCpuUs();
  if (exec.timeout_ms) ctl->set_deadline(start + std::chrono::milliseconds(exec.timeout_ms));
  ctl->set_memory_limit(exec.memory_bytes);
  box.AddLog(exec.argv);
  auto sink = fakesh::MakeSink(ctl, exec.output_bytes, exec.on_output);
  int status = 0;
  {
    Shell sh;
    sh.box = &box;
    sh.ctl = ctl;
    sh.info = std::make_shared<fakesh::RunInfo>();
    sh.info->file_size_bytes = exec.file_size_bytes;
    sh.info->command = fakesh::Join(exec.argv);
    for (const auto& [k, v] : exec.env) {
      sh.vars[k] = v;
      sh.exported.insert(k);
    }
    sh.cwd = FakeJoinPath("/", exec.cwd.empty() ? "/" : exec.cwd);
    sh.in = fakesh::StringReader(exec.stdin_data);
    sh.out = fakesh::SinkWriter(sink, false);
    sh.err = fakesh::SinkWriter(sink, true);
    const std::string name = exec.argv.empty() ? "" : exec.argv[0];
    int err = 0;
    FakeNodePtr cwd, prog;
    {
      auto lk = box.Lock();
      cwd = box.fs().Find(sh.cwd, &err);
      if (cwd && !cwd->is_dir()) err = ENOTDIR;
      int perr = 0;
      if (name.find('/') != std::string::npos) prog = box.fs().Find(sh.Path(name), &perr);
    }
    bool script = prog && prog->is_reg() && (prog->mode & 0111) && prog->data.compare(0, 2, "#!") == 0;
    if (err) {
      res.ending = FakeResult::Ending::kBadCwd;
      res.detail = "exec: cannot enter the working directory '" + exec.cwd + "': " + fakesh::ErrnoText(err);
    } else if (!fakesh::FindTool(name) && !script) {
      res.ending = prog ? FakeResult::Ending::kNotExecutable : FakeResult::Ending::kNotFound;
    } else {
      status = fakesh::RunCommand(sh, exec.argv) & 0xff;
    }
  }
  fakesh::CloseSink(*sink, &res);
  if (!box.Sync().ok()) {
    // Reported by the driver, which syncs again after the run.
  }
  res.exit_code = status;
  switch (ctl->why()) {
    case FakeStop::kNone:
      break;
    case FakeStop::kKilled:
      res.ending = FakeResult::Ending::kKilled;
      break;
    case FakeStop::kTimedOut:
      res.ending = FakeResult::Ending::kTimedOut;
      break;
    case FakeStop::kOutputLimit:
      res.ending = FakeResult::Ending::kOutputLimit;
      break;
    case FakeStop::kMemoryLimit:
      res.ending = FakeResult::Ending::kMemoryLimit;
      break;
    case FakeStop::kPlatform:
      res.ending = FakeResult::Ending::kPlatform;
      break;
  }
  if (ctl->why() != FakeStop::kNone) {
    res.signal = SIGKILL;
    res.exit_code = 0;
    res.detail = ctl->detail();
  }
  res.wall_us = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count());
  res.cpu_us = fakesh::ThreadCpuUs() - cpu0 + ctl->cpu_us();
  res.peak_memory_bytes = ctl->peak_memory();
  return res;
}

}  // namespace dsec::drivers
