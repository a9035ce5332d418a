"""The tiers' machinery (CONTRIBUTING.md, "The tiers"): tests/stages.sh times make's stages and
stops at the first failure, tests/count_tests.py counts what the JUnit files say ran, and the
collection hook refuses a slow test that does not say why."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
CONFTEST = TESTS / "python" / "conftest.py"


def stages(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """tests/stages.sh with a stand-in for make that logs each call, sleeps for a target named
    sleep, and fails a target named fail."""
    make = tmp_path / "make"
    make.write_text(textwrap.dedent(f"""\
        #!/usr/bin/env bash
        echo "$@" >> {tmp_path}/calls
        for t in "$@"; do
          case $t in sleep) sleep 1.1 ;; fail) exit 3 ;; esac
        done
        """))  # fmt: skip
    make.chmod(0o755)
    return subprocess.run([str(TESTS / "stages.sh"), str(tmp_path / "times.tsv"), *args],
                          env={**os.environ, "MAKE": str(make)}, capture_output=True,
                          text=True)  # fmt: skip


def test_stages_run_in_order_and_each_one_s_wall_time_is_printed(tmp_path):
    r = stages(tmp_path, "first=a", "both at once=sleep+b", "last=c")
    assert r.returncode == 0, r.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == ["--no-print-directory a", "--no-print-directory -j 2 sleep b",
                     "--no-print-directory c"]  # fmt: skip
    rows = [line.split("\t") for line in (tmp_path / "times.tsv").read_text().splitlines()]
    assert [r[0] for r in rows] == ["first", "both at once", "last"]
    assert int(rows[1][1]) >= 1 and all(r[2] == "ok" for r in rows)
    table = r.stdout[r.stdout.index("wall time by stage"):]
    assert "both at once" in table and "total" in table


def test_the_first_failed_stage_stops_the_run_with_its_status_and_the_table_still_prints(tmp_path):
    r = stages(tmp_path, "first=a", "broken=fail", "never=c")
    assert r.returncode == 3
    assert (tmp_path / "calls").read_text().splitlines() == [
        "--no-print-directory a", "--no-print-directory fail"]  # fmt: skip
    assert "FAILED (3)" in r.stdout and "never" not in r.stdout


def junit(path: Path, tests: int, failures: int, skipped: int, times: list[float]) -> None:
    cases = "".join(f'<testcase classname="m" name="t{i}" time="{t}"/>'
                    for i, t in enumerate(times))  # fmt: skip
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="s" tests="{tests}" '
                    f'failures="{failures}" errors="0" skipped="{skipped}">{cases}'
                    "</testsuite></testsuites>")  # fmt: skip


def test_count_tests_adds_up_every_junit_file_and_lists_the_tests_over_a_budget(tmp_path):
    junit(tmp_path / "python-fast.xml", 10, 1, 2, [0.5, 3.5, 7.0])
    junit(tmp_path / "cpp.xml", 5, 0, 1, [0.1])
    count = [sys.executable, str(TESTS / "count_tests.py")]
    out = subprocess.run([*count, str(tmp_path)], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    assert rows["python-fast"] == ["10", "7", "2", "1"]
    assert rows["cpp"] == ["5", "4", "1", "0"]
    assert rows["total"] == ["15", "11", "3", "1"]
    over = subprocess.run([*count, "--over", "3", str(tmp_path / "python-fast.xml")],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert over.splitlines()[0] == "2 tests of python-fast.xml over 3 s"
    assert "m::t2" in over.splitlines()[1] and "m::t1" in over.splitlines()[2]


def test_a_slow_test_without_its_reason_is_refused_at_collection(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""\
        import importlib.util
        spec = importlib.util.spec_from_file_location("tiers", {str(CONFTEST)!r})
        tiers = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tiers)
        pytest_collection_modifyitems = tiers.pytest_collection_modifyitems
        """))  # fmt: skip
    (tmp_path / "test_x.py").write_text(textwrap.dedent("""\
        import pytest

        @pytest.mark.slow("a reason")
        def test_said():
            pass

        @pytest.mark.slow
        def test_unsaid():
            pass
        """))  # fmt: skip
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-W", "ignore", "--rootdir", str(tmp_path), str(tmp_path)],
                       capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert r.returncode == pytest_usage_error(), r.stdout + r.stderr
    assert "test_unsaid: pytest.mark.slow needs its reason" in r.stdout + r.stderr
    assert "test_said" not in r.stdout + r.stderr


def pytest_usage_error() -> int:
    import pytest

    return int(pytest.ExitCode.USAGE_ERROR)
