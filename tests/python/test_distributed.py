"""Many ranks: the epoch's order does not depend on the world size, ranks get equal shares of it,
block shuffle reads few shards at a time, a state resumes at another world size, and torchrun
jobs of 2 and 4 ranks train with DistributedDataParallel to the end of every epoch."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import stoker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from servers.ports import free_port  # noqa: E402

N = 43  # samples; 5 shards of 9, 9, 9, 9, 7: neither count divides 2, 4 or 8
DDP_SCRIPT = Path(__file__).resolve().parents[1] / "distributed" / "ddp_train.py"


@pytest.fixture(scope="module")
def pack(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("distributed")
    rng = np.random.default_rng(0)
    for c, (name, count) in enumerate((("a", 15), ("b", 14), ("c", 14))):
        folder = root / "folder" / name
        folder.mkdir(parents=True)
        for i in range(count):
            pixels = rng.integers(0, 255, (80, 80, 3), dtype=np.uint8)
            pixels[..., c] = 200  # a class a model can learn
            Image.fromarray(pixels).save(folder / f"{i:03d}.jpg", quality=90)
    stoker.pack(root / "folder", root / "pack", shard_size="64KB", progress=False)
    dataset = stoker.load.loader.open_dataset(root / "pack")
    assert len(dataset) == N and dataset.num_shards == 5
    return root / "pack"


def loader(pack, **kw) -> stoker.ImageLoader:
    options = dict(batch_size=4, size=16, threads=1, return_index=True, seed=3)
    return stoker.ImageLoader(pack, **{**options, **kw})


def indices(ldr, max_batches: int | None = None) -> list[int]:
    out: list[int] = []
    for b, (_, _, idx) in enumerate(ldr):
        out += idx.tolist()
        if max_batches is not None and b + 1 == max_batches:
            break
    return out


def shard_of(pack) -> list[str]:
    dataset = stoker.load.loader.open_dataset(pack)
    return [dataset.record(i)["shard"] for i in range(len(dataset))]


def test_shuffle_argument(pack):
    assert loader(pack).shuffle == "global"  # train=True
    assert loader(pack, shuffle=True).shuffle == "global"
    assert loader(pack, train=False).shuffle is False
    assert loader(pack, shuffle="block").shuffle == "block"
    assert indices(loader(pack, shuffle=False)) == list(range(N))
    assert indices(loader(pack, shuffle=True)) == indices(loader(pack, shuffle="global"))
    for bad in ("random", 1):
        with pytest.raises(stoker.InvalidArgumentError, match="shuffle"):
            loader(pack, shuffle=bad)
    for bad in (0, -2, True):
        with pytest.raises(stoker.InvalidArgumentError, match="shuffle_window"):
            loader(pack, shuffle="block", shuffle_window=bad)


@pytest.mark.parametrize("shuffle", ["global", "block"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_share_one_order_whatever_the_world_size(pack, shuffle, drop_last):
    """Rank r of W takes positions r, r + W, ... of one order G: rebuilt from the ranks, G is the
    same for every W; every rank gets the same number of batches; the ranks together take G,
    padded by wrapping to its start (or cut with drop_last)."""
    g = indices(loader(pack, shuffle=shuffle, shuffle_window=2, batch_size=1))
    assert sorted(g) == list(range(N))
    for world in range(1, 9):
        ranks = [
            loader(
                pack,
                shuffle=shuffle,
                shuffle_window=2,
                rank=r,
                world_size=world,
                drop_last=drop_last,
            )
            for r in range(world)
        ]
        assert len({len(ldr) for ldr in ranks}) == 1
        seen = [indices(ldr) for ldr in ranks]
        per_rank = len(seen[0])
        assert all(len(s) == per_rank for s in seen), (world, [len(s) for s in seen])
        rebuilt = [seen[p % world][p // world] for p in range(per_rank * world)]
        if drop_last:  # (N // W) per rank, then whole batches of 4
            assert per_rank == N // world // 4 * 4
            assert rebuilt == g[: per_rank * world]
        else:
            assert per_rank == -(-N // world)
            assert rebuilt == g + g[: per_rank * world - N]  # the padding: G's first positions


@pytest.mark.parametrize("window", [1, 2, 3])
def test_block_shuffle_has_at_most_window_shards_open(pack, window):
    """At any point of a block-shuffled epoch, the shards begun and not yet finished number at
    most shuffle_window: each window's shards are finished before the next window starts."""
    shards = shard_of(pack)
    sizes = collections.Counter(shards)

    def most_open(order: list[int]) -> int:
        left, most = dict(sizes), 0
        started: set[str] = set()
        for i in order:
            started.add(shards[i])
            left[shards[i]] -= 1
            most = max(most, sum(1 for s in started if left[s] > 0))
        return most

    for epoch in range(3):
        ldr = loader(pack, shuffle="block", shuffle_window=window)
        ldr.set_epoch(epoch)
        order = indices(ldr)
        assert sorted(order) == list(range(N))
        assert most_open(order) <= window
        if window > 1:
            assert order != sorted(order, key=lambda i: (shards[i], i))  # mixed within windows
    glob = loader(pack, shuffle="global")
    assert most_open(indices(glob)) > 3  # the measure tells the two apart


def test_block_shuffle_same_batches_whatever_the_threads(pack):
    def run(threads):
        ldr = loader(pack, shuffle="block", shuffle_window=2, threads=threads)
        return [(img.clone(), idx.clone()) for img, _, idx in ldr]

    one, three = run(1), run(3)
    assert len(one) == len(three) == 11
    for (a, ia), (b, ib) in zip(one, three, strict=True):
        assert torch.equal(ia, ib) and torch.equal(a, b)


@pytest.mark.parametrize("shuffle", ["global", "block"])
@pytest.mark.parametrize("after", [2, 4, 8])
def test_elastic_resume(pack, shuffle, after):
    """A state taken mid-epoch on 4 ranks resumes on 2, 4 or 8: every sample of the epoch is
    handed out once, the rest of the epoch split evenly across the new ranks (their padding
    apart), and the new ranks take the global order's positions where the old ones stopped."""
    kw = dict(shuffle=shuffle, shuffle_window=2)
    g = indices(loader(pack, **kw, batch_size=1))
    before = [loader(pack, **kw, batch_size=2, rank=r, world_size=4) for r in range(4)]
    seen: list[int] = []
    states = []
    for ldr in before:
        ldr.set_epoch(0)
        it = iter(ldr)
        for _ in range(3):
            seen += next(it)[2].tolist()
        states.append(ldr.state_dict())
        del it
    consumed = 3 * 2 * 4
    assert {s["samples_consumed"] for s in states} == {consumed}
    assert sorted(seen) == sorted(g[:consumed])
    state = states[0]
    assert state["version"] == 2 and state["world_size"] == 4 and state["batches_done"] == 3
    rest = []
    for r in range(after):
        ldr = loader(pack, **kw, batch_size=2, rank=r, world_size=after)
        ldr.load_state_dict(state)
        assert ldr.state_dict()["samples_consumed"] == consumed
        rest.append(indices(ldr))
        assert ldr.state_dict()["epoch"] == 1  # the resumed pass finished the epoch
    per_rank = -(-(N - consumed) // after)
    assert [len(r) for r in rest] == [per_rank] * after
    rebuilt = [rest[p % after][p // after] for p in range(per_rank * after)]
    remaining = g[consumed:]
    assert rebuilt == remaining + g[: per_rank * after - len(remaining)]  # padding: G's start
    assert sorted(seen + rebuilt[: len(remaining)]) == list(range(N))  # none lost or repeated


def test_state_of_version_1_resumes(pack):
    """States written before samples_consumed (version 1: this rank's batches_done at its world
    size) still resume, at that world size exactly where they were, and at another."""
    kw = dict(shuffle=True, batch_size=4)
    full = [indices(loader(pack, **kw, rank=r, world_size=2)) for r in range(2)]
    old = {
        "version": 1,
        "epoch": 0,
        "batches_done": 3,
        "seed": 3,
        "num_samples": N,
        "batch_size": 4,
        "rank": 0,
        "world_size": 2,
        "shuffle": True,
    }
    for r in range(2):
        ldr = loader(pack, **kw, rank=r, world_size=2)
        ldr.load_state_dict(dict(old, rank=r))
        assert indices(ldr) == full[r][12:]
    ldr = loader(pack, **kw, rank=0, world_size=1)
    ldr.load_state_dict(old)
    assert ldr.state_dict()["samples_consumed"] == 24
    assert sorted(indices(ldr) + full[0][:12] + full[1][:12]) == list(range(N))
    with pytest.raises(stoker.InvalidArgumentError, match="shuffle"):
        loader(pack, shuffle="block").load_state_dict(old)
    with pytest.raises(stoker.InvalidArgumentError, match="version"):
        loader(pack).load_state_dict(dict(old, version=7))


@pytest.mark.parametrize(("nproc", "drop_last"), [(2, True), (4, False)])
@pytest.mark.slow("torchrun starts 2 and 4 training processes, each importing torch: 4-7 s")
@pytest.mark.serial  # its ranks use every core and wait on one another
def test_torchrun_ddp_training_ends_every_epoch_on_every_rank(pack, tmp_path, nproc, drop_last):
    """torchrun, gloo, real DistributedDataParallel, two epochs, block shuffle, 43 samples in 5
    shards: every rank gets the same number of batches (a rank short of one would leave the
    others waiting in backward's all-reduce: the timeout fails the test instead of hanging it),
    and the ranks together see the whole epoch (padded as DistributedSampler, or cut)."""
    out = tmp_path / "out"
    out.mkdir()
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
        "--nnodes=1", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        str(DDP_SCRIPT), str(pack), str(out), "--epochs=2", "--batch-size=4",
        "--shuffle=block", "--shuffle-window=2", *(["--drop-last"] if drop_last else []),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    job = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its own process group: a hang is killed whole
    )  # fmt: skip
    try:
        output, _ = job.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        output, _ = job.communicate()
        pytest.fail(f"torchrun with {nproc} ranks did not finish in 120 s:\n{output[-4000:]}")
    assert job.returncode == 0, output[-4000:]
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(nproc)]
    per_rank = N // nproc // 4 * 4 if drop_last else -(-N // nproc)
    batches = per_rank // 4 if drop_last else -(-per_rank // 4)
    for r, got in enumerate(ranks):
        assert got["world"] == nproc and got["len"] == batches
        assert got["batches"] == [batches, batches], (r, got["batches"])
        assert got["state"]["samples_consumed"] == 2 * 4 * nproc
    for epoch in range(2):
        seen = [got["seen"][epoch] for got in ranks]
        assert all(len(s) == per_rank for s in seen)
        together = collections.Counter(i for s in seen for i in s)
        if drop_last:
            assert len(together) == per_rank * nproc and max(together.values()) == 1
        else:
            assert sorted(together) == list(range(N))
            assert sum(together.values()) - N == per_rank * nproc - N  # padding only
        # Each rank saw what the same loader gives in this process for its rank.
        for r in range(nproc):
            ldr = loader(pack, seed=7, shuffle="block", shuffle_window=2, rank=r,
                         world_size=nproc, drop_last=drop_last)  # fmt: skip
            ldr.set_epoch(epoch)
            assert indices(ldr) == seen[r]
    assert ranks[0]["seen"][0] != ranks[0]["seen"][1]  # epochs differ
