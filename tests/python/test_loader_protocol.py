"""What trainers expect of a loader beyond iterating it (docs/INTEGRATIONS.md): ranks resolved
when each pass starts, not when the loader is built; `loader.sampler.set_epoch`; and pickling to
the loader's arguments and position, in this process or a spawned one."""

from __future__ import annotations

import multiprocessing
import pickle

import pytest
import torch

import stoker
from stoker.load.loader import resolve_ranks

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it


def loader(packed, **kw) -> stoker.ImageLoader:
    options = dict(batch_size=4, size=16, threads=2, seed=9, return_index=True)
    return stoker.ImageLoader(packed, **{**options, **kw})


def fields_loader(packed, **kw) -> stoker.Loader:
    fields = {"image": stoker.Image("jpg;png", size=16), "label": stoker.Label("cls")}
    return stoker.Loader(packed, batch_size=5, fields=fields, threads=2, seed=4, **kw)


def batches(iterable) -> list:
    """Each batch's tensors, cloned (a stoker batch is a lease on a reused slot)."""
    out = []
    for batch in iterable:
        values = batch.values() if isinstance(batch, dict) else batch
        out.append([v.clone() for v in values])
    return out


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        len(x) == len(y) and all(torch.equal(u, v) for u, v in zip(x, y)) for x, y in zip(a, b)
    )


@pytest.fixture
def no_launcher(monkeypatch):
    """No process group and none of a launcher's variables: ranks come from what a test sets."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert not (torch.distributed.is_available() and torch.distributed.is_initialized())
    return monkeypatch


# --- ranks: resolved when a pass starts -----------------------------------------------------------
def test_a_loader_built_before_the_launcher_set_its_ranks_takes_them_at_the_pass(
    packed, no_launcher
):
    early = loader(packed)  # built at the top of the script, as Lightning's docs build theirs
    assert (early.rank, early.world_size) == (0, 1) and len(early) == 9  # 36 samples
    whole = [i for _, _, idx in early for i in idx.tolist()]
    for rank in (0, 1):
        # Lightning's launcher gives rank 1 WORLD_SIZE and LOCAL_RANK but no RANK.
        no_launcher.setenv("WORLD_SIZE", "2")
        no_launcher.setenv("LOCAL_RANK", str(rank))
        assert len(early) == 5  # the job's ranks now: 18 samples each, in batches of 4
        assert (early.rank, early.world_size) == (rank, 2)
        early.set_epoch(0)
        seen = [i for _, _, idx in early for i in idx.tolist()]
        built_late = loader(packed)  # what a loader built now would give: the same
        assert seen == [i for _, _, idx in built_late for i in idx.tolist()]
        assert seen == whole[rank::2]  # this rank's share of the same epoch order
        assert early.state_dict()["world_size"] == 2


def test_given_ranks_are_kept_and_the_others_resolved(packed, no_launcher):
    no_launcher.setenv("RANK", "1")
    no_launcher.setenv("WORLD_SIZE", "3")
    assert resolve_ranks(None, None) == (1, 3)
    assert resolve_ranks(0, None) == (0, 3)
    assert resolve_ranks(0, 1) == (0, 1)
    fixed = loader(packed, rank=0, world_size=1)  # e.g. validation on one rank
    assert (fixed.rank, fixed.world_size, len(fixed)) == (0, 1, 9)
    with pytest.raises(stoker.InvalidArgumentError, match="rank"):
        list(loader(packed, rank=3))  # of WORLD_SIZE=3


def test_a_rank_the_environment_cannot_tell_is_refused_at_the_pass_not_at_build(
    packed, no_launcher
):
    # A second node of a launcher that sets no RANK: its LOCAL_RANK is not its rank.
    no_launcher.setenv("WORLD_SIZE", "4")
    no_launcher.setenv("LOCAL_RANK", "1")
    no_launcher.setenv("NODE_RANK", "1")
    ldr = loader(packed)  # built at the top of a script: fine
    assert len(ldr) == 3  # counts need only the world size
    with pytest.raises(stoker.InvalidArgumentError, match="no RANK"):
        iter(ldr)


def test_lightning_reaches_set_epoch_through_the_sampler(packed):
    from lightning.fabric.utilities.data import _set_sampler_epoch

    ldr = loader(packed)
    stopped = loader(packed)
    for epoch in range(3):
        _set_sampler_epoch(stopped, epoch)  # what Lightning does at every epoch's start
        first = next(iter(stopped))[2]  # then stops the pass (limit_train_batches)
        ldr.set_epoch(epoch)
        assert torch.equal(first, next(iter(ldr))[2])
    assert stopped.sampler is not None and stoker.mix([ldr], [1]).sampler is not None


# --- pickling --------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [loader, fields_loader], ids=["ImageLoader", "Loader"])
def test_a_pickled_loader_gives_the_same_batches_from_the_same_position(packed, make):
    original = make(packed)
    fresh = pickle.loads(pickle.dumps(original))
    assert same(batches(fresh), batches(make(packed)))

    # Mid-pass: the copy continues where the original stands.
    it = iter(original)
    for _ in range(3):
        next(it)
    copy = pickle.loads(pickle.dumps(original))
    assert type(copy) is type(original)
    rest = batches(it)
    assert len(rest) == len(original) - 3 and same(batches(copy), rest)

    # Between passes: the next epoch.
    copy = pickle.loads(pickle.dumps(original))
    assert same(batches(copy), batches(original))


def test_a_pickle_holds_arguments_and_position_not_threads_or_buffers(packed):
    ldr = loader(packed, threads=2)
    next(iter(ldr))
    data = pickle.dumps(ldr)
    assert len(data) < 4096  # a few arguments and a state, not a batch slot
    copy = pickle.loads(data)
    assert copy._engine is not ldr._engine and copy.state_dict() == ldr.state_dict()
    ldr.close()
    assert next(iter(copy))[0].shape == (4, 3, 16, 16)  # its own engine, open
    copy.close()


def test_a_pickled_loader_with_a_host_device_feed_resumes_after_the_batches_handed_out(packed):
    # device="cpu": the feed's path with nothing to copy; its state excludes batches in flight.
    ldr = loader(packed, device="cpu", dtype=torch.float32, device_prefetch=2)
    it = iter(ldr)
    head = batches([next(it) for _ in range(2)])
    copy = pickle.loads(pickle.dumps(ldr))
    whole = batches(loader(packed, device="cpu", dtype=torch.float32))
    assert same(head + batches(copy), whole)


def test_a_pickled_mix_and_to_device_continue_where_they_stand(packed):
    def make():
        return stoker.mix([loader(packed), loader(packed, seed=2)], weights=[0.5, 0.5], seed=1)

    mixed = make()
    it = iter(mixed)
    head = batches([next(it) for _ in range(4)])
    copy = pickle.loads(pickle.dumps(mixed))
    assert same(head + batches(copy), batches(make()))

    feed = stoker.to_device(loader(packed), "cpu", dtype=torch.float32)
    it = iter(feed)
    head = batches([next(it) for _ in range(2)])
    copy = pickle.loads(pickle.dumps(feed))
    whole = batches(stoker.to_device(loader(packed), "cpu", dtype=torch.float32))
    assert same(head + batches(copy), whole)


def _spawned_rest(pickled: bytes, queue) -> None:
    ldr = pickle.loads(pickled)
    queue.put([idx.tolist() for _, _, idx in ldr])


def test_a_loader_crosses_into_a_spawned_process(packed):
    """What ddp_spawn, torch.multiprocessing.spawn and a notebook's launcher do with it."""
    original = loader(packed)
    it = iter(original)
    next(it)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_spawned_rest, args=(pickle.dumps(original), queue))
    child.start()
    try:
        rest = queue.get(timeout=120)
    finally:
        child.join(timeout=60)
    assert child.exitcode == 0
    assert rest == [idx.tolist() for _, _, idx in it]
