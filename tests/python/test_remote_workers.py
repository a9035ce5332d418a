"""remote_workers= (issue 35): a loader's batches made by workers elsewhere are the loader's own,
bit for bit, with its states, epochs, ranks, records and on_error; a worker lost mid-chunk has
its steps made again elsewhere, none lost or repeated; each worker holds a bounded number of
batches. These tests run the workers as threads of this process (stoker.load.workers.local),
which go through the same dispatcher, recipe and stage as Ray's actors; test_remote_workers_ray
runs them on a real Ray cluster."""

from __future__ import annotations

import dataclasses
import pickle
import queue
import statistics
import threading
import time
import warnings

import numpy as np
import pytest
from test_replay import cloned, same


import stoker
import stoker.augment as A
from stoker import faults
from stoker.errors import ErrorBudgetExceededError, InvalidArgumentError
from stoker.load.stages.workers import WorkerSteps
from stoker.load.workers import local
from stoker.load.workers.local import ThreadPool, ThreadWorkers
from stoker.load.workers.steps import Chunk, Recipe, StepWorker

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it


def a_pass(loader, epoch=None, stop=None):
    if epoch is not None:
        loader.set_epoch(epoch)
    out = []
    for batch in loader:
        out.append(cloned(batch))
        if stop is not None and len(out) == stop:
            break
    return out


def ready(loader, count):
    """Waits until `count` workers are ready, so that each takes work from the first steps."""
    deadline = time.monotonic() + 60
    while len(loader.stats()["workers"]["workers"]) < count:
        assert time.monotonic() < deadline, loader.stats()["workers"]
        time.sleep(0.01)


RECIPE = [A.TimmRandAugment.from_config("rand-m9-mstd0.5"), A.RandomErasing(0.5)]


@pytest.mark.parametrize("local_threads", [0, 1])
@pytest.mark.parametrize("world_size", [1, 2])
def test_batches_states_and_epochs_are_the_loaders_own(packed, local_threads, world_size):
    for rank in range(world_size):
        kw = dict(batch_size=3, size=48, seed=5, rank=rank, world_size=world_size,
                  augment=RECIPE, return_index=True)  # fmt: skip
        plain = stoker.ImageLoader(packed, threads=2, **kw)
        spec = ThreadWorkers(2, threads=1, name="remote", batches_in_flight=4)
        with stoker.ImageLoader(packed, threads=local_threads, remote_workers=spec, **kw) as rw:
            assert len(rw) == len(plain) >= 5
            for epoch in (0, 1):
                want = a_pass(plain, epoch)
                assert same(a_pass(rw, epoch), want)
            # a state mid-epoch resumes in a new loader with exactly the remaining batches
            plain.set_epoch(2)
            want = a_pass(plain)
            rw.set_epoch(2)
            head = a_pass(rw, stop=2)
            state = rw.state_dict()
            plain_state = stoker.ImageLoader(packed, threads=2, **kw)
            plain_state.set_epoch(2)
            for _ in zip(range(2), plain_state):
                pass
            assert state == plain_state.state_dict()
        with stoker.ImageLoader(packed, threads=0, remote_workers=spec, **kw) as resumed:
            resumed.load_state_dict(state)
            assert same(head + a_pass(resumed), want)
            stats = resumed.stats()
            made = stats["workers"]["workers"]
            assert sum(w["steps"] for w in made) == len(want) - 2
            assert all(w["name"].startswith("remote/") for w in made)  # threads=0: none here
            assert stats["workers"]["bytes"] > 0 and stats["workers"]["lost"] == 0


def test_fields_bytes_and_map_run_on_the_workers(packed):
    def darken(sample, rng):
        return {"image": sample["image"] // 2 + rng.integers(0, 3, dtype=np.uint8)}

    fields = {"image": stoker.Image(size=32, hflip=0.5), "label": stoker.Label(optional=True),
              "jpg": stoker.Bytes("jpg", optional=True)}  # fmt: skip
    kw = dict(batch_size=4, fields=fields, seed=2, map=darken, map_threads=2)
    want = a_pass(stoker.Loader(packed, threads=2, **kw))
    spec = ThreadWorkers(2, threads=1, name="remote")
    with stoker.Loader(packed, threads=0, remote_workers=spec, **kw) as rw:
        got = a_pass(rw)
    assert same(got, want) and any(len(b["jpg"][0]) for b in got)


def test_tokens_and_a_mix_of_loaders_with_workers(packed, tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 60000, int(rng.integers(3, 40))).astype(np.uint16) for _ in range(200)]
    tokens = tmp_path / "tokens"
    stoker.pack_tokens(docs, tokens, eos_id=0, shard_size="4KB", progress=False)
    spec = ThreadWorkers(2, threads=1, name="remote")
    kw = dict(seq_len=16, batch_size=8, seed=4, return_offsets=True)
    want = a_pass(stoker.TokenLoader(tokens, threads=1, **kw))
    with stoker.TokenLoader(tokens, threads=0, remote_workers=spec, **kw) as rw:
        assert same(a_pass(rw), want)

    def make(**extra):
        a = stoker.ImageLoader(packed, batch_size=4, size=32, seed=1, **extra)
        b = stoker.ImageLoader(packed, batch_size=4, size=32, seed=2, train=False, **extra)
        return stoker.mix([a, b], [0.5, 0.5], seed=3, stop="all_exhausted")

    want = a_pass(make(threads=1))
    assert same(a_pass(make(threads=0, remote_workers=spec)), want)


@pytest.mark.parametrize("on_error", ["skip", "warn", "replace"])
def test_failures_are_counted_warned_and_replaced_as_the_loader_does(damaged, on_error):
    pack, keys = damaged
    # batch_size=1: the steps of a corrupt sample make no batch (skip): the workers say so
    kw = dict(batch_size=1, size=32, seed=6, on_error=on_error)
    plain = stoker.ImageLoader(pack, threads=2, **kw)
    with warnings.catch_warnings(record=True) as plain_warnings:
        warnings.simplefilter("always")
        want = a_pass(plain)
    spec = ThreadWorkers(2, threads=1, name="remote", batches_in_flight=4)
    with stoker.ImageLoader(pack, threads=0, remote_workers=spec, **kw) as rw:
        with warnings.catch_warnings(record=True) as rw_warnings:
            warnings.simplefilter("always")
            got = a_pass(rw)
        assert same(got, want)
        mine, theirs = rw.stats(), plain.stats()
    assert len(got) == (102 if on_error == "replace" else 98)  # 102 samples, 4 corrupt
    for key in ("samples", "skipped", "replaced", "pass_skipped"):
        assert mine[key] == theirs[key], key
    listed = lambda s: sorted((x["key"], x["error"], x.get("substitute")) for x in s)  # noqa: E731
    assert listed(mine["skipped_samples"]) == listed(theirs["skipped_samples"])
    assert {x["key"] for x in mine["skipped_samples"]} == keys
    said = lambda ws: sorted(str(w.message) for w in ws if w.category is stoker.StokerWarning)  # noqa: E731
    assert said(rw_warnings) == said(plain_warnings)
    assert len(said(rw_warnings)) == (4 if on_error == "warn" else 0)


@pytest.mark.parametrize("on_error, max_errors", [("raise", None), ("skip", 2), ("replace", 1)])
def test_the_error_and_the_budget_trip_at_the_loaders_step(damaged, on_error, max_errors):
    pack, _ = damaged
    kw = dict(batch_size=4, size=32, seed=6, on_error=on_error, max_errors=max_errors)

    def until_error(loader):
        batches = []
        with pytest.raises(stoker.StokerError) as caught:
            for batch in loader:
                batches.append(cloned(batch))
        return batches, caught.value

    want, plain_error = until_error(stoker.ImageLoader(pack, threads=2, **kw))
    spec = ThreadWorkers(2, threads=1, name="remote")
    with stoker.ImageLoader(pack, threads=0, remote_workers=spec, **kw) as rw:
        got, error = until_error(rw)
    assert same(got, want) and len(got) < 25
    assert type(error) is type(plain_error) and str(error) == str(plain_error)
    if max_errors is not None:
        assert isinstance(error, ErrorBudgetExceededError)


def test_a_record_is_the_loaders_record(packed, tmp_path):
    kw = dict(batch_size=5, size=32, seed=8)
    a_pass(stoker.ImageLoader(packed, threads=1, record=tmp_path / "plain.jsonl", **kw))
    spec = ThreadWorkers(2, threads=1, name="remote")
    with stoker.ImageLoader(packed, threads=0, remote_workers=spec,
                            record=tmp_path / "rw.jsonl", **kw) as rw:  # fmt: skip
        a_pass(rw)
    plain, mine = (stoker.read_record(tmp_path / f) for f in ("plain.jsonl", "rw.jsonl"))
    assert mine == plain and len(mine) == len(rw)


class _Losing:
    """The dispatcher's event queue as a pool sees it, where worker `victim` is lost after its
    `after`-th result: what it made after that never arrives."""

    def __init__(self, events, victim, after):
        self.events, self.victim, self.after, self.seen, self.gone = events, victim, after, 0, False

    def put(self, event):
        if event[1] == self.victim:
            if self.gone:
                return
            if event[0] == "result":
                self.seen += 1
                if self.seen > self.after:
                    self.gone = True
                    self.events.put(("lost", self.victim, "lost in a test"))
                    return
        self.events.put(event)


class LosingWorkers(ThreadWorkers):
    def __init__(self, *args, after=3, replace=True, **kwargs):
        super().__init__(*args, **kwargs)
        self.after, self.replace = after, replace

    def open(self, recipe):
        spec = self

        class Pool(ThreadPool):
            def start(self, events):
                super().start(_Losing(events, f"{spec.name}/0", spec.after))

            def lose(self, worker):
                if spec.replace:
                    super().lose(worker)
                else:  # no machine takes its place
                    self.stopped.add(worker)
                    self.inboxes[worker].put(None)

        return Pool(self, recipe)


@pytest.mark.parametrize("after", [0, 3, 5])
def test_a_worker_lost_mid_chunk_has_its_steps_made_elsewhere(packed, after):
    kw = dict(batch_size=2, size=32, seed=3, return_index=True)
    want = a_pass(stoker.ImageLoader(packed, threads=2, **kw))
    spec = LosingWorkers(2, threads=1, name="remote", batches_in_flight=4, after=after)
    with stoker.ImageLoader(packed, threads=0, remote_workers=spec, **kw) as rw:
        ready(rw, 2)
        got = a_pass(rw)
        stats = rw.stats()["workers"]
        pool = rw._chain.find(WorkerSteps).dispatcher.pools[0]
    assert same(got, want)  # none lost, none repeated, in order
    assert stats["lost"] == 1 and stats["recomputed_steps"] >= 1
    names = {w["name"]: w for w in stats["workers"]}
    assert names["remote/0"]["lost"] == "lost in a test" and names["remote/0"]["steps"] == after
    assert pool.started == 3  # one started in its place (ready or not by the end)
    assert sum(w["steps"] for w in names.values()) == len(want)


def test_with_no_worker_left_the_steps_are_made_here(packed):
    kw = dict(batch_size=2, size=32, seed=3)
    want = a_pass(stoker.ImageLoader(packed, threads=2, **kw))
    spec = LosingWorkers(1, threads=1, name="remote", after=2, replace=False)
    spec.fallback_after = 0.2
    with stoker.ImageLoader(packed, threads=0, remote_workers=spec, **kw) as rw:
        assert same(a_pass(rw), want)
        names = [w["name"] for w in rw.stats()["workers"]["workers"]]
    assert names == ["fallback/0", "remote/0"]


def test_each_worker_holds_at_most_its_batches_in_flight(packed):
    spec = ThreadWorkers(2, threads=1, name="remote", batches_in_flight=2)
    with stoker.ImageLoader(packed, batch_size=2, size=32, threads=0, remote_workers=spec) as rw:
        ready(rw, 2)
        for _ in rw:
            time.sleep(0.02)  # a slow trainer: the workers wait for it
        made = rw.stats()["workers"]["workers"]
    assert [w["most_in_flight"] for w in made] == [2, 2]


def test_replay_pickling_and_the_options_that_do_not_go_with_workers(packed):
    spec = ThreadWorkers(1, threads=1, name="remote")
    kw = dict(batch_size=4, size=32, seed=2)
    plain = stoker.ImageLoader(packed, threads=1, **kw)
    full = a_pass(plain, 1)
    with stoker.ImageLoader(packed, threads=0, remote_workers=spec, **kw) as rw:
        assert same(cloned(rw.batch_at(1, 3)), full[3])
        assert rw.sample_ids(1, 3, 0) == plain.sample_ids(1, 3, 0)
        rw.set_epoch(1)
        it = iter(rw)
        next(it)
        copy = pickle.loads(pickle.dumps(rw))  # its arguments and position
        try:
            assert same(a_pass(copy), full[1:])
        finally:
            copy.close()
    with pytest.raises(InvalidArgumentError, match="threads"):
        stoker.ImageLoader(packed, batch_size=4, threads=0)
    with pytest.raises(InvalidArgumentError, match="resident"):
        stoker.ImageLoader(packed, batch_size=4, resident=True, remote_workers=spec)
    with pytest.raises(InvalidArgumentError, match="decode='host'"):
        stoker.ImageLoader(packed, batch_size=4, decode="gpu", remote_workers=spec)
    with pytest.raises(InvalidArgumentError, match="RayWorkers"):
        stoker.ImageLoader(packed, batch_size=4, remote_workers=3)
    with pytest.raises(InvalidArgumentError, match="count"):
        stoker.RayWorkers(0)


@pytest.mark.parametrize("stop_at", [6, 7])
def test_a_break_near_the_end_with_device_leaves_the_epoch_as_the_host_loader_does(packed, stop_at):
    """The feed pulls `device_prefetch` batches ahead but not past the pass's end (the workers'
    steps say how many are left): a `break` at the last batch but one or two leaves the epoch
    where a host loader's leaves it, and the next pass repeats that epoch."""
    kw = dict(batch_size=4, size=32, seed=5, return_index=True)

    def passes(loader):
        it = iter(loader)
        first = [next(it)[2].tolist() for _ in range(stop_at + 1)]
        del it  # the `break`
        state = loader.state_dict()
        return first, state, [b[2].tolist() for b in loader], loader.state_dict()

    host = passes(stoker.ImageLoader(packed, threads=1, **kw))
    spec = ThreadWorkers(1, threads=1, name="remote")
    with stoker.ImageLoader(packed, threads=0, remote_workers=spec, device="cpu",
                            device_prefetch=3, **kw) as rw:  # fmt: skip
        assert len(rw) == 9
        got = passes(rw)
    assert got[0] == host[0] and got[1] == host[1] and got[1]["epoch"] == 0
    assert got[2] == host[2] == host[0] + got[2][stop_at + 1:]  # epoch 0 again, from its start
    assert got[3]["epoch"] == host[3]["epoch"] == 1


def test_a_worker_that_cannot_build_the_loader_says_why(packed, tmp_path):
    class Elsewhere(ThreadWorkers):  # workers whose machine has no such pack
        def open(self, recipe):
            kwargs = dict(recipe.kwargs, path=tmp_path / "not-here")
            return super().open(dataclasses.replace(recipe, kwargs=kwargs))

    spec = Elsewhere(1, threads=1, name="remote")
    with stoker.ImageLoader(packed, batch_size=4, threads=0, remote_workers=spec) as rw:
        with pytest.raises(stoker.StokerError, match="remote/0.*not-here"):
            a_pass(rw)


def test_the_doctor_sizes_the_workers_and_the_network(packed):
    import math

    from stoker.doctor.adapters import StokerLoaderAdapter
    from stoker.doctor.experiments import _remote_workers

    spec = ThreadWorkers(2, threads=1, name="remote")
    with stoker.ImageLoader(packed, batch_size=4, size=32, threads=0, remote_workers=spec) as rw:
        ready(rw, 2)  # both make steps
        a_pass(rw)
        adapter = StokerLoaderAdapter(rw)
        made = rw.stats()["workers"]
        per_worker = sorted(w["samples_per_second"] for w in made["workers"] if w["steps"])
        batch_bytes = made["bytes"] / sum(w["steps"] for w in made["workers"])
        assert batch_bytes == 4 * 32 * 32 * 3 + 4 * 8  # the images and the labels
        step_s = 4 / (3.5 * per_worker[0])  # a step that takes 3.5 slow workers' samples
        [advice] = _remote_workers(adapter, loader_s=4 * step_s, step_s=step_s)
    median = statistics.median(per_worker)
    count = math.ceil(3.5 * per_worker[0] / median)
    assert f"stoker.RayWorkers({count}, threads=1)" in advice.text
    network = batch_bytes / step_s
    assert f"{network / 1e6:,.0f} MB/s" in advice.text and advice.gain == pytest.approx(4.0)
    assert _remote_workers(adapter, loader_s=step_s, step_s=step_s) == []  # it keeps up


class LateWorkers(ThreadWorkers):
    """Workers that are ready only after `delay` seconds (a cluster that had no room)."""

    def __init__(self, *args, delay=1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.delay = delay

    def open(self, recipe):
        spec = self

        class Pool(ThreadPool):
            def _work(self, name, inbox):
                time.sleep(spec.delay)
                super()._work(name, inbox)

        return Pool(self, recipe)


def test_the_fallback_stops_once_a_worker_is_ready_again(packed):
    kw = dict(batch_size=2, size=32, seed=3, return_index=True)
    want = a_pass(stoker.ImageLoader(packed, threads=2, **kw))
    spec = LateWorkers(1, threads=1, name="remote", batches_in_flight=2, delay=1.5)
    spec.fallback_after = 0.1
    gone = []

    def slow(loader):
        out = []
        for batch in loader:
            out.append(cloned(batch))
            made = {w["name"]: w for w in loader.stats()["workers"]["workers"]}
            if "retired" in made.get("fallback/0", {}) and not gone:
                gone.append(not [t for t in threading.enumerate()
                                 if t.name.startswith("stoker-worker-fallback")])  # fmt: skip
            if len(out) == 2:  # a slow trainer: the late worker catches up
                ready(loader, 2)
        return out

    with stoker.ImageLoader(packed, threads=0, remote_workers=spec, **kw) as rw:
        assert same(slow(rw), want)
        made = {w["name"]: w for w in rw.stats()["workers"]["workers"]}
    assert made["fallback/0"]["steps"] >= 1 and made["remote/0"]["steps"] >= 1, made
    assert made["fallback/0"]["retired"] == "a remote worker was ready again"
    assert gone == [True]  # its thread had ended before the loader closed
    assert made["fallback/0"]["steps"] + made["remote/0"]["steps"] == len(want)


def test_with_no_worker_and_no_fallback_a_step_raises_after_the_timeout(packed):
    spec = LosingWorkers(1, threads=1, name="remote", after=2, replace=False)
    spec.fallback_after, spec.timeout = None, 1.0
    with stoker.ImageLoader(packed, batch_size=2, size=32, threads=0, remote_workers=spec) as rw:
        t0 = time.monotonic()
        with pytest.raises(stoker.StokerError, match=r"step 2 not made after 1 s \(timeout=1\)"
                           r".*lost: \{'remote/0': 'lost in a test'\}.*no fallback"):  # fmt: skip
            a_pass(rw)
        assert time.monotonic() - t0 < 30


def test_a_plain_exception_of_a_worker_thread_names_it_with_its_traceback(packed, monkeypatch):
    """A failure that is not the step's own (here the worker's batch cannot be sent) ends that
    worker: the loop raises it at its batch, naming the worker, with the traceback."""
    real_run = StepWorker.run

    def run(self, chunk):
        for i, result in enumerate(real_run(self, chunk)):
            if chunk.first + i == 3:
                raise KeyError("a step that cannot be sent")
            yield result

    monkeypatch.setattr(StepWorker, "run", run)
    spec = ThreadWorkers(1, threads=1, name="remote")
    with stoker.ImageLoader(packed, batch_size=2, size=32, threads=0, remote_workers=spec) as rw:
        with pytest.raises(stoker.StokerError) as caught:
            a_pass(rw)
    text = str(caught.value)
    assert "remote worker remote/0 (this process) failed: KeyError" in text
    assert "Traceback (most recent call last)" in text and "in run" in text


def test_a_worker_closed_as_its_pass_begins_stops(packed, monkeypatch):
    """The pool's close() (or a loss) closes a worker's loader from the trainer's thread while
    the worker's thread may be starting a chunk's pass: closed there, between the engine's check
    that it is open and the pass it starts, the pass ends and the thread with it. (The pass
    started on the closed engine, whose next() never returned: close() waited out its
    JOIN_TIMEOUT_S and raised, the thread left spinning.)"""
    monkeypatch.setattr(local, "JOIN_TIMEOUT_S", 10.0)  # a thread that does not stop, sooner
    recipe = Recipe(stoker.ImageLoader, dict(path=packed, batch_size=2, size=32, seed=3))
    pool = ThreadWorkers(1, threads=1, name="remote").open(recipe)
    events: queue.SimpleQueue = queue.SimpleQueue()
    pool.start(events)
    assert events.get(timeout=60)[:2] == ("ready", "remote/0")
    with faults.hold("begin") as held:
        pool.submit("remote/0", Chunk(0, 0, 2, 0, 1, 1, 0))
        held.wait()  # the worker's engine found open, its pass not started
        pool._stop("remote/0")  # what close() does first: the worker's loader closed now
    pool.close()  # raises if the thread did not end
    assert events.empty()  # a worker told to stop says nothing more
