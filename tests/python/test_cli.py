import json
import subprocess
import sys

import stoker


def run(*args):
    return subprocess.run([sys.executable, "-m", "stoker", *args], capture_output=True, text=True)


def test_pack_inspect_bench(tmp_path, image_folder):
    out = tmp_path / "pack"
    r = run("pack", str(image_folder), str(out), "--quiet", "--shard-size", "200KB")
    assert r.returncode == 0, r.stderr
    assert "packed 36 samples" in r.stdout

    r = run("inspect", str(out), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["num_samples"] == 36 and info["classes"] == ["cat", "dog", "eel"]
    assert info["version"] == stoker.packing.packer.FORMAT_VERSION

    r = run("inspect", str(out))
    assert "samples     36" in r.stdout

    r = run(
        "bench",
        str(out),
        "--batch-size",
        "8",
        "--size",
        "64",
        "--epochs",
        "1",
        "--vs-dataloader",
        "--workers",
        "0",
    )
    assert r.returncode == 0, r.stderr
    assert "stoker / best DataLoader (DataLoader num_workers=0):" in r.stdout


def test_errors_are_one_line_and_exit_nonzero(tmp_path):
    r = run("inspect", str(tmp_path / "missing"))
    assert r.returncode == 1
    assert "no such file or folder" in r.stderr
    assert "Traceback" not in r.stderr
    r = run("pack", str(tmp_path / "nothing"), str(tmp_path / "out"))
    assert r.returncode == 1 and "nothing: no such file or folder" in r.stderr
    (tmp_path / "notes.bin").write_bytes(b"\x01\x02 nothing stoker reads " * 10)
    r = run("pack", str(tmp_path / "notes.bin"), str(tmp_path / "out"))
    assert r.returncode == 1 and "not a format stoker.pack recognises" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
