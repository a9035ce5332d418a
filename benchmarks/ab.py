"""ImageLoader now against ImageLoader at an earlier commit: an interleaved A/B of two builds.

    .venv/bin/python benchmarks/ab.py --baseline a6d6137            # 5 rounds, train and eval
    .venv/bin/python benchmarks/ab.py --baseline a6d6137 --rounds 9

The baseline commit is checked out into a git worktree under build/ab/ and installed there with
pip (no build isolation, so it uses this environment's CMake and nanobind); the pack is written by
the baseline so both builds read the same bytes in the oldest format either understands. Each
round runs the baseline and then the current build, each in a fresh process (a warm-up epoch,
then 3 timed epochs), so a burst of load on the machine hits both sides alike. Printed: the
medians of the rounds, their ratio, and the median of each round's own ratio (robust to drift in
the machine's load). Never a timed test.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "imagenet-sample"

EPOCH = """
import sys, time
import stoker
pack, train = sys.argv[1], sys.argv[2] == "train"
loader = stoker.ImageLoader(pack, batch_size=256, size=224, train=train, threads=2, seed=1)
for _ in loader:
    pass  # warm-up epoch: page cache, thread pool, first-touch of the batch buffers
n, t0 = 0, time.perf_counter()
for epoch in range(1, 4):
    loader.set_epoch(epoch)
    for images, _labels in loader:
        n += images.shape[0]
print(n / (time.perf_counter() - t0))
"""


def build_baseline(rev: str, work: Path) -> Path:
    """Install stoker at `rev` into work/<rev>/pkg; returns the directory to put on PYTHONPATH."""
    src, pkg = work / rev / "src", work / rev / "pkg"
    if (pkg / "stoker").is_dir():
        return pkg
    if not src.exists():
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(src), rev], check=True
        )
    print(f"building {rev} (a few minutes)...", flush=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-build-isolation",
            "--no-deps",
            "--target",
            str(pkg),
            str(src),
        ],
        check=True,
    )
    return pkg


def run(pythonpath: Path | None, pack: Path, mode: str) -> float:
    env = {"PATH": "/usr/bin:/bin"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    out = subprocess.run(
        [sys.executable, "-c", EPOCH, str(pack), mode],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd="/",
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare against")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", default="train,eval", help="pipelines, comma-separated")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "ab")
    args = parser.parse_args()
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", args.baseline],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    old = build_baseline(rev, args.work)
    pack = args.work / rev / "pack"
    if not (pack / "manifest.json").exists():
        table = args.work / rev / "list.csv"
        files = sorted(DATA.glob("*.JPEG")) or sorted(DATA.glob("*.jp*g"))
        table.write_text("path,label\n" + "".join(f"{f},{i % 10}\n" for i, f in enumerate(files)))
        code = f"import stoker; stoker.pack({str(table)!r}, {str(pack)!r}, progress=False)"
        subprocess.run(
            [sys.executable, "-c", code], env={"PYTHONPATH": str(old)}, check=True, cwd="/"
        )
    print(f"baseline {rev} against the working tree's installed build; pack {pack}")
    for mode in args.modes.split(","):
        before, after = [], []
        for r in range(args.rounds):
            before.append(run(old, pack, mode))
            after.append(run(None, pack, mode))
            print(
                f"  {mode} round {r + 1}: baseline {before[-1]:.0f}  now {after[-1]:.0f} img/s",
                flush=True,
            )
        b, a = statistics.median(before), statistics.median(after)
        paired = statistics.median(x / y for x, y in zip(after, before, strict=True))
        print(
            f"{mode}: baseline median {b:.0f}, now median {a:.0f} img/s: now/baseline = "
            f"{a / b:.3f} (median of the rounds' ratios {paired:.3f})",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
