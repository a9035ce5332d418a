"""`make test` lists every skip with its reason and fails when a suite it must run (media, Ray,
the servers) is skipped for want of a dependency (tests/required_suites.py): through pytest
(conftest's hooks) and through CTest's log of the C++ tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import required_suites

HERE = Path(__file__).resolve().parent


def run_probe(required: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "STOKER_REQUIRED_SUITES"}
    if required is not None:
        env["STOKER_REQUIRED_SUITES"] = required
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           str(HERE / "required_probe.py")], cwd=HERE.parents[1], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_a_required_suite_skipped_for_want_of_a_dependency_fails_the_session():
    listed = run_probe(None)
    assert listed.returncode == 0, listed.stdout[-2000:]
    assert "could not import 'ray'" in listed.stdout and "needs two GPUs" in listed.stdout
    required = run_probe("media,ray,servers")
    assert required.returncode == 1, required.stdout[-2000:]
    assert "required suites skipped for want of a dependency" in required.stdout
    assert "ray: tests/python/required_probe.py::test_a_suite_whose_dependency_is_missing" in (
        required.stdout)  # fmt: skip
    section = required.stdout.split("required suites skipped")[1].split("STOKER_REQUIRED")[0]
    assert "two GPUs" not in section  # a skip for another reason: listed, not failed
    other = run_probe("media")  # Ray not required: listed, not failed
    assert other.returncode == 0, other.stdout[-2000:]


LOG = """\
12/40 Test: Media.VideoClips
Output:
----------------------------------------------------------
[ RUN      ] Media.VideoClips
/work/stoker/cpp/src/media/media_test.cc:56: Skipped
no ffmpeg command

[  SKIPPED ] Media.VideoClips (0 ms)
<end of output>
13/40 Test: Decode.Corpus
Output:
[ RUN      ] Decode.Corpus
/work/stoker/cpp/src/decode/decode_test.cc:103: Skipped
shared data not found

[  SKIPPED ] Decode.Corpus (0 ms)
14/40 Test: Decode.Other
[       OK ] Decode.Other (1 ms)
"""


def test_ctests_skips_are_listed_and_a_required_suites_fails(tmp_path, monkeypatch):
    assert required_suites.ctest_skips(LOG) == [
        ("Media.VideoClips", "no ffmpeg command"),
        ("Decode.Corpus", "shared data not found"),
    ]
    log = tmp_path / "LastTest.log"
    log.write_text(LOG)
    monkeypatch.setenv("STOKER_REQUIRED_SUITES", "media,ray,servers")
    assert required_suites.main(["x", str(log)]) == 1
    monkeypatch.setenv("STOKER_REQUIRED_SUITES", "ray")
    assert required_suites.main(["x", str(log)]) == 0
