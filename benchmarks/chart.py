"""The README's chart, drawn from the results file benchmarks/run.py writes
(benchmarks/results/peers.json), never by hand: stoker against DataLoader, FFCV and DALI on the
CPU, images/s to the training loop on the same machine in the same run. benchmarks/run.py calls
it after each run that writes its results; by hand:

    .venv/bin/python benchmarks/chart.py [--results FILE] [--out docs/images/throughput.svg]

The SVG keeps its text as text (svg.fonttype none): every figure it shows can be read back from
it, which tests/python/test_docs.py does against the results file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "peers.json"
OUT = ROOT / "docs" / "images" / "throughput.svg"
DATASET = "imagenet-sample"
# The loaders shown, top to bottom: stoker, then the peers users compare it with.
LOADERS = ["stoker", "FFCV", "DALI (CPU)", "DataLoader + PIL"]
PIPELINES = [("train", "train: RandomResizedCrop 224 + flip"),
             ("eval", "eval: Resize 256 + CenterCrop 224")]  # fmt: skip
COLOURS = {"train": "#e8663a", "eval": "#3a7ce8"}


def caption(results: dict[str, Any]) -> str:
    """What the chart measured, on which machine, when, by which command (also its title)."""
    m = results["machine"]
    d = results["datasets"][DATASET]
    return (
        f"images/s to the training loop, 224x224 uint8, {DATASET} (batch {d['batch_size']}); "
        f"{m['cpu']}, {m['cores']} cores, {results['date']}, `{results['command']}`"
    )


def figures(results: dict[str, Any]) -> dict[str, dict[str, int]]:
    """{pipeline: {loader: images/s}} of the loaders the chart shows."""
    d = results["datasets"][DATASET]
    out: dict[str, dict[str, int]] = {}
    for pipe, _ in PIPELINES:
        missing = [n for n in LOADERS if n not in d[pipe]]
        if missing:
            raise SystemExit(f"{RESULTS.name}: no {pipe} figure for {missing} in {DATASET}")
        out[pipe] = {n: round(d[pipe][n]["median"]) for n in LOADERS}
    return out


def draw(results: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "stoker", "font.size": 11,
                         "font.family": "DejaVu Sans"})  # fmt: skip
    values = figures(results)
    fig, ax = plt.subplots(figsize=(8, 3.4))
    height = 0.38
    top = max(v for row in values.values() for v in row.values())
    for k, (pipe, label) in enumerate(PIPELINES):
        ys = [i + (k - 0.5) * height for i in range(len(LOADERS))]
        xs = [values[pipe][n] for n in LOADERS]
        ax.barh(ys, xs, height=height * 0.92, color=COLOURS[pipe], label=label)
        for y, x in zip(ys, xs, strict=True):
            ax.text(x + top * 0.01, y, f"{x:,}", va="center", fontsize=9)
    ax.set_yticks(range(len(LOADERS)), LOADERS)
    ax.get_yticklabels()[0].set_fontweight("bold")
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.15)
    ax.set_xlabel("images/s (higher is better)")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(loc="lower right", frameon=False, fontsize=9)
    m = results["machine"]
    ax.set_title(f"ImageNet JPEGs to the training loop, {m['cores']} cores ({m['cpu']}), "
                 f"{results['date']}", fontsize=11, loc="left")  # fmt: skip
    fig.text(0.01, 0.01, "FFCV reads its own copies, re-encoded at JPEG quality 90, at most "
             "512 px; the others the original files. benchmarks/results/peers.json",
             fontsize=7.5, color="#555555")  # fmt: skip
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    draw(results, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
