"""examples/train_classifier.py, run as a user runs it, on the CPU with a tiny model: it trains,
and a run preempted mid-epoch and resumed from its checkpoint ends with exactly the weights of a
run that was never interrupted."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_classifier.py"


def train(pack, checkpoint, *extra, amp="bf16"):
    cmd = [
        sys.executable, str(SCRIPT), str(pack), "--model", "tiny", "--epochs", "2",
        "--batch-size", "4", "--size", "32", "--accum", "2", "--device", "cpu", "--threads", "2",
        "--amp", amp, "--checkpoint", str(checkpoint), "--log-every", "2", *extra,
    ]  # fmt: skip
    # Later flags win in argparse: `extra` may override the defaults above.
    # One intra-op thread: CPU kernels then sum in a fixed order, run after run.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("amp", ["bf16", "off"])
@pytest.mark.slow("the example trained as programs of their own (whole, cut, resumed): 8 s")
def test_preempted_and_resumed_run_ends_with_the_same_weights(packed, tmp_path, amp):
    whole = train(packed, tmp_path / "whole.pt", "--val", str(packed), amp=amp)
    # 36 samples, 9 batches of 4, 4 optimizer steps of 2 micro-batches an epoch.
    assert "epoch 1: loss" in whole and "val loss" in whole
    train(packed, tmp_path / "cut.pt", "--max-steps", "3", amp=amp)
    cut = torch.load(tmp_path / "cut.pt", weights_only=False)
    assert cut["step"] == 3
    assert (cut["loader"]["epoch"], cut["loader"]["batches_done"]) == (0, 6)
    resumed = train(packed, tmp_path / "cut.pt", "--resume", amp=amp)
    assert "resumed at step 3, epoch 0, batch 6 of 9" in resumed

    a = torch.load(tmp_path / "whole.pt", weights_only=False)
    b = torch.load(tmp_path / "cut.pt", weights_only=False)
    assert a["step"] == b["step"] == 8
    assert a["model"].keys() == b["model"].keys()
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), f"{name} differs after resuming"
    momentum_a = [s["momentum_buffer"] for s in a["optimizer"]["state"].values()]
    momentum_b = [s["momentum_buffer"] for s in b["optimizer"]["state"].values()]
    assert all(torch.equal(x, y) for x, y in zip(momentum_a, momentum_b, strict=True))


def test_training_lowers_the_loss(packed, tmp_path):
    """Not a loop that runs without learning: over 10 epochs the loss goes down."""
    out = train(
        packed, tmp_path / "c.pt", "--epochs", "10", "--accum", "1", "--lr", "0.4", amp="off"
    )
    losses = [float(out.split(f"epoch {e}: loss ")[1].split()[0]) for e in range(10)]
    assert sum(losses[-3:]) / 3 < losses[0] - 0.05, losses
