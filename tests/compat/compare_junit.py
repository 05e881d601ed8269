#!/usr/bin/env python3
"""Compares CPython regrtest JUnit results: every test case that passes in
the baseline (a chroot) must pass in the sandbox, unless it is listed in
the expected-differences file with why. Prints one line per regression and
a summary; exits 1 when there is a regression, 2 on unreadable input.

    compare_junit.py BASELINE.xml SANDBOX.xml [EXPECTED_DIFFERENCES]
"""
import sys
import xml.etree.ElementTree as ET


def load(path):
    results = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        key = ".".join(x for x in (case.get("classname", ""), case.get("name", "")) if x)
        state, detail = "pass", ""
        for child in case:
            if child.tag in ("failure", "error"):
                state = "fail"
                detail = ((child.get("message") or "") + " " + (child.text or "")).strip()
            elif child.tag == "skipped" and state == "pass":
                state = "skip"
                detail = child.get("message") or ""
        results[key] = (state, detail)
    return results


def expected(path):
    out = {}
    if not path:
        return out
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#"):
            case, _, why = line.partition(" ")
            out[case] = why.strip()
    return out


def main():
    try:
        base, box = load(sys.argv[1]), load(sys.argv[2])
    except (OSError, ET.ParseError, IndexError) as e:
        print("cannot read the results:", e)
        return 2
    allowed = expected(sys.argv[3] if len(sys.argv) > 3 else None)
    passed = {k for k, v in base.items() if v[0] == "pass"}
    regressions = 0
    for case in sorted(passed):
        state, detail = box.get(case, ("missing", "not run in the sandbox"))
        if state == "pass" or case in allowed:
            continue
        regressions += 1
        print("REGRESSION %s: %s in the sandbox: %s" % (case, state, detail[:300].replace("\n", " | ")))
    box_passed = sum(1 for v in box.values() if v[0] == "pass")
    print("summary: baseline %d cases, %d pass; sandbox %d cases, %d pass; %d regression(s); %d expected "
          "difference(s) listed" % (len(base), len(passed), len(box), box_passed, regressions, len(allowed)))
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
