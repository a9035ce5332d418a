"""The README and docs/ as a newcomer reads them: the README fits a screen and shows the chart
drawn from the benchmark's own results; README.md and docs/ describe the product as it is, with
no issue numbers and no run history (CHANGELOG.md keeps those); the licence is where pip and
GitHub look for it."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").rglob("*.md"))
RESULTS = ROOT / "benchmarks" / "results" / "peers.json"
CHART = ROOT / "docs" / "images" / "throughput.svg"

# "issue 32", "issue 32's", "issues 13 and 19", "Issue #7", "(#45)": where a page tells its history.
ISSUE = re.compile(r"\bissues?\s+#?\d+|\(#\d+\)", re.IGNORECASE)


def test_readme_fits_on_a_screen_then_links():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, len(lines)
    text = "\n".join(lines)
    first_screen = "\n".join(lines[:60])
    assert "](docs/images/throughput.svg)" in first_screen  # the chart, near the top
    assert "pip install" in first_screen and "## Quick start" in first_screen
    assert "docs/BENCHMARKS.md" in text
    # The user's make commands, the chart's own (its figures' command) and the two test tiers
    # (CI's among them): the contributors' others (sanitizers, fuzzing, the GPU kit) are
    # CONTRIBUTING.md's.
    found = sorted(set(re.findall(r"\bmake [\w-]+", text)))
    assert found == ["make bench-peers", "make check", "make demo", "make docs", "make install",
                     "make test", "make wheels"], found  # fmt: skip
    assert "CONTRIBUTING.md" in text


def test_no_issue_numbers_in_readme_or_docs():
    found = []
    for path in [README, *DOCS]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if ISSUE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not found, "issue numbers (history goes to CHANGELOG.md):\n" + "\n".join(found)


def test_the_issue_pattern_finds_what_it_should():
    for text in ("issue 32's design", "(issue 19, item 7)", "Issues #31/#54", "see (#45)"):
        assert ISSUE.search(text), text
    for text in ("an issue with numbers", "issues per shard: 3", "version 2.0"):
        assert not ISSUE.search(text), text


def test_the_chart_shows_the_results_file_figures():
    """docs/images/throughput.svg is benchmarks/chart.py's drawing of the results file: every
    figure it shows is the file's, with its date and machine; redrawn, it is the same."""
    results = json.loads(RESULTS.read_text())
    # Loaded from its file: benchmarks/ on sys.path would shadow packages (its datasets.py
    # hides Hugging Face's `datasets` from every later test).
    spec = importlib.util.spec_from_file_location("stoker_chart", ROOT / "benchmarks" / "chart.py")
    chart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chart)

    svg = CHART.read_text()
    texts = set(re.findall(r">([^<>]+)</text>", svg)) | set(re.findall(r"<!-- (.*?) -->", svg))
    for pipe, by_loader in chart.figures(results).items():
        for loader, value in by_loader.items():
            assert f"{value:,}" in texts, (pipe, loader, value)
    assert any(results["date"] in t and results["machine"]["cpu"] in t for t in texts), texts
    drawn = [t for t in texts if re.fullmatch(r"\d{1,3}(,\d{3})*", t)]
    shown = {f"{v:,}" for row in chart.figures(results).values() for v in row.values()}
    assert set(drawn) - shown <= {f"{x:,}" for x in range(0, 100001, 250)}, drawn  # axis ticks


def test_the_chart_is_redrawn_the_same(tmp_path):
    out = tmp_path / "chart.svg"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chart.py"), "--out",
                           str(out)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    strip = re.compile(r"\s+")
    assert strip.sub("", out.read_text()) == strip.sub("", CHART.read_text()), (
        "docs/images/throughput.svg differs from benchmarks/chart.py's drawing of "
        "benchmarks/results/peers.json: run it and commit the result"
    )


def test_the_licence_is_apache_2_and_pyproject_ships_it():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'license = "Apache-2.0"' in pyproject and 'license-files = ["LICENSE"]' in pyproject


def test_changelog_keeps_a_changelog_form():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog")
    assert "keepachangelog.com" in text and "## [Unreleased]" in text
    sections = re.findall(r"^### (\w+)", text, re.MULTILINE)
    assert sections and set(sections) <= {"Added", "Changed", "Deprecated", "Removed", "Fixed",
                                          "Security"}, sections  # fmt: skip


def test_the_root_holds_only_what_a_newcomer_expects():
    """What git tracks at the repository's root: its front page, licence, build and tool files.
    A stray file committed there (a fuzzer's crash input, a shell redirect's output) fails."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True,
                             check=True).stdout.splitlines()  # fmt: skip
    at_root = {name for name in tracked if "/" not in name}
    expected = {".clang-format", ".gitignore", "CHANGELOG.md", "CMakeLists.txt", "CONTRIBUTING.md",
                "LICENSE", "Makefile", "README.md", "mkdocs.yml", "pyproject.toml"}  # fmt: skip
    assert at_root <= expected, sorted(at_root - expected)
