"""resident=True on a GPU: an array pack's columns and a token stream held in
GPU memory, each batch a gather there, equal bit for bit to the engine's batches on the host."""

from __future__ import annotations

import numpy as np
import torch

import stoker


def test_an_array_pack_held_on_the_gpu_gives_the_engines_batches(tmp_path):
    rng = np.random.default_rng(0)
    stoker.pack_arrays(
        {
            "image": rng.integers(0, 256, (2000, 32, 32, 3), dtype=np.uint8),
            "label": rng.integers(0, 10, 2000).astype(np.int64),
            "feat": rng.standard_normal((2000, 8)).astype(np.float32),
        },
        tmp_path / "pack",
        progress=False,
    )
    fields = {
        "image": stoker.Image("image", size=32, geometry=stoker.RandomCrop(padding=4), hflip=0.5),
        "label": stoker.Label("label"),
        "feat": stoker.Array("feat"),
    }
    options = dict(batch_size=512, fields=fields, seed=1, return_index=True, threads=2)
    host = [
        {k: v.clone() for k, v in b.items()} for b in stoker.Loader(tmp_path / "pack", **options)
    ]
    held = stoker.Loader(tmp_path / "pack", resident=True, device="cuda", dtype=torch.uint8,
                         **options)  # fmt: skip
    assert held._on_device is not None
    batches = list(held)
    assert len(batches) == len(host) == 4
    for got, want in zip(batches, host, strict=True):
        for k in want:
            assert got[k].device.type == "cuda"
            assert torch.equal(got[k].cpu(), want[k]), k
    # Normalised there, as the device feed does it.
    convert = dict(dtype=torch.bfloat16, mean=stoker.IMAGENET_MEAN, std=stoker.IMAGENET_STD)
    fed = list(stoker.Loader(tmp_path / "pack", device="cuda", **options, **convert))
    assert len(fed) == 4
    compared = 0
    for got, want in zip(stoker.Loader(tmp_path / "pack", resident=True, device="cuda",
                                       **options, **convert), fed, strict=True):  # fmt: skip
        assert torch.equal(got["image"], want["image"])
        compared += 1
    assert compared == 4


def test_grey_images_held_on_the_gpu_are_the_device_feeds(tmp_path):
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (1000, 28, 28), dtype=np.uint8)
    stoker.pack_arrays({"image": images}, tmp_path / "grey", progress=False)
    grey = {"image": stoker.Image("image", size=28, channels=1,
                                  geometry=stoker.RandomCrop(padding=2), hflip=0.5)}  # fmt: skip
    options = dict(batch_size=250, fields=grey, seed=4, device="cuda")
    fed = [b["image"].clone() for b in stoker.Loader(tmp_path / "grey", **options)]
    held = [b["image"] for b in stoker.Loader(tmp_path / "grey", resident=True, **options)]
    assert len(held) == len(fed) == 4
    for got, want in zip(held, fed, strict=True):
        assert got.shape == (250, 1, 28, 28) and got.dtype == torch.float32
        assert torch.equal(got, want)


def test_a_token_stream_held_on_the_gpu_gives_the_engines_windows(tmp_path):
    rng = np.random.default_rng(1)
    documents = [rng.integers(1, 50000, int(rng.integers(5, 200))) for _ in range(2000)]
    stoker.pack_tokens(documents, tmp_path / "tokens", eos_id=0, progress=False)
    options = dict(seq_len=256, batch_size=16, seed=2, return_offsets=True, return_positions=True)
    host = [tuple(t for t in b) for b in stoker.TokenLoader(tmp_path / "tokens", **options)]
    held = stoker.TokenLoader(tmp_path / "tokens", resident=True, device="cuda", **options)
    compared = 0
    for got, want in zip(held, host, strict=True):
        for x, y in zip(got, want, strict=True):
            if torch.is_tensor(x):
                assert x.device.type == "cuda" and torch.equal(x.cpu(), y.cpu())
            else:
                assert x == y
        compared += 1
    assert compared == len(host) > 0
