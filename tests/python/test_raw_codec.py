"""stoker pack --codec raw: decoded pixels (binary PPM members) that the loader reads without
decoding, giving the batches the source pack gives when that one decodes at full size."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from test_pack import pil_resized, shrunk_size, torchvision_image_folder

import stoker

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it


def check_pixels(stored: np.ndarray, want: np.ndarray, path) -> None:
    """Byte for byte; a progressive JPEG decoded at a reduced scale reads only the scans that
    scale needs (docs/ARCHITECTURE.md: 40-50 dB from reading every scan), which Pillow reads."""
    with open(path, "rb") as f:
        progressive = stoker._core.image_info(f.read())["progressive"]
    if not progressive:
        np.testing.assert_array_equal(stored, want, err_msg=str(path))
    else:
        assert psnr(stored, want) > 38, (path, psnr(stored, want))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))


@pytest.fixture(scope="module")
def raw_pack(image_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("raw") / "pack"
    result = stoker.pack(image_folder, out, codec="raw", shard_size="256KB", progress=False)
    assert result.num_samples == 36 and not result.failed
    return out


def test_every_image_is_a_ppm_of_its_decoded_pixels(raw_pack, packed):
    raw, source = stoker.load.loader.open_dataset(raw_pack), stoker.load.loader.open_dataset(packed)
    manifest = json.loads((raw_pack / "manifest.json").read_text())
    assert manifest["codec"] == "raw" and manifest["restart_interval"] is None
    for i in range(len(raw)):
        record = raw.record(i)
        assert [m["name"] for m in record["members"]] == ["ppm", "cls"]
        assert record["label"] == source.record(i)["label"]
        stored = np.asarray(Image.open(io.BytesIO(raw.read(i))))
        decoded = stoker._core.decode_image(source.read(i))  # the source file, decoded whole
        assert np.array_equal(stored, decoded), i


@pytest.mark.parametrize("train", [True, False])
def test_a_raw_pack_gives_the_source_packs_batches_decoded_at_full_size(raw_pack, packed, train):
    def batches(path, **image):
        fields = {"image": stoker.Image(size=48, **image), "label": stoker.Label()}
        loader = stoker.Loader(path, batch_size=12, fields=fields, train=train, seed=2, threads=2)
        return [(b["image"].clone(), b["label"].clone()) for b in loader]

    raw = batches(raw_pack)
    source = batches(packed, dct_scaling=False)  # the pixels the raw pack stored
    assert len(raw) == len(source) == 3
    for (a, la), (b, lb) in zip(raw, source, strict=True):
        assert torch.equal(la, lb) and torch.equal(a, b)


def test_codec_raw_at_one_size_and_its_command_line(image_folder, tmp_path):
    out = tmp_path / "sized"
    done = subprocess.run(
        [sys.executable, "-m", "stoker", "pack", str(image_folder), str(out), "--codec", "raw",
         "--size", "24", "40", "--quiet"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    dataset = stoker.load.loader.open_dataset(out)
    samples, _ = torchvision_image_folder(image_folder)
    assert len(dataset) == len(samples)
    for i, (path, _) in enumerate(samples):
        stored = np.asarray(Image.open(io.BytesIO(dataset.read(i))))
        assert stored.shape == (24, 40, 3)
        # PIL: decoded at the smallest DCT scale still 40x24 or more, resized to 40x24.
        want = pil_resized(path, 40, 24, cover=(40, 24))
        check_pixels(stored, want, path)
    schema = stoker.load.loader.read_schema(out)
    assert schema["ppm"]["min_shape"] == schema["ppm"]["max_shape"] == [24, 40, 3]
    with pytest.raises(stoker.InvalidArgumentError, match="codec='raw'"):
        stoker.pack(image_folder, tmp_path / "x", size=(24, 40), progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="codec"):
        stoker.pack(image_folder, tmp_path / "x", codec="bmp", progress=False)


def test_codec_raw_at_max_side_is_pils_resize(image_folder, tmp_path):
    """codec="raw" with max_side=100: an image over 100 px decoded at the smallest DCT scale
    that covers its size at max_side, resized to it: PIL's pixels, exactly."""
    out = tmp_path / "raw100"
    result = stoker.pack(image_folder, out, codec="raw", max_side=100, progress=False)
    samples, _ = torchvision_image_folder(image_folder)
    dataset = stoker.load.loader.open_dataset(out)
    assert len(dataset) == len(samples) == result.num_samples
    shrunk = 0
    for i, (path, _) in enumerate(samples):
        stored = np.asarray(Image.open(io.BytesIO(dataset.read(i))))
        width, height = Image.open(path).size
        w, h = shrunk_size(width, height, 100) if max(width, height) > 100 else (width, height)
        assert stored.shape == (h, w, 3), path
        check_pixels(stored, pil_resized(path, w, h, cover=(w, h)), path)
        shrunk += (w, h) != (width, height)
    assert shrunk > 20


def test_damaged_ppm_members_are_named_errors(tmp_path):
    good = b"P6\n4 2\n255\n" + bytes(range(24))
    cases = {
        "truncated": (good[:-5], stoker.CorruptDataError, "truncated"),
        "maxval": (b"P6\n4 2\n65535\n" + bytes(48), stoker.UnsupportedFormatError, "maxval"),
        "header": (b"P6\n4 x2\n255\n" + bytes(24), stoker.CorruptDataError, "malformed"),
        "huge": (b"P6\n99999999 2\n255\n", stoker.CorruptDataError, "too large"),
    }
    for data, error, message in cases.values():
        with pytest.raises(error, match=message):
            stoker._core.image_info(data)
