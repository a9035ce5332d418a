"""A new user's first hour (issue 33): a replayed step past the epoch's end is refused with the
epoch's length, in one line on the command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import stoker

STOKER = str(Path(sys.executable).parent / "stoker")


def test_a_step_past_the_epoch_is_refused_with_its_length(packed):
    loader = stoker.ImageLoader(packed, batch_size=4, rank=0, world_size=2)
    steps = len(loader)
    assert steps == 5  # 36 samples, 2 ranks, batches of 4
    assert len(loader.sample_ids(7, steps - 1, 0)) == 2  # 18 samples a rank: 4 + 4 + 4 + 4 + 2
    for step in (steps, 41200, -1):
        with pytest.raises(stoker.StepOutOfRangeError) as e:
            loader.sample_ids(7, step)
        assert str(e.value) == (
            f"epoch 7 has 5 steps on each of 2 ranks (steps 0 to 4): step {step:,} is not one "
            "of them"
        )
        with pytest.raises(IndexError, match="epoch 7 has 5 steps"):  # an IndexError too
            loader.batch_at(7, step)


@pytest.mark.parametrize("command", ["show", "trace"])
def test_the_command_line_says_so_in_one_line(packed, tmp_path, command):
    html = ["--html", str(tmp_path / "b.html")] if command == "show" else []
    done = subprocess.run([STOKER, command, str(packed), "--epoch", "7", "--step", "41200", *html],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "epoch 7 has 1 step (step 0): step 41,200 is not one of them" in lines[0]
