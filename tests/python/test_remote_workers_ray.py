"""remote_workers=stoker.RayWorkers(...) on a real Ray cluster (issue 35, item 5): a head and two
worker nodes on loopback, 1 CPU each (servers/ray_cluster.py: `ray start` three times), started
by this module and stopped by it. The batches equal the loader's own over two epochs with a
resume between them; a node that joins mid-epoch takes work; a node whose raylet is killed
mid-epoch loses its worker, and the epoch still matches; after close() no actor, process or
thread of the loader remains."""

from __future__ import annotations

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

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_AUTH_MODE", "disabled")  # the driver's side of the cluster's setting
    mp.delenv("RAY_ADDRESS", raising=False)
    try:
        with RayCluster(head_cpus=1) as c:
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


def test_batches_over_two_epochs_and_a_resume_equal_the_loaders(cluster, pack):
    plain = stoker.ImageLoader(pack, threads=2, **KW)
    want = [a_pass(plain) for _ in range(2)]
    spec = stoker.RayWorkers(3, threads=1, address=cluster.address, batches_in_flight=4)
    rw = stoker.ImageLoader(pack, threads=0, remote_workers=spec, **KW)
    try:
        ready(rw, 3)
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
