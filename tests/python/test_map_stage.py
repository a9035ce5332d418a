"""Loader(..., map=fn): per-sample Python on the decoded fields, on a pool of threads, written
back into the batch; a real albumentations pipeline from PyPI runs in it; its time is a stage of
stats()."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import stoker

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it


def loader(pack, **kw):
    kw.setdefault("threads", 2)
    return stoker.ImageLoader(pack, batch_size=8, size=48, seed=4, train=False, **kw)


def epoch(ld, n=0):
    ld.set_epoch(n)
    return [tuple(b) for b in ld]


def test_an_albumentations_pipeline_runs_in_the_map_stage(packed):
    A = pytest.importorskip("albumentations")
    invert = A.Compose([A.InvertImg(p=1.0)])
    plain = epoch(loader(packed))
    ld = loader(packed, map=lambda s: {"image": invert(image=s["image"])["image"]}, map_threads=3)
    mapped = epoch(ld)
    for (x, y), (mx, my) in zip(plain, mapped, strict=True):
        assert torch.equal(mx, 255 - x) and torch.equal(my, y)
        assert mx.is_contiguous(memory_format=torch.channels_last)
    assert ld.stats()["seconds"]["map"] > 0
    # a random pipeline of photometric and dropout ops keeps the batch's shapes
    recipe = A.Compose([A.HueSaturationValue(p=1.0), A.CLAHE(p=1.0), A.CoarseDropout(p=1.0)])
    ld = loader(packed, map=lambda s: {"image": recipe(image=s["image"])["image"]})
    for (x, _), (mx, _) in zip(plain, epoch(ld), strict=True):
        assert mx.shape == x.shape and not torch.equal(mx, x)


def noisy(sample, rng):
    image = sample["image"].astype(np.int16) + rng.integers(-20, 21, sample["image"].shape)
    return {"image": np.clip(image, 0, 255).astype(np.uint8)}


def test_a_keyed_rng_makes_the_stage_repeatable_across_threads_and_resume(packed):
    one = epoch(loader(packed, map=noisy, map_threads=1), 1)
    many = epoch(loader(packed, map=noisy, map_threads=4, threads=1), 1)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(one, many, strict=True))
    assert not torch.equal(one[0][0], epoch(loader(packed, map=noisy), 2)[0][0])
    first = loader(packed, map=noisy)
    first.set_epoch(1)
    it = iter(first)
    next(it)
    state = first.state_dict()
    again = loader(packed, map=noisy)
    again.load_state_dict(state)
    rest = [tuple(b) for b in again]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(rest, one[1:], strict=True))


def test_the_stage_sees_every_field_and_may_change_labels(packed):
    seen = []

    def fn(sample):
        seen.append((sample["image"].shape, sample["image"].dtype, sample["label"].shape))
        return {"label": np.int64(7)}

    batches = epoch(loader(packed, map=fn))
    assert set(seen) == {((48, 48, 3), np.dtype("uint8"), ())}
    assert all((y == 7).all() for _, y in batches)


def test_map_errors_are_clear(packed):
    with pytest.raises(stoker.InvalidArgumentError, match=r"came back \(10, 10, 3\)"):
        epoch(loader(packed, map=lambda s: {"image": np.zeros((10, 10, 3), np.uint8)}))
    with pytest.raises(stoker.InvalidArgumentError, match="field 'mask'"):
        epoch(loader(packed, map=lambda s: {"mask": 1}))
    with pytest.raises(stoker.InvalidArgumentError, match="not a dict"):
        epoch(loader(packed, map=lambda s: None))
    with pytest.raises(stoker.InvalidArgumentError, match="map_threads= goes with map="):
        loader(packed, map_threads=2)


def test_the_doctor_names_a_map_stage_that_bounds_the_job(packed, monkeypatch):
    """A map= stage that sleeps 3 ms a sample (24 ms a batch) against a step of 1 ms: the job
    waits for data, and the doctor says the map stage is why, with the loader measured
    without it.

    What a busy machine cannot change is checked: the sleeps are lower bounds (the map's share
    of a batch), and the recommendation's trial is the loader without its map, its gain the
    loader's time over the trial's. How much faster the loader is without its map (10-15x on a
    quiet machine, 7x beside four CPU-bound jobs) is a figure for benchmarks/."""
    import time

    from stoker.doctor import experiments

    calls = []

    def slow(sample):
        calls.append(1)
        time.sleep(0.003)
        return {}

    trials = []
    real = experiments._time_loader

    def timed(trial, batches, warmup):
        before = len(calls)
        seconds, rows, first = real(trial, batches, warmup)
        trials.append((trial._map is None, len(calls) - before, seconds))
        return seconds, rows, first

    monkeypatch.setattr(experiments, "_time_loader", timed)
    ld = loader(packed, map=slow, map_threads=1)
    d = stoker.diagnose(ld, lambda batch: time.sleep(0.001), steps=12, warmup=2)
    assert d.verdict == "data" and d.data_cause == "map", d
    assert d.stages["map"] > 0.015
    rec = [r for r in d.recommendations if r.action == "map"]
    assert rec and rec[0].gain is not None, d.recommendations
    without = [(n, seconds) for unmapped, n, seconds in trials if unmapped]
    assert len(without) == 1 and without[0][0] == 0, trials  # the map never ran in that trial
    assert rec[0].gain == pytest.approx(d.loader_s / without[0][1])


def test_an_error_waits_for_the_batch_s_other_samples(packed):
    """The first sample's error reaches the caller only once the other samples' calls have
    returned: none writes into the batch's memory after the loader has it back."""
    import threading
    import time

    calls, finished = [], []
    lock = threading.Lock()

    def fn(sample):
        with lock:
            calls.append(1)
            first = len(calls) == 1
        if first:
            raise ValueError("bad sample")
        time.sleep(0.05)
        with lock:
            finished.append(1)
        return {}

    ld = loader(packed, map=fn, map_threads=4)
    with pytest.raises(ValueError, match="bad sample"):
        next(iter(ld))
    assert len(finished) == 7  # a batch of 8
    ld.close()


def test_with_map_the_augmentation_stays_after_it_on_the_batch(packed):
    import stoker.augment as A

    ld = loader(packed, map=lambda s: {}, augment=[A.RandomGrayscale(0.5)])
    assert ld._augment.in_workers == 0  # map= sees the images before any augmentation
    assert len(epoch(ld)) == 5


def test_a_loader_collected_inside_threadings_bookkeeping_closes_without_joining(packed):
    """The garbage collector may run Loader.__del__ while a thread is starting, which holds
    threading's _shutdown_locks_lock; joining a finished thread takes that lock. So a loader
    closed from its finalizer stops its map threads and does not wait for them (a clean-clone
    run under ASan hung there)."""
    lock = getattr(threading, "_shutdown_locks_lock", None)
    if lock is None:
        pytest.skip("this Python's threading keeps no _shutdown_locks_lock")
    ld = loader(packed, map=lambda s: s, map_threads=2)
    next(iter(ld))  # the map pool's threads run
    done = threading.Event()

    def collected() -> None:
        with lock:  # as inside Thread._set_tstate_lock
            ld.__del__()
        done.set()

    threading.Thread(target=collected, daemon=True).start()
    assert done.wait(30), "Loader.__del__ joined a thread under threading's lock"
    ld.close()  # an explicit close after it still waits, and finds nothing left to stop
