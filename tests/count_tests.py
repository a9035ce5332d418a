"""The tests a run of make test or make check ran, from the JUnit files its pytest and CTest runs
wrote (build/test-results/*.xml, every test's duration in them): how many ran, passed, failed
and were skipped in each suite, and in all. With --over SECONDS FILE.xml..., the tests of those
files that took longer (the fast tier's budget: such a test is made cheaper or marked slow,
CONTRIBUTING.md).

    python tests/count_tests.py build/test-results [FILE.xml...]
    python tests/count_tests.py --over 3 build/test-results/python-fast*.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def junit_counts(path: Path) -> dict[str, int]:
    """tests, failures (errors included) and skips of one JUnit file."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {"tests": 0, "failed": 0, "skipped": 0}
    for s in suites:
        counts["tests"] += int(s.get("tests", 0))
        counts["failed"] += int(s.get("failures", 0)) + int(s.get("errors", 0))
        counts["skipped"] += int(s.get("skipped", 0))
    return counts


def slow_cases(path: Path, seconds: float) -> list[tuple[float, str]]:
    """(time, test) of every test case in a JUnit file that took longer than seconds."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        t = float(case.get("time", 0))
        if t > seconds:
            out.append((t, f"{case.get('classname')}::{case.get('name')}"))
    return sorted(out, reverse=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--over"]:
        seconds, paths = float(argv[1]), [Path(a) for a in argv[2:]]
        cases = sorted((c for p in paths for c in slow_cases(p, seconds)), reverse=True)
        print(f"{len(cases)} tests of {', '.join(p.name for p in paths)} over {seconds:g} s")
        for t, name in cases:
            print(f"  {t:7.2f} s  {name}")
        return 0
    rows = []
    for arg in argv:
        p = Path(arg)
        if p.is_dir():
            rows += [(f.stem, junit_counts(f)) for f in sorted(p.glob("*.xml"))]
        elif p.suffix == ".xml" and p.exists():
            rows.append((p.stem, junit_counts(p)))
    total = {"tests": 0, "failed": 0, "skipped": 0}
    print(f"  {'suite':<30} {'tests':>6} {'passed':>7} {'skipped':>8} {'failed':>7}")
    for name, c in rows:
        passed = c["tests"] - c["failed"] - c["skipped"]
        print(f"  {name:<30} {c['tests']:>6} {passed:>7} {c['skipped']:>8} {c['failed']:>7}")
        for k in total:
            total[k] += c[k]
    passed = total["tests"] - total["failed"] - total["skipped"]
    print(f"  {'total':<30} {total['tests']:>6} {passed:>7} {total['skipped']:>8} "
          f"{total['failed']:>7}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
