#!/usr/bin/env python3
"""E2B's SDK tests against dsec: which files run, and whether the failures are the listed ones.

  expected.py select EXPECTED TESTS_DIR          the test files to run, one per line
  expected.py compare EXPECTED REPORT FILE...    vitest's JSON report against the list

EXPECTED (expected.txt) has one entry per line, `#` comments:
  FILE | reason                 the file is not run (what it needs dsec does not serve, or it mocks the API)
  FILE > FULL NAME | reason     that test fails against dsec, for that reason
FILE is relative to packages/js-sdk; FULL NAME is vitest's (describe blocks and the test's title).
"""
import json
import os
import sys


def load(path):
    files, tests = {}, {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if " | " not in line:
                sys.exit(f"{path}:{n}: no ' | reason' in: {line}")
            what, why = line.rsplit(" | ", 1)
            if " > " in what:
                file, name = what.split(" > ", 1)
                tests[(file.strip(), name.strip())] = why.strip()
            else:
                files[what.strip()] = why.strip()
    return files, tests


def select(expected, tests_dir):
    files, _ = load(expected)
    out = []
    for dirpath, _, names in os.walk(tests_dir):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), os.path.dirname(os.path.abspath(tests_dir)))
            if not name.endswith(".test.ts") or rel.startswith(("tests/runtimes/", "tests/template/")):
                continue  # other runtimes (a browser, workers), and template builds (E2B's builder)
            if rel not in files:
                out.append(rel)
    for rel in sorted(out):
        print(rel)


def compare(expected, report_path, ran):
    files, tests = load(expected)
    with open(report_path, encoding="utf-8") as f:
        report = json.load(f)
    root = os.getcwd()
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    unexpected, fixed, seen = [], [], set()
    for result in report.get("testResults", []):
        file = os.path.relpath(result["name"], root)
        if not result.get("assertionResults") and result.get("status") == "failed":
            unexpected.append((file, "(the file)", result.get("message", "")[:600]))
        for t in result.get("assertionResults", []):
            key = (file, t["fullName"])
            seen.add(key)
            status = t["status"]
            if status in ("skipped", "pending", "todo", "disabled"):
                counts["skipped"] += 1
                continue
            counts["passed" if status == "passed" else "failed"] += 1
            if status != "passed" and key not in tests:
                unexpected.append((file, t["fullName"], " ".join(t.get("failureMessages", []))[:600]))
            if status == "passed" and key in tests:
                fixed.append(key)
    stale = [k for k in tests if k[0] in ran and k not in seen]
    print(f"E2B SDK tests: {len(ran)} files run, {len(files)} not run (expected.txt); "
          f"{counts['passed']} passed, {counts['failed']} failed ({len(tests)} listed), {counts['skipped']} skipped")
    for file, name, msg in unexpected:
        print(f"FAILED, not listed: {file} > {name}\n    {msg}")
    for file, name in fixed:
        print(f"PASSED, but listed as failing (remove it from expected.txt): {file} > {name}")
    for file, name in stale:
        print(f"LISTED, but no such test ran: {file} > {name}")
    return 0 if not unexpected and not fixed and not stale else 1


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "select":
        select(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3], set(sys.argv[4:])))
    else:
        sys.exit(__doc__)
