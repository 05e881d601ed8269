// The path globs of a task spec's protected and hidden paths (DESIGN.md
// section 13): `tests/**`, `**/conftest.py`, `pytest.ini`, `.git/**`.
//
// A glob is matched against a path relative to the task's root, segment by
// segment ('/' separates them):
//   **      a whole segment: any number of segments, none included, so
//           `tests/**` is `tests` itself and everything under it
//   *  ?    within one segment: any run of characters, one character
//   [abc]   one character of a class (`[!a]`, `[a-z]` as fnmatch(3))
// `*` and `?` match a leading dot too (`tests/*` takes `tests/.x`: a
// protected tree has no hidden corner). A glob is refused (InvalidArgument,
// naming it and why) when it is empty, absolute, has an empty, `.` or
// `..` segment, a `**` inside a segment, an unclosed `[`, or is longer
// than kMaxGlobBytes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "dsec/status.hpp"

namespace dsec::guard {

inline constexpr size_t kMaxGlobBytes = 512;
inline constexpr size_t kMaxGlobs = 256;  // in one list

class PathGlob {
 public:
  static Result<PathGlob> Parse(std::string_view text);
  // Whether relative path `path` ("a/b/c", no leading '/') matches.
  bool Matches(std::string_view path) const;
  // Whether some path under directory `dir` could match (a listing of
  // `dir` would show one): `tests/**` and `**/x` reach under any dir they
  // could lead into.
  bool MayMatchUnder(std::string_view dir) const;
  const std::string& text() const { return text_; }

 private:
  std::string text_;
  std::vector<std::string> segs_;
};

// A list of globs (each checked; the list bounded): the first error names
// the entry.
Result<std::vector<PathGlob>> ParseGlobs(const std::vector<std::string>& texts, const std::string& what);
// The first glob of `globs` matching `path`, or nullptr.
const PathGlob* FirstMatch(const std::vector<PathGlob>& globs, std::string_view path);

}  // namespace dsec::guard
