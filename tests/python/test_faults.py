"""Every acquisition of a loader's life made to fail in turn (stoker.faults; SQLite's anomaly
tests): a life is build, 3 batches, state_dict, break, a second pass, close; for each kind of
loader it is first run with every acquisition counted, then once per kind and per N up to that
count with the Nth acquisition of that kind failing. After each: the life either raised the
injected failure itself (not a later error it caused), or recovered from it with the batches
of a life without faults; nothing is left behind (threads, file descriptors, child processes,
shared memory, page-locked slots, open loaders); and a fresh loader built the same way in the
same process gives the same first batch. Ray's own points (actor creation, reading a result)
are made to fail the same way on a Ray cluster (test_remote_workers_ray)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_image_folder
from cuda_standin import StandInCuda
from leaks import Snapshot, left_behind

import stoker
from stoker import faults
from stoker.device import gpu_decode
from stoker.load.workers.local import ThreadWorkers

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("faults")
    images = root / "images"
    # 18 images in 2 shards: each kind of acquisition a few times, each life short
    stoker.pack(make_image_folder(root / "src", per_class=6, seed=9), images, max_side=80,
                shard_size="64KB", progress=False)  # fmt: skip
    rng = np.random.default_rng(1)
    arrays = root / "arrays"
    stoker.pack_arrays({"image": rng.integers(0, 256, (14, 8, 8, 3), dtype=np.uint8),
                        "label": np.arange(14) % 3}, arrays, shard_size="64KB",
                       progress=False)  # fmt: skip
    tokens = root / "tokens"
    docs = [rng.integers(1, 500, int(rng.integers(3, 20))).astype(np.uint16) for _ in range(40)]
    stoker.pack_tokens(docs, tokens, eos_id=0, shard_size="64KB", progress=False)
    return {"images": images, "arrays": arrays, "tokens": tokens, "root": root}


def _image_loader(data, **kw):
    return stoker.ImageLoader(data["images"], batch_size=3, size=16, threads=2, seed=4, **kw)


def _invert(sample):
    return {"image": 255 - sample["image"]}


# Each kind of loader a life is run for: how to build it (a context manager giving an iterable
# with state_dict and close), from the test's data and a fresh folder.
def image_loader(data, where):
    return _image_loader(data)


def fields_loader(data, where):
    fields = {"image": stoker.Image(size=16, hflip=0.5), "label": stoker.Label(optional=True),
              "jpg": stoker.Bytes("jpg", optional=True)}  # fmt: skip
    return stoker.Loader(data["images"], batch_size=3, fields=fields, threads=2, seed=5,
                         map=_invert, map_threads=2, record=where / "steps.jsonl",
                         quarantine=where / "bad.json")  # fmt: skip


def token_loader(data, where):
    return stoker.TokenLoader(data["tokens"], seq_len=8, batch_size=4, threads=2, seed=2)


@contextlib.contextmanager
def mix(data, where):
    with contextlib.ExitStack() as stack:  # as a user builds two loaders: one may fail
        a = stack.enter_context(_image_loader(data))
        b = stack.enter_context(_image_loader(data, train=False))
        yield stoker.mix([a, b], [0.5, 0.5], seed=3, stop="all_exhausted")


def remote_pack(data, where):
    return stoker.ImageLoader(f"file://{data['images']}", batch_size=3, size=16, threads=2,
                              seed=4, cache_dir=where / "cache")  # fmt: skip


def resident(data, where):
    fields = {"image": stoker.Image("image", size=8), "label": stoker.Label("label")}
    return stoker.Loader(data["arrays"], batch_size=4, fields=fields, threads=2, seed=1,
                         resident=True)  # fmt: skip


def remote_workers(data, where):
    spec = ThreadWorkers(2, threads=1, name="remote", batches_in_flight=2)
    return stoker.ImageLoader(data["images"], batch_size=3, size=16, threads=0, seed=4,
                              remote_workers=spec)  # fmt: skip


def on_a_gpu(data, where):
    # batch_size=2: the feed's prefetch stays short of the pass's end when the loop breaks
    return stoker.ImageLoader(data["images"], batch_size=2, size=16, threads=2, seed=4,
                              device="cuda", dtype=torch.float16)  # fmt: skip


def gpu_decode_on_the_cpu(data, where):
    # decode="gpu" with stoker's own decoder standing in for the device's (the test installs
    # it): the stage thread, its decoder built in it, the ring
    return stoker.ImageLoader(data["images"], batch_size=3, size=16, threads=2, seed=4,
                              device="cpu", dtype=torch.uint8, decode="gpu")  # fmt: skip


LOADERS = {f.__name__: f for f in (image_loader, fields_loader, token_loader, mix, remote_pack,
                                    resident, remote_workers, on_a_gpu,
                                    gpu_decode_on_the_cpu)}  # fmt: skip


def _host(batch):
    """A batch as plain host values to compare (a copy: the loader's memory is reused)."""
    if isinstance(batch, dict):
        return {k: _host(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return [_host(v) for v in batch]
    if torch.is_tensor(batch):
        return batch.detach().to("cpu").clone().numpy()
    return batch


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


def life(make, data, where) -> list:
    """Build, 3 batches, state_dict, break, a second pass, close: what a training loop does."""
    out: list = []
    with make(data, where) as loader:
        for batch in loader:
            out.append(_host(batch))
            if len(out) == 3:
                out.append(loader.state_dict())
                break
        for batch in loader:
            out.append(_host(batch))
    return out


def first_batch(make, data, where):
    """A fresh loader's first batch (or what it raised), without faults."""
    try:
        with make(data, where) as loader:
            for batch in loader:
                return _host(batch)
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e))


def run(make, data, where, kind="", nth=0):
    """One life under `inject(kind, nth)`: (what it gave or the exception it raised, what was
    counted). The exception's traceback, which holds the life's frames, is dropped here."""
    with faults.inject(kind, nth) as counts:
        try:
            result: object = life(make, data, where)
        except Exception as e:  # noqa: BLE001 - what the life raised is the outcome
            result = (type(e).__name__, str(e))
    return result, counts


def test_every_acquisition_of_every_loaders_life_fails_in_turn_and_nothing_is_left(
    data, tmp_path, monkeypatch
):
    cuda = StandInCuda(devices=1).install(monkeypatch)
    host_decoder = gpu_decode.DecoderFactory(lambda device: gpu_decode.HostDecoder(), 8)
    monkeypatch.setattr(gpu_decode, "decoder_for", lambda device, batch_size=0: host_decoder)
    # The stand-in decoder's render runs torch's CPU kernels on the stage thread: one torch
    # thread, or OpenMP's teams of the two threads spin against each other on a loaded machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _every_life(cuda, data, tmp_path)
    finally:
        torch.set_num_threads(threads)


def _every_life(cuda, data, tmp_path):
    covered: dict[str, dict[str, int]] = {}
    outcomes: dict[str, dict[str, dict[str, int]]] = {}
    problems: list[str] = []
    lives = 0
    t0 = time.perf_counter()
    for name, make in LOADERS.items():
        where = tmp_path / name
        where.mkdir()
        (where / "cache").mkdir()
        before = Snapshot.now()
        want, counts = run(make, data, where)
        lives += 1
        assert isinstance(want, list), f"{name}: a life without faults failed: {want}"
        assert left_behind(before) == [], name
        covered[name] = {k: v for k, v in counts.by_kind.items() if v}
        outcomes[name] = {}
        for kind, count in sorted(covered[name].items()):
            for nth in range(1, count + 1):
                life_dir = where / f"{kind}-{nth}"
                (life_dir / "cache").mkdir(parents=True)
                result, counts = run(make, data, life_dir, kind, nth)
                lives += 1
                what = f"{name}: {kind} #{nth}"
                injected = f"injected fault: {kind} #{nth} ("
                if isinstance(result, tuple):
                    if not counts.fired or injected not in result[1]:
                        problems.append(f"{what}: raised {result[0]}: {result[1][:300]}")
                elif not _equal(result, want):
                    differ = [i for i, (a, b) in enumerate(zip(result, want)) if not _equal(a, b)]
                    states = [(result[i], want[i]) for i in differ if isinstance(want[i], dict)]
                    problems.append(f"{what}: completed with {len(result)} steps (not "
                                    f"{len(want)}) or others at {differ} {states}")  # fmt: skip
                outcome = "raised" if isinstance(result, tuple) else (
                    "recovered" if counts.fired else "not reached")  # fmt: skip
                outcomes[name].setdefault(kind, {}).setdefault(outcome, 0)
                outcomes[name][kind][outcome] += 1
                left = left_behind(before)
                if left:
                    problems.append(f"{what}: left behind {left}")
                    before = Snapshot.now()  # report each leak once
                if cuda.registered:
                    problems.append(f"{what}: slots still page-locked: {cuda.registered}")
                    cuda.registered.clear()
                fresh = first_batch(make, data, life_dir)
                if not _equal(fresh, want[0]):
                    problems.append(f"{what}: a fresh loader afterwards failed: {str(fresh)[:300]}")
    seconds = time.perf_counter() - t0
    print(f"\n{lives} lives in {seconds:.1f} s; each kind's Ns, and what the life did:")
    for name in LOADERS:
        print(f"  {name}: " + "; ".join(f"{kind} 1-{covered[name][kind]} {outcomes[name][kind]}"
                                        for kind in sorted(covered[name])))  # fmt: skip
    assert problems == [], "\n".join(problems)
    # Every point a life reaches was reached, and each made to fail at least once.
    reached = {kind for kinds in covered.values() for kind in kinds}
    assert reached == {"thread", "file_open", "mmap", "shard_fetch", "page_lock", "stream",
                       "batch_alloc"}  # fmt: skip
    # Each kind failed in every kind of life, and most lives raised it: the points are where
    # the failures have consequences.
    for name, kinds in outcomes.items():
        for kind, seen in kinds.items():
            assert seen.get("raised", 0) + seen.get("recovered", 0) > 0, (name, kind, seen)


def test_a_point_costs_nothing_while_off_and_names_the_kind():
    assert not faults.armed
    with pytest.raises(ValueError, match="no fault point 'disk'"):
        with faults.inject("disk", 1):
            pass
    with faults.inject("file_open", 2) as counts:
        faults.point("file_open", "a")
        with pytest.raises(faults.InjectedFault, match=r"injected fault: file_open #2 \(b\)"):
            faults.point("file_open", "b")
        faults.point("file_open", "c")
    assert counts.by_kind == {"file_open": 3} and counts.fired
    faults.point("file_open", "d")  # off again: nothing counted, nothing raised


# --- options checked before anything is acquired -------------------------------------------------
def _bad(data, **kw):
    return lambda: stoker.ImageLoader(data["images"], batch_size=3, size=16, **kw)


BAD_OPTIONS = {
    "mean without std": (dict(device="cpu", mean=(0.5, 0.5, 0.5), threads=0,
                              remote_workers=ThreadWorkers(2)), "mean and std together"),
    "device_prefetch 0": (dict(device="cpu", device_prefetch=0), "device_prefetch"),
    "an integer dtype": (dict(device="cpu", dtype=torch.int32), "dtype must be"),
    "map_threads 0": (dict(map=_invert, map_threads=0), "map_threads must be"),
    "map not a function": (dict(map="invert"), "map= takes a function"),
    "augment not an op": (dict(augment=["flip"]), "augment"),
    "decode='gpu' with workers": (dict(decode="gpu", threads=0, remote_workers=ThreadWorkers(1)),
                                  "decode='host'"),
    "a device that is not one": (dict(device="tpu"), "device must be"),
    "resident with workers": (dict(resident=True, threads=0, remote_workers=ThreadWorkers(1)),
                              "resident"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_OPTIONS))
def test_every_option_is_checked_before_anything_is_acquired(data, case):
    """A bad option raises before any file is opened, any thread or worker started: nothing
    at all was acquired (stoker.faults counts every acquisition)."""
    kw, message = BAD_OPTIONS[case]
    before = Snapshot.now()
    with faults.inject() as counts:
        with pytest.raises(stoker.InvalidArgumentError, match=message):
            _bad(data, **kw)()
    assert counts.by_kind == {}, counts.by_kind
    assert left_behind(before) == []


def test_a_remote_pack_at_a_url_is_refused_resident_before_anything_is_fetched(data):
    with faults.inject() as counts:
        with pytest.raises(stoker.InvalidArgumentError, match="resident=True holds a local"):
            stoker.ImageLoader(f"file://{data['images']}", batch_size=3, resident=True)
    assert counts.by_kind == {}


# --- no thread dies silently ---------------------------------------------------------------------
def test_a_fetcher_thread_that_fails_ends_the_pass_naming_it(data, tmp_path, monkeypatch):
    """A fetcher thread failing with anything (a bug, here) tells the readers waiting for its
    shards: the loop's next() raises, naming the thread and the cause with its traceback,
    instead of the readers waiting for a shard that never comes."""
    from stoker.remote.fetcher import Fetcher

    def broken(self, wait_ms):
        raise ZeroDivisionError("a fetcher's bug")

    monkeypatch.setattr(Fetcher, "_wanted", broken)
    loader = stoker.ImageLoader(f"file://{data['images']}", batch_size=3, size=16, threads=2,
                                cache_dir=tmp_path)  # fmt: skip
    with loader, pytest.raises(stoker.ShardIOError) as caught:
        next(iter(loader))
    text = str(caught.value)
    assert "fetcher thread stoker-fetch-" in text and "ZeroDivisionError: a fetcher's bug" in text
    assert "Traceback (most recent call last)" in text and "in broken" in text
