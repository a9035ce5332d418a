"""stoker.verify and `stoker verify`: every damaged sample found and named, nothing else, whatever
the thread count; the report file; the exit status."""

import csv
import datetime
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

import stoker
from stoker.load.quarantine import write_report

from conftest import shared_data

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it


def run(*args):
    return subprocess.run([sys.executable, "-m", "stoker", *args], capture_output=True, text=True)


def damaged_copy(packed, tmp_path, index, damage):
    """A copy of the pack with sample `index`'s bytes in its shard passed through `damage`."""
    out = tmp_path / "pack"
    shutil.copytree(packed, out)
    rec = stoker.load.loader.open_dataset(out).record(index)
    with open(out / rec["shard"], "r+b") as f:
        f.seek(rec["offset"])
        data = bytearray(f.read(rec["size"]))
        damage(data)
        assert len(data) == rec["size"]
        f.seek(rec["offset"])
        f.write(data)
    return out, rec


def flip_middle_byte(data):
    data[len(data) // 2] ^= 0x10


def zero_last_quarter(data):
    n = len(data) // 4
    data[-n:] = bytes(n)


def test_clean_pack_is_clean(packed):
    ds = stoker.load.loader.open_dataset(packed)
    report = stoker.verify(packed, progress=False)
    assert report.clean
    assert report.failures == []
    assert report.samples == report.checked == len(ds) == 36
    # Every member is read: the images and their .cls labels.
    assert report.bytes == sum(m["size"] for i in range(len(ds)) for m in ds.record(i)["members"])
    assert report.crc_checked and report.decoded
    assert str(report).endswith(": clean")

    r = run("verify", str(packed), "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verified 36 of 36 samples" in r.stdout and "(CRC32C + full decode)" in r.stdout


def test_flipped_byte_is_a_crc_failure_naming_shard_and_key(tmp_path, packed):
    pack, rec = damaged_copy(packed, tmp_path, 20, flip_middle_byte)
    for threads in (1, 2):
        report = stoker.verify(pack, threads=threads, progress=False)
        assert not report.clean and report.checked == 36
        assert [f.as_dict() for f in report.failures] == [
            {
                "index": 20,
                "shard": rec["shard"],
                "key": rec["key"],
                "error": "CorruptDataError",
                "reason": report.failures[0].reason,
            }
        ]
        assert "CRC32C mismatch" in report.failures[0].reason

    out = tmp_path / "bad.json"
    r = run("verify", str(pack), "--quiet", "--report", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{rec['shard']}  {rec['key']}  CorruptDataError: CRC32C mismatch" in r.stdout
    assert "1 FAILED" in r.stdout
    doc = json.loads(out.read_text())
    created = doc.pop("created")
    assert datetime.datetime.fromisoformat(created).tzinfo is not None
    assert doc == {
        "format": "stoker-quarantine",
        "version": 1,
        "kind": "verify",
        "source": str(pack),
        "checked": 36,
        "failed": 1,
        "failures": [
            {
                "index": 20,
                "shard": rec["shard"],
                "key": rec["key"],
                "error": "CorruptDataError",
                "reason": doc["failures"][0]["reason"],
            }
        ],
    }
    assert doc["failures"][0]["reason"].startswith("CRC32C mismatch")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".bad.json")] == []


def test_full_decode_finds_damage_the_loader_would_not_see(tmp_path, packed):
    pack, rec = damaged_copy(packed, tmp_path, 20, zero_last_quarter)
    data = stoker.load.loader.open_dataset(pack).read(20)
    # The loader's decode accepts it (libjpeg fills the lost rows with grey) ...
    stoker._core.transform_image(data, 64, train=False)
    # ... verification does not, even without the CRC.
    report = stoker.verify(pack, check_crc=False, progress=False)
    assert not report.crc_checked
    assert [(f.index, f.key, f.error) for f in report.failures] == [
        (20, rec["key"], "CorruptDataError")
    ]
    assert "damaged JPEG data" in report.failures[0].reason
    assert stoker.verify(pack, check_crc=False, allow_warnings=True, progress=False).clean
    # With neither check only readability is left: nothing fails.
    assert stoker.verify(pack, check_crc=False, decode=False, progress=False).clean
    # The CRC alone finds it too (--no-decode).
    r = run("verify", str(pack), "--quiet", "--no-decode")
    assert r.returncode == 1 and "(CRC32C)" in r.stdout and "CRC32C mismatch" in r.stdout


def refused_corpus_jpegs(count):
    """The first `count` jpeg-corrupt files (by path) that djpeg 2.1.5 refuses with an error of
    its own, not after a warning, and that are JPEGs at all."""
    root = shared_data()
    with open(root / "MANIFEST.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    warnings = ("Corrupt JPEG data", "Premature end", "Warning:", "Invalid SOS parameters")
    picked = sorted(
        r["path"]
        for r in rows
        if r["path"].startswith("jpeg-corrupt/")
        and r["path"].endswith(".jpg")
        and r["djpeg_2.1.5_rc"] == "1"
        and int(r["bytes"]) > 0
        and not r["djpeg_2.1.5_msg"].startswith(warnings + ("Not a JPEG file",))
    )[:count]
    assert len(picked) == count
    return [root / p for p in picked]


@pytest.fixture(scope="module")
def foreign_tar(tmp_path_factory):
    """A WebDataset tar written by Python's tarfile: 150 imagenet-sample JPEGs with 5 corpus files
    that libjpeg refuses among them. Returns (tar path, {index: key} of the bad ones)."""
    root = shared_data()
    good = sorted((root / "imagenet-sample").iterdir())[:150]
    bad = refused_corpus_jpegs(5)
    path = tmp_path_factory.mktemp("foreign") / "foreign.tar"
    expected = {}
    with tarfile.open(path, "w") as t:
        for i, src in enumerate(good):
            t.add(src, arcname=f"good_{i:03d}.jpg")
            if i % 30 == 7:  # spread over several chunks of 64
                j = len(expected)
                expected[i + 1 + j] = f"bad_{j}"
                t.add(bad[j], arcname=f"bad_{j}.jpg")
    assert len(expected) == 5
    return path, expected


def test_foreign_tar_reports_exactly_the_refused_files(foreign_tar):
    path, expected = foreign_tar
    one = stoker.verify(path, threads=1, progress=False)
    two = stoker.verify(path, threads=2, progress=False)
    assert one.samples == one.checked == 155
    assert not one.crc_checked  # foreign shards carry no CRCs
    assert {f.index: f.key for f in one.failures} == expected
    assert all(f.shard == "foreign.tar" for f in one.failures)
    assert all(
        f.error in ("CorruptDataError", "UnsupportedFormatError", "ResourceLimitError")
        for f in one.failures
    )
    assert one.failures == two.failures
    assert one.bytes == two.bytes
    # Reading alone finds nothing wrong with them.
    assert stoker.verify(path, decode=False, progress=False).clean


def test_cli_caps_the_list_and_points_at_the_report(tmp_path, foreign_tar):
    path, expected = foreign_tar
    r = run("verify", str(path), "--quiet", "--max-failures", "2")
    assert r.returncode == 1
    assert r.stdout.count("  bad_") == 2
    assert "... 3 more, see --report" in r.stdout
    out = tmp_path / "q.json"
    r = run("verify", str(path), "--quiet", "--max-failures", "2", "--report", str(out))
    assert f"... 3 more, see {out}" in r.stdout
    assert [f["key"] for f in json.loads(out.read_text())["failures"]] == sorted(expected.values())

    r = run("verify", str(path), "--quiet", "--json", "--threads", "2")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["kind"] == "verify" and doc["checked"] == doc["samples"] == 155
    assert {f["index"]: f["key"] for f in doc["failures"]} == expected


def test_progress_bar_unless_quiet(packed):
    r = run("verify", str(packed))
    assert r.returncode == 0
    assert "verifying" in r.stderr and "36/36" in r.stderr
    r = run("verify", str(packed), "--quiet")
    assert r.returncode == 0
    assert r.stderr == ""


def test_a_pack_that_cannot_be_opened_exits_2(tmp_path):
    r = run("verify", str(tmp_path / "missing"))
    assert r.returncode == 2
    assert "stoker verify:" in r.stderr and "Traceback" not in r.stderr
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")
    r = run("verify", str(broken))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    with pytest.raises(stoker.StokerError):
        stoker.verify(tmp_path / "missing", progress=False)


def test_bad_arguments_are_refused_before_any_work(tmp_path, packed):
    with pytest.raises(stoker.InvalidArgumentError):
        stoker.verify(packed, threads=0, progress=False)
    with pytest.raises(stoker.InvalidArgumentError):
        stoker.verify(packed, report=tmp_path / "no" / "such" / "r.json", progress=False)
    with pytest.raises(stoker.StokerError):
        stoker.verify(packed, max_scans=0, progress=False)


def test_write_report_is_atomic_and_keeps_only_the_report_fields(tmp_path):
    out = tmp_path / "r.json"
    out.write_text("old")
    failure = {"index": 3, "shard": "s.tar", "key": "k", "error": "ShardIOError", "reason": "gone"}
    write_report(out, source="src", kind="loader", checked=10, failures=[dict(failure, extra=1)])
    doc = json.loads(out.read_text())
    assert doc["kind"] == "loader" and doc["checked"] == 10 and doc["failed"] == 1
    assert doc["failures"] == [failure]
    assert sorted(os.listdir(tmp_path)) == ["r.json"]
    with pytest.raises(ValueError):
        write_report(out, source="src", kind="other", checked=0, failures=[])
    assert json.loads(out.read_text()) == doc  # a refused report leaves the old one
