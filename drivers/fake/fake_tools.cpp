// The fake shell's text tools: cat head tail wc tr sort grep seq yes, over
// stdin, pipes and the box's files. Each takes the options tests and
// agents use most and says plainly when given one it lacks; messages are
// coreutils'.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <regex>

#include "drivers/fake/fake_shell_internal.hpp"

namespace dsec::drivers::fakesh {

namespace {
constexpr size_t kChunk = 64 << 10;

bool ParseCount(const std::string& s, long long* v) {
  char* end = nullptr;
  *v = std::strtoll(s.c_str(), &end, 10);
  return !s.empty() && *end == '\0' && *v >= 0;
}

// The inputs of a tool that reads files or stdin ("-", or none given).
// Calls `each` with the reader and the name; a file that cannot be opened
// is reported and makes the status 1. False when `each` says stop.
bool ForInputs(Shell& sh, const std::string& tool, std::vector<std::string> files, int* status,
               const std::function<bool(const ReaderPtr&, const std::string&)>& each) {
  if (files.empty()) files.push_back("-");
  for (const auto& f : files) {
    int err = 0;
    ReaderPtr r = f == "-" ? sh.in : OpenRead(sh, sh.Path(f), &err);
    if (!r) {
      *status = Complain(sh, tool + ": " + f + ": " + ErrnoText(err), 1);
      continue;
    }
    if (!each(r, f)) return false;
  }
  return true;
}

int Cat(Shell& sh, const std::vector<std::string>& a) {
  std::vector<std::string> files;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i].size() > 1 && a[i][0] == '-') return BadOption(sh, "cat", a[i]);
    files.push_back(a[i]);
  }
  int status = 0;
  if (!ForInputs(sh, "cat", files, &status, [&](const ReaderPtr& r, const std::string&) { return Pump(sh, r); }))
    return 1;
  return status;
}

// -n N, -nN, -N, -c N, -cN (tail: also +N, from the Nth on).
bool CountOption(const std::vector<std::string>& a, long long* n, bool* bytes, bool* from,
                 std::vector<std::string>* files, std::string* bad) {
  for (size_t i = 1; i < a.size(); ++i) {
    std::string s = a[i];
    if (s.size() < 2 || s[0] != '-') {
      files->push_back(s);
      continue;
    }
    std::string v;
    if (s[1] == 'n' || s[1] == 'c') {
      *bytes = s[1] == 'c';
      v = s.size() > 2 ? s.substr(2) : i + 1 < a.size() ? a[++i] : "";
    } else {
      v = s.substr(1);
    }
    if (!v.empty() && v[0] == '+') *from = true, v = v.substr(1);
    if (!ParseCount(v, n)) return *bad = s, false;
  }
  return true;
}

int Head(Shell& sh, const std::vector<std::string>& a) {
  long long n = 10;
  bool bytes = false, from = false;
  std::vector<std::string> files;
  std::string bad;
  if (!CountOption(a, &n, &bytes, &from, &files, &bad) || from)
    return Complain(sh, "head: invalid number of lines: '" + bad + "'", 1);
  int status = 0;
  bool ok = ForInputs(sh, "head", files, &status, [&](const ReaderPtr& r, const std::string& name) {
    if (files.size() > 1 && !sh.Out((name == files[0] ? "" : "\n") + std::string("==> ") + name + " <==\n"))
      return false;
    long long left = n;
    std::string buf;
    while (left > 0) {
      buf.clear();
      long got = sh.Get(r, &buf, bytes ? std::min<size_t>(kChunk, static_cast<size_t>(left)) : kChunk);
      if (got <= 0) return got == 0;
      size_t take = buf.size();
      if (bytes) {
        left -= got;
      } else {
        for (size_t i = 0; i < buf.size(); ++i)
          if (buf[i] == '\n' && --left == 0) {
            take = i + 1;
            break;
          }
      }
      if (!sh.Out(std::string_view(buf).substr(0, take))) return false;
    }
    return true;
  });
  return ok ? status : 1;
}

// Buffers its whole input (charged to the run's memory), then prints the end.
int Tail(Shell& sh, const std::vector<std::string>& a) {
  long long n = 10;
  bool bytes = false, from = false;
  std::vector<std::string> files;
  std::string bad;
  if (!CountOption(a, &n, &bytes, &from, &files, &bad))
    return Complain(sh, "tail: invalid number of lines: '" + bad + "'", 1);
  int status = 0;
  bool ok = ForInputs(sh, "tail", files, &status, [&](const ReaderPtr& r, const std::string& name) {
    std::string all;
    bool read = ReadAll(sh, r, &all);
    size_t start = 0;
    if (bytes) {
      start = from ? std::min<size_t>(all.size(), n > 0 ? static_cast<size_t>(n - 1) : 0)
                   : all.size() - std::min<size_t>(all.size(), static_cast<size_t>(n));
    } else if (from) {
      for (long long line = 1; line < n && start < all.size(); ++line) {
        size_t nl = all.find('\n', start);
        start = nl == std::string::npos ? all.size() : nl + 1;
      }
    } else {
      start = all.size();
      size_t end = all.size() - (!all.empty() && all.back() == '\n' ? 1 : 0);
      for (long long line = 0; line < n && start > 0; ++line) {
        size_t nl = end == 0 ? std::string::npos : all.rfind('\n', end - 1);
        start = nl == std::string::npos ? 0 : nl + 1;
        end = start == 0 ? 0 : start - 1;
      }
    }
    bool wrote = read &&
                 (files.size() < 2 || sh.Out((name == files[0] ? "" : "\n") + std::string("==> ") + name + " <==\n")) &&
                 sh.Out(std::string_view(all).substr(start));
    sh.ctl->Charge(-static_cast<int64_t>(all.size()));
    return wrote;
  });
  return ok ? status : 1;
}

int Wc(Shell& sh, const std::vector<std::string>& a) {
  bool l = false, w = false, c = false;
  std::vector<std::string> files;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i].size() > 1 && a[i][0] == '-') {
      for (char f : a[i].substr(1)) {
        if (f == 'l')
          l = true;
        else if (f == 'w')
          w = true;
        else if (f == 'c' || f == 'm')
          c = true;
        else
          return BadOption(sh, "wc", a[i]);
      }
    } else {
      files.push_back(a[i]);
    }
  }
  if (!l && !w && !c) l = w = c = true;
  struct Counts {
    uint64_t lines = 0, words = 0, bytes = 0;
    std::string name;
  };
  std::vector<Counts> rows;
  int status = 0;
  bool ok = ForInputs(sh, "wc", files, &status, [&](const ReaderPtr& r, const std::string& name) {
    Counts k;
    k.name = files.empty() ? "" : name;
    bool in_word = false;
    std::string buf;
    for (;;) {
      buf.clear();
      long got = sh.Get(r, &buf, kChunk);
      if (got < 0) return false;
      if (got == 0) break;
      k.bytes += buf.size();
      for (char ch : buf) {
        bool blank = ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
        if (ch == '\n') ++k.lines;
        if (!blank && !in_word) ++k.words;
        in_word = !blank;
      }
    }
    rows.push_back(k);
    return true;
  });
  if (!ok) return 1;
  if (rows.size() > 1) {
    Counts t;
    t.name = "total";
    for (const auto& k : rows) t.lines += k.lines, t.words += k.words, t.bytes += k.bytes;
    rows.push_back(t);
  }
  // coreutils' widths: one number alone unpadded; stdin at least 7; else the digits of the bytes.
  size_t width = 1;
  if ((l + w + c) > 1 || rows.size() > 1) {
    if (files.empty())
      width = 7;
    else
      for (uint64_t v = rows.back().bytes; v >= 10; v /= 10) ++width;
  }
  std::string out;
  for (const auto& k : rows) {
    std::string line;
    for (auto [on, v] : {std::pair{l, k.lines}, std::pair{w, k.words}, std::pair{c, k.bytes}}) {
      if (!on) continue;
      std::string num = std::to_string(v);
      if (!line.empty()) line += ' ';
      line += std::string(num.size() < width ? width - num.size() : 0, ' ') + num;
    }
    out += line + (k.name.empty() ? "" : " " + k.name) + "\n";
  }
  return sh.Out(out) ? status : 1;
}

// tr's sets: ranges (a-z), classes ([:upper:]) and escapes (\n \t \\ \0 \NNN).
std::string TrSet(const std::string& s) {
  std::string chars;
  for (size_t i = 0; i < s.size(); ++i) {
    static const std::pair<const char*, int (*)(int)> kClasses[] = {{"[:upper:]", isupper}, {"[:lower:]", islower},
                                                                    {"[:digit:]", isdigit}, {"[:alpha:]", isalpha},
                                                                    {"[:alnum:]", isalnum}, {"[:space:]", isspace}};
    bool cls = false;
    for (const auto& [name, fn] : kClasses)
      if (s.compare(i, std::strlen(name), name) == 0) {
        for (int ch = 0; ch < 256; ++ch)
          if (fn(ch)) chars.push_back(static_cast<char>(ch));
        i += std::strlen(name) - 1;
        cls = true;
      }
    if (cls) continue;
    char c = s[i];
    if (c == '\\' && i + 1 < s.size()) {
      char e = s[++i];
      if (e >= '0' && e <= '7') {
        int v = 0;
        for (int k = 0; k < 3 && i < s.size() && s[i] >= '0' && s[i] <= '7'; ++k, ++i) v = v * 8 + (s[i] - '0');
        --i;
        c = static_cast<char>(v);
      } else {
        c = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
      }
    }
    if (i + 2 < s.size() && s[i + 1] == '-') {
      unsigned char hi = static_cast<unsigned char>(s[i + 2]);
      for (int ch = static_cast<unsigned char>(c); ch <= hi; ++ch) chars.push_back(static_cast<char>(ch));
      i += 2;
      continue;
    }
    chars.push_back(c);
  }
  return chars;
}

int Tr(Shell& sh, const std::vector<std::string>& a) {
  bool del = false;
  size_t i = 1;
  for (; i < a.size() && a[i].size() > 1 && a[i][0] == '-'; ++i) {
    if (a[i] != "-d") return BadOption(sh, "tr", a[i]);
    del = true;
  }
  size_t want = del ? 1 : 2;
  if (a.size() - i < want)
    return Complain(sh, a.size() == i ? "tr: missing operand" : "tr: missing operand after '" + a[i] + "'", 1);
  if (a.size() - i > want) return Complain(sh, "tr: extra operand '" + a[i + want] + "'", 1);
  std::string from = TrSet(a[i]), to = del ? "" : TrSet(a[i + 1]);
  int map[256];
  for (int c = 0; c < 256; ++c) map[c] = c;
  for (size_t k = 0; k < from.size(); ++k)
    map[static_cast<unsigned char>(from[k])] = del ? -1
                                               : to.empty()
                                                   ? static_cast<unsigned char>(from[k])
                                                   : static_cast<unsigned char>(to[std::min(k, to.size() - 1)]);
  std::string buf, out;
  for (;;) {
    buf.clear();
    long got = sh.Get(sh.in, &buf, kChunk);
    if (got < 0) return 1;
    if (got == 0) return 0;
    out.clear();
    for (char ch : buf)
      if (int m = map[static_cast<unsigned char>(ch)]; m >= 0) out.push_back(static_cast<char>(m));
    if (!sh.Out(out)) return 1;
  }
}

int Sort(Shell& sh, const std::vector<std::string>& a) {
  bool rev = false, num = false, uniq = false;
  std::vector<std::string> files;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i].size() > 1 && a[i][0] == '-') {
      for (char f : a[i].substr(1)) {
        if (f == 'r')
          rev = true;
        else if (f == 'n')
          num = true;
        else if (f == 'u')
          uniq = true;
        else
          return BadOption(sh, "sort", a[i]);
      }
    } else {
      files.push_back(a[i]);
    }
  }
  std::string all;
  int status = 0;
  if (!ForInputs(sh, "sort", files, &status, [&](const ReaderPtr& r, const std::string&) {
        bool ok = ReadAll(sh, r, &all);
        if (!all.empty() && all.back() != '\n') all.push_back('\n');
        return ok;
      })) {
    sh.ctl->Charge(-static_cast<int64_t>(all.size()));
    return 1;
  }
  std::vector<std::string> lines;
  for (size_t p = 0; p < all.size();) {
    size_t nl = all.find('\n', p);
    lines.push_back(all.substr(p, nl - p));
    p = nl + 1;
  }
  auto less = [&](const std::string& x, const std::string& y) {
    if (num) {
      double dx = std::atof(x.c_str()), dy = std::atof(y.c_str());
      if (dx != dy) return dx < dy;
    }
    return x < y;
  };
  std::stable_sort(lines.begin(), lines.end(), less);
  if (rev) std::reverse(lines.begin(), lines.end());
  if (uniq) lines.erase(std::unique(lines.begin(), lines.end()), lines.end());
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  bool wrote = sh.Out(out);
  sh.ctl->Charge(-static_cast<int64_t>(all.size()));
  return wrote ? status : 1;
}

// grep [-qvciFEx] PATTERN [FILE...]: line by line.
int Grep(Shell& sh, const std::vector<std::string>& a) {
  bool quiet = false, invert = false, count = false, icase = false, fixed = false, ext = false, whole = false;
  std::vector<std::string> rest;
  bool options = true;
  for (size_t i = 1; i < a.size(); ++i) {
    if (options && a[i] == "--") {
      options = false;
    } else if (options && a[i].size() > 1 && a[i][0] == '-' && rest.empty()) {
      for (char f : a[i].substr(1)) {
        if (f == 'q')
          quiet = true;
        else if (f == 'v')
          invert = true;
        else if (f == 'c')
          count = true;
        else if (f == 'i')
          icase = true;
        else if (f == 'F')
          fixed = true;
        else if (f == 'E')
          ext = true;
        else if (f == 'x')
          whole = true;
        else
          return Complain(sh, "grep: option -" + std::string(1, f) + " is not supported by the fake shell", 2);
      }
    } else {
      rest.push_back(a[i]);
    }
  }
  if (rest.empty()) return Complain(sh, "Usage: grep [OPTION]... PATTERNS [FILE]...", 2);
  std::string pat = rest[0];
  std::vector<std::string> files(rest.begin() + 1, rest.end());
  std::regex re;
  // std::regex reports a bad pattern (and a match too deep for it) by
  // throwing: caught here, said as grep says it.
  try {
    if (!fixed) {
      auto flags = ext ? std::regex::extended : std::regex::basic;
      if (icase) flags |= std::regex::icase;
      re.assign(!whole ? pat : ext ? "^(" + pat + ")$" : "^\\(" + pat + "\\)$", flags);
    }
  } catch (const std::regex_error&) {
    return Complain(sh, "grep: invalid regular expression '" + pat + "'", 2);
  }
  bool regex_failed = false;
  auto match = [&](const std::string& line) {
    if (fixed) return whole ? line == pat : line.find(pat) != std::string::npos;
    try {
      return std::regex_search(line, re);
    } catch (const std::regex_error&) {
      regex_failed = true;
      return false;
    }
  };
  bool any = false;
  int status = 0;
  bool ok = ForInputs(sh, "grep", files, &status, [&](const ReaderPtr& r, const std::string& name) {
    std::string buf, line, out;
    uint64_t n = 0;
    bool eof = false;
    while (!eof) {
      buf.clear();
      long got = sh.Get(r, &buf, kChunk);
      if (got < 0) return false;
      eof = got == 0;
      if (eof && !line.empty()) buf = "\n";
      for (char ch : buf) {
        if (ch != '\n') {
          line.push_back(ch);
          continue;
        }
        if (match(line) != invert) {
          any = true;
          ++n;
          if (quiet) return false;
          if (!count) out += (files.size() > 1 ? name + ":" : "") + line + "\n";
        }
        line.clear();
      }
      if (!out.empty() && !sh.Out(out)) return false;
      out.clear();
    }
    return !count || sh.Out((files.size() > 1 ? name + ":" : "") + std::to_string(n) + "\n");
  });
  if (regex_failed) return Complain(sh, "grep: the pattern is too complex for a line of the input", 2);
  if (!ok && !(quiet && any)) return 2;
  return status ? 2 : any ? 0 : 1;
}

int Seq(Shell& sh, const std::vector<std::string>& a) {
  std::vector<long long> v;
  for (size_t i = 1; i < a.size(); ++i) {
    char* end = nullptr;
    v.push_back(std::strtoll(a[i].c_str(), &end, 10));
    if (a[i].empty() || *end) return Complain(sh, "seq: invalid argument: '" + a[i] + "'", 1);
  }
  if (v.empty() || v.size() > 3) return Complain(sh, "seq: missing operand", 1);
  long long first = v.size() > 1 ? v[0] : 1, step = v.size() == 3 ? v[1] : 1, last = v.back();
  if (step == 0) return Complain(sh, "seq: invalid Zero increment value: '0'", 1);
  std::string out;
  for (long long x = first; step > 0 ? x <= last : x >= last; x += step) {
    out += std::to_string(x) + "\n";
    if (out.size() >= kChunk) {
      if (!sh.Out(out)) return 1;
      out.clear();
    }
  }
  return sh.Out(out) ? 0 : 1;
}

int Yes(Shell& sh, const std::vector<std::string>& a) {
  std::string line;
  for (size_t i = 1; i < a.size(); ++i) line += (i > 1 ? " " : "") + a[i];
  line = (a.size() > 1 ? line : "y") + "\n";
  std::string chunk;
  while (chunk.size() < 8192) chunk += line;
  for (;;)
    if (!sh.Out(chunk)) return 1;
}

}  // namespace

const std::map<std::string, Tool>& TextTools() {
  static const std::map<std::string, Tool> tools = {{"cat", Cat},   {"head", Head}, {"tail", Tail},
                                                    {"wc", Wc},     {"tr", Tr},     {"sort", Sort},
                                                    {"grep", Grep}, {"seq", Seq},   {"yes", Yes}};
  return tools;
}

}  // namespace dsec::drivers::fakesh
