"""The device feed on a real GPU: the output equals the CPU reference, the copies overlap the
training step, and the caching allocator never hands a batch's memory to the next copy while the
training stream still reads it. Figures are printed (pytest -s) for docs/GPU.md."""

import ctypes
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import stoker
from stoker import device as device_module
from stoker.device import Normalize

MEAN, STD = stoker.IMAGENET_MEAN, stoker.IMAGENET_STD
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_classifier.py"


# --- equality with the CPU path -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_loader_on_gpu_equals_cpu_reference(gpu_pack, dtype):
    kwargs = dict(batch_size=64, size=128, threads=4, seed=3, return_index=True)
    norm = dict(dtype=dtype, mean=MEAN, std=STD)
    cpu = stoker.ImageLoader(gpu_pack, device="cpu", **norm, **kwargs)
    gpu = stoker.ImageLoader(gpu_pack, device="cuda", **norm, **kwargs)
    n = 0
    for (c_images, c_labels, c_indices), (g_images, g_labels, g_indices) in zip(cpu, gpu):
        assert g_images.device.type == "cuda" and g_images.dtype == dtype
        assert g_images.shape == (len(c_labels), 3, 128, 128)
        assert g_images.is_contiguous(memory_format=torch.channels_last)
        # The same float32 operations in the same order: bit for bit, not approximately.
        assert torch.equal(g_images.cpu(), c_images)
        assert torch.equal(g_labels.cpu(), c_labels) and torch.equal(g_indices.cpu(), c_indices)
        n += 1
    assert n == len(gpu)
    stats = gpu.stats()["device"]
    assert stats["staged_bytes"] == 0 and stats["direct_bytes"] > 0  # straight from the slots
    assert 0 < stats["pinned_slots"] <= 2 + 2 + 2 + 2
    gpu.close()
    cpu.close()


@pytest.mark.parametrize("decode", ["host", "gpu"])
def test_a_break_near_the_end_leaves_the_epoch_where_it_was(gpu_pack, decode):
    """The feed pulls device_prefetch batches ahead (with decode="gpu", through its stage thread);
    a `break` at the last batch but one must not end the epoch: the next pass repeats it, as a
    host loader's does."""
    if decode == "gpu":
        pytest.importorskip("nvidia.nvimgcodec", reason="decode='gpu' needs nvImageCodec")
    kwargs = dict(batch_size=128, size=96, threads=4, seed=11, return_index=True)
    host = stoker.ImageLoader(gpu_pack, **kwargs)
    fed = stoker.ImageLoader(gpu_pack, device="cuda", device_prefetch=3, decode=decode, **kwargs)
    n = len(fed)
    assert n == len(host) >= 5
    first = [b[2].tolist() for b in host]
    for i, (images, _, indices) in enumerate(fed):
        assert images.device.type == "cuda" and indices.tolist() == first[i]
        if i == n - 2:
            break
    assert fed.state_dict()["epoch"] == 0 and fed.state_dict()["batches_done"] == n - 1
    assert [b[2].tolist() for b in fed] == first  # epoch 0 again, from its start
    assert fed.state_dict()["epoch"] == 1
    fed.close()
    host.close()


@pytest.mark.parametrize("pin_memory", [True, False])
def test_to_device_over_a_dataloader_equals_cpu_reference(pin_memory):
    images = torch.randint(0, 256, (96, 3, 40, 40), dtype=torch.uint8)
    labels = torch.arange(96)
    dataset = torch.utils.data.TensorDataset(images, labels)
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, pin_memory=pin_memory)
    feed = stoker.to_device(loader, "cuda", dtype=torch.bfloat16, mean=MEAN, std=STD)
    for i, (x, y) in enumerate(feed):
        expected = Normalize(MEAN, STD, torch.bfloat16)(images[16 * i : 16 * (i + 1)])
        assert x.device.type == "cuda" and torch.equal(x.cpu(), expected)
        assert torch.equal(y.cpu(), labels[16 * i : 16 * (i + 1)])
    stats = feed.stats()
    if pin_memory:
        assert stats["staged_bytes"] == 0
    else:
        assert stats["direct_bytes"] == 0 and stats["staging_buffers"] <= 2 * (2 + 2 + 1)


def test_loader_slots_are_page_locked_and_unlocked_at_close(gpu_pack):
    def is_pinned(address: int) -> bool:  # what the CUDA driver says of a host address
        view = (ctypes.c_uint8 * 4096).from_address(address)
        return torch.frombuffer(view, dtype=torch.uint8).is_pinned()

    loader = stoker.ImageLoader(gpu_pack, batch_size=32, size=64, device="cuda")
    images, _ = next(iter(loader))
    addresses = set(loader._pinned_slots)
    assert addresses and all(is_pinned(a) for a in addresses)
    engine = loader._engine  # keeps the slots' memory allocated after close()
    loader.close()
    assert not any(is_pinned(a) for a in addresses)
    assert engine.slots_allocated >= len(addresses)
    assert images.device.type == "cuda"  # the batch handed out outlives the loader


# --- overlap --------------------------------------------------------------------------------------
def heavy_model() -> nn.Module:
    """A convolution stack whose training step takes tens of ms on a large GPU at batch 256."""
    layers = [nn.Conv2d(3, 64, 3, stride=2, padding=1), nn.ReLU()]
    for _ in range(10):
        layers += [nn.Conv2d(64, 64, 3, padding=1), nn.ReLU()]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    return nn.Sequential(*layers).cuda().to(memory_format=torch.channels_last)


def time_steps(model, batches, steps) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _, x in zip(range(steps), batches):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def test_copies_overlap_the_training_step():
    """Each batch is 154 MB of float32 on the host: copied serially it would add a large share
    of the step. Through the feed, the step time is within 10% of training on a batch that is
    already on the GPU (the seeds' synthetic-data experiment)."""
    torch.backends.cudnn.benchmark = True
    model = heavy_model()
    host = [torch.rand(256, 3, 224, 224).pin_memory() for _ in range(4)]
    cached = Normalize(MEAN, STD, torch.bfloat16)(host[0].cuda())

    def endless(source):
        while True:
            yield from source

    def cached_batches():
        while True:
            yield cached

    def serial_batches():  # the naive path: a blocking copy, then normalise, on one stream
        for x in endless(host):
            yield Normalize(MEAN, STD, torch.bfloat16)(x.cuda())

    def fed():  # a fresh feed per timing: each pass closes its own
        return iter(stoker.to_device(endless(host), "cuda", **normalise))

    normalise = dict(dtype=torch.bfloat16, mean=MEAN, std=STD)
    steps = 30
    time_steps(model, cached_batches(), 5)  # warm-up: cudnn autotuning, allocator
    time_steps(model, fed(), 5)
    results = {"cached": [], "feed": [], "serial": []}
    for _ in range(3):  # interleaved, medians
        results["cached"].append(time_steps(model, cached_batches(), steps))
        results["feed"].append(time_steps(model, fed(), steps))
        results["serial"].append(time_steps(model, serial_batches(), steps))
    median = {k: sorted(v)[1] for k, v in results.items()}
    print(
        f"\nstep time, batch 256x3x224x224 float32 from pinned host memory: "
        f"on the GPU already {1e3 * median['cached']:.2f} ms, through stoker.to_device "
        f"{1e3 * median['feed']:.2f} ms ({median['feed'] / median['cached']:.3f}x), serial copy "
        f"{1e3 * median['serial']:.2f} ms ({median['serial'] / median['cached']:.3f}x); "
        f"{torch.cuda.get_device_name()}"
    )
    assert median["feed"] <= 1.10 * median["cached"]


# --- the caching allocator ------------------------------------------------------------------------
def stress(feed, batches: int, expected_sums: torch.Tensor) -> torch.Tensor:
    """Reads each batch only after a delay on the training stream, and returns how many sums
    came out wrong. A batch's memory freed too early goes back to the side stream's pool, where
    the next copy takes it while the read is still queued."""
    sums = []
    for i, (x, y) in enumerate(feed):
        torch.cuda._sleep(5_000_000)  # ~3 ms: the training stream lags the side stream
        sums.append(x.double().sum() + 1e9 * (y != i).sum())
        del x, y  # freed while the reads above are still queued
        if i + 1 == batches:
            break
    return (torch.stack(sums).cpu() != expected_sums[: len(sums)]).sum()


def stress_source(batches: int, pinned: bool):
    """Batch i is filled with (37 i mod 251). Pageable batches reuse three host buffers (the feed
    stages them at once); pinned ones are fresh, as a DataLoader's pin_memory thread makes them
    (a pinned tensor is copied directly, so its source must not rewrite it)."""
    shape = (64, 3, 128, 128)
    pool = [torch.empty(shape, dtype=torch.uint8) for _ in range(3)]
    numel = pool[0].numel()
    expected = torch.tensor([float((i * 37 % 251) * numel) for i in range(batches)])

    def source():
        for i in range(batches):
            value = i * 37 % 251
            if pinned:
                t = torch.full(shape, value, dtype=torch.uint8).pin_memory()
            else:
                t = pool[i % 3]
                t.fill_(value)
            yield t, torch.tensor(i)

    return source(), expected.double()


@pytest.mark.parametrize("pinned", [True, False])
def test_no_corruption_under_allocator_reuse(pinned):
    batches = 200
    source, expected = stress_source(batches, pinned)
    wrong = stress(stoker.to_device(source, "cuda", prefetch=2), batches, expected)
    assert int(wrong) == 0


def test_the_stress_test_catches_a_feed_without_its_two_guards(monkeypatch):
    """The stress test can fail: with hand_over (record_stream on the training stream) and the
    side stream's wait for the training stream both made no-ops, it finds corrupted batches.
    Either guard alone keeps a loop that reads each batch on the stream current at next() safe:
    the side stream allocates only after waiting for what that stream had queued, the reads of
    freed batches included; record_stream also covers reads queued later."""
    monkeypatch.setattr(device_module._CudaBackend, "hand_over", lambda self, tensor: None)
    monkeypatch.setattr(device_module._CudaBackend, "wait_for_producers", lambda self, d: None)
    batches = 200
    source, expected = stress_source(batches, pinned=True)
    wrong = stress(stoker.to_device(source, "cuda", prefetch=2), batches, expected)
    assert int(wrong) > 0


# --- the training recipe --------------------------------------------------------------------------
@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_example_trains_on_the_gpu(gpu_pack, tmp_path, amp):
    cmd = [
        sys.executable, str(EXAMPLE), str(gpu_pack), "--val", str(gpu_pack), "--model", "tiny",
        "--epochs", "2", "--batch-size", "64", "--size", "96", "--amp", amp, "--device", "cuda",
        "--checkpoint", str(tmp_path / "c.pt"), "--log-every", "5",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    state = torch.load(tmp_path / "c.pt", weights_only=False)
    assert state["loader"]["epoch"] == 2
