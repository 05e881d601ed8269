#!/usr/bin/env bash
# The house rules a compiler does not check (docs/style.md), over the tree:
#   1. the rooms: base/ uses no other room; runtime/, state/, wire/ and
#      drivers/ include nothing of sdk/ (the client library's headers);
#   2. sizes: product sources (outside tests/ and perf/) at most 700 lines,
#      headers at most 300 (generated code is not in the tree);
#   3. clang-tidy (.clang-tidy's checks, warnings as errors) over the C++
#      sources the change touches: those changed in the working tree and
#      those of the commits since $DSEC_LINT_BASE (default HEAD~1, the
#      commit under test); DSEC_LINT_ALL=1 checks every source.
# Usage: lint_test.sh SOURCE_DIR BUILD_DIR (BUILD_DIR holds compile_commands.json).
# Exit 0 when the tree keeps them; 1, saying where, when not; 77 (skipped)
# when a tool it needs is missing, naming it.
set -uo pipefail
src=${1:?source dir}
build=${2:?build dir}
cd "$src" || exit 1
fail=0
say() { printf 'lint: %s\n' "$*"; }

if ! git rev-parse --git-dir >/dev/null 2>&1; then
  say "skipped: $src is not a git checkout (the rules read the tracked files)"
  exit 77
fi

# 1. Rooms.
bad=$(git grep -n -E '#include "(dsec/client\.hpp|sdk/)' -- runtime state wire drivers base || true)
if [ -n "$bad" ]; then
  say "runtime/, state/, wire/, drivers/ and base/ must not include the SDK's headers:"; echo "$bad"; fail=1
fi
bad=$(git grep -n -E '#include "(runtime|state|wire|drivers|actors|sdk|tools|harness)/' -- base || true)
if [ -n "$bad" ]; then
  say "base/ is the bottom room: it includes no other room's headers:"; echo "$bad"; fail=1
fi

# 2. Sizes.
while read -r f; do
  n=$(wc -l < "$f")
  case "$f" in *.hpp|*.h) lim=300 ;; *) lim=700 ;; esac
  if [ "$n" -gt "$lim" ]; then say "$f has $n lines (at most $lim): split it by concern"; fail=1; fi
done < <(git ls-files '*.cpp' '*.cc' '*.hpp' '*.h' | grep -Ev '^(tests|perf)/')

# 3. clang-tidy over the changed sources.
if ! command -v clang-tidy >/dev/null 2>&1; then
  say "skipped clang-tidy: not installed (apt-get install clang-tidy; scripts/dev installs it)"
  [ "$fail" -eq 0 ] && exit 77 || exit 1
fi
if [ ! -f "$build/compile_commands.json" ]; then
  say "no $build/compile_commands.json (configure with CMAKE_EXPORT_COMPILE_COMMANDS=ON)"; exit 1
fi
if [ "${DSEC_LINT_ALL:-0}" = 1 ]; then
  files=$(git ls-files '*.cpp')
else
  base=${DSEC_LINT_BASE:-HEAD~1}
  git rev-parse -q --verify "$base^{commit}" >/dev/null || base=$(git rev-list --max-parents=0 HEAD | tail -n 1)
  files=$( (git diff --name-only "$base" HEAD; git diff --name-only HEAD; git ls-files --others --exclude-standard) |
          sort -u | grep -E '\.cpp$' || true)
fi
# Only what the build compiles (compile_commands.json), outside tests/ and perf/.
checked=()
for f in $files; do
  [ -f "$f" ] || continue
  case "$f" in tests/*|perf/*) continue ;; esac
  grep -q "\"file\": \"$src/$f\"" "$build/compile_commands.json" || grep -q "$src/$f\"" "$build/compile_commands.json" || continue
  checked+=("$src/$f")
done
say "clang-tidy over ${#checked[@]} changed source(s)"
if [ ${#checked[@]} -gt 0 ]; then
  if ! printf '%s\n' "${checked[@]}" | xargs -P 2 -n 1 clang-tidy -p "$build" --quiet 2>/dev/null |
       grep -E 'error:|warning:' | sort -u > "$build/lint-tidy.txt"; then :; fi
  if [ -s "$build/lint-tidy.txt" ]; then
    say "clang-tidy found (checks in .clang-tidy):"; cat "$build/lint-tidy.txt"; fail=1
  fi
fi
[ "$fail" -eq 0 ] && say "the tree keeps the house rules"
exit "$fail"
