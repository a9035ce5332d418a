from pathlib import Path

import numpy as np
import pytest
from PIL import Image

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def make_image_folder(root: Path, classes=("cat", "dog", "eel"), per_class=12, seed=0) -> Path:
    """A small ImageFolder tree: varied sizes, a progressive JPEG, a PNG and a grayscale file."""
    rng = np.random.default_rng(seed)
    for c, name in enumerate(classes):
        d = root / name
        d.mkdir(parents=True)
        for i in range(per_class):
            w, h = int(rng.integers(60, 400)), int(rng.integers(60, 400))
            yy, xx = np.mgrid[0:h, 0:w]
            base = np.stack([(xx * (c + 1)) % 256, (yy * 2) % 256, (xx + yy + 40 * c) % 256], -1)
            noise = rng.integers(0, 30, size=(h, w, 3))
            img = Image.fromarray((base + noise).clip(0, 255).astype(np.uint8))
            if i == 3:
                img.save(d / f"img{i:03d}.png")
            elif i == 4:
                img.convert("L").save(d / f"img{i:03d}.jpg", quality=90)
            else:
                img.save(d / f"img{i:03d}.jpg", quality=90, progressive=(i == 5))
    return root


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("folder") / "train")


@pytest.fixture(scope="session")
def packed(image_folder, tmp_path_factory) -> Path:
    import stoker

    out = tmp_path_factory.mktemp("pack") / "train"
    stoker.pack(image_folder, out, shard_size="128KB", progress=False)
    return out


def corrupt(pack, indices) -> set[str]:
    """Cut the JPEG data of these samples short in place; their keys."""
    import stoker

    ds = stoker.load.loader.open_dataset(pack)
    keys = set()
    for i in indices:
        record = ds.record(i)
        with open(pack / record["shard"], "r+b") as shard:
            shard.seek(record["offset"] + 200)
            shard.write(b"\xff\xd9" + bytes(record["size"] - 202))
        keys.add(record["key"])
    return keys


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """102 images, 4 of them corrupt after packing."""
    import stoker

    root = tmp_path_factory.mktemp("damaged")
    pack = root / "pack"
    stoker.pack(make_image_folder(root / "src", per_class=34, seed=3), pack, progress=False)
    keys = corrupt(pack, [6, 40, 62, 98])  # baseline JPEGs (per class: 3 is a PNG)
    return pack, keys


def shared_data() -> Path:
    if not SHARED.exists():
        pytest.skip(f"shared data not found at {SHARED}")
    return SHARED
