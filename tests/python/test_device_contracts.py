"""The GPU feed's contracts with CUDA, checked on the CPU: the real CUDA backend runs against
cuda_standin.StandInCuda, which records the device current at every call, which stream waits on
which, when a copy's source was rewritten before the copy ran, and what the caching allocator
still holds. tests/gpu/test_gpu_contracts.py checks the same contracts on a GPU."""

import importlib.util
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import stoker
from stoker import device as device_module
from stoker.device import Normalize
from stoker.device import backend as backend_module

from cuda_standin import StandInCuda

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

MEAN, STD = stoker.IMAGENET_MEAN, stoker.IMAGENET_STD
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_classifier.py"


@pytest.fixture
def cuda(monkeypatch):
    yield StandInCuda(devices=2).install(monkeypatch)
    from stoker.load.loader import _open_loaders

    for loader in list(_open_loaders):  # while the stand-in is there to close them against
        loader.close()


def train(cuda, feed, device: int = 1, keep: bool = False) -> list:
    """The training loop: for every batch, a step queued on the stream current for `device`.
    Nothing in it waits for the GPU."""
    out = []
    for batch in feed:
        cuda.current_stream(device).enqueue("step")
        if keep:
            out.append(batch)
    return out


def pinned_source(cuda, batches: int, shape=(4, 3, 8, 8), device: int | None = None):
    """Fresh pinned batches, as DataLoader(pin_memory=True) gives (or tensors on a GPU)."""
    for i in range(batches):
        images = torch.full(shape, i, dtype=torch.uint8)
        labels = torch.full((shape[0],), i)
        if device is None:
            yield cuda._pin(images), cuda._pin(labels)
        else:
            yield cuda.on_device(images, device), cuda.on_device(labels, device)


# --- 1. device guards -----------------------------------------------------------------------------
def test_every_cuda_call_of_a_loader_is_made_on_its_device(cuda, packed):
    """A DDP rank feeding cuda:1 that never called set_device: nothing may run on GPU 0, or it
    gets a CUDA context there (about 0.5 GB)."""
    kwargs = dict(batch_size=4, size=32, threads=2, seed=3, return_index=True)
    loader = stoker.ImageLoader(packed, device="cuda:1", dtype=torch.float32, **kwargs)
    assert cuda.log == [] and cuda.contexts == set()  # building it touches no GPU
    for i, _ in enumerate(loader):
        cuda.current_stream(1).enqueue("step")
        if i == 3:
            break  # a pass abandoned: its copies are waited for, its slots given back
    train(cuda, loader)
    assert loader.stats()["device"]["batches"] == 4 + 9
    loader.close()
    assert cuda.contexts == {1}
    assert {call.device for call in cuda.log} == {1}, [c for c in cuda.log if c.device != 1]
    kinds = {call.what for call in cuda.log}
    assert {"cudaHostRegister", "cudaHostUnregister", "copy", "record", "wait_event"} <= kinds
    assert torch.cuda.current_device() == 0  # the caller's device is left as it was
    assert loader.stats()["device"]["source_waits"] == 0  # leased slots: no wait before a pull


def test_every_cuda_call_of_to_device_is_made_on_its_device(cuda):
    feed = stoker.to_device(pinned_source(cuda, 6), "cuda:1", dtype=torch.bfloat16)
    train(cuda, feed)
    assert cuda.contexts == {1} and {call.device for call in cuda.log} == {1}
    assert torch.cuda.current_device() == 0


def test_a_bare_cuda_is_the_current_device_when_the_pass_starts(cuda, packed):
    """Built before torch.cuda.set_device(local_rank), the loader still feeds that rank's GPU."""
    loader = stoker.ImageLoader(packed, batch_size=4, size=32, threads=2, device="cuda")
    assert loader.device == torch.device("cuda", 0)
    torch.cuda.set_device(1)
    for _, labels in loader:
        assert labels.device == torch.device("cuda", 1)
    assert loader.device == torch.device("cuda", 1)
    assert all(c.detail["to"] == 1 for c in cuda.calls("copy"))
    loader.close()
    assert cuda.contexts == {1}


def test_a_pass_after_set_device_decodes_on_the_new_device(cuda, packed, monkeypatch):
    """decode="gpu" on device="cuda": the first pass on GPU 0, then torch.cuda.set_device(1) (a
    rank's device set after the loader was built, or changed between epochs): the second pass's
    stage thread works on a stream of GPU 1 with a decoder made for GPU 1, never GPU 0's."""
    from stoker.device import gpu_decode

    built = []

    def build(device):
        built.append(device)
        return gpu_decode.HostDecoder()

    factory = gpu_decode.DecoderFactory(build, 8)
    monkeypatch.setattr(gpu_decode, "decoder_for", lambda device, batch_size=0: factory)
    loader = stoker.ImageLoader(packed, batch_size=4, size=32, threads=2, device="cuda",
                                dtype=torch.uint8, decode="gpu")  # fmt: skip
    train(cuda, loader, device=0)
    first = len(cuda.log)
    torch.cuda.set_device(1)
    train(cuda, loader, device=1)
    second = cuda.log[first:]
    loader.close()
    assert built == [torch.device("cuda", 0), torch.device("cuda", 1)]
    # (A thread ending sets its device back as it found it: no work, the context exists.)
    on_zero = [c for c in second if (c.on is not None and c.on.device_index != 1)
               or (c.what != "cudaSetDevice" and c.device != 1)]  # fmt: skip
    assert second and on_zero == [], on_zero[:5]


def test_a_host_row_is_copied_from_memory_kept_until_then(cuda, packed, monkeypatch):
    """decode="gpu" on a GPU: a file the device refuses is decoded by the engine into a slot of
    its pool, page-locked by cudaHostRegister, and copied into the batch on the stage's stream
    without blocking. The pool hands a slot to the next worker as soon as Python lets it go, and
    the copy reads its source when the stream runs it: the row goes through torch's pinned
    allocator, which keeps its block until then (the stand-in counts a registered source let go
    before its copy ran), and every copy reads what was there when it was queued."""
    from stoker.device import gpu_decode

    class Refusing(gpu_decode.HostDecoder):
        def decode_into(self, blobs, regions, targets):
            done = super().decode_into(blobs, regions, targets)
            return [ok and len(data) % 3 != 0 for ok, data in zip(done, blobs, strict=True)]

    decoder = Refusing()
    factory = gpu_decode.DecoderFactory.reusing(decoder)
    monkeypatch.setattr(gpu_decode, "decoder_for", lambda device, batch_size=0: factory)
    loader = stoker.ImageLoader(packed, batch_size=4, size=32, threads=2, device="cuda",
                                dtype=torch.uint8, decode="gpu")  # fmt: skip
    train(cuda, loader, device=0)
    refused = loader.stats()["decode"]["device_failed"]
    loader.close()
    for stream in cuda.streams:
        stream.run(stream.queued, force=True)
    assert refused > 3
    assert cuda.freed_early == 0 and cuda.corrupted == 0


# --- 2. sources that reuse their buffers ----------------------------------------------------------
class RewritingSource:
    """One buffer, rewritten for every batch, as some custom loaders do: pinned host memory, or
    memory on the feed's GPU (a ring buffer of one)."""

    def __init__(self, cuda, batches: int, on_gpu: bool = False):
        self.cuda = cuda
        if on_gpu:
            self.buffer = cuda.on_device(torch.zeros((4, 3, 8, 8), dtype=torch.uint8), 1)
        else:
            self.buffer = torch.empty((4, 3, 8, 8), dtype=torch.uint8, pin_memory=True)
        self.batches, self.i = batches, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.i == self.batches:
            raise StopIteration
        self.cuda.log_call("pull")
        self.buffer.fill_(self.i)  # before the next copy has read the last batch: corruption
        self.i += 1
        return self.buffer


@pytest.mark.parametrize("prefetch", [1, 2, 4])
def test_a_source_that_rewrites_its_pinned_buffer_is_never_read_late(cuda, prefetch):
    feed = stoker.to_device(RewritingSource(cuda, 30), "cuda:1", prefetch=prefetch)
    values = [int(b[0, 0, 0, 0]) for b in train(cuda, feed, keep=True)]
    assert values == list(range(30))
    assert cuda.copies_run == 30 and cuda.corrupted == 0, "a copy read a rewritten buffer"
    assert feed.stats()["direct_bytes"] == 30 * 4 * 3 * 8 * 8  # no staging: it waited instead


# --- 3. sources already on a GPU, and the current stream at next() --------------------------------
def test_each_copy_waits_for_the_work_queued_on_the_current_stream(cuda):
    """A pinned batch may still be being written by the stream current at next() (a
    device-to-host copy, say): the side stream must wait for it before copying."""
    train(cuda, stoker.to_device(pinned_source(cuda, 8), "cuda:1", dtype=torch.float32))
    log = cuda.log
    copies = [i for i, c in enumerate(log) if c.what == "copy" and c.detail["pinned"]]
    assert len(copies) == 16
    for i in copies:
        last_step = max((j for j in range(i) if log[j].what == "step"), default=-1)
        waits = [
            c for c in log[last_step + 1 : i]
            if c.what == "wait_event" and c.stream == "side" and c.detail.stream.name == "main"
            and c.detail.stream.device_index == 1
        ]  # fmt: skip
        assert waits, f"the copy at {i} does not wait for the steps queued before it"


@pytest.mark.parametrize("dtype", [None, torch.float32])
def test_a_batch_on_the_feeds_gpu_is_copied_after_its_producer_and_before_it_is_rewritten(
    cuda, dtype
):
    source = RewritingSource(cuda, 6, on_gpu=True)
    out = train(cuda, stoker.to_device(source, "cuda:1", dtype=dtype), keep=True)
    # The feed hands out its own copies, not the buffer the source goes on rewriting.
    assert all(batch.data_ptr() != source.buffer.data_ptr() for batch in out)
    expected = [torch.full((4, 3, 8, 8), i, dtype=torch.uint8) for i in range(6)]
    assert all(
        torch.equal(b, Normalize(dtype=dtype)(e)) for b, e in zip(out, expected, strict=True)
    )
    main = cuda.current_stream(1)
    log = cuda.log
    pulls = [i for i, c in enumerate(log) if c.what == "pull"]
    copies = [i for i, c in enumerate(log) if c.what == "copy" and c.on.name == "side"]
    assert len(pulls) == len(copies) == 6
    for pull, copy, next_pull in zip(pulls, copies, pulls[1:] + [len(log)]):
        between = log[pull:copy]
        # the copy waits for what the training stream had queued (the producer's writes)...
        assert any(
            c.what == "wait_event" and c.on.name == "side" and c.detail.stream is main
            for c in between
        )
        # ...the source's buffer is recorded as in use on the side stream...
        assert any(c.what == "record_stream" and c.on.name == "side" for c in between)
        # ...and before the source is asked again, the training stream waits for the copy.
        after = log[copy:next_pull]
        assert next_pull == len(log) or any(
            c.what == "wait_event" and c.on is main and c.detail.stream.name == "side"
            for c in after
        )


def test_a_batch_on_another_gpu_is_copied_there_after_its_producer(cuda):
    """torch copies between GPUs on the source GPU's current stream, after a barrier with the
    target's current stream (the side stream here), which waited for the source GPU first."""
    out = train(cuda, stoker.to_device(pinned_source(cuda, 5, device=0), "cuda:1"), keep=True)
    assert [int(labels[0]) for _, labels in out] == list(range(5))
    assert all(labels.device == torch.device("cuda", 1) for _, labels in out)
    producer = cuda.current_stream(0)
    waited_on = {c.detail.stream for c in cuda.calls("wait_event") if c.on.name == "side"}
    assert producer in waited_on
    assert {c.on for c in cuda.calls("copy")} == {producer}


# --- 4. exact conversion without mean/std ---------------------------------------------------------
def test_uint8_to_float_is_the_correctly_rounded_quotient_for_all_256_values(monkeypatch):
    """CUDA's division by a number multiplies by its float32 reciprocal instead; stand that in
    here, and the feed must still divide exactly (a tensor divisor takes the true division)."""
    real_div_ = torch.Tensor.div_

    def cuda_div_(self, other, **kwargs):
        if isinstance(other, (int, float)):
            return self.mul_(float(np.float32(1.0) / np.float32(other)))
        return real_div_(self, other, **kwargs)

    values = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16)
    exact = torch.from_numpy(np.arange(256, dtype=np.float32) / np.float32(255)).view(1, 1, 16, 16)
    reciprocal = values.float() * float(np.float32(1) / np.float32(255))
    assert int((reciprocal != exact).sum()) == 126  # what the stand-in would cost
    monkeypatch.setattr(torch.Tensor, "div_", cuda_div_)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert torch.equal(Normalize(dtype=dtype)(values), exact.to(dtype)), dtype


# --- 5. page-locking that fails -------------------------------------------------------------------
def test_a_refused_page_lock_falls_back_to_staging_with_one_warning(cuda, packed, monkeypatch):
    monkeypatch.setattr(backend_module, "_warned_page_lock", False, raising=False)
    cuda.register_result = 801  # cudaErrorNotSupported, as on WSL2
    kwargs = dict(batch_size=4, size=32, threads=2, seed=5, return_index=True)
    expected = [(i.clone(), x.clone()) for i, _, x in stoker.ImageLoader(packed, **kwargs)]
    loader = stoker.ImageLoader(packed, device="cuda:1", dtype=torch.float32, **kwargs)
    with pytest.warns(stoker.StokerWarning, match="cannot page-lock.*returned 801"):
        got = [(images, indices) for images, _, indices in loader]
    assert cuda.pending_error() == 0  # cleared: the next kernel launch must not report it
    assert len(cuda.calls("cudaHostRegister")) == 1  # tried once, not for every slot
    for (images, indices), (h_images, h_indices) in zip(got, expected, strict=True):
        assert torch.equal(indices, h_indices) and torch.equal(images, h_images.float() / 255)
    stats = loader.stats()["device"]
    assert stats["pinned_slots"] == 0 and stats["direct_bytes"] == 0 and stats["staged_bytes"] > 0
    assert cuda.corrupted == 0
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning per process, not per loader
        second = stoker.ImageLoader(packed, device="cuda:1", **kwargs)
        assert len(list(second)) == len(expected)
    loader.close()
    second.close()


def test_a_failed_unregister_is_reported_and_its_error_cleared(cuda, packed):
    loader = stoker.ImageLoader(packed, batch_size=4, size=32, threads=2, device="cuda:1")
    next(iter(loader))
    cuda.unregister_result = 1  # cudaErrorInvalidValue
    with pytest.warns(stoker.StokerWarning, match="cudaHostUnregister.*returned 1"):
        loader.close()
    assert cuda.pending_error() == 0


# --- 6. the current stream, and threads -----------------------------------------------------------
class BlockingSource:
    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()

    def __iter__(self):
        return self

    def __next__(self):
        self.entered.set()
        self.release.wait(10)
        return torch.zeros(2)


def test_next_from_two_threads_at_once_is_refused_clearly():
    source = BlockingSource()
    it = iter(stoker.to_device(source, "cpu", prefetch=1))
    first = []
    worker = threading.Thread(target=lambda: first.append(next(it)))
    worker.start()
    assert source.entered.wait(10)
    with pytest.raises(stoker.InvalidArgumentError, match="one thread at a time"):
        next(it)
    source.release.set()
    worker.join(10)
    assert len(first) == 1 and next(it).shape == (2,)


def test_a_batch_is_ready_for_the_stream_current_in_the_thread_that_asked(cuda):
    feed = stoker.to_device(pinned_source(cuda, 6), "cuda:1", dtype=torch.float32)
    it = iter(feed)
    next(it)
    consumer = torch.cuda.Stream(1)
    consumer.name = "consumer"

    def on_own_stream():
        torch.cuda.set_stream(consumer)  # this thread's current stream on cuda:1
        cuda.log.clear()
        next(it)

    worker = threading.Thread(target=on_own_stream)
    worker.start()
    worker.join(10)
    waits = [c for c in cuda.calls("wait_event") if c.detail.stream.name == "side"]
    handed = [c for c in cuda.calls("record_stream") if c.stream != "side"]
    assert {c.stream for c in waits} == {"consumer"}  # ready waited for there, not on main
    assert {c.stream for c in handed} == {"consumer"} and len(handed) == 2
    cuda.log.clear()
    next(it)  # back on this thread: its own current stream
    assert {c.stream for c in cuda.calls("record_stream") if c.stream != "side"} == {"main"}


# --- 7. device memory is bounded ------------------------------------------------------------------
@pytest.mark.parametrize("prefetch", [1, 2, 3])
@pytest.mark.parametrize("copies_wait_for_the_step", [True, False])
def test_device_memory_stays_bounded_when_the_host_runs_ahead(
    cuda, monkeypatch, prefetch, copies_wait_for_the_step
):
    """The loop never waits for the GPU, and the training stream runs only when the host waits
    on it: without a bound, every batch's outputs would stay held by record_stream. The bound
    holds by itself, not only because the copies wait for the training stream (item 3)."""
    if not copies_wait_for_the_step:
        monkeypatch.setattr(
            device_module._CudaBackend, "wait_for_producers", lambda self, d: None, raising=False
        )
    feed = stoker.to_device(
        pinned_source(cuda, 60), "cuda:1", dtype=torch.float32, prefetch=prefetch
    )
    held = []
    for _ in feed:
        cuda.current_stream(1).enqueue("step")
        held.append(cuda.held_blocks("main"))
    assert len(held) == 60
    # Two tensors a batch: the batch in the loop's hands and the two before it.
    assert max(held) <= 2 * (1 + device_module._MAX_UNCONSUMED), held
    if not copies_wait_for_the_step:
        assert "main" in cuda.host_waits  # the host waited for the training stream itself


# --- 8. the training example ----------------------------------------------------------------------
def load_example():
    spec = importlib.util.spec_from_file_location("train_classifier_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def example_args(pack, checkpoint, *extra):
    return [
        str(pack), "--model", "tiny", "--epochs", "1", "--batch-size", "4", "--size", "32",
        "--device", "cpu", "--threads", "2", "--amp", "off", "--checkpoint", str(checkpoint),
        "--log-every", "100", *extra,
    ]  # fmt: skip


def test_example_evaluates_the_model_not_its_compiled_wrapper(packed, tmp_path, monkeypatch):
    """A compiled module recompiles for inference_mode and for the last partial batch."""
    example = load_example()
    calls = {"train": 0, "inference": 0}

    class Compiled(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            calls["inference" if torch.is_inference_mode_enabled() else "train"] += 1
            return self.model(x)

    monkeypatch.setattr(torch, "compile", lambda model, **kw: Compiled(model))
    example.main(example_args(packed, tmp_path / "c.pt", "--compile", "--val", str(packed)))
    assert calls == {"train": 9, "inference": 0}


def test_example_steps_the_scheduler_only_when_the_optimizer_stepped():
    example = load_example()
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([param], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5**s)
    scaler = torch.amp.GradScaler("cpu", enabled=True)  # fp16's loss scaling
    scaler.scale((param * float("inf")).sum()).backward()  # overflow: the step is skipped
    assert example.optimizer_step(optimizer, scaler, scheduler) is False
    assert scheduler.last_epoch == 0 and torch.equal(param.detach(), torch.ones(3))
    optimizer.zero_grad()
    scaler.scale(param.sum()).backward()
    assert example.optimizer_step(optimizer, scaler, scheduler) is True
    assert scheduler.last_epoch == 1 and optimizer.param_groups[0]["lr"] == 0.5


def test_example_checkpoints_keep_the_cuda_rng_state(packed, tmp_path, monkeypatch):
    example = load_example()
    states = [torch.arange(16, dtype=torch.uint8), torch.arange(16, 32, dtype=torch.uint8)]
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in states])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    checkpoint = tmp_path / "c.pt"
    example.main(example_args(packed, checkpoint, "--max-steps", "2"))
    saved = torch.load(checkpoint, weights_only=False)["rng"]
    assert all(torch.equal(a, b) for a, b in zip(saved["cuda"], states, strict=True))
    example.main(example_args(packed, checkpoint, "--resume"))
    assert len(restored) == 1
    assert all(torch.equal(a, b) for a, b in zip(restored[0], states, strict=True))
