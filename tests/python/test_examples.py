"""examples/mnist.py and examples/fusion.py, the field notes' own experiments, run as a user runs
them (on small data, on the CPU): they finish, their models learn, the sweep finds and prints its
best setting, and the fusion model's batches carry every input in its packed shape and dtype. Their
GPU branch (resident on the device, batches made by tensor operations) runs here on CPU tensors."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import stoker

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(script: str, *args: str) -> str:
    # One intra-op thread: on 2 cores shared with stoker's threads (and other jobs), torch's
    # OpenMP threads otherwise wait on each other for milliseconds per small op.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(EXAMPLES / script), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def load(name: str):
    """An example as a module, for the tests that run it in this process."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def one_torch_thread():
    """As run() gives the examples' processes, for those run in this one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def gpu_path_on_cpu(monkeypatch):
    """resident=True with a device takes the GPU's path (tensors held, batches made by tensor
    operations), here with CPU tensors: what the examples run on a machine with a GPU."""
    monkeypatch.setattr(stoker.Loader, "_resident_torch_on_cpu", True)


def sweep_table(out: str, name: str) -> dict[int, tuple[float, bool]]:
    """A printed SweepResult: value -> (samples/s, marked best)."""
    lines = out.split(f"{name:>12}  samples/s\n", 1)[1].splitlines()
    table = {}
    for line in lines:
        m = re.fullmatch(r"\s*(\d+)\s+([\d,]+)\s+#*(  <- best)?", line)
        if m is None:
            break
        table[int(m[1])] = (float(m[2].replace(",", "")), m[3] is not None)
    return table


def final_accuracy(out: str) -> float:
    m = re.search(r"final test accuracy ([\d.]+)%", out)
    assert m is not None, out
    return float(m[1]) / 100


@pytest.mark.slow("the example run as a program until its model learns: 4-5 s")
def test_mnist_sweeps_then_learns(tmp_path):
    out = run("mnist.py", "--small", "--data-dir", str(tmp_path), "--workers", "0", "2")
    assert "drew 6,000 train digits" in out and "packed 6000 samples" in out

    # Each sweep ran every setting and marked the fastest, once; the summary names both bests.
    dataloader, ours = sweep_table(out, "num_workers"), sweep_table(out, "threads")
    assert sorted(dataloader) == [0, 2] and sorted(ours) == [1, 2], out
    for table in (dataloader, ours):
        assert all(rate > 0 for rate, _ in table.values()), table
        best = [v for v, (_, marked) in table.items() if marked]
        assert best == [max(table, key=lambda v: table[v][0])], table
    best_dl = next(v for v, (_, marked) in dataloader.items() if marked)
    best_ours = next(v for v, (_, marked) in ours.items() if marked)
    assert f"best: DataLoader num_workers={best_dl}: " in out
    assert f"stoker threads={best_ours}: " in out
    for plot in ("sweep-dataloader.png", "sweep-stoker.png"):
        assert (tmp_path / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # It learns: the loss falls, and the test accuracy is far above chance (10%).
    epochs = re.findall(r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)%\s+[\d,]+$", out, re.M)
    assert [int(e) for e, _, _ in epochs] == [1, 2], out
    assert float(epochs[1][1]) < float(epochs[0][1])
    assert final_accuracy(out) > 0.9


def test_mnist_gpu_branch_on_cpu_tensors(tmp_path, gpu_path_on_cpu, one_torch_thread):
    """The GPU's resident path (run on CPU tensors) trains the model on grey images."""
    mnist = load("mnist")
    args = ["--small", "--data-dir", str(tmp_path), "--skip-sweep", "--epochs", "1"]
    assert mnist.main([*args, "--train-size", "3000", "--min-accuracy", "0.5"]) == 0

    # Its test loader gives the packed digits, normalised as the notes normalise them.
    images, labels = mnist.draw_digits(300, 7)
    stoker.pack_arrays({"image": images, "label": labels}, tmp_path / "p", progress=False)
    loader = mnist.stoker_loader(
        tmp_path / "p", torch.device("cpu"), batch_size=100, augment=False, shuffle=False
    )
    batch = next(iter(loader))
    expected = (torch.from_numpy(images[:100]).float() / 255 - mnist.MEAN) / mnist.STD
    assert batch["image"].shape == (100, 1, 28, 28)
    torch.testing.assert_close(batch["image"][:, 0], expected)
    assert torch.equal(batch["label"], torch.from_numpy(labels[:100]))


@pytest.mark.parametrize("fusion", ["concat", "outer"])
@pytest.mark.slow("the example run as a program until its model learns: 4-5 s")
def test_fusion_learns_from_every_input(tmp_path, fusion):
    out = run("fusion.py", "--small", "--fusion", fusion, "--data-dir", str(tmp_path))
    # One pack holds every input, each in its own dtype and shape.
    packed = re.findall(r"^  (\w+)\s+(\w+)\s+(\[[\d, ]*\])$", out, re.M)
    assert packed[:5] == [
        ("image", "uint8", "[32, 32, 3]"),
        ("vector", "float32", "[12]"),
        ("series", "float16", "[64, 2]"),
        ("ids", "int32", "[6]"),
        ("label", "uint8", "[]"),
    ], out
    # One loader's dict batch carries all of them: the image made float32 NCHW and normalised,
    # the arrays as packed, the label int64.
    batch = re.findall(r"^  (\w+)\s+(\w+)\s+(\[[\d, ]*\]) cpu$", out, re.M)
    assert batch == [
        ("image", "float32", "[128, 3, 32, 32]"),
        ("vector", "float32", "[128, 12]"),
        ("series", "float16", "[128, 64, 2]"),
        ("ids", "int32", "[128, 6]"),
        ("label", "int64", "[128]"),
    ], out
    assert final_accuracy(out) > 0.8  # chance: 1/6
    # The class is 3a + b, a shown by the image, b by the series: the model uses both.
    shuffled = dict(re.findall(r"^  (\w+)\s+[\d.]+%\s+\(([-+][\d.]+)%\)$", out, re.M))
    assert sorted(shuffled) == ["ids", "image", "series", "vector"], out
    assert float(shuffled["image"]) < -20 and float(shuffled["series"]) < -20, shuffled


@pytest.mark.parametrize("gpu_path", [False, True], ids=["host", "gpu-path"])
def test_fusion_loader_gives_the_packed_samples(tmp_path, request, gpu_path):
    """The example's evaluation loader, in pack order: every input equals its packed rows."""
    if gpu_path:
        request.getfixturevalue("gpu_path_on_cpu")
    fusion = load("fusion")
    samples = fusion.make_samples(300, 3)
    stoker.pack_arrays(samples, tmp_path / "p", shard_size="64KB", progress=False)
    loader = fusion.make_loader(tmp_path / "p", torch.device("cpu"), batch_size=128, train=False)
    batches = list(loader)
    assert [len(b["label"]) for b in batches] == [128, 128, 44]
    for name in ("vector", "series", "ids"):
        got = torch.cat([b[name] for b in batches])
        assert got.dtype == torch.from_numpy(samples[name]).dtype
        assert torch.equal(got, torch.from_numpy(samples[name])), name
    labels = torch.cat([b["label"] for b in batches])
    assert torch.equal(labels, torch.from_numpy(samples["label"].astype(np.int64)))
    image = torch.cat([b["image"] for b in batches])
    mean = torch.tensor(fusion.MEAN).view(1, 3, 1, 1)
    std = torch.tensor(fusion.STD).view(1, 3, 1, 1)
    pixels = torch.from_numpy(samples["image"]).permute(0, 3, 1, 2).float()
    torch.testing.assert_close(image, (pixels / 255 - mean) / std)


def test_train_buckets_trains_on_bucketed_batches_and_draws_them(tmp_path):
    """examples/train_buckets.py, cheaply: 60 real photos, 6 steps at buckets of about 64 x 64.
    It exits 1 unless every batch had one bucket's shape and the loss fell."""
    picture = tmp_path / "batches.png"
    out = run("train_buckets.py", "--images", "60", "--steps", "6", "--area", "64",
              "--threads", "2", "--data-dir", str(tmp_path), "--picture", str(picture))  # fmt: skip
    assert "every batch one bucket's shape: True" in out, out
    assert "48 x 80" in out and "80 x 48" in out  # landscape and portrait buckets both used
    from PIL import Image

    with Image.open(picture) as im:
        assert im.height >= 2 * 96  # a row per batch drawn, at least two buckets


@pytest.mark.slow("the example writes its Parquet with datasets, then trains twice: about 7 s")
def test_train_from_parquet_over_http_resumes_exactly(tmp_path):
    """examples/train_from_parquet.py, cheaply: 120 photos written by `datasets`, read over HTTP
    from a loopback server. It exits 1 unless the loader resumed from its mid-epoch state hands
    out the uninterrupted run's batches and the loss fell."""
    out = run("train_from_parquet.py", "--images", "120", "--epochs", "2", "--http",
              "--data-dir", str(tmp_path))  # fmt: skip
    assert "120 rows, 8 row groups" in out, out
    assert "resumed mid-epoch, the same batches: True" in out, out
    assert "requests: 10" in out, out  # 2 footers and 8 row groups, nothing else


@pytest.mark.slow("the example trained three times (12 steps; 6, then 6 more resumed): about 5 s")
def test_train_lm_packed_learns_and_resumes_exactly(tmp_path, capsys, one_torch_thread):
    """examples/train_lm_packed.py, cheaply: 12 steps of rows of 256 tokens. Its loss falls (it
    returns 0 only then); 6 steps, then --resume to 12, print the same losses and counts as the
    12 steps at once (model, optimizer and loader state all carried by the checkpoint)."""
    lm = load("train_lm_packed")
    args = ["--seq-len", "256", "--batch-size", "4", "--threads", "2"]
    assert lm.main([*args, "--steps", "12", "--out", str(tmp_path / "a")]) == 0
    whole = capsys.readouterr().out
    lm.main([*args, "--steps", "6", "--out", str(tmp_path / "b")])
    capsys.readouterr()
    lm.main([*args, "--steps", "12", "--out", str(tmp_path / "b"), "--resume"])
    resumed = capsys.readouterr().out
    assert "resumed at step 6, epoch 0" in resumed, resumed

    def losses(out: str) -> dict[int, str]:
        return {int(s): v for s, v in re.findall(r"^step\s+(\d+)\s+loss ([\d.]+)", out, re.M)}

    assert sorted(losses(whole)) == list(range(1, 13)), whole
    assert losses(resumed) == {s: v for s, v in losses(whole).items() if s > 6}, resumed

    def counts(out: str) -> dict[str, list[int]]:
        rows = re.findall(r"^\s+(docs|sft)((?:\s+[\d,]+){5})$", out, re.M)
        return {s: [int(v.replace(",", "")) for v in c.split()] for s, c in rows}

    table = counts(whole)
    assert sorted(table) == ["docs", "sft"] and counts(resumed) == table, (whole, resumed)
    real, padding, loss, split, dropped = table["sft"]
    assert 0 < loss < 0.9 * real and split == 0 and dropped > 0  # prompts carry no loss
    # The rows' efficiency is the real tokens' share of their slots, the table's.
    efficiency = float(re.search(r"^efficiency ([\d.]+)%", whole, re.M)[1]) / 100
    slots = sum(c[0] + c[1] for c in table.values())
    assert efficiency == pytest.approx(sum(c[0] for c in table.values()) / slots, abs=1e-3)
    assert slots == 12 * 4 * 256 and efficiency > 0.75, whole


@pytest.mark.slow("the example makes 12 videos with ffmpeg, packs, encodes and trains: about 6 s")
def test_train_video_latents_buckets_attaches_and_trains(tmp_path):
    """examples/train_video_latents.py, cheaply: 12 videos, 6 steps. It exits 1 unless every
    clip batch had one bucket's shape, the attached latents read back as encoded, every latent
    batch had one length and the loss fell."""
    import shutil

    pytest.importorskip("stoker._media")
    if shutil.which("ffmpeg") is None:
        pytest.skip("no ffmpeg command")
    out = run("train_video_latents.py", "--videos", "12", "--steps", "6", "--threads", "2",
              "--data-dir", str(tmp_path))  # fmt: skip
    assert "3 fill no bucket" in out, out  # the 0.5 s videos
    assert "every batch one bucket's shape: True; every video that fills a bucket encoded: True" \
        in out, out
    assert "latents read back as encoded: True; every latent batch one length: True" in out, out
    assert "attached 'latents': 12 values" in out, out
