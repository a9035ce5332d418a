"""The feed's contracts with CUDA on a real GPU, one section per contract of docs/GPU.md
("Contracts"); tests/python/test_device_contracts.py checks the same on the CPU against a
stand-in. Each test makes the hazard real: the training stream lags behind the host
(torch.cuda._sleep), so that a copy or a read ordered wrongly finds the wrong bytes."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import stoker
from stoker import device as device_module
from stoker.device import Normalize
from stoker.device import backend as backend_module
from stoker.device import feed as feed_module

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_classifier.py"
LAG = 2_000_000  # cycles of torch.cuda._sleep per step: about a millisecond
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


def run_python(code: str) -> str:
    """`code` in a fresh interpreter: this one already has contexts on its GPUs."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=os.environ
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


# --- 1. device guards -----------------------------------------------------------------------------
def test_building_a_loader_touches_no_gpu(gpu_pack):
    """With one GPU too: a loader made before set_device creates no context; its first pass
    does, on the device current then."""
    out = run_python(f"""
import torch, stoker
loader = stoker.ImageLoader({str(gpu_pack)!r}, batch_size=32, size=64, device="cuda")
print("after building:", torch._C._cuda_hasPrimaryContext(0))
x, y = next(iter(loader))
print("after a batch:", torch._C._cuda_hasPrimaryContext(0), x.device, y.device)
loader.close()
""")
    assert "after building: False" in out
    assert "after a batch: True cuda:0 cuda:0" in out


@two_gpus
def test_a_feed_for_the_second_gpu_makes_no_context_on_the_first(gpu_pack):
    out = run_python(f"""
import torch, stoker
loader = stoker.ImageLoader({str(gpu_pack)!r}, batch_size=32, size=64, device="cuda:1",
                            dtype=torch.bfloat16, mean=(0.5, 0.5, 0.5), std=(0.2, 0.2, 0.2))
for i, (x, y) in enumerate(loader):
    assert x.device == torch.device("cuda", 1) and y.device == torch.device("cuda", 1)
    if i == 5:
        break
loader.close()
print("context on GPU 0:", torch._C._cuda_hasPrimaryContext(0))
""")
    assert "context on GPU 0: False" in out


@two_gpus
def test_a_bare_cuda_binds_when_the_pass_starts(gpu_pack):
    """The DDP mistake: the loader built before torch.cuda.set_device(local_rank)."""
    out = run_python(f"""
import torch, stoker
loader = stoker.ImageLoader({str(gpu_pack)!r}, batch_size=32, size=64, device="cuda")
torch.cuda.set_device(1)
devices = {{x.device for x, _ in loader}}
loader.close()
print(sorted(str(d) for d in devices), "context on GPU 0:", torch._C._cuda_hasPrimaryContext(0))
""")
    assert "['cuda:1'] context on GPU 0: False" in out


# --- 2. a source that rewrites its pinned buffer --------------------------------------------------
SHAPE = (64, 3, 128, 128)


def rewriting_source(batches: int):
    buffer = torch.empty(SHAPE, dtype=torch.uint8).pin_memory()
    for i in range(batches):
        buffer.fill_(i % 251)  # the last batch's copy may still be queued behind the step
        yield buffer


def expected_sums(batches: int, scaled: bool) -> torch.Tensor:
    """Batch i holds i mod 251 everywhere (divided by 255 in float32 if `scaled`). Its sum in
    float64 is exact: a float32 value (24 bits) times 3 x 2^20 elements fits in 53 bits."""
    values = np.arange(batches, dtype=np.float32) % 251
    if scaled:
        values = values / np.float32(255)
    return torch.from_numpy(values.astype(np.float64) * float(np.prod(SHAPE)))


def sums_after_lagging_steps(feed) -> torch.Tensor:
    sums = []
    for x in feed:
        torch.cuda._sleep(LAG)
        sums.append(x.double().sum())
    return torch.stack(sums).cpu()


def wrong_batches(feed, batches: int, scaled: bool = False) -> int:
    """Sums each batch after a lagging step; how many are not what the source made."""
    return int((sums_after_lagging_steps(feed) != expected_sums(batches, scaled)).sum())


def test_a_source_rewriting_one_pinned_buffer_is_copied_intact():
    assert wrong_batches(stoker.to_device(rewriting_source(100), "cuda", prefetch=2), 100) == 0


def test_without_the_wait_a_rewriting_source_is_corrupted(monkeypatch):
    """The test above can fail: the feed asking for the next batch before the copies are done."""
    monkeypatch.setattr(feed_module._Pass, "_release_source_buffers", lambda self: None)
    assert wrong_batches(stoker.to_device(rewriting_source(100), "cuda", prefetch=2), 100) > 0


# --- 3. sources already on a GPU, or written by the current stream --------------------------------
def test_a_batch_made_on_another_stream_is_read_after_it_and_kept_alive():
    """Each batch is allocated and filled on the producer's stream after a delay, handed to the
    current stream as torch asks (wait_stream), and dropped by the producer at once: the side
    stream must wait for it, and its memory must not go back to the producer's stream while the
    side stream reads it."""
    producer = torch.cuda.Stream()

    def source():
        for i in range(100):
            with torch.cuda.stream(producer):
                torch.cuda._sleep(LAG)
                x = torch.full(SHAPE, i % 251, dtype=torch.uint8, device="cuda")
            torch.cuda.current_stream().wait_stream(producer)
            yield x

    feed = stoker.to_device(source(), "cuda", dtype=torch.float32)  # the side stream reads x
    assert wrong_batches(feed, 100, scaled=True) == 0


def test_a_pinned_batch_written_by_the_current_stream_is_copied_after_it():
    """A device-to-host copy into pinned memory, queued on the current stream behind a delay:
    the feed's copy of that memory must wait for it."""

    def source():
        for i in range(60):
            on_gpu = torch.full(SHAPE, i % 251, dtype=torch.uint8, device="cuda")
            torch.cuda._sleep(LAG)
            host = torch.empty(SHAPE, dtype=torch.uint8).pin_memory()
            host.copy_(on_gpu, non_blocking=True)
            yield host

    assert wrong_batches(stoker.to_device(source(), "cuda"), 60) == 0


def test_a_gpu_source_rewriting_one_buffer_is_copied_before_each_rewrite():
    """The source rewrites one buffer on the current stream for every batch, late: the feed must
    copy each batch after its write and before the next one, and never hand out the buffer."""
    buffer = torch.empty(SHAPE, dtype=torch.uint8, device="cuda")

    def source():
        for i in range(100):
            torch.cuda._sleep(LAG)
            buffer.fill_(i % 251)
            yield buffer

    assert wrong_batches(stoker.to_device(source(), "cuda", prefetch=2), 100) == 0


@two_gpus
def test_a_batch_on_the_other_gpu_is_read_after_its_producer():
    """torch itself copies between GPUs on the source GPU's current stream, after its producer's
    work: this checks that the feed's own waits do not get in the way, not that they are needed."""

    def source():
        for i in range(60):
            with torch.cuda.device(0):
                torch.cuda._sleep(LAG)
                x = torch.full(SHAPE, i % 251, dtype=torch.uint8, device="cuda:0")
            yield x

    assert wrong_batches(stoker.to_device(source(), "cuda:1"), 60) == 0


# --- 4. exact conversion --------------------------------------------------------------------------
def test_uint8_to_float_is_the_correctly_rounded_quotient_for_all_256_values(gpu_pack):
    values = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16)
    exact = torch.from_numpy(np.arange(256, dtype=np.float32) / np.float32(255)).view(1, 1, 16, 16)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert torch.equal(Normalize(dtype=dtype)(values.cuda()).cpu(), exact.to(dtype)), dtype
        assert torch.equal(Normalize(dtype=dtype)(values), exact.to(dtype)), dtype
    kwargs = dict(batch_size=32, size=64, threads=4, seed=1)
    cpu = stoker.ImageLoader(gpu_pack, device="cpu", **kwargs)  # float32, no mean/std
    gpu = stoker.ImageLoader(gpu_pack, device="cuda", **kwargs)
    for (c, _), (g, _) in zip(cpu, gpu, strict=True):
        assert torch.equal(g.cpu(), c)
    cpu.close()
    gpu.close()


# --- 5. page-locking that fails -------------------------------------------------------------------
class RefusingCudart:
    """torch's cudart bindings, but cudaHostRegister fails for real (a null pointer): the
    runtime's last error is set as it would be on a system that refuses."""

    def __init__(self, real):
        self.real = real

    def cudaHostRegister(self, address, nbytes, flags):  # noqa: N802
        return self.real.cudaHostRegister(0, 0, flags)

    def cudaHostUnregister(self, address):  # noqa: N802
        return self.real.cudaHostUnregister(address)


def test_a_refused_page_lock_stages_and_leaves_no_error_behind(gpu_pack, monkeypatch):
    real = torch.cuda.cudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: RefusingCudart(real))
    monkeypatch.setattr(backend_module, "_warned_page_lock", False)
    kwargs = dict(batch_size=32, size=64, threads=4, seed=2, dtype=torch.float16)
    reference = [x for x, _ in stoker.ImageLoader(gpu_pack, device="cpu", **kwargs)]
    loader = stoker.ImageLoader(gpu_pack, device="cuda", **kwargs)
    with pytest.warns(stoker.StokerWarning, match="cannot page-lock"):
        got = [x.cpu() for x, _ in loader]
    assert all(torch.equal(a, b) for a, b in zip(got, reference, strict=True))
    stats = loader.stats()["device"]
    assert stats["pinned_slots"] == 0 and stats["staged_bytes"] > 0
    loader.close()
    assert torch.ones(8, device="cuda").add_(1).sum().item() == 16  # no stale error surfaces


def test_a_failed_unregister_warns_and_leaves_no_error_behind():
    backend = device_module.device_backend("cuda")
    block = torch.empty(1 << 20, dtype=torch.uint8)  # pageable: never registered
    with pytest.warns(stoker.StokerWarning, match="cudaHostUnregister"):
        backend.unpin(block.data_ptr())
    assert torch.ones(8, device="cuda").add_(1).sum().item() == 16


# --- 6. another thread, its own stream ------------------------------------------------------------
def test_a_batch_is_ready_for_the_stream_current_in_the_thread_that_asked():
    sums: list[torch.Tensor] = []
    errors: list[BaseException] = []

    def train_on_own_stream():
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                feed = stoker.to_device(rewriting_source(60), "cuda", dtype=torch.float32)
                sums.append(sums_after_lagging_steps(feed))
        except BaseException as e:  # raised in the test's thread below
            errors.append(e)

    worker = threading.Thread(target=train_on_own_stream)
    worker.start()
    worker.join(300)
    assert not errors, errors
    assert torch.equal(sums[0], expected_sums(60, scaled=True))


# --- 7. device memory is bounded ------------------------------------------------------------------
def peak_reserved(prefetch: int) -> int:
    """A loop that never waits for the GPU over 150 batches whose every step lags; the peak of
    the caching allocator's reserved memory over it. The source's batches are fresh pinned
    tensors (DataLoader's pin_memory), declared leased so that no wait for a source's buffers
    bounds the host: only the feed's bound on the training stream does."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_reserved()

    def fresh_pinned():
        for i in range(150):
            yield torch.full(SHAPE, i % 251, dtype=torch.uint8).pin_memory()

    feed = device_module.DeviceFeed(
        fresh_pinned(), "cuda", dtype=torch.float32, prefetch=prefetch, source_leases_memory=True
    )
    for x in feed:
        torch.cuda._sleep(4 * LAG)
        x.mul_(2)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_reserved() - base


BATCH_BYTES = int(np.prod(SHAPE)) * (1 + 4)  # the uint8 copy and the float32 output


def test_device_memory_stays_bounded_when_the_host_runs_ahead():
    peak = peak_reserved(prefetch=2)
    print(f"\npeak reserved {peak / 2**20:.0f} MiB for batches of {BATCH_BYTES / 2**20:.0f} MiB")
    # in flight, the one handed out, those the stream may still read, and the allocator's slack
    assert peak <= (2 + 1 + device_module._MAX_UNCONSUMED + 2) * BATCH_BYTES


def test_without_the_bound_device_memory_piles_up(monkeypatch):
    """The test above can fail: with no bound, and copies that do not wait for the training
    stream either, the outputs held by record_stream pile up."""
    monkeypatch.setattr(feed_module, "_MAX_UNCONSUMED", 10**9)  # the name feed.py reads
    monkeypatch.setattr(device_module._CudaBackend, "wait_for_producers", lambda self, d: None)
    assert peak_reserved(prefetch=2) > 2 * (2 + 1 + 2 + 2) * BATCH_BYTES


# --- 8. the training example ----------------------------------------------------------------------
def test_example_compiled_fp16_with_evaluation_and_cuda_rng_in_checkpoints(gpu_pack, tmp_path):
    cmd = [
        sys.executable, str(EXAMPLE), str(gpu_pack), "--val", str(gpu_pack), "--model", "tiny",
        "--epochs", "1", "--batch-size", "64", "--size", "96", "--amp", "fp16", "--compile",
        "--device", "cuda", "--checkpoint", str(tmp_path / "c.pt"), "--log-every", "5",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=os.environ)
    assert done.returncode == 0, done.stderr
    assert "val loss" in done.stdout
    state = torch.load(tmp_path / "c.pt", weights_only=False)
    assert len(state["rng"]["cuda"]) == torch.cuda.device_count()
    resumed = subprocess.run(
        [*cmd, "--resume", "--epochs", "2"], capture_output=True, text=True, timeout=900
    )
    assert resumed.returncode == 0, resumed.stderr
