"""Nothing leaked, nothing left (issue 26, item 4): loaders created, iterated part-way,
abandoned or closed by the thousand leave threads, file descriptors, anonymous memory and
page-locked slots where they were, and remote ones their cache folder within its limit with no
download left over; a process killed with SIGKILL in the middle of an epoch, or of a download,
leaves nothing the next run trips over or that grows run after run."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import stoker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from servers.nginx import NGINX, Nginx  # noqa: E402

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

needs_nginx = pytest.mark.skipif(not os.path.exists(NGINX), reason="nginx is not installed")


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def anon_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon")


def churn(make, count: int) -> None:
    """`count` loaders: each iterated one batch in, then closed, abandoned mid-pass without a
    close (left to the garbage collector), or run to the end of its epoch, in turn."""
    for k in range(count):
        loader = make()
        it = iter(loader)
        next(it)
        if k % 3 == 0:
            loader.close()
        elif k % 3 == 2:
            for _ in it:
                pass
        del loader, it


@pytest.mark.slow("1,070 loaders made and dropped, 4-8 ms each, to bound what each leaves: 4 s")
def test_a_thousand_loaders_leave_nothing_behind(packed, monkeypatch):
    from test_device import LateBackend

    from stoker import device as device_module

    def host():
        return stoker.ImageLoader(packed, batch_size=4, size=16, threads=2, prefetch=2)

    def fed():  # the device feed, with torch's CPU standing in for a GPU
        return stoker.ImageLoader(packed, batch_size=4, size=16, threads=1, device="cpu")

    pinning = LateBackend(polls=2)  # a stand-in GPU whose page-locking is bookkeeping

    def pinned():
        with monkeypatch.context() as m:
            m.setattr(device_module, "device_backend", lambda device: pinning)
            return stoker.ImageLoader(packed, batch_size=4, size=16, threads=1, device="cuda")

    churn(host, 30)  # warm: the allocator's arenas, torch's thread pools, lazy imports
    churn(fed, 30)
    churn(pinned, 10)
    gc.collect()
    base_threads, base_fds, base_anon = threads(), fds(), anon_mb()
    t0 = time.perf_counter()
    churn(host, 600)
    churn(fed, 300)
    churn(pinned, 100)
    gc.collect()
    elapsed = time.perf_counter() - t0
    assert pinning.pin_calls >= 100 and pinning.pinned == {}  # every page-locked slot released
    assert threads() == base_threads
    assert fds() == base_fds
    grown = anon_mb() - base_anon
    if "libasan" not in os.environ.get("LD_PRELOAD", ""):  # ASan's quarantine keeps freed memory
        assert grown < 40, f"anonymous memory grew {grown:.0f} MB over 1,000 loaders"
    assert not stoker.load.loader._open_loaders  # every loader closed, by close() or collection
    print(f"\n1,000 loaders in {elapsed:.1f} s; anonymous memory {grown:+.1f} MB")


def test_loaders_in_forked_dataloader_workers_leave_nothing(packed):
    class Wrapped(torch.utils.data.IterableDataset):
        def __init__(self, loader):
            self.loader = loader

        def __iter__(self):
            for images, _ in self.loader:
                yield images.shape[0]

    gc.collect()
    base_threads, base_fds = threads(), fds()
    for _ in range(5):
        loader = stoker.ImageLoader(packed, batch_size=6, size=16, threads=1)
        next(iter(loader))
        dl = torch.utils.data.DataLoader(Wrapped(loader), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")  # fmt: skip
        assert sum(dl) == 72
        loader.close()
        del loader, dl
    gc.collect()
    # A DataLoader's shutdown closes its index queues without joining their feeder threads,
    # which end a moment later: wait for them (a leaked thread or descriptor stays for good).
    deadline = time.monotonic() + 10
    while (threads() > base_threads or fds() > base_fds) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threads() <= base_threads and fds() <= base_fds


KILLED = textwrap.dedent(
    """
    import sys, time
    import stoker
    loader = stoker.ImageLoader(sys.argv[1], batch_size=4, size=16, threads=2, on_error="skip",
                                quarantine=sys.argv[2])
    for epoch in range(1000):
        loader.set_epoch(epoch)
        for images, labels in loader:
            print("batch", flush=True)
            time.sleep(0.01)
    """
)


def test_a_process_killed_mid_epoch_leaves_nothing_in_the_way(packed, tmp_path):
    report = tmp_path / "bad.json"
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(packed), str(report)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    for _ in range(5):  # mid-epoch, workers decoding
        assert proc.stdout.readline().startswith("batch")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert after <= before  # no shared memory left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no partial report, no lock
    # the next run over the same pack and report path starts and finishes as if nothing happened
    loader = stoker.ImageLoader(packed, batch_size=4, size=16, on_error="skip", quarantine=report)
    assert sum(len(x) for x, _ in loader) == 36
    loader.close()
    assert report.exists()


# --- remote packs: a cache folder churned by loaders, and downloads killed half-way ---------------
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A pack of 48 JPEGs in ~8 shards under www/pack (nginx serves www)."""
    root = tmp_path_factory.mktemp("served")
    rng = np.random.default_rng(0)
    for c in range(2):
        (root / "src" / f"c{c}").mkdir(parents=True)
        for i in range(24):
            noise = rng.integers(0, 255, (120, 150, 3), dtype=np.uint8)
            Image.fromarray(noise).save(root / "src" / f"c{c}" / f"{i}.jpg", quality=90)
    stoker.pack(root / "src", root / "www" / "pack", shard_size=64 * 1024, progress=False)
    return root


def cache_files(folder: Path) -> dict[str, list[str]]:
    names = sorted(p.name for p in folder.iterdir())
    return {
        "parts": [n for n in names if ".part-" in n],
        "shards": [n for n in names if n.endswith(".tar")],
        "other": [n for n in names if ".part-" not in n and not n.endswith(".tar")],
    }


def shard_bytes(pack: Path) -> list[int]:
    return [p.stat().st_size for p in sorted(pack.glob("*.tar"))]


@needs_nginx
def test_remote_loaders_by_the_dozen_keep_their_cache_in_bounds_and_leave_nothing(
    served, tmp_path
):
    # 60 loaders, 20 closed, 20 abandoned and 20 run out, each fetching ~17 shards: a loader
    # that leaks a descriptor or a thread shows at once, one that leaves a part or overfills the
    # cache is among a thousand downloads (150 loaders took 6 s and caught no more).
    sizes = shard_bytes(served / "www" / "pack")
    limit = 3 * max(sizes)  # under half the pack: every pass evicts and fetches again
    cache = tmp_path / "cache"
    with Nginx(served / "www", tmp_path / "nginx") as server:
        url = f"{server.url}/pack"

        def remote():
            return stoker.ImageLoader(url, batch_size=4, size=16, threads=1, shuffle="global",
                                      cache_dir=cache, cache_limit=limit)  # fmt: skip

        churn(remote, 10)
        gc.collect()
        base_threads, base_fds = threads(), fds()
        folder = next(cache.iterdir())
        before = cache_files(folder)["other"]
        t0 = time.perf_counter()
        churn(remote, 60)
        gc.collect()
        elapsed = time.perf_counter() - t0
        assert threads() == base_threads
        assert fds() == base_fds
        files = cache_files(folder)
        assert files["parts"] == []  # no download left over
        assert sum((folder / n).stat().st_size for n in files["shards"]) <= limit
        assert files["other"] == before  # locks, keep files, indexes: the same set, not growing
        fetched = [r for r in server.requests() if r.startswith("GET") and ".tar" in r]
    assert not stoker.load.loader._open_loaders
    print(f"\n60 remote loaders in {elapsed:.1f} s, {len(fetched)} shard downloads")


KILLED_DOWNLOADING = textwrap.dedent(
    """
    import sys
    import stoker
    loader = stoker.ImageLoader(sys.argv[1], cache_dir=sys.argv[2], cache_limit=int(sys.argv[3]),
                                batch_size=4, size=16, threads=1)
    for images, labels in loader:
        print("batch", flush=True)
    """
)


@needs_nginx
@pytest.mark.slow("child processes killed mid-download, nginx restarted, a full pass: 4 s")
def test_processes_killed_mid_download_leave_nothing_that_grows(served, tmp_path):
    pack = served / "www" / "pack"
    sizes = shard_bytes(pack)
    limit = 3 * max(sizes)
    cache = tmp_path / "cache"
    server = Nginx(served / "www", tmp_path / "nginx", rate=16 * 1024)  # a shard takes ~3 s
    server.start()
    try:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        # Killed twice, each mid-download: the second child opens a cache holding the first's
        # dead part, the case every later run repeats (a third kill took 1 s more, caught no more).
        for _ in range(2):
            proc = subprocess.Popen(
                [sys.executable, "-c", KILLED_DOWNLOADING, f"{server.url}/pack", str(cache),
                 str(limit)],
                stdout=subprocess.DEVNULL, env=env,
            )  # fmt: skip
            deadline = time.monotonic() + 60
            parts: list[str] = []
            while not parts and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.05)
                if cache.exists():  # this child's download (those killed before stay)
                    parts = [p.name for f in cache.iterdir() for p in f.iterdir()
                             if f".part-{proc.pid}-" in p.name]  # fmt: skip
            assert parts, "the child never started a download"
            time.sleep(0.3)  # into the download
            # Another process opening the cache meanwhile leaves a live download alone.
            folder = next(cache.iterdir())
            live = [p for p in folder.iterdir() if f".part-{proc.pid}-" in p.name]
            stoker.ImageLoader(f"{server.url}/pack", cache_dir=cache, cache_limit=limit,
                               batch_size=4, size=16).close()  # fmt: skip
            assert proc.poll() is None and all(p.exists() for p in live)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        folder = next(cache.iterdir())
        assert cache_files(folder)["parts"], "a killed download leaves its part behind"
        server.stop()
        server.rate = None
        server.start()
        # The next run: opening the cache deletes the dead parts (they counted against the limit
        # at their full size), and the pass gives the local pack's batches within the limit.
        loader = stoker.ImageLoader(f"{server.url}/pack", cache_dir=cache, cache_limit=limit,
                                    batch_size=4, size=16, threads=1, shuffle="global")  # fmt: skip
        assert cache_files(folder)["parts"] == []
        local = stoker.ImageLoader(pack, batch_size=4, size=16, threads=1, shuffle="global")
        for (a, ya), (b, yb) in zip(loader, local, strict=True):
            assert torch.equal(a, b) and torch.equal(ya, yb)
        assert loader.stats()["remote"]["cache_bytes"] <= limit
        loader.close()
        local.close()
        files = cache_files(folder)
        assert files["parts"] == []
        # per shard its index, the index's lock, the shard's lock and keep file; then the manifest
        assert len(files["other"]) <= 4 * len(sizes) + 8
    finally:
        server.stop()


def test_only_downloads_in_progress_are_taken_for_parts():
    from stoker.remote.cache import _part_of

    assert _part_of("shard-000001.tar.part-12-3456") == "shard-000001.tar"
    assert _part_of("manifest.json.part-77") == "manifest.json"
    assert _part_of("laion.part-00001.tar") is None  # a shard of that name
    assert _part_of("laion.part-00001.tar.part-5-6") == "laion.part-00001.tar"
    assert _part_of("x.part-1.idx") is None
