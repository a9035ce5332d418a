"""Run inside the bare Debian root by tests/wheel/run.sh (make test-wheels), in a fresh venv of
one interpreter that has only a stoker wheel and its dependencies (and torch, unless
--no-torch): packs the JPEG, PNG and WebP files tests/wheel/make_images.py wrote and loads them,
writes an array pack and reads it back, and checks that the decoders that did it are the wheel's
own (stoker.libs/), not the system's. Without torch (the interpreters CI has no torch for), what
runs without it: packing, `stoker.verify` (every image decoded whole by the wheel's decoders),
the array pack written and verified, the `stoker` command. Video and audio: before the root has
FFmpeg, a Video field must say what to install; after tests/wheel/run.sh installs FFmpeg 5.1's
libraries from apt, the wheel's stoker._media must decode the clips and sounds make_images.py
wrote.

    check.py DATA WORK [--media] [--no-torch]"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

import stoker
from stoker import _core

if TYPE_CHECKING or "--no-torch" not in sys.argv:
    import torch

DECODERS = ("libjpeg", "libturbojpeg", "libspng", "libwebp")


def check_image_loader(data: Path, work: Path, expected: dict) -> None:
    result = stoker.pack(data / "folder", work / "folder-pack", progress=False)
    total = sum(expected["counts"].values())
    assert result.num_samples == total and not result.failed, result
    assert result.classes == sorted(expected["class_colours"]), result.classes
    colours = torch.tensor([expected["class_colours"][c] for c in result.classes])
    loader = stoker.ImageLoader(work / "folder-pack", batch_size=5, size=24, train=False, threads=2)
    seen: collections.Counter[int] = collections.Counter()
    for images, labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 24, 24), images.shape
        assert labels.shape == (images.shape[0],), labels.shape
        # Every image is its class's solid colour (JPEG: within its rounding).
        diff = (images.int() - colours[labels][:, :, None, None]).abs().amax()
        assert diff <= 4, f"pixels differ from the class colour by {diff}"
        seen.update(labels.tolist())
    want = {i: expected["counts"][c] for i, c in enumerate(result.classes)}
    assert dict(seen) == want, (seen, want)
    print(f"ImageLoader: {sum(seen.values())} JPEG/PNG/WebP images, labels {dict(seen)}")


def check_loader(data: Path, work: Path, expected: dict) -> None:
    result = stoker.pack(data / "table" / "table.csv", work / "table-pack", progress=False)
    halves = expected["halves"]
    assert result.num_samples == len(halves) and not result.failed, result
    size = (16, 32)
    fields = {
        "png": stoker.Image("png", size=size, geometry=stoker.Resize()),
        "webp": stoker.Image("webp", size=size, geometry=stoker.Resize()),
        "label": stoker.Label(),
    }
    loader = stoker.Loader(work / "table-pack", batch_size=2, fields=fields, train=False)
    n = 0
    for batch in loader:
        for j, label in enumerate(batch["label"].tolist()):
            left, right = (torch.tensor(c, dtype=torch.uint8) for c in halves[label])
            for name in ("png", "webp"):
                image = batch[name][j]
                assert image.shape == (3, *size), image.shape
                # Lossless files, halved: the outer columns are exact, the middle is a blend.
                assert (image[:, :, :12] == left[:, None, None]).all(), (name, label)
                assert (image[:, :, -12:] == right[:, None, None]).all(), (name, label)
            n += 1
    assert n == len(halves), n
    print(f"Loader: {n} samples, an Image field over PNG and one over WebP")


def check_decoders_are_the_wheels() -> None:
    libs = Path(_core.__file__).parent.parent / "stoker.libs"
    with open("/proc/self/maps") as maps:  # address perms offset dev inode [path]
        mapped = {f[5] for f in (line.split(maxsplit=5) for line in maps) if len(f) == 6}
    mapped = {p.strip() for p in mapped}
    decoders = sorted(p for p in mapped if Path(p).name.startswith(DECODERS))
    for name in DECODERS:
        hits = [p for p in decoders if Path(p).name.startswith(name + "-")]
        assert hits, f"{name} is not loaded from the wheel: {decoders}"
    foreign = [p for p in decoders if Path(p).parent != libs]
    assert not foreign, f"decoders loaded from outside {libs}: {foreign}"
    assert "PIL" not in sys.modules, "Pillow was imported"
    print("decoders loaded:", *decoders, sep="\n  ")


def check_packs_without_torch(data: Path, work: Path, expected: dict) -> None:
    """What a machine without torch runs: packing, and every image decoded by `stoker.verify`."""
    result = stoker.pack(data / "folder", work / "folder-pack", progress=False)
    assert result.num_samples == sum(expected["counts"].values()) and not result.failed, result
    report = stoker.verify(work / "folder-pack", progress=False)
    assert report.clean and report.decoded and report.checked == result.num_samples, report
    done = subprocess.run([str(Path(sys.executable).parent / "stoker"), "inspect",
                           str(work / "folder-pack")], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0 and str(result.num_samples) in done.stdout, done
    assert "torch" not in sys.modules, "torch was imported"
    print(f"without torch: {report.checked} JPEG/PNG/WebP images packed and decoded")


def check_array_pack(work: Path, with_torch: bool) -> None:
    """An array pack written from numpy and read back: a batch without augmentation is exactly
    X[indices]."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (40, 8, 6, 3), dtype=np.uint8)
    y = rng.integers(0, 10, 40)
    result = stoker.pack_arrays({"image": x, "label": y}, work / "arrays", progress=False)
    assert result.num_samples == 40, result
    if not with_torch:
        report = stoker.verify(work / "arrays", progress=False)
        assert report.clean and report.checked == 40 and report.files == 2, report
        print("without torch: an array pack of 40 samples written and verified")
        return
    loader = stoker.Loader(work / "arrays", batch_size=16, train=False, return_index=True,
                           fields={"image": stoker.Image("image", size=(8, 6),
                                                         geometry=stoker.Resize()),
                                   "label": stoker.Label("label")})  # fmt: skip
    n = 0
    for batch in loader:
        index = batch["index"].numpy()
        assert (batch["image"].permute(0, 2, 3, 1).numpy() == x[index]).all(), index
        assert (batch["label"].numpy() == y[index]).all(), index
        n += len(index)
    assert n == 40, n
    print(f"array pack: {n} samples read back as X[indices]")


def check_media_needs_ffmpeg(data: Path, work: Path) -> None:
    assert not list(Path("/usr/lib").rglob("libavformat.so*")), "the root has FFmpeg already"
    stoker.pack(data / "media", work / "media-pack", progress=False)
    try:
        stoker.Loader(work / "media-pack", batch_size=1, fields={"clip": stoker.Video(frames=4)})
    except stoker.UnsupportedFormatError as e:
        message = str(e)
    else:
        raise AssertionError("a Video field loaded without FFmpeg")
    for words in ("libavformat.so.59", "apt install libavformat59"):
        assert words in message, message
    print("without FFmpeg, Video says:", message)


def check_media(data: Path, work: Path, expected: dict) -> None:
    result = stoker.pack(data / "media", work / "video-pack", progress=False)
    assert result.classes == sorted(expected["class_colours"]), result.classes
    colours = torch.tensor([expected["class_colours"][c] for c in result.classes])
    fields = {"clip": stoker.Video(frames=4, stride=2, size=32), "label": stoker.Label()}
    loader = stoker.Loader(work / "video-pack", batch_size=3, fields=fields, train=True, seed=1)
    labels = []
    for batch in loader:
        clips = batch["clip"]
        assert clips.shape[1:] == (4, 3, 32, 32) and clips.dtype == torch.uint8, clips.shape
        # Each clip is its class's solid colour (H.264 and 4:2:0: within a few levels).
        diff = (clips.int() - colours[batch["label"]][:, None, :, None, None]).abs().amax()
        assert diff <= 6, f"clip pixels differ from the class colour by {diff}"
        labels += batch["label"].tolist()
    assert sorted(labels) == [0, 1, 2], labels
    result = stoker.pack(data / "sounds", work / "sound-pack", progress=False)
    fields = {"audio": stoker.Audio(seconds=1.0, sample_rate=16000), "label": stoker.Label()}
    loader = stoker.Loader(work / "sound-pack", batch_size=3, fields=fields, train=False)
    (batch,) = list(loader)
    t = torch.arange(16000, dtype=torch.float64) / 16000
    tones = [float(result.classes[i]) for i in batch["label"].tolist()]
    assert sorted(tones) == sorted(expected["tones"]), tones
    for row, hz in zip(batch["audio"], tones, strict=True):
        # ffmpeg's sine source: amplitude 1/8, stored as 16-bit FLAC.
        want = torch.sin(2 * torch.pi * hz * t) / 8
        err = (row[0].double() - want).abs().max().item()
        assert err <= 1e-3, (hz, err)
    print(f"with FFmpeg: {len(labels)} clips of their class colour, {len(tones)} sine windows")


def main() -> None:
    data, work = Path(sys.argv[1]), Path(sys.argv[2])
    expected = json.loads((data / "expected.json").read_text())
    flags = set(sys.argv[3:])
    with_torch = "--no-torch" not in flags
    print(f"stoker {stoker.__version__} ({_core.__file__}), Python {sys.version.split()[0]},",
          f"torch {torch.__version__}" if with_torch else "no torch")  # fmt: skip
    if "--media" in flags:
        check_media(data, work, expected)
        return
    if with_torch:
        check_image_loader(data, work, expected)
        check_loader(data, work, expected)
    else:
        check_packs_without_torch(data, work, expected)
    check_array_pack(work, with_torch)
    check_decoders_are_the_wheels()
    if with_torch:
        check_media_needs_ffmpeg(data, work)


if __name__ == "__main__":
    main()
