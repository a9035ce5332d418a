import gc
import math
import os
import shutil

import pytest
import torch

import stoker

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it


def collect(loader):
    images, labels, indices = [], [], []
    for batch in loader:
        images.append(batch[0].clone())
        labels.append(batch[1].clone())
        if len(batch) == 3:
            indices.append(batch[2].clone())
    return images, labels, indices


def test_batches_are_channels_last_uint8_and_zero_copy(packed):
    with stoker.ImageLoader(packed, batch_size=8, size=64, threads=2) as loader:
        assert len(loader) == 5  # 36 samples
        images, labels = next(iter(loader))
        assert images.dtype == torch.uint8
        assert images.shape == (8, 3, 64, 64)
        assert images.is_contiguous(memory_format=torch.channels_last)
        assert labels.dtype == torch.int64 and labels.shape == (8,)
        # The tensor's memory is the engine's batch slot: no copy on the way.
        assert images.data_ptr() == loader._last_address


def test_each_sample_once_per_epoch_and_epochs_differ(packed):
    loader = stoker.ImageLoader(packed, batch_size=5, size=32, return_index=True, seed=3)
    _, labels, idx = collect(loader)
    first = torch.cat(idx).tolist()
    assert sorted(first) == list(range(36))
    ds = loader.dataset
    assert torch.cat(labels).tolist() == [ds.record(i)["label"] for i in first]
    _, _, idx2 = collect(loader)  # a finished pass advanced the epoch
    assert torch.cat(idx2).tolist() != first
    loader.set_epoch(0)
    _, _, idx3 = collect(loader)
    assert torch.cat(idx3).tolist() == first


def test_set_epoch_mid_pass_applies_to_the_next_pass(packed):
    reference = stoker.ImageLoader(packed, batch_size=6, size=32, seed=2, return_index=True)
    epoch0 = torch.cat(collect(reference)[2]).tolist()
    reference.set_epoch(7)
    epoch7 = torch.cat(collect(reference)[2]).tolist()
    loader = stoker.ImageLoader(packed, batch_size=6, size=32, seed=2, return_index=True)
    seen = []
    for i, (_, _, idx) in enumerate(loader):
        seen += idx.tolist()
        if i == 1:
            loader.set_epoch(7)
            assert loader.state_dict()["epoch"] == 0  # the pass in progress keeps its epoch
    assert seen == epoch0
    assert torch.cat(collect(loader)[2]).tolist() == epoch7


def test_same_batches_with_one_or_many_threads(packed):
    a = collect(stoker.ImageLoader(packed, batch_size=7, size=48, threads=1, seed=11))
    b = collect(stoker.ImageLoader(packed, batch_size=7, size=48, threads=4, seed=11))
    assert all(torch.equal(x, y) for x, y in zip(a[0], b[0], strict=True))
    assert all(torch.equal(x, y) for x, y in zip(a[1], b[1], strict=True))


def test_resume_mid_epoch_gives_exactly_the_rest(packed):
    full = collect(stoker.ImageLoader(packed, batch_size=4, size=32, seed=5, return_index=True))
    loader = stoker.ImageLoader(packed, batch_size=4, size=32, seed=5, return_index=True)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    assert state["batches_done"] == 3 and state["epoch"] == 0
    del it, loader
    resumed = stoker.ImageLoader(
        packed, batch_size=4, size=32, seed=5, return_index=True, threads=1
    )
    resumed.load_state_dict(state)
    rest = collect(resumed)
    got = [b[2] for b in head] + rest[2]
    assert [t.tolist() for t in got] == [t.tolist() for t in full[2]]
    got_images = [b[0] for b in head] + rest[0]
    assert all(torch.equal(x, y) for x, y in zip(got_images, full[0], strict=True))
    with pytest.raises(stoker.InvalidArgumentError, match="batch_size"):
        stoker.ImageLoader(packed, batch_size=8, seed=5).load_state_dict(state)


def test_ranks_disjoint_complete_and_equal(packed):
    per_rank = []
    for rank in range(3):
        loader = stoker.ImageLoader(
            packed, batch_size=4, size=32, rank=rank, world_size=3, return_index=True, seed=1
        )
        _, _, idx = collect(loader)
        per_rank.append(torch.cat(idx).tolist())
        assert len(loader) == 3  # 12 samples each
    assert [len(r) for r in per_rank] == [12, 12, 12]
    assert sorted(sum(per_rank, [])) == list(range(36))


def test_held_tensor_stays_intact_while_loader_moves_on(packed):
    loader = stoker.ImageLoader(packed, batch_size=4, size=32, prefetch=1, threads=2)
    it = iter(loader)
    held, _ = next(it)
    copy = held.clone()
    for _ in it:
        pass
    for _ in loader:  # another whole epoch reusing the pool
        pass
    assert torch.equal(held, copy)


def test_eval_pipeline_is_deterministic_and_unshuffled(packed):
    loader = stoker.ImageLoader(packed, batch_size=6, size=40, train=False, return_index=True)
    a = collect(loader)
    b = collect(loader)
    assert torch.cat(a[2]).tolist() == list(range(36))
    assert all(torch.equal(x, y) for x, y in zip(a[0], b[0], strict=True))


def test_fast_idct_reaches_the_decoder_close_and_deterministic(packed):
    # dct_scaling=False: every JPEG is decoded at full scale, where every IDCT is 8x8 (fast or not).
    def images(threads, fast_idct, typed=False):
        options = dict(batch_size=6, seed=4, threads=threads)
        if typed:  # the same option through stoker.Loader's Image field
            image = stoker.Image(size=96, dct_scaling=False, fast_idct=fast_idct)
            loader = stoker.Loader(packed, fields={"image": image}, train=True, **options)
            return torch.cat([b["image"].clone() for b in loader])
        loader = stoker.ImageLoader(
            packed, size=96, dct_scaling=False, fast_idct=fast_idct, **options
        )
        return torch.cat(collect(loader)[0])

    accurate = images(2, False)
    fast = images(2, True)
    assert torch.equal(images(1, True), fast)  # same with 1 or 2 threads
    assert torch.equal(images(2, True), fast)  # and from run to run
    assert torch.equal(images(2, True, typed=True), fast)
    assert torch.equal(images(2, False, typed=True), accurate)
    assert not torch.equal(fast, accurate)
    mse = ((fast.double() - accurate.double()) ** 2).mean().item()
    assert 10 * math.log10(255**2 / mse) > 35  # close: about 44 dB on imagenet-sample


def test_on_error_raise_names_shard_and_key_and_skip_counts(tmp_path, image_folder):
    src = tmp_path / "src"
    shutil.copytree(image_folder, src)
    out = tmp_path / "pack"
    stoker.pack(src, out, progress=False)
    # Damage one sample inside the shard after packing (the index still points at it).
    ds = stoker.load.loader.open_dataset(out)
    rec = ds.record(7)
    shard = out / rec["shard"]
    data = bytearray(shard.read_bytes())
    data[rec["offset"] + 4 : rec["offset"] + rec["size"]] = b"\x00" * (rec["size"] - 4)
    shard.write_bytes(bytes(data))

    loader = stoker.ImageLoader(out, batch_size=4, size=32, shuffle=False)
    with pytest.raises(stoker.CorruptDataError) as err:
        collect(loader)
    assert err.value.key == rec["key"] and err.value.shard == rec["shard"]
    assert rec["key"] in str(err.value)

    loader = stoker.ImageLoader(
        out, batch_size=4, size=32, shuffle=False, on_error="skip", return_index=True
    )
    _, _, idx = collect(loader)
    flat = torch.cat(idx).tolist()
    assert 7 not in flat and len(flat) == 35
    stats = loader.stats()
    assert stats["skipped"] == 1
    assert stats["skipped_samples"][0]["key"] == rec["key"]
    assert set(stats["seconds"]) == {"read", "decode", "transform", "collate", "wait"}

    # verify_crc catches damage that still decodes.
    with pytest.raises(stoker.CorruptDataError, match="CRC32C"):
        collect(stoker.ImageLoader(out, batch_size=4, size=32, shuffle=False, verify_crc=True))


def test_foreign_webdataset_shards(tmp_path, image_folder):
    wds = pytest.importorskip("webdataset")
    from stoker.packing.sources.folder import list_image_folder

    samples, _ = list_image_folder(image_folder)
    for s in range(2):
        with wds.TarWriter(str(tmp_path / f"part-{s}.tar")) as sink:
            for i, (path, label) in enumerate(samples[s::2]):
                ext = "png" if path.endswith(".png") else "jpg"
                with open(path, "rb") as f:
                    sink.write({"__key__": f"s{s}/{i:04d}", ext: f.read(), "cls": label})
    loader = stoker.ImageLoader(str(tmp_path / "*.tar"), batch_size=6, size=32, return_index=True)
    _, labels, idx = collect(loader)
    assert sorted(torch.cat(idx).tolist()) == list(range(36))
    assert sorted(torch.cat(labels).tolist()) == sorted(label for _, label in samples)


def test_bad_arguments_are_clear(packed):
    with pytest.raises(stoker.InvalidArgumentError, match="on_error"):
        stoker.ImageLoader(packed, batch_size=4, on_error="ignore")
    with pytest.raises(stoker.InvalidArgumentError, match="rank"):
        stoker.ImageLoader(packed, batch_size=4, rank=3, world_size=2)
    with pytest.raises(stoker.ShardIOError):
        stoker.ImageLoader(packed / "nope", batch_size=4)


def test_break_and_close_do_not_hang(packed):
    loader = stoker.ImageLoader(packed, batch_size=2, size=32)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    images, _ = next(iter(loader))  # a new pass starts cleanly
    loader.close()
    assert images.shape[0] == 2
    with pytest.raises(stoker.InvalidArgumentError):
        iter(loader)


def _thread_names() -> list[str]:
    from pathlib import Path

    names = []
    for task in Path("/proc/self/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:
            pass  # a thread that ended meanwhile
    return names


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux only")
def test_worker_threads_are_named(packed):
    # top -H, py-spy and perf show stoker's workers by name. (Other tests' loaders may still be
    # alive in this process: counted against what was there before, once garbage is collected.)
    gc.collect()
    before = _thread_names()
    with stoker.ImageLoader(packed, batch_size=8, size=32, threads=2) as loader:
        next(iter(loader))
        during = _thread_names()
        for name in ("stoker-worker0", "stoker-worker1"):
            assert during.count(name) == before.count(name) + 1
        assert during.count("stoker-worker2") == before.count("stoker-worker2")
    after = _thread_names()
    assert after.count("stoker-worker0") == before.count("stoker-worker0")
