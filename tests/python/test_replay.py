"""Replay (issue 26, item 1, for Loader, ImageLoader and TokenLoader): loader.sample_ids(epoch,
step) computes which samples a step hands each rank without reading them, and
loader.batch_at(epoch, step) gives that step's batch bit for bit as an uninterrupted pass gave
it (crops, flips and augmentation keyed the same), at any rank of 1, 2 or 4."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import stoker
import stoker.augment as A

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def cloned(batch):
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, dict):
        return {k: cloned(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(cloned(v) for v in batch)
    return batch


def a_pass(loader, epoch):
    loader.set_epoch(epoch)
    return [cloned(b) for b in loader]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_image_loader_steps_replay_bit_for_bit(packed, world_size):
    recipe = [A.TimmRandAugment.from_config("rand-m9-mstd0.5"), A.RandomErasing(0.5),
              A.MixUp(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=3)]  # fmt: skip
    for rank in range(world_size):
        make = lambda rank=rank: stoker.ImageLoader(  # noqa: E731
            packed,
            batch_size=4,
            size=40,
            seed=9,
            rank=rank,
            world_size=world_size,
            threads=2,
            augment=recipe,
            return_index=True,
        )
        loader = make()
        full = a_pass(loader, 3)
        assert len(full) == len(loader) >= 2
        for step in (len(full) - 1, 0, len(full) // 2):  # in any order
            assert same(cloned(make().batch_at(3, step)), full[step])
            ids = loader.sample_ids(3, step, rank)
            assert [s["index"] for s in ids] == full[step][2].tolist()
        with pytest.raises(IndexError, match=f"epoch 3 has {len(full)} steps"):
            loader.batch_at(3, len(full))
        with pytest.raises(stoker.StepOutOfRangeError, match=f"epoch 3 has {len(full)} steps"):
            loader.sample_ids(3, len(full), rank)


def test_sample_ids_of_every_rank_name_shard_and_key(packed):
    loader = stoker.ImageLoader(packed, batch_size=5, rank=0, world_size=2, seed=1)
    ids = loader.sample_ids(0, 1)
    assert set(ids) == {0, 1} and all(len(v) == 5 for v in ids.values())
    ds = stoker.load.loader.open_dataset(packed)
    for sample in ids[0] + ids[1]:
        record = ds.record(sample["index"])
        assert (sample["shard"], sample["key"]) == (record["shard"], record["key"])
    assert not {s["index"] for s in ids[0]} & {s["index"] for s in ids[1]}  # disjoint ranks


def test_a_loader_of_fields_replays(packed):
    fields = {"image": stoker.Image(size=32, geometry=stoker.RandomCrop(32, padding=4),
                                    hflip=0.5, vflip=0.5, return_params=True),
              "label": stoker.Label(optional=True)}  # fmt: skip
    loader = stoker.Loader(packed, batch_size=7, fields=fields, seed=4, train=True)
    full = a_pass(loader, 1)
    assert len(full) == 6  # 36 samples, 7 a batch: every step is replayed, not none
    for step in range(len(full)):
        assert same(cloned(loader.batch_at(1, step)), full[step])


def test_skipped_samples_replay_as_the_pass_had_them(tmp_path, image_folder):
    """A sample that fails to decode is skipped in the pass and in the replayed step alike (the
    step's batch one shorter); sample_ids still names it (it was that step's sample)."""
    pack = tmp_path / "pack"
    stoker.pack(image_folder, pack, progress=False)
    ds = stoker.load.loader.open_dataset(pack)
    bad = 7
    record = ds.record(bad)
    with open(pack / record["shard"], "r+b") as shard:  # the JPEG's data cut short
        shard.seek(record["offset"] + 200)
        shard.write(b"\xff\xd9" + bytes(record["size"] - 202))
    loader = stoker.ImageLoader(pack, batch_size=6, size=32, on_error="skip", return_index=True)
    full = a_pass(loader, 0)
    assert loader.stats()["skipped"] == 1
    short = [s for s, b in enumerate(full) if len(b[0]) == 5]
    assert len(short) == 1
    for step in range(len(full)):
        assert same(cloned(loader.batch_at(0, step)), full[step])
    assert bad in [s["index"] for s in loader.sample_ids(0, short[0], 0)]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_token_loader_replays(tmp_path, world_size):
    rng = np.random.default_rng(0)
    documents = [rng.integers(1, 500, int(rng.integers(3, 40))).astype(np.uint16)
                 for _ in range(200)]  # fmt: skip
    pack = tmp_path / "tokens"
    stoker.pack_tokens(documents, pack, eos_id=0, shard_size="2KB", progress=False)
    for rank in range(world_size):
        loader = stoker.TokenLoader(pack, seq_len=16, batch_size=8, seed=3, rank=rank,
                                    world_size=world_size)  # fmt: skip
        full = a_pass(loader, 2)
        assert len(full) >= 3
        for step in range(len(full)):
            assert same(cloned(loader.batch_at(2, step)), full[step])
            assert len(loader.sample_ids(2, step, rank)) == len(full[step][0])


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("resident", [False, True])
def test_an_array_loader_replays(tmp_path_factory, world_size, resident):
    rng = np.random.default_rng(1)
    n = 150
    data = {"image": rng.integers(0, 256, (n, 20, 20, 3), dtype=np.uint8),
            "label": rng.integers(0, 10, n).astype(np.int64),
            "feat": rng.standard_normal((n, 3)).astype(np.float32)}  # fmt: skip
    pack = tmp_path_factory.mktemp("arrays") / "pack"
    stoker.pack_arrays(data, pack, shard_size="16KB", progress=False)
    fields = {"image": stoker.Image("image", size=16, geometry=stoker.RandomCrop(16, padding=2),
                                    hflip=0.5),
              "label": stoker.Label("label"), "feat": stoker.Array("feat")}  # fmt: skip
    for rank in range(world_size):
        loader = stoker.Loader(pack, batch_size=8, fields=fields, seed=5, rank=rank,
                               world_size=world_size, resident=resident, return_index=True,
                               augment=[A.ColorJitter(0.3, 0.3), A.RandomErasing(0.5)])  # fmt: skip
        full = a_pass(loader, 4)
        assert len(full) >= 4
        for step in (0, len(full) - 1, len(full) // 2):
            assert same(cloned(loader.batch_at(4, step)), full[step])
            ids = loader.sample_ids(4, step, rank)
            assert [s["index"] for s in ids] == full[step]["index"].tolist()


@pytest.mark.serial  # compares two timings: other processes beside it skew one
def test_batch_at_costs_about_one_batch_whatever_the_step(tmp_path):
    """Late steps cost what early ones do: the twin is positioned, not run up to the step."""
    import time

    from conftest import make_image_folder

    pack = tmp_path / "pack"
    stoker.pack(make_image_folder(tmp_path / "src", per_class=100, seed=2), pack, progress=False)
    loader = stoker.ImageLoader(pack, batch_size=4, size=32, threads=1)
    assert len(loader) == 75

    def cost(step):
        t0 = time.perf_counter()
        loader.batch_at(0, step)
        return time.perf_counter() - t0

    cost(0)  # warm
    early = min(cost(0) for _ in range(5))
    late = min(cost(74) for _ in range(5))
    assert late < 10 * early, (early, late)  # running the pass up to step 74: ~75 batches


# --- on_error="replace" (issue 26, item 2) -----------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_replace_keeps_every_batch_full_on_every_rank(damaged, world_size, tmp_path):
    pack, keys = damaged
    failed = set()
    for rank in range(world_size):
        report = tmp_path / f"bad-{rank}.json"
        loader = stoker.ImageLoader(pack, batch_size=8, size=32, seed=6, on_error="replace",
                                    rank=rank, world_size=world_size, return_index=True,
                                    quarantine=report, drop_last=False)  # fmt: skip
        batches = a_pass(loader, 0)
        sizes = [len(b[0]) for b in batches]
        assert sizes[:-1] == [8] * (len(sizes) - 1)  # full; the last as the sampler makes it
        assert sizes[-1] == loader.num_samples - 8 * (len(sizes) - 1)
        stats = loader.stats()
        assert stats["replaced"] == stats["skipped"] == len(stats["skipped_samples"])
        ds = stoker.load.loader.open_dataset(pack)
        for failure in stats["skipped_samples"]:
            assert failure["key"] in keys and failure["substitute"] != failure["index"]
            # from the failed sample's own shard (a remote pack's is there already)
            assert ds.record(failure["substitute"])["shard"] == failure["shard"]
            failed.add(failure["key"])
            # the substitute is in the failed sample's place in its batch
            assert any(failure["substitute"] in b[2].tolist() for b in batches)
        loader.close()
        import json

        listed = {f["key"] for f in json.loads(report.read_text())["failures"]}
        assert listed == {f["key"] for f in stats["skipped_samples"]}
    assert failed == keys  # every corrupt file, on one rank or another


def test_replace_is_the_same_with_any_threads_after_a_resume_and_in_a_replay(damaged):
    pack, _ = damaged
    make = lambda threads: stoker.ImageLoader(pack, batch_size=8, size=32, seed=6,  # noqa: E731
                                              on_error="replace", threads=threads,
                                              return_index=True)  # fmt: skip
    one, many = a_pass(make(1), 2), a_pass(make(3), 2)
    assert same(one, many)
    first = make(2)
    first.set_epoch(2)
    it = iter(first)
    for _ in range(5):
        next(it)
    resumed = make(2)
    resumed.load_state_dict(first.state_dict())
    assert same([cloned(b) for b in resumed], one[5:])
    for step in range(len(one)):
        assert same(cloned(make(1).batch_at(2, step)), one[step])


def test_replace_still_counts_against_max_errors(damaged):
    pack, _ = damaged
    loader = stoker.ImageLoader(pack, batch_size=8, size=32, on_error="replace", max_errors=2)
    with pytest.raises(stoker.ErrorBudgetExceededError):
        a_pass(loader, 0)


def test_a_mix_replays_which_loader_gave_each_step_and_its_batch(packed, tmp_path):
    """stoker.mix: the loader each step drew and that loader's batch, bit for bit, across a
    loader running out and restarting (stop="all_exhausted")."""
    from conftest import make_image_folder

    other = tmp_path / "other"
    stoker.pack(make_image_folder(tmp_path / "src", per_class=4, seed=8), other, progress=False)

    def make():
        a = stoker.ImageLoader(packed, batch_size=4, size=24, seed=1, return_index=True)
        b = stoker.ImageLoader(other, batch_size=4, size=24, seed=2, return_index=True)
        return stoker.mix([a, b], [0.5, 0.5], seed=7, stop="all_exhausted"), (a, b)

    mixed, _ = make()
    mixed.set_epoch(1)
    expected = len(mixed)
    full = [cloned(batch) for batch in mixed]
    assert len(full) == expected > 9
    replay, loaders = make()
    for step in range(len(full)):
        assert same(cloned(replay.batch_at(1, step)), full[step]), step
        ids = replay.sample_ids(1, step, 0)
        assert [s["index"] for s in ids["samples"]] == full[step][2].tolist()
        assert loaders[ids["source"]].dataset.record(ids["samples"][0]["index"])
    with pytest.raises(IndexError):
        replay.source_at(1, len(full))
