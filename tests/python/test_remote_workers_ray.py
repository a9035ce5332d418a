"""remote_workers=stoker.RayWorkers(...) on a real Ray cluster: a head and two worker nodes, 1 CPU
each (servers/ray_cluster.py: `ray start` three times), started by this module and stopped by
it, on the test host of a network namespace the tests make (conftest's ray_host), which this
process enters for the module: Ray's choice of an address is that host's, never the machine's
interface. The batches equal the loader's own over two epochs with a resume between them; a node
that joins mid-epoch takes work; a node whose raylet is killed, or a worker SIGKILLed, mid-epoch
has its steps made again elsewhere, and the epoch still matches; a training and a validation
loader share the connection, whichever closes first; an error of any kind reaches the loop
naming the worker, its node and the cause; the fallback in this process stops once a worker is
ready again; every acquisition Ray makes fails in turn; after close() no actor, process or
thread of the loader remains."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import make_image_folder
from test_remote_workers import ready
from test_replay import cloned, same

import stoker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from servers.ray_cluster import RayCluster  # noqa: E402

pytestmark = [
    pytest.mark.slow("a Ray cluster of its own in a network namespace, nodes started, killed and "
                     "joined: 60 s for the module on 2 cores"),
    pytest.mark.serial,  # a Ray cluster of its own: its nodes use every core
]

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster(inside_ray_host):
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_AUTH_MODE", "disabled")  # the driver's side of the cluster's setting
    mp.delenv("RAY_ADDRESS", raising=False)
    try:
        with RayCluster(head_cpus=1, netns=inside_ray_host) as c:
            c.add_node(1)
            c.add_node(1)
            yield c
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def pack(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("rw-ray")
    out = root / "pack"
    stoker.pack(make_image_folder(root / "src", per_class=20, seed=4), out, progress=False)
    return out


KW = dict(batch_size=2, size=40, seed=11, return_index=True)


def a_pass(loader, each=None):
    out = []
    for batch in loader:
        out.append(cloned(batch))
        if each is not None:
            each(loader, len(out))
    return out


def actor_processes() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any("_StepActor" in part for part in p.info["cmdline"] or ()):
            found.append(p)
    return found


def nothing_remains() -> None:
    assert not ray.is_initialized()  # the loader connected, so it disconnected
    assert not [t for t in threading.enumerate() if t.name.startswith("stoker-")]
    deadline = time.monotonic() + 30
    while actor_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert actor_processes() == []


def test_batches_over_two_epochs_and_a_resume_equal_the_loaders(cluster, pack, inside_ray_host):
    """Also: inside the namespace the only address besides loopback is the test host's, which
    the nodes and this process's connection use."""
    plain = stoker.ImageLoader(pack, threads=2, **KW)
    want = [a_pass(plain) for _ in range(2)]
    spec = stoker.RayWorkers(3, threads=1, address=cluster.address, batches_in_flight=4)
    rw = stoker.ImageLoader(pack, threads=0, remote_workers=spec, **KW)
    try:
        ready(rw, 3)
        assert ray.util.get_node_ip_address() == inside_ray_host.address
        assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {
            inside_ray_host.address}  # fmt: skip
        assert same(a_pass(rw), want[0])
        head, it = [], iter(rw)
        for batch in it:
            head.append(cloned(batch))
            if len(head) == 7:
                break
        state = rw.state_dict()
        stats = rw.stats()["workers"]
        assert len(stats["workers"]) == 3 and stats["lost"] == 0
        assert {w["name"] for w in stats["workers"] if w["steps"]} == {"ray/0", "ray/1", "ray/2"}
        assert len({w["pid"] for w in stats["workers"]}) == 3
    finally:
        rw.close()
    nothing_remains()
    resumed = stoker.ImageLoader(pack, threads=0, remote_workers=spec, **KW)
    try:
        resumed.load_state_dict(state)
        assert same(head + a_pass(resumed), want[1])
    finally:
        resumed.close()
    nothing_remains()


def test_a_node_that_joins_mid_epoch_takes_work(cluster, pack):
    want = a_pass(stoker.ImageLoader(pack, threads=2, **KW))
    # 4 workers of 1 CPU on 3 CPUs: one waits for room
    spec = stoker.RayWorkers(4, threads=1, address=cluster.address, batches_in_flight=4)
    joined = []

    def each(loader, done):
        made = {w["name"]: w["steps"] for w in loader.stats()["workers"]["workers"]}
        if done == 2:
            assert len(made) == 3
            joined.append(cluster.add_node(1))
            ready(loader, 4)  # the trainer waits for it (a loaded machine starts it slowly)
        if joined and len(made) == 4 and min(made.values()) > 0:
            return  # the fourth worker has made steps: the rest at the workers' pace
        time.sleep(0.2)  # a slow trainer, until then

    with stoker.ImageLoader(pack, threads=0, remote_workers=spec, **KW) as rw:
        ready(rw, 3)
        assert same(a_pass(rw, each), want)
        made = {w["name"]: w["steps"] for w in rw.stats()["workers"]["workers"]}
    assert len(made) == 4 and all(made.values()), made
    nothing_remains()


def test_a_node_lost_mid_epoch_has_its_steps_made_elsewhere(cluster, pack):
    want = a_pass(stoker.ImageLoader(pack, threads=2, **KW))
    spec = stoker.RayWorkers(3, threads=1, address=cluster.address, batches_in_flight=4)
    killed = []

    def each(loader, done):
        if done == 3:
            workers = loader.stats()["workers"]["workers"]
            pids = {w["pid"] for w in workers}
            for node in cluster.nodes[1:]:  # a worker node (not the head) with a worker on it
                if node.poll() is None and {c.pid for c in cluster.raylet(node).children(
                        recursive=True)} & pids:  # fmt: skip
                    cluster.kill_raylet(node)
                    killed.append(node)
                    return

    # Slow workers (0.1 s a sample), a fast trainer: every worker is always making a step, so
    # the one lost had steps on its way, which the others make again.
    with stoker.ImageLoader(pack, threads=0, remote_workers=spec, simulated_read_latency=0.1,
                            **KW) as rw:  # fmt: skip
        ready(rw, 3)
        assert same(a_pass(rw, each), want)  # none lost, none repeated, in order
        stats = rw.stats()["workers"]
    assert killed and stats["lost"] == 1 and stats["recomputed_steps"] >= 1
    assert sum(w["steps"] for w in stats["workers"]) == len(want)
    nothing_remains()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("closed_first", ["train", "val"])
def test_a_training_and_a_validation_loader_share_ray_whichever_closes_first(
    cluster, pack, closed_first
):
    """Ray not started by the user: the first loader connects, the second shares the
    connection; closing either leaves it to the other, which finishes its epoch; the last one
    closed disconnects. (At f05e42c, closing the first shut Ray down under the second, whose
    pass then never returned.)"""
    train_kw, val_kw = dict(KW, train=True), dict(KW, train=False, seed=12)
    want = {"train": a_pass(stoker.ImageLoader(pack, threads=2, **train_kw)),
            "val": a_pass(stoker.ImageLoader(pack, threads=2, **val_kw))}  # fmt: skip
    spec = stoker.RayWorkers(1, threads=1, address=cluster.address, batches_in_flight=4)
    loaders = {name: stoker.ImageLoader(pack, threads=0, remote_workers=spec, **kw)
               for name, kw in (("train", train_kw), ("val", val_kw))}  # fmt: skip
    try:
        for name in ("train", "val"):  # an epoch of each, as a training job interleaves them
            assert same(a_pass(loaders[name]), want[name]), name
        other = "val" if closed_first == "train" else "train"
        loaders[closed_first].close()
        assert ray.is_initialized()  # the other loader still uses the connection
        loaders[other].set_epoch(0)
        assert same(a_pass(loaders[other]), want[other])  # on Ray, not on the fallback
        made = loaders[other].stats()["workers"]["workers"]
        assert {w["name"] for w in made if w["steps"]} == {"ray/0"}, made
    finally:
        for loader in loaders.values():
            loader.close()
    nothing_remains()


def test_a_connection_the_user_opened_is_never_shut_down(cluster, pack):
    """Also: a batch read from Ray's object store is the loop's own memory, no tensor of it in
    the store's mapping (an in-place op never writes into Ray's objects). 160 px: a step's
    result of 150 kB goes through the store, not inline."""
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        spec = stoker.RayWorkers(1, threads=1, batches_in_flight=4)  # the connection in use
        with stoker.ImageLoader(pack, threads=0, remote_workers=spec, **dict(KW, size=160)) as rw:
            for batch in rw:
                store = _store_mappings()
                assert store, "no mapping of Ray's object store in this process"
                for t in batch:
                    assert not any(lo <= t.data_ptr() < hi for lo, hi in store)
                    t.add_(0)  # writable
            assert rw.stats()["batches"] == len(rw)
        assert ray.is_initialized()
    finally:
        ray.shutdown()
    nothing_remains()


@pytest.mark.timeout(240)
def test_a_plain_exception_in_a_reading_thread_reaches_the_loop(cluster, pack, monkeypatch):
    """A reader here failing with an error that is not Ray's (a bug, a result that cannot be
    unpickled) ends its worker's stream: the loop's next() raises a StokerError naming the
    worker, its node and the cause, with the traceback, instead of waiting for ever. (At
    f05e42c the thread ended silently, the worker still counted as alive, and the pass hung.)"""
    real_get, calls = ray.get, []

    def get(ref, *args, **kwargs):
        if sys._getframe(1).f_globals["__name__"].startswith("stoker."):  # not Ray's own gets
            calls.append(ref)
            if len(calls) == 4:  # the readiness, two steps, then this
                raise ValueError("this result cannot be read here")
        return real_get(ref, *args, **kwargs)

    monkeypatch.setattr(ray, "get", get)
    spec = stoker.RayWorkers(1, threads=1, address=cluster.address, batches_in_flight=4)
    with stoker.ImageLoader(pack, threads=0, remote_workers=spec, **KW) as rw:
        with pytest.raises(stoker.StokerError) as caught:
            a_pass(rw)
    text = str(caught.value)
    assert "remote worker ray/0 on " in text and "(pid " in text  # the worker and its node
    assert "ValueError: this result cannot be read here" in text
    assert "Traceback (most recent call last)" in text and "in get" in text
    nothing_remains()


def test_a_failure_in_the_workers_code_reaches_the_loop_with_its_traceback(cluster, pack):
    """An exception of the worker's own code (here the loader's map=) is raised at the step,
    naming the worker and its node, with the worker's traceback."""
    calls = [0]

    def fails_on_its_fifth_call(sample):  # nested: Ray ships it by value
        calls[0] += 1  # in the worker's process
        if calls[0] == 5:
            return {"image": sample["image"] * (1 // 0)}
        return {}

    spec = stoker.RayWorkers(1, threads=1, address=cluster.address)
    fields = {"image": stoker.Image(size=16), "label": stoker.Label(optional=True)}
    with stoker.Loader(pack, batch_size=2, fields=fields, threads=0, remote_workers=spec,
                       map=fails_on_its_fifth_call) as rw:  # fmt: skip
        with pytest.raises(stoker.StokerError) as caught:
            a_pass(rw)
    text = str(caught.value)
    assert "remote worker ray/0" in text and "ZeroDivisionError" in text
    assert "fails_on_its_fifth_call" in text  # the remote traceback
    nothing_remains()


@pytest.mark.timeout(240)
def test_a_worker_killed_mid_epoch_is_noticed_and_its_steps_made_again(cluster, pack):
    """SIGKILL, no word from the worker: Ray tells the reader its actor died, the worker is
    counted lost within seconds, and the steps it held are made by the others."""
    want = a_pass(stoker.ImageLoader(pack, threads=2, **KW))
    spec = stoker.RayWorkers(2, threads=1, address=cluster.address, batches_in_flight=4)
    killed: list[tuple[int, float]] = []
    noticed: list[float] = []

    def each(loader, done):
        workers = loader.stats()["workers"]
        if done == 3 and not killed:
            pid = next(w["pid"] for w in workers["workers"] if w["name"] == "ray/0")
            os.kill(pid, signal.SIGKILL)
            killed.append((pid, time.monotonic()))
        elif killed and not noticed and workers["lost"]:
            noticed.append(time.monotonic() - killed[0][1])

    # Slow samples (0.05 s each): the worker killed has steps on its way.
    with stoker.ImageLoader(pack, threads=0, remote_workers=spec, simulated_read_latency=0.05,
                            **KW) as rw:  # fmt: skip
        ready(rw, 2)
        assert same(a_pass(rw, each), want)  # none lost, none repeated, in order
        stats = rw.stats()["workers"]
    assert killed and stats["lost"] == 1 and stats["recomputed_steps"] >= 1, stats
    print(f"\nthe worker SIGKILLed was counted lost after {noticed[0]:.2f} s")
    assert noticed and noticed[0] < 15, noticed
    lost = [w for w in stats["workers"] if "lost" in w]
    assert lost[0]["pid"] == killed[0][0] and "ActorDied" in lost[0]["lost"], lost
    nothing_remains()


@pytest.mark.timeout(240)
def test_a_worker_killed_before_it_is_ready_is_replaced(cluster, pack):
    """SIGKILL while the actor builds its loader: its reader hears that the actor died before
    it was ever ready, and another is started in its place, which makes the epoch (at
    f05e42c such a loss was dropped: no worker took its place, and after fallback_after the
    steps were made in the training process)."""
    want = a_pass(stoker.ImageLoader(pack, threads=2, **KW))
    spec = stoker.RayWorkers(1, threads=1, address=cluster.address, batches_in_flight=4,
                             fallback_after=120)  # fmt: skip
    with stoker.ImageLoader(pack, threads=0, remote_workers=spec, **KW) as rw:
        deadline = time.monotonic() + 60
        while not (starting := actor_processes()) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert starting, "no actor process appeared"
        assert rw.stats()["workers"]["workers"] == []  # not ready yet
        starting[0].send_signal(signal.SIGKILL)
        assert same(a_pass(rw), want)
        stats = rw.stats()["workers"]
    made = {w["name"]: w for w in stats["workers"]}
    assert stats["lost"] == 1 and "ActorDied" in made["ray/0"]["lost"], made
    assert made["ray/1"]["steps"] == len(want)  # the replacement made them all, not a fallback
    nothing_remains()


def _store_mappings() -> list[tuple[int, int]]:
    """Address ranges of this process mapping Ray's object store (plasma's /dev/shm files)."""
    found = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and "plasma" in fields[5]:
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                found.append((lo, hi))
    return found


@pytest.mark.timeout(300)
def test_every_acquisition_of_ray_fails_in_turn_and_nothing_is_left(cluster, pack):
    """stoker.faults on Ray's own points (test_faults makes the others fail): each actor
    created and each result read, made to fail in turn in a loader's life (build, 3 batches,
    state_dict, break, a second pass, close). Either the life raises that failure, or the worker
    is counted lost, its steps made again, and the life gives the batches of a life without
    faults; nothing is left (threads, actors, their processes) and a fresh loader works."""
    from stoker import faults

    # Two workers: a lost one's steps go to the other, not to one that has yet to start.
    spec = stoker.RayWorkers(2, threads=1, address=cluster.address, batches_in_flight=2)
    kw = dict(KW, batch_size=15)  # 4 steps a pass: few reads, each life short

    def life():
        out = []
        with stoker.ImageLoader(pack, threads=0, remote_workers=spec, **kw) as rw:
            for batch in rw:
                out.append(cloned(batch))
                if len(out) == 3:
                    out.append(rw.state_dict())
                    break
            out += a_pass(rw)
        return out

    t0 = time.monotonic()
    with faults.inject() as counts:
        want = life()
    nothing_remains()
    problems, outcomes = [], {}
    for kind in ("actor", "ray_get"):
        for nth in range(1, counts.by_kind[kind] + 1):
            with faults.inject(kind, nth) as fired:
                try:
                    got: object = life()
                except Exception as e:  # noqa: BLE001
                    got = f"{type(e).__name__}: {e}"
            if isinstance(got, str):
                ok = f"injected fault: {kind} #{nth} (" in got
                outcome = "raised"
            else:
                ok, outcome = same(got, want), "recovered" if fired.fired else "not reached"
            outcomes.setdefault(kind, []).append(outcome)
            if not ok:
                problems.append(f"{kind} #{nth}: {str(got)[:300]}")
            nothing_remains()
    print(f"\nRay's points, each N: {outcomes} ({time.monotonic() - t0:.0f} s)")
    assert problems == [], problems
    assert same(life(), want)  # and a fresh loader works
    nothing_remains()


def test_a_bad_option_is_refused_before_ray_is_asked_for_anything(cluster, pack):
    """mean without std: refused before any connection, actor or thread (at f05e42c, checked
    when the last stage was built: both actors and their reading threads stayed)."""
    spec = stoker.RayWorkers(2, threads=1, address=cluster.address)
    with pytest.raises(stoker.InvalidArgumentError, match="mean and std together"):
        stoker.ImageLoader(pack, threads=0, device="cpu", mean=(0.5, 0.5, 0.5),
                           remote_workers=spec, **KW)  # fmt: skip
    nothing_remains()


@pytest.mark.timeout(120)
def test_with_no_worker_and_no_fallback_a_step_raises_after_the_timeout(cluster, pack):
    """No node has room for the actor (100 CPUs) and no fallback: the loop's next() raises
    after `timeout`, naming the step, instead of waiting for ever."""
    spec = stoker.RayWorkers(1, threads=1, address=cluster.address, num_cpus=100,
                             fallback_after=None, timeout=3)  # fmt: skip
    with stoker.ImageLoader(pack, threads=0, remote_workers=spec, **KW) as rw:
        t0 = time.monotonic()
        with pytest.raises(stoker.StokerError, match=r"step 0 not made after 3 s \(timeout=3\): "
                           r"workers ready .*: none; no fallback"):  # fmt: skip
            next(iter(rw))
        assert time.monotonic() - t0 < 20
    nothing_remains()


@pytest.mark.timeout(300)
def test_the_fallback_stops_once_a_worker_is_ready_again(cluster, pack):
    """No node has room for the actor (1.5 CPUs on nodes of 1): after fallback_after, steps
    are made in this process; a node with room joins, the actor is ready, and the fallback
    takes no new chunk and stops: the rest of the epoch is made on Ray, the batches the
    loader's own. (Last: the node it adds stays.)"""
    want = a_pass(stoker.ImageLoader(pack, threads=2, **KW))
    spec = stoker.RayWorkers(1, threads=1, address=cluster.address, num_cpus=1.5,
                             batches_in_flight=2, fallback_after=0.5)  # fmt: skip
    seen: dict[str, object] = {}

    def each(loader, done):
        made = {w["name"]: w for w in loader.stats()["workers"]["workers"]}
        if done == 2:
            assert set(made) == {"fallback/0"}  # the actor waits for room
            seen["joined"] = cluster.add_node(2)
            deadline = time.monotonic() + 120
            while "ray/0" not in made and time.monotonic() < deadline:  # a slow trainer
                time.sleep(0.2)
                made = {w["name"]: w for w in loader.stats()["workers"]["workers"]}
        if "retired" in made.get("fallback/0", {}) and "gone" not in seen:
            seen["gone"] = not [t for t in threading.enumerate()
                                if t.name.startswith("stoker-worker-fallback")]  # fmt: skip

    with stoker.ImageLoader(pack, threads=0, remote_workers=spec, **KW) as rw:
        assert same(a_pass(rw, each), want)
        made = {w["name"]: w for w in rw.stats()["workers"]["workers"]}
    assert made["fallback/0"]["steps"] >= 2 and made["ray/0"]["steps"] >= 3, made
    assert made["fallback/0"]["retired"] == "a remote worker was ready again"
    assert seen.get("gone") is True, seen  # its thread ended before the loader closed
    nothing_remains()
