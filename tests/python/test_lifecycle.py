"""Nothing leaked, nothing left (issue 26, item 4): loaders created, iterated part-way,
abandoned or closed by the thousand leave threads, file descriptors, anonymous memory and
page-locked slots where they were; a process killed with SIGKILL in the middle of an epoch
leaves nothing the next run trips over."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import torch

import stoker


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


def test_a_thousand_loaders_leave_nothing_behind(packed):
    def host():
        return stoker.ImageLoader(packed, batch_size=4, size=16, threads=2, prefetch=2)

    def fed():  # the device feed, with torch's CPU standing in for a GPU
        return stoker.ImageLoader(packed, batch_size=4, size=16, threads=1, device="cpu")

    churn(host, 30)  # warm: the allocator's arenas, torch's thread pools, lazy imports
    churn(fed, 30)
    gc.collect()
    base_threads, base_fds, base_anon = threads(), fds(), anon_mb()
    t0 = time.perf_counter()
    churn(host, 700)
    churn(fed, 300)
    gc.collect()
    elapsed = time.perf_counter() - t0
    assert threads() == base_threads
    assert fds() == base_fds
    grown = anon_mb() - base_anon
    if "libasan" not in os.environ.get("LD_PRELOAD", ""):  # ASan's quarantine keeps freed memory
        assert grown < 40, f"anonymous memory grew {grown:.0f} MB over 1,000 loaders"
    assert not stoker.loader._open_loaders  # every loader closed, by close() or collection
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
