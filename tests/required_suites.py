"""The suites `make test` must run (CI runs them all): a skip for want of one of their
dependencies is a failure there, never a quiet skip. tests/python/conftest.py applies it to
pytest's skips; run as a program it reads a CTest log (the C++ tests' GTEST_SKIPs) and prints
every skip with its reason.

STOKER_REQUIRED_SUITES (`make test` sets it: "media,ray,servers") names the suites whose
dependencies must be there; without it, skips are only listed. A skip for want of privilege (a
network namespace for Ray's tests, debootstrap's root) is not a missing dependency: listed, not
failed. The sanitizer builds are not skipped by anything: without their compiler or runtime they
fail to build, which fails `make test` by itself."""

from __future__ import annotations

import os
import re
import sys

# suite -> what its skip reasons say when a dependency is missing
MISSING: dict[str, re.Pattern[str]] = {
    "media": re.compile(
        r"could not import '(stoker\._media|av|soundfile|soxr)'|no ffmpeg command"
        r"|make build/\.stamps/real-media"
    ),
    "ray": re.compile(r"could not import 'ray'|no ray command"),
    "servers": re.compile(
        r"nginx is not installed|SeaweedFS .*is not installed|could not import '(s3fs|aiohttp)'"
    ),
}


def required() -> set[str]:
    named = {s.strip() for s in os.environ.get("STOKER_REQUIRED_SUITES", "").split(",")}
    unknown = named - set(MISSING) - {""}
    if unknown:
        raise SystemExit(f"STOKER_REQUIRED_SUITES: no suite {sorted(unknown)} ({sorted(MISSING)})")
    return named - {""}


def missing_suite(reason: str) -> str | None:
    """The required suite a skip's reason says lacks a dependency, or None."""
    for suite in sorted(required()):
        if MISSING[suite].search(reason):
            return suite
    return None


def ctest_skips(log: str) -> list[tuple[str, str]]:
    """(test, reason) of every GTEST_SKIP in a CTest LastTest.log: googletest writes
    ``FILE:LINE: Skipped`` and the message on the lines after it, up to ``[  SKIPPED ]``."""
    skips = []
    test, reason = "", None
    for line in log.splitlines():
        m = re.match(r"\d+/\d+ Test: (\S+)", line)
        if m:
            test, reason = m.group(1), None
        elif re.search(r":\d+: Skipped$", line):
            reason = []
        elif reason is not None:
            if line.startswith("[  SKIPPED ]"):
                skips.append((test, " ".join(reason).strip() or "(no reason given)"))
                reason = None
            elif line.strip():
                reason.append(line.strip())
    return skips


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: required_suites.py build/cpp/Testing/Temporary/LastTest.log")
        return 2
    with open(argv[1], encoding="utf-8", errors="replace") as f:
        skips = ctest_skips(f.read())
    failed = []
    for test, reason in skips:
        suite = missing_suite(reason)
        print(f"SKIPPED {test}: {reason}" + (f"  [required suite {suite!r}]" if suite else ""))
        if suite:
            failed.append(test)
    if failed:
        print(f"{len(failed)} C++ tests of required suites skipped for want of a dependency "
              "(STOKER_REQUIRED_SUITES): install it (make setup)")  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
