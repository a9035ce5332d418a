"""resident=True: a dataset held whole in memory gives the batches read from disk give, bit for
bit: in host memory (the engine reading memory), and through the GPU's path (batched tensor
operations on held tensors), run here on CPU tensors; a dataset that does not fit is refused
before anything is copied."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import stoker
from stoker.load.stages import resident

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

N = 300


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    rng = np.random.default_rng(0)
    out = tmp_path_factory.mktemp("resident") / "pack"
    stoker.pack_arrays(
        {
            "image": rng.integers(0, 256, (N, 32, 32, 3), dtype=np.uint8),
            "grey": rng.integers(0, 256, (N, 28, 28), dtype=np.uint8),
            "label": rng.integers(0, 10, N).astype(np.int64),
            "feat": rng.standard_normal((N, 6)).astype(np.float32),
        },
        out,
        shard_size="256KB",
        progress=False,
    )
    return out


def fields(fill=0):
    return {
        "image": stoker.Image("image", size=32, geometry=stoker.RandomCrop(padding=4, fill=fill),
                              hflip=0.5, vflip=0.2),
        "grey": stoker.Image("grey", size=28, geometry=stoker.RandomCrop(padding=2), hflip=0.5),
        "label": stoker.Label("label"),
        "feat": stoker.Array("feat"),
    }  # fmt: skip


def epochs(loader, n=2):
    out = []
    for epoch in range(n):
        loader.set_epoch(epoch)
        for batch in loader:
            out.append({k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()})
    return out


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k].dtype == y[k].dtype and torch.equal(x[k].cpu(), y[k].cpu()), k


@pytest.fixture
def on_torch(monkeypatch):
    """The GPU's resident path, with CPU tensors."""
    monkeypatch.setattr(stoker.Loader, "_resident_torch_on_cpu", True)


def test_host_resident_gives_the_disk_batches_and_no_longer_needs_the_files(pack, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(pack, copy)
    options = dict(batch_size=64, fields=fields(), seed=1, threads=2, return_index=True)
    disk = epochs(stoker.Loader(copy, **options))
    held = stoker.Loader(copy, resident=True, **options)
    assert held.dataset.resident_bytes == sum(f.stat().st_size for f in copy.glob("*.npy"))
    for f in copy.glob("*.npy"):
        f.write_bytes(b"")  # the files emptied: a disk read would fail now
    same(epochs(held), disk)


def test_the_gpu_path_gives_the_engines_batches_bit_for_bit(pack, on_torch):
    options = dict(batch_size=64, fields=fields(fill=7), seed=3, threads=2, return_index=True)
    engine = epochs(stoker.Loader(pack, **options))
    held = stoker.Loader(pack, resident=True, device="cpu", dtype=torch.uint8, **options)
    assert held._on_device is not None and held._on_device.bytes > 0
    same(epochs(held), engine)
    # With the device conversion: the same Normalize as the device feed's.
    convert = dict(dtype=torch.float32, mean=stoker.IMAGENET_MEAN, std=stoker.IMAGENET_STD)
    fed = epochs(stoker.Loader(pack, device="cpu", **options, **convert), 1)
    same(epochs(stoker.Loader(pack, resident=True, device="cpu", **options, **convert), 1), fed)


def test_the_gpu_path_gives_grey_images_and_the_feeds_default_dtype(pack, on_torch):
    grey = {"grey": stoker.Image("grey", size=28, channels=1,
                                 geometry=stoker.RandomCrop(padding=2), hflip=0.5)}  # fmt: skip
    options = dict(batch_size=64, fields=grey, seed=5, threads=2, device="cpu")
    fed = epochs(stoker.Loader(pack, **options), 1)
    held = epochs(stoker.Loader(pack, resident=True, **options), 1)
    assert held[0]["grey"].shape == (64, 1, 28, 28)
    assert held[0]["grey"].dtype == torch.float32  # as the device feed: float32 in [0, 1]
    same(held, fed)
    one_of_three = {"image": stoker.Image("image", size=32, channels=1)}
    with pytest.raises(stoker.InvalidArgumentError, match="1 channel of column 'image'"):
        stoker.Loader(pack, batch_size=8, fields=one_of_three, resident=True, device="cpu")


def test_the_gpu_path_resumes_and_shares_as_the_engine_does(pack, on_torch):
    def make(**kw):
        return stoker.Loader(pack, batch_size=32, fields=fields(), seed=2, return_index=True,
                             resident=True, device="cpu", **kw)  # fmt: skip

    whole = [b["index"].tolist() for b in make()]
    first = make()
    it = iter(first)
    head = [next(it)["index"].tolist() for _ in range(3)]
    again = make()
    again.load_state_dict(first.state_dict())
    assert head + [b["index"].tolist() for b in again] == whole
    shares = [{i for b in make(rank=r, world_size=2) for i in b["index"].tolist()} for r in (0, 1)]
    assert not shares[0] & shares[1] and shares[0] | shares[1] == set(range(N))


def test_the_gpu_path_refuses_what_it_cannot_give_exactly(pack, on_torch):
    scaled = {"image": stoker.Image("image", size=24, geometry=stoker.RandomResizedCrop())}
    loader = stoker.Loader(pack, batch_size=8, fields=scaled, resident=True, device="cpu")
    with pytest.raises(stoker.InvalidArgumentError, match="resamples"):
        next(iter(loader))
    with pytest.raises(stoker.InvalidArgumentError, match="Image, Label or Array"):
        stoker.Loader(pack, batch_size=8, fields={"x": stoker.Bytes("image")}, resident=True,
                      device="cpu")  # fmt: skip


def test_a_dataset_that_does_not_fit_is_refused_before_anything_is_copied(pack, monkeypatch):
    monkeypatch.setattr(resident, "host_memory", lambda: (3 << 30, 8 << 30))  # 3 of 8 GiB free
    big = 2200 << 20  # more than 3 GiB less the 1 GiB margin
    monkeypatch.setattr(stoker._core.Dataset, "resident_bytes", property(lambda d: big))
    with pytest.raises(
        stoker.ResourceLimitError, match=r"2\.15 GiB .* 3\.00 GiB free .* 1\.00 GiB"
    ):
        stoker.Loader(pack, batch_size=8, fields={"label": stoker.Label("label")}, resident=True)


@pytest.mark.parametrize("positions", [False, True])
def test_token_data_resident_in_host_memory_and_through_the_gpu_path(tmp_path, monkeypatch,
                                                                     positions):  # fmt: skip
    rng = np.random.default_rng(1)
    documents = [rng.integers(1, 50000, int(rng.integers(2, 30))) for _ in range(200)]
    stoker.pack_tokens(documents, tmp_path / "t", eos_id=0, shard_size="2KB", progress=False)
    options = dict(seq_len=12, batch_size=5, seed=4, return_offsets=True,
                   return_positions=positions, threads=2)  # fmt: skip

    def batches(loader):
        return [tuple(t.clone() if torch.is_tensor(t) else t for t in b) for b in loader]

    disk = batches(stoker.TokenLoader(tmp_path / "t", **options))
    host = batches(stoker.TokenLoader(tmp_path / "t", resident=True, **options))
    monkeypatch.setattr(stoker.Loader, "_resident_torch_on_cpu", True)
    gpu_path = batches(stoker.TokenLoader(tmp_path / "t", resident=True, device="cpu", **options))
    assert len(disk) == len(host) == len(gpu_path) > 10
    for a, b, c in zip(disk, host, gpu_path):
        for x, y, z in zip(a, b, c):
            if torch.is_tensor(x):
                assert torch.equal(x, y) and torch.equal(x, z)
            else:
                assert x == y == z
