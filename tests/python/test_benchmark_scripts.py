"""The benchmark scripts that only a GPU machine runs in earnest still run: their harness, on the
CPU, with the feeds that need no GPU (`--smoke`). Figures are not checked: benchmarks are never
timed tests; what is checked is that each row is measured and the tables are written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_gpu_training_harness_runs(image_folder, tmp_path):
    out = tmp_path / "result.json"
    table = tmp_path / "result.md"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_training.py"), "--smoke", "--batch", "8",
         "--data", str(image_folder), "--work", str(tmp_path), "--json", str(out),
         "--markdown", str(table)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["models"]["tiny"]
    assert "synthetic (already on the GPU)" in rows and any("stoker host" in r for r in rows)
    assert all(row["img_s"] > 0 and 0 <= row["wait"] <= 1 for row in rows.values())
    assert set(result["feeds"]) == set(rows)
    text = table.read_text()
    assert text.count("| stoker host") == sum("stoker host" in r for r in rows) and "100.0%" in text


def test_gpu_stage_overlap_harness_runs():
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_stage_overlap.py"), "--smoke"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stage thread:" in done.stdout and "serial (on the training thread):" in done.stdout
