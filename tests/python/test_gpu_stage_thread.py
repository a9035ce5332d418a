"""decode="gpu"'s device stage on a thread and stream of its own, on the CPU (device="cpu",
stand-in decoders): the decoder is built and called on the stage thread, never the training
thread's; batch k is handed out while the decoder still holds batch k+1; at most device_prefetch
jobs wait; each decode buffer is written only after the host waited for its release; a decoder's
error surfaces at its own batch, after the batches before it; `break` and `close()` join the
thread; the batches are the serial path's byte for byte (tests/python/test_gpu_decode.py holds
that for every geometry). On a GPU, tests/gpu/test_gpu_decode.py adds the engines' early writes
and the device memory over 2,000 batches."""

from __future__ import annotations

import gc
import threading
import time

import pytest
import torch

import stoker
from stoker.device import gpu_decode
from stoker.device.stage_thread import StageThread

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

THREAD = "stoker-gpu-decode"


@pytest.fixture(autouse=True)
def one_torch_thread():
    """On the CPU the stand-in's render is torch's CPU kernels, called from the stage thread:
    OpenMP gives that thread a team of its own, whose threads spin against the training
    thread's on a loaded 2-core machine (30x slower here). On a GPU they are CUDA kernels."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Decoder(gpu_decode.HostDecoder):
    """stoker's own decoder standing in for the device's, which records where it was built and
    called, and can be held at a call (`gate`), slowed (`sleep`) or made to raise (`fail_at`)."""

    def __init__(self, gate_at: int = -1, sleep: float = 0.0, fail_at: int = -1):
        super().__init__()
        self.built_on = threading.get_ident()
        self.called_on: set[int] = set()
        self.calls = 0
        self.gate_at, self.sleep, self.fail_at = gate_at, sleep, fail_at
        self.entered = threading.Event()  # the gated call began
        self.gate = threading.Event()
        self.gate_timed_out = False
        self.intervals: list[tuple[float, float]] = []
        self.writes: list[int] = []  # the address of each call's first output

    def decode_into(self, blobs, regions, targets):
        call, self.calls = self.calls, self.calls + 1
        self.called_on.add(threading.get_ident())
        self.writes.append(targets.buffer.data_ptr() + targets.offsets[0])
        started = time.perf_counter()
        if call == self.gate_at:
            self.entered.set()
            self.gate_timed_out = not self.gate.wait(timeout=20)
        if call == self.fail_at:
            raise RuntimeError(f"the decoder failed on call {call}")
        if self.sleep:
            time.sleep(self.sleep)
        done = super().decode_into(blobs, regions, targets)
        self.intervals.append((started, time.perf_counter()))
        return done


@pytest.fixture
def use(monkeypatch):
    """use(make) installs a device decoder made by `make()` on the stage thread; returns a list
    that gets each decoder made."""
    made: list[Decoder] = []

    def install(make=Decoder):
        def factory(device, batch_size=0):
            def build(on):
                made.append(make())
                return made[-1]

            return gpu_decode.DecoderFactory(build, 8)

        monkeypatch.setattr(gpu_decode, "decoder_for", factory)
        return made

    return install


def loader(pack, **kw):
    kw = {"batch_size": 6, "size": 64, "seed": 2, "threads": 2, "device": "cpu",
          "dtype": torch.uint8, "return_index": True, "decode": "gpu", **kw}  # fmt: skip
    return stoker.ImageLoader(pack, **kw)


def stage_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD]


def test_built_and_called_on_the_stage_thread(packed, use):
    made = use()
    got = list(loader(packed))
    assert len(got) == 6 and len(made) == 1
    decoder = made[0]
    me = threading.get_ident()
    assert decoder.built_on != me and decoder.called_on == {decoder.built_on}


def test_batch_k_is_handed_out_while_the_decoder_holds_batch_k_plus_1(packed, use):
    """The decoder holds its second call until the training thread has its first batch: on
    the training thread (the serial path) the gate would only open by its timeout."""
    made = use(lambda: Decoder(gate_at=1))
    it = iter(loader(packed, device_prefetch=1))
    x, _, _ = next(it)  # batch 0, while call 1 is queued or held
    decoder = made[0]
    assert decoder.entered.wait(timeout=20)  # the stage thread is inside batch 1's decode
    assert not decoder.gate.is_set()
    decoder.gate.set()
    rest = list(it)
    assert len(rest) == 5 and not decoder.gate_timed_out


@pytest.mark.parametrize("prefetch", [1, 2])
def test_at_most_device_prefetch_jobs_wait(packed, use, prefetch):
    """With a slow decoder the queue fills to device_prefetch jobs, and never past it."""
    use(lambda: Decoder(sleep=0.05))
    data = loader(packed, device_prefetch=prefetch)
    assert len(list(data)) == 6
    figures = data.stats()["device"]["stage_thread"]
    assert figures["max_queued"] == prefetch
    assert figures["jobs"] == 6 and figures["threads_started"] == 1


def test_a_decode_buffer_is_written_only_after_its_release_was_waited_for(packed, use,
                                                                         monkeypatch):  # fmt: skip
    """Each buffer of the ring, used again, is written by the decoder only after the host has
    waited for the event recorded after the last render that read it."""
    made = use()
    log: list[tuple[str, int]] = []

    class Release:
        def __init__(self, slot: int):
            self.slot = slot

        def synchronize(self) -> None:
            log.append(("waited", self.slot))

    real_release = gpu_decode.DecodeRing.release

    def release(ring, slot, event):
        log.append(("released", slot))
        real_release(ring, slot, Release(slot))

    monkeypatch.setattr(gpu_decode.DecodeRing, "release", release)
    data = loader(packed, batch_size=4)
    real_take = gpu_decode.DecodeRing.take

    def take(ring, nbytes, device, sync_stream):
        slot, buffer = real_take(ring, nbytes, device, sync_stream)
        log.append(("write", slot))
        return slot, buffer

    monkeypatch.setattr(gpu_decode.DecodeRing, "take", take)
    batches = list(data)
    assert len(batches) == 9 and made[0].calls == 9
    pending: dict[int, bool] = {}  # slot -> released and not yet waited for
    waits = 0
    for what, slot in log:
        if what == "released":
            pending[slot] = True
        elif what == "waited":
            assert pending.pop(slot), f"slot {slot} waited for without a release"
            waits += 1
        else:
            assert not pending.get(slot), f"slot {slot} written before its release was waited for"
    assert waits == 9 - 2  # every use but each slot's first
    assert data.stats()["decode"]["ring_release_waits"] == waits


def test_a_decoder_error_surfaces_at_its_own_batch(packed, use):
    use(lambda: Decoder(fail_at=3))
    data = loader(packed, device_prefetch=2)
    it = iter(data)
    got = [next(it) for _ in range(3)]
    with pytest.raises(RuntimeError, match="failed on call 3"):
        next(it)
    assert len(got) == 3
    with pytest.raises(StopIteration):  # the pass ended with it
        next(it)
    assert not stage_threads()
    assert len(list(data)) == 6  # the next pass, with the same decoder (past its failing call)


def test_a_corrupt_file_raises_at_its_own_batch(tmp_path, use):
    """A file the device refuses and the host fails on (on_error="raise") raises at the batch it
    is in, after every batch before it."""
    from conftest import corrupt, make_image_folder

    pack = tmp_path / "pack"
    stoker.pack(make_image_folder(tmp_path / "src"), pack, progress=False)
    use(lambda: Decoder())
    order = [int(i) for _, _, index in loader(pack, decode="host") for i in index]
    bad = order[20]  # in batch 3 (positions 18-23)
    corrupt(pack, [bad])
    it = iter(loader(pack, on_error="raise"))
    got = []
    with pytest.raises(stoker.CorruptDataError):
        while True:
            got.append(next(it))
    assert len(got) == 3


def test_break_and_close_join_the_thread(packed, use):
    use()
    before = threading.active_count()
    for k in range(100):
        data = loader(packed, batch_size=4)
        for n, _ in enumerate(data):
            if n == 1:
                break
        if k % 2:
            data.close()
        del data
    gc.collect()
    assert not stage_threads()
    assert threading.active_count() <= before


def test_a_pass_after_a_break_decodes_with_the_same_decoder(packed, use):
    made = use()
    data = loader(packed)
    for n, _ in enumerate(data):
        if n == 2:
            break
    assert len(list(data)) == 6
    figures = data.stats()["device"]["stage_thread"]
    assert len(made) == 1 and figures["threads_started"] == 2
    assert made[0].called_on.isdisjoint({threading.get_ident()})


@pytest.mark.serial  # the stage thread and the loop must get a core each
def test_decoding_overlaps_the_training_step(packed, use):
    """A decoder and a training step that each take 40 ms a batch: the decode of batch k+1
    runs while the loop works on batch k (their intervals overlap), as they could not on one
    thread. (The rate this gives is benchmarks/gpu_stage_overlap.py's.)"""
    made = use(lambda: Decoder(sleep=0.04))
    steps = []
    for _ in loader(packed, device_prefetch=2):
        started = time.perf_counter()
        time.sleep(0.04)
        steps.append((started, time.perf_counter()))
    decodes = made[0].intervals[1:]  # the first call is the warm-up's full batch
    overlapping = sum(
        any(d0 < s1 and s0 < d1 for d0, d1 in decodes) for s0, s1 in steps
    )
    assert overlapping >= len(steps) - 2


def test_a_decoder_that_cannot_be_built_fails_the_first_batch(packed, monkeypatch):
    def factory(device, batch_size=0):
        def build(on):
            raise stoker.DeviceUnavailableError("no engines here")

        return gpu_decode.DecoderFactory(build, 8)

    monkeypatch.setattr(gpu_decode, "decoder_for", factory)
    with pytest.raises(stoker.DeviceUnavailableError, match="no engines here"):
        next(iter(loader(packed)))
    assert not stage_threads()


def test_stop_drops_the_jobs_not_begun_and_joins():
    from stoker.device import device_backend

    thread = StageThread(device_backend("cpu"), depth=3)
    hold, began = threading.Event(), threading.Event()
    seen = []

    def work(batch):
        began.set()
        hold.wait(timeout=20)
        seen.append(batch)
        return batch

    jobs = [thread.submit(k, None, work) for k in range(3)]
    assert began.wait(timeout=20)  # the first job begins and is held
    stopper = threading.Thread(target=thread.stop)
    stopper.start()
    hold.set()
    stopper.join(timeout=20)
    assert not stopper.is_alive() and not thread.running
    out, _ = jobs[0].result()
    assert out == 0
    for job in jobs[1:]:
        with pytest.raises(RuntimeError, match="pass ended"):
            job.result()
    assert seen == [0]


def test_the_stage_thread_takes_a_core_of_the_cpu_budget(packed, use):
    use()
    host = stoker.ImageLoader(packed, batch_size=6, threads="auto", cpu_budget=4, device="cpu")
    gpu = loader(packed, threads="auto", cpu_budget=4)
    assert host._engine.threads == 4 and gpu._engine.threads == 3


def test_auto_weighs_the_device_side_by_the_slower_of_its_gpu_and_host_times():
    """decode="auto"'s device rate: images over the device's own seconds, or over the stage
    thread's host seconds where the thread is the slower (a GPU that waits for its launches)."""
    stage = gpu_decode.DeviceDecodeStage(gpu_decode.DecoderFactory.reusing(Decoder()))
    stage.device_seconds, stage.timed_images = 1.0, 100
    stage.call_seconds, stage.call_images = 3.0, 150  # the thread: 2 s on 100 images
    assert stage.seconds_per_timed_image() == pytest.approx(2.0)
    stage.call_seconds = 0.75
    assert stage.seconds_per_timed_image() == pytest.approx(1.0)


def test_interpreter_exit_stops_the_stage_thread(packed, tmp_path):
    """A loader left mid-pass at exit: stoker's exit hook stops its stage thread before the
    interpreter tears torch down (a hook registered before stoker's runs after it and finds no
    stage thread alive), and the process exits at once."""
    import subprocess
    import sys

    script = tmp_path / "exit.py"
    script.write_text(f"""
import atexit, threading
def check():
    alive = [t.name for t in threading.enumerate() if t.name == "{THREAD}"]
    print("alive at exit:", alive, flush=True)
atexit.register(check)  # runs after stoker's own hook (atexit runs the last registered first)
import torch
import stoker
from stoker.device import gpu_decode
torch.set_num_threads(1)
factory = gpu_decode.DecoderFactory(lambda device: gpu_decode.HostDecoder(), 8)
gpu_decode.decoder_for = lambda device, batch_size=0: factory
loader = stoker.ImageLoader({str(packed)!r}, batch_size=4, size=32, device="cpu",
                            dtype=torch.uint8, decode="gpu", threads=1)
it = iter(loader)
next(it)
print("running:", any(t.name == "{THREAD}" for t in threading.enumerate()), flush=True)
""")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "running: True" in done.stdout and "alive at exit: []" in done.stdout, done.stdout
