"""One build, one ImageLoader option off and on: an interleaved A/B on imagenet-sample.

    .venv/bin/python benchmarks/option_ab.py --option fast_idct=1            # 5 rounds
    .venv/bin/python benchmarks/option_ab.py --option fast_idct=1 --rounds 9 --modes train

Each side is a run of benchmarks/peer_runners/stoker_pack.py (the runner benchmarks/run.py times
stoker with) in a fresh process: imagenet-sample listed 5 times (5,000 samples an epoch), batch
256, pinned to --threads cores with as many threads, one warm-up epoch, then --epochs timed
epochs, of which the runner keeps the median img/s and the median CPU time an image (the
process's, every thread: other work on the machine inflates it far less than the wall time).
Both sides read the same pack. The rounds alternate which side goes first (off-on, on-off, ...),
so drift in the machine's load hits both alike. Printed: every round, the medians over the rounds,
their ratio, and the median of the rounds' own ratios (on / off). Never a timed test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "imagenet-sample"
RUNNER = ROOT / "benchmarks" / "peer_runners" / "stoker_pack.py"


def run(listing: Path, mode: str, args: argparse.Namespace, options: list[str]) -> tuple:
    """(img/s, CPU microseconds an image): the medians over the timed epochs."""
    out = args.work / "result.json"
    command = [sys.executable, str(RUNNER), "--files", str(listing), "--pipeline", mode]
    command += ["--threads", str(args.threads), "--epochs", str(args.epochs)]
    command += ["--batch-size", "256", "--work", str(args.work), "--out", str(out)]
    for option in options:
        command += ["--option", option]
    subprocess.run(command, check=True, capture_output=True, text=True)
    result = json.loads(out.read_text())
    return result["median_images_per_s"], statistics.median(result["cpu_s_per_image"]) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--option", action="append", required=True, help="k=v, side B only")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs a run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--modes", default="train,eval", help="pipelines, comma-separated")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "option-ab")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in DATA.iterdir() if p.suffix.lower() in (".jpeg", ".jpg"))
    listing = args.work / "imagenet-sample-x5.tsv"
    listing.write_text("".join(f"{f}\t{i}\n" for _ in range(5) for i, f in enumerate(files)))
    name = " ".join(args.option)
    for mode in args.modes.split(","):
        off: list[tuple] = []
        on: list[tuple] = []
        for r in range(args.rounds):
            sides = [(off, []), (on, args.option)]
            for results, options in sides if r % 2 == 0 else sides[::-1]:
                results.append(run(listing, mode, args, options))
            print(
                f"  {mode} round {r + 1}: off {off[-1][0]:.0f} img/s {off[-1][1]:.0f} us CPU, "
                f"{name} {on[-1][0]:.0f} img/s {on[-1][1]:.0f} us CPU",
                flush=True,
            )
        for i, what, unit in ((0, "img/s", "{:.0f}"), (1, "CPU us an image", "{:.0f}")):
            x = [o[i] for o in off]
            y = [o[i] for o in on]
            a, b = statistics.median(x), statistics.median(y)
            paired = statistics.median(q / p for p, q in zip(x, y, strict=True))
            fmt = unit.format
            print(
                f"{mode}, {what}: off median {fmt(a)} ({fmt(min(x))}-{fmt(max(x))}), {name} "
                f"median {fmt(b)} ({fmt(min(y))}-{fmt(max(y))}): on/off = {b / a:.3f} "
                f"(median of the rounds' ratios {paired:.3f})",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
