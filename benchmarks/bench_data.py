"""The benchmark inputs, built once under bench-data/ from ../shared/data (never committed)."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
BENCH_DATA = ROOT / "bench-data"


def imagenet_sample() -> list[tuple[str, int]]:
    """The 1,000 ImageNet validation JPEGs (one per class), as (path, label)."""
    src = SHARED / "imagenet-sample"
    files = sorted(p for p in src.iterdir() if p.suffix.lower() in (".jpeg", ".jpg"))
    return [(str(p), i) for i, p in enumerate(files)]


def photos() -> list[tuple[str, int]]:
    """Real photos of 1-24 MP from ../shared/data/jpeg-variety, every other one made progressive,
    each listed 12 times.

    The progressive copies come from `jpegtran -progressive`, a lossless transcoding: the same
    pixels, libjpeg's default progressive scan script.
    """
    out = BENCH_DATA / "photos"
    rows = list(csv.DictReader(open(SHARED / "MANIFEST.tsv"), delimiter="\t"))
    chosen = []
    for r in rows:
        if not r["path"].startswith("jpeg-variety/") or r["djpeg_2.1.5_rc"] != "0":
            continue
        if r["sof"] != "baseline" or r["ncomp"] != "3" or "x" not in r["WxH"]:
            continue
        w, h = (int(v) for v in r["WxH"].split("x"))
        if 1_000_000 <= w * h <= 24_000_000:
            chosen.append(SHARED / r["path"])
    # The flower and EXIF-orientation sets are many encodings of one picture each: keep two.
    kept: dict[str, int] = {}
    unique = []
    for p in sorted(chosen):
        family = "flower" if "flower" in p.name else p.stem.split("_")[0]
        kept[family] = kept.get(family, 0) + 1
        if family in ("flower", "Landscape", "Portrait") and kept[family] > 2:
            continue
        unique.append(p)
    if not (out / "done").exists():
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for i, p in enumerate(unique):
            dst = out / f"{i:03d}_{p.name}"
            if i % 2:
                subprocess.run(
                    ["jpegtran", "-progressive", "-copy", "none", "-outfile", str(dst), str(p)],
                    check=True,
                )
            else:
                shutil.copyfile(p, dst)
        (out / "done").touch()
    files = sorted(p for p in out.iterdir() if p.suffix.lower() == ".jpg")
    # Each photo 12 times (with different random crops): with batch 32, five batches an epoch, so
    # DataLoader's workers each get batches to make in parallel.
    return [(str(p), i % 10) for _ in range(12) for i, p in enumerate(files)]


def listing(name: str, samples: list[tuple[str, int]], copies: int = 1) -> Path:
    """The samples listed `copies` times, as the peer runners read them: absolute path<TAB>label
    per line (build/peers/lists/<name>.tsv)."""
    out = ROOT / "build" / "peers" / "lists" / f"{name}.tsv"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{Path(p).resolve()}\t{label}\n" for _ in range(copies) for p, label in samples)
    if not out.exists() or out.read_text() != text:
        out.write_text(text)
    return out


def machine() -> dict[str, str]:
    import platform

    import torch

    model = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    jpeg = (
        subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", "libjpeg62-turbo"], capture_output=True, text=True
        ).stdout
        or "?"
    )
    return {
        "cpu": model,
        "cores": str(len(os.sched_getaffinity(0))),
        "memory": f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "libjpeg-turbo": jpeg,
    }


def markers(script: str) -> tuple[str, str]:
    """The lines that begin and end `script`'s section of docs/BENCHMARKS.md."""
    return f"<!-- {script}: begin -->", f"<!-- {script}: end -->"


def write_section(script: str, text: str) -> None:
    """Replace `script`'s section of docs/BENCHMARKS.md (`text`, from its line
    ``<!-- benchmarks/SCRIPT: begin -->`` to its ``end`` line) or append it; the rest of the
    file is left as it is (benchmarks/run.py keeps such sections when it rewrites the file)."""
    doc_path = ROOT / "docs" / "BENCHMARKS.md"
    begin, end = markers(script)
    doc = doc_path.read_text() if doc_path.exists() else "# Benchmarks\n"
    if begin in doc and end in doc:
        head, rest = doc.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        doc = head + text + ("\n" + tail if tail else "")
    else:
        doc = doc.rstrip("\n") + "\n\n" + text
    doc_path.write_text(doc)
    print(f"wrote its section of {doc_path}")
