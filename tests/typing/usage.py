"""Type-checked, never run: the public API used as a user would, so that mypy (make test-python)
checks stoker's public signatures and the shipped stubs (python/stoker/_core.pyi) together.
A signature change that breaks this file breaks user code the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import stoker
from stoker import _core


def pack_then_load(src: Path, out: Path) -> None:
    result: stoker.PackResult = stoker.pack(src, out, max_side=512, shard_size="64MB")
    n: int = result.num_samples
    classes: list[str] = result.classes
    info: dict[str, Any] = stoker.inspect(out)
    print(n, classes, info)

    with stoker.ImageLoader(out, batch_size=64, size=160, threads=4, seed=1) as loader:
        loader.set_epoch(3)
        batches: int = len(loader)
        for images, labels in loader:
            print(images.shape, labels.shape)
            break
        state: dict[str, Any] = loader.state_dict()
    resumed = stoker.ImageLoader(str(out), batch_size=64, size=160, train=False, on_error="skip")
    resumed.load_state_dict(state)
    stats: dict[str, Any] = resumed.stats()
    print(batches, stats, resumed.classes, resumed.num_samples)
    resumed.close()


def load_fields(out: Path) -> None:
    loader = stoker.Loader(
        [out],
        batch_size=8,
        train=True,
        missing="skip",
        max_errors=0.01,
        fields={
            "image": stoker.Image("jpg", size=(256, 320), geometry=stoker.Letterbox(fill=114)),
            "view": stoker.Image(follow="image", return_params=True),
            "crop": stoker.Image(size=64, geometry=stoker.RandomResizedCrop((0.2, 1.0))),
            "mask": stoker.Mask("seg.png", follow="image", fill=255),
            "boxes": stoker.Boxes("json", follow="image", max_boxes=50, normalized=True),
            "label": stoker.Label(optional=True),
            "emb": stoker.Array("npy", shape=(-1, 16), dtype="float32", max_length=32),
            "raw": stoker.Bytes("bin"),
            "caption": stoker.Text(),
            "meta": stoker.Json(optional=True),
        },
    )
    for batch in loader:
        print(batch["image"], batch["boxes"]["count"])
    loader.load_state_dict(loader.state_dict())
    loader.close()
    geometries: list[stoker.load.fields.Geometry] = [
        stoker.CenterCrop(resize_size=256),
        stoker.Resize(),
        stoker.RandomCrop(padding=4),
    ]
    print(geometries)


def on_gpu(out: Path) -> None:
    loader = stoker.ImageLoader(
        out,
        batch_size=32,
        device="cuda",
        dtype=torch.bfloat16,
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
    )
    device: torch.device | None = loader.device
    print(device)


def errors(out: Path) -> None:
    try:
        stoker.ImageLoader(out, batch_size=0)
    except stoker.InvalidArgumentError as e:
        assert isinstance(e, ValueError)
    except (stoker.CorruptDataError, stoker.ShardIOError) as e:
        print(e)


def engine(data: bytes) -> None:
    ds: _core.Dataset = _core.Dataset.open("packs/train")
    first: bytes = ds.read(0, "jpg")
    pixels = _core.decode_image(first)
    height: int = pixels.shape[0]
    opts = _core.LoaderOptions()
    opts.batch_size = 16
    spec = _core.FieldSpec()
    spec.kind = _core.FieldKind.image
    spec.image.geometry.kind = _core.GeometryKind.letterbox
    opts.fields = [spec]
    crc: int = _core.crc32c(data)
    print(len(ds), height, crc)
