// Inside the fake shell: the syntax tree the parser makes
// (fake_shell_parse.cpp), the streams a command reads and writes, the state
// of one shell (a subshell, a pipeline stage and a background job each
// have a copy of their own), and the tools (fake_builtins.cpp,
// fake_tools.cpp, fake_file_tools.cpp) that the interpreter
// (fake_shell.cpp, fake_streams.cpp) runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "drivers/fake/fake_box.hpp"
#include "drivers/fake/fake_shell.hpp"
#include "dsec/status.hpp"

namespace dsec::drivers::fakesh {

struct Node;
using NodePtr = std::shared_ptr<const Node>;

// A piece of a word: literal text, or an expansion done when it runs.
struct WordPart {
  enum Kind { kLit, kParam, kCmd, kArith };
  Kind kind = kLit;
  bool quoted = false;  // inside quotes: no field splitting, "" still a field
  std::string text;     // the literal, the parameter's name, the arithmetic expression
  // ${NAME:-alt} (colon: also when empty) and ${#NAME}.
  bool has_alt = false;
  bool alt_if_empty = false;
  bool length = false;
  std::string alt;  // raw; expanded as a double-quoted word when used
  NodePtr cmd;      // $(...) and `...`
};

struct Word {
  std::vector<WordPart> parts;
  // The text of a word that is one unquoted literal (reserved words, NAME=).
  bool Plain(std::string* text = nullptr) const;
};

struct Redir {
  enum Op { kIn, kOut, kAppend, kDup };  // kDup: N>&M, N<&M
  int fd = 1;
  Op op = kOut;
  Word target;
};

struct Node {
  enum Kind { kSimple, kPipeline, kAndOr, kList, kSubshell, kGroup, kIf, kWhile, kUntil, kFor };
  Kind kind = kSimple;
  std::vector<std::pair<std::string, Word>> assigns;  // kSimple: NAME=VALUE before the command
  std::vector<Word> words;                            // kSimple: the command and its arguments
  std::vector<Redir> redirs;                          // kSimple and the compound commands
  // kPipeline: stages; kAndOr: pipelines; kList: and-or lists; kSubshell,
  // kGroup: the body; kIf: cond, then, [cond, then]..., [else]; kWhile,
  // kUntil: cond, body; kFor: body.
  std::vector<NodePtr> kids;
  std::vector<int> flags;  // kAndOr: 1 && / 2 || before kids[i+1]; kList: 1 when run with &
  bool negate = false;     // kPipeline: ! before it
  std::string var;         // kFor
  bool has_items = false;  // kFor: `in WORDS` given (else "$@")
  std::vector<Word> items;
};

// A script's tree, or "syntax error: ..." (InvalidArgument).
Result<NodePtr> Parse(const std::string& script);
// A string as the inside of double quotes (for ${NAME:-alt}).
Result<Word> ParseQuotedText(const std::string& text);
// $((expr)): C integer arithmetic over names and $params (`value` gives
// their text). False with `err` said the way dash says it.
bool EvalArith(const std::string& expr, const std::function<std::string(const std::string&)>& value, int64_t* out,
               std::string* err);

struct Shell;

// Streams. Read: bytes appended to *out (at most `max`), 0 at the end, -1
// when the run stopped. Write: 0, an errno (EPIPE: no reader any more;
// ENOSPC, EFBIG: the file), or -1 when the run stopped. Both block the way
// pipes do, honouring stops, deadlines and pauses.
class Reader {
 public:
  virtual ~Reader() = default;
  virtual long Read(Shell& sh, std::string* out, size_t max) = 0;
  virtual void Close() {}
};
class Writer {
 public:
  virtual ~Writer() = default;
  virtual int Write(Shell& sh, std::string_view data) = 0;
  virtual void Close() {}
};
using ReaderPtr = std::shared_ptr<Reader>;
using WriterPtr = std::shared_ptr<Writer>;

ReaderPtr StringReader(std::string data);
ReaderPtr NullReader();
WriterPtr NullWriter();
// A bounded pipe between two stages: {read end, write end}.
std::pair<ReaderPtr, WriterPtr> MakePipe();
// The exec's stdout and stderr, shared by every shell of the exec: capped
// per stream (`cap`, 0: 1 MiB), kept or given to `stream` as written; past
// the cap the process group `group` (the exec, its jobs) is stopped.
class Sink;
std::shared_ptr<Sink> MakeSink(std::shared_ptr<FakeRunControl> group, uint64_t cap,
                               std::function<void(bool is_stderr, const std::string&)> stream);
WriterPtr SinkWriter(const std::shared_ptr<Sink>& sink, bool is_err);
// The exec was answered: later writes (a job's) fail with EPIPE; what was
// kept, and whether a stream was cut, go to `r`.
void CloseSink(Sink& sink, FakeResult* r);
// What a $(...) writes, charged to the run's memory while it is held.
class Capture : public Writer {
 public:
  ~Capture() override;
  int Write(Shell& sh, std::string_view data) override;
  std::string Take();

 private:
  std::shared_ptr<FakeRunControl> ctl_;
  std::string buf_;
};

// What every shell of one exec shares.
struct RunInfo {
  uint64_t file_size_bytes = 0;
  std::string command;             // the exec's argv joined: what a background job's shell shows as running
  std::atomic<int> next_pid{100};  // $! of background jobs: numbered, deterministic
};

// One shell's state. Copying it makes a subshell (charges stay with the
// original; jobs to `wait` for are the copy's own).
struct Shell {
  Shell() = default;
  Shell(const Shell& other);
  Shell& operator=(const Shell&) = delete;
  ~Shell();

  FakeBox* box = nullptr;
  std::shared_ptr<FakeRunControl> ctl;
  std::shared_ptr<RunInfo> info;
  std::map<std::string, std::string> vars;
  std::set<std::string> exported;
  std::vector<std::string> args;  // $0 $1 ...
  std::string cwd = "/";
  int status = 0;        // $?
  int last_pid = 0;      // $!
  bool exiting = false;  // `exit`, a fatal error, or SIGPIPE: unwind to the shell's end
  bool sigpipe = false;  // a write found no reader: this shell dies with 141
  int breaks = 0;        // `break N` / `continue N` still to unwind
  bool continuing = false;
  int loops = 0;        // loops we are in
  int write_errno = 0;  // a tool's failed write (not EPIPE), reported once it returns
  ReaderPtr in;
  WriterPtr out, err;
  std::vector<std::pair<int, std::shared_ptr<FakeRunControl>>> jobs;  // $! and its control, for `wait`
  int subst_status = -1;  // of the last $(...) in the command being expanded; -1: none
  int64_t charged = 0;    // bytes of variables charged to ctl

  // The checkpoint: false when the run stopped (waits while paused).
  bool Check();
  // Check, and nothing asks this shell to unwind (exit, break).
  bool Go() { return !exiting && breaks == 0 && !continuing && Check(); }
  std::string Var(const std::string& name) const;
  bool SetVar(const std::string& name, const std::string& value);
  void Unset(const std::string& name);
  // Writes; false when it failed (EPIPE ends this shell with status 141).
  bool Put(const WriterPtr& w, std::string_view data);
  bool Out(std::string_view data) { return Put(out, data); }
  bool Err(std::string_view data) { return Put(err, data); }
  long Get(const ReaderPtr& r, std::string* out, size_t max) { return r->Read(*this, out, max); }
  // The box's files, for a program: waits while the box is paused.
  std::unique_lock<std::mutex> Lock() const { return box->LockRunnable(*ctl); }
  // A path as this shell names it.
  std::string Path(const std::string& p) const { return FakeJoinPath(cwd, p); }
  // The exported variables: a program's environment.
  std::map<std::string, std::string> Environ() const;
};

// Opens `path` for reading (/dev/null, /dev/zero, files): null with errno.
ReaderPtr OpenRead(Shell& sh, const std::string& path, int* err);
// Opens for writing (append: >>). null with errno.
WriterPtr OpenWrite(Shell& sh, const std::string& path, bool append, int* err);

// A tool: its exit status. args[0] is its name.
using Tool = int (*)(Shell& sh, const std::vector<std::string>& args);
// A tool by its name, a bare one or under /bin/ or /usr/bin/; null if none.
Tool FindTool(const std::string& name);
// The text tools (fake_tools.cpp) and the file tools
// (fake_file_tools.cpp); FindTool adds the shell's own.
const std::map<std::string, Tool>& TextTools();
const std::map<std::string, Tool>& FileTools();
// Helpers the tools share: "NAME: MESSAGE\n" on stderr, then `status`.
int Complain(Shell& sh, const std::string& text, int status);
// An option the fake's `tool` lacks: said so, status 1.
int BadOption(Shell& sh, const std::string& tool, const std::string& opt);
// Copies `r` to stdout: false when the run stopped or the write failed.
bool Pump(Shell& sh, const ReaderPtr& r);
// Reads all of `r`, charged to the run's memory (released by the caller
// with ctl->Charge(-size)): false when the run stopped.
bool ReadAll(Shell& sh, const ReaderPtr& r, std::string* out);
// Runs a script (a `sh -c` or a nested `sh`) in `sh`: its status.
int RunScript(Shell& sh, const std::string& script, const std::string& name);
// Runs a parsed tree in `sh`: its status.
int RunNode(Shell& sh, const Node& n);
// Runs argv as one command in `sh` (tool, nested sh, script file): its
// status; 127 not found, 126 not executable, with the shell's message.
int RunCommand(Shell& sh, const std::vector<std::string>& argv);

// "No such file or directory" and friends, as the tools print them.
std::string ErrnoText(int err);

}  // namespace dsec::drivers::fakesh
