#include "drivers/guard/path_glob.hpp"

#include <fnmatch.h>

namespace dsec::guard {

namespace {

std::vector<std::string> Split(std::string_view path) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= path.size()) {
    size_t slash = path.find('/', at);
    if (slash == std::string_view::npos) slash = path.size();
    out.emplace_back(path.substr(at, slash - at));
    at = slash + 1;
  }
  return out;
}

bool SegMatch(const std::string& pat, const std::string& seg) {
  return ::fnmatch(pat.c_str(), seg.c_str(), 0) == 0;
}

// Whether pattern segments match path segments; with `prefix`, whether
// they could once more segments follow the path. A table over (pattern
// segment, path segment): linear in each, whatever the number of `**`
// (a deep path an agent makes costs no more than its length).
bool Match(const std::vector<std::string>& pat, const std::vector<std::string>& path, bool prefix) {
  const size_t P = pat.size(), S = path.size();
  // ok[p][s]: pat[p..] matches path[s..].
  std::vector<std::vector<char>> ok(P + 1, std::vector<char>(S + 1, 0));
  for (size_t s = 0; s <= S; ++s) ok[P][s] = s == S;
  for (size_t p = P; p-- > 0;) {
    for (size_t s = S + 1; s-- > 0;) {
      if (pat[p] == "**") {
        ok[p][s] = ok[p + 1][s] || (s < S ? ok[p][s + 1] : prefix);
      } else if (s == S) {
        ok[p][s] = prefix;
      } else {
        ok[p][s] = SegMatch(pat[p], path[s]) && ok[p + 1][s + 1];
      }
    }
  }
  return ok[0][0];
}

// An unclosed '[' (fnmatch would take it as a literal, silently).
bool ClassesClose(const std::string& seg) {
  for (size_t i = 0; i < seg.size(); ++i) {
    if (seg[i] == '\\') {
      ++i;
      continue;
    }
    if (seg[i] != '[') continue;
    size_t j = i + 1;
    if (j < seg.size() && (seg[j] == '!' || seg[j] == '^')) ++j;
    if (j < seg.size() && seg[j] == ']') ++j;  // a leading ']' is a member
    while (j < seg.size() && seg[j] != ']') ++j;
    if (j >= seg.size()) return false;
    i = j;
  }
  return true;
}

}  // namespace

Result<PathGlob> PathGlob::Parse(std::string_view text) {
  std::string t(text);
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("path glob '" + t + "' " + why);
  };
  if (t.empty()) return Status::InvalidArgument("a path glob is empty (give a path relative to the task's root)");
  if (t.size() > kMaxGlobBytes) return bad("is longer than " + std::to_string(kMaxGlobBytes) + " bytes");
  if (t[0] == '/') return bad("is absolute: give it relative to the task's root (tests/**, not /work/tests/**)");
  PathGlob g;
  g.text_ = t;
  g.segs_ = Split(t);
  for (const auto& s : g.segs_) {
    if (s.empty()) return bad("has an empty segment (a '//' or a trailing '/')");
    if (s == "." || s == "..") return bad("has a '" + s + "' segment");
    if (s != "**" && s.find("**") != std::string::npos)
      return bad("has '**' inside a segment ('" + s + "'): '**' stands alone between slashes");
    if (!ClassesClose(s)) return bad("has an unclosed '[' in '" + s + "'");
    if (s.find('\0') != std::string::npos) return bad("has a NUL byte");
  }
  return g;
}

bool PathGlob::Matches(std::string_view path) const { return Match(segs_, Split(path), false); }

bool PathGlob::MayMatchUnder(std::string_view dir) const {
  if (dir.empty()) return true;
  return Match(segs_, Split(dir), true);
}

Result<std::vector<PathGlob>> ParseGlobs(const std::vector<std::string>& texts, const std::string& what) {
  if (texts.size() > kMaxGlobs)
    return Status::InvalidArgument(what + ": " + std::to_string(texts.size()) + " globs, more than " +
                                   std::to_string(kMaxGlobs));
  std::vector<PathGlob> out;
  for (const auto& t : texts) {
    auto g = PathGlob::Parse(t);
    if (!g.ok()) return g.status().Annotate(what);
    out.push_back(std::move(*g));
  }
  return out;
}

const PathGlob* FirstMatch(const std::vector<PathGlob>& globs, std::string_view path) {
  for (const auto& g : globs)
    if (g.Matches(path)) return &g;
  return nullptr;
}

}  // namespace dsec::guard
