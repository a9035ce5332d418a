"""decode="gpu" on the CPU (issue 22): the host half (the workers hand over a sequential JPEG's
bytes with its keyed geometry, and decode every other file themselves) and the device stage
(crop, resize, flip, placement) run with a host stand-in for nvJPEG on device="cpu"; nvJPEG
itself, and this stage on a GPU, are tests/gpu/test_gpu_decode.py's."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import stoker
from stoker import _core, gpu_decode


class HostStandIn:
    """nvJPEG's place: stoker's own decoder, the whole image, on the CPU."""

    def __init__(self) -> None:
        self.decoded = 0

    def decode(self, data: bytes) -> torch.Tensor:
        self.decoded += 1
        return torch.from_numpy(_core.decode_image(data))


@pytest.fixture
def stand_in(monkeypatch):
    decoder = HostStandIn()
    monkeypatch.setattr(gpu_decode, "decoder_for", lambda device: decoder)
    return decoder


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.double() - b.double()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def loader(pack, **kw):
    return stoker.ImageLoader(pack, batch_size=6, size=64, seed=2, threads=2, device="cpu",
                              dtype=torch.uint8, return_index=True, **kw)  # fmt: skip


def kinds(pack) -> dict[int, dict]:
    ds = stoker.loader.open_dataset(pack)
    return {i: _core.image_info(ds.read(i)) for i in range(len(ds))}


@pytest.mark.parametrize("train", [True, False])
def test_the_same_batches_as_the_host_path_within_the_tolerance(packed, stand_in, train):
    """The same samples, crops and flips as the host path; a file the device takes within 30 dB
    of the host's pixels (a box to the nearest pixel, torch's antialiased bilinear against
    Pillow's), every other file (PNG, progressive) the host's own bytes."""
    info = kinds(packed)
    host = list(loader(packed, train=train))
    gpu = loader(packed, train=train, decode="gpu")
    got = list(gpu)
    assert len(got) == len(host) == 6
    on_device = host_decoded = 0
    for (x, y, i), (hx, hy, hi) in zip(got, host, strict=True):
        assert torch.equal(i, hi) and torch.equal(y, hy)
        for k, index in enumerate(i.tolist()):
            meta = info[index]
            if meta["format"] == "jpg" and not meta["progressive"]:
                on_device += 1
                assert psnr(x[k], hx[k]) > 30, (index, psnr(x[k], hx[k]))
            else:
                host_decoded += 1
                assert torch.equal(x[k], hx[k]), index
    assert on_device == stand_in.decoded > 20 and host_decoded >= 4  # the PNGs, the progressive
    assert gpu.stats()["decode"] == {"device": on_device, "host": host_decoded}


def test_flips_and_padding_land_as_on_the_host(packed, stand_in):
    """A RandomCrop with padding (the rect runs past the output, the fill around it) and both
    flips: placement and flips as the host path's."""
    fields = lambda decode: {  # noqa: E731
        "image": stoker.Image(size=48, geometry=stoker.RandomCrop(48, padding=12, fill=77),
                              hflip=0.5, vflip=0.5, decode=decode),
        "label": stoker.Label(optional=True),
    }  # fmt: skip
    common = dict(batch_size=6, seed=5, threads=1, device="cpu", dtype=torch.uint8, train=True)
    host = list(stoker.Loader(packed, fields=fields("host"), **common))
    gpu = list(stoker.Loader(packed, fields=fields("gpu"), **common))
    for a, b in zip(gpu, host, strict=True):
        for k in range(len(a["image"])):
            assert psnr(a["image"][k], b["image"][k]) > 30
            # the fill where the host has it: RandomCrop's padding is never resampled
            bars = (b["image"][k] == 77).all(dim=0)
            assert (a["image"][k][:, bars] == 77).all()


def test_place_is_the_box_resized_into_the_rect_then_flipped():
    image = torch.arange(40 * 30 * 3, dtype=torch.int64).remainder(251).to(torch.uint8)
    image = image.view(30, 40, 3)
    out = torch.zeros(3, 10, 20, dtype=torch.uint8)
    params = torch.tensor([10, 5, 30, 15, 0, 0, 20, 10, 1, 1, 0, 0, 40, 30], dtype=torch.float64)
    gpu_decode.place(out, image, params, fill=0)
    assert torch.equal(out, image[5:15, 10:30].permute(2, 0, 1))  # a 1:1 box: the pixels
    params[10] = 1  # hflip
    gpu_decode.place(out, image, params, fill=0)
    assert torch.equal(out, image[5:15, 10:30].permute(2, 0, 1).flip(2))
    params[4:8] = torch.tensor([5, 2, 15, 8])  # into part of the output: fill around
    gpu_decode.place(out, image, params, fill=9)
    assert (out[:, :2] == 9).all() and (out[:, 8:] == 9).all()


def test_without_nvjpeg_the_error_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_decode, "_library_candidates", lambda: [])
    with pytest.raises(
        stoker.DeviceUnavailableError,
        match=r"pip install 'stoker\[nvjpeg\]' \(that is, nvidia-nvjpeg-cu12",
    ):
        gpu_decode.load_nvjpeg()
    broken = tmp_path / "libnvjpeg.so.12"
    broken.write_bytes(b"not a library")
    monkeypatch.setattr(gpu_decode, "_library_candidates", lambda: [str(broken)])
    with pytest.raises(stoker.DeviceUnavailableError, match="tried .*libnvjpeg.so.12"):
        gpu_decode.load_nvjpeg()


def test_decode_gpu_options_are_checked(packed):
    with pytest.raises(stoker.InvalidArgumentError, match="give device='cuda'"):
        stoker.ImageLoader(packed, batch_size=4, decode="gpu")
    with pytest.raises(stoker.InvalidArgumentError, match="CUDA device"):
        stoker.ImageLoader(packed, batch_size=4, decode="gpu", device="cpu")
    with pytest.raises(stoker.InvalidArgumentError, match="'host' or 'gpu'"):
        stoker.Image(decode="nvjpeg")
    with pytest.raises(stoker.InvalidArgumentError, match="channels=3"):
        stoker.Image(decode="gpu", channels=1)
    with pytest.raises(stoker.InvalidArgumentError, match="resident"):
        stoker.ImageLoader(packed, batch_size=4, decode="gpu", device="cpu", resident=True)


def test_the_workers_hand_over_the_file_itself(packed, stand_in):
    """What the stage receives for a device sample is the member's bytes, untouched, and its
    pixels are left for the device (zeros before the stage)."""
    seen = []
    real = gpu_decode.DeviceDecodeStage.__call__

    def spy(self, images):
        blobs, params, flags = self.pending[0]
        seen.append((list(blobs), flags.clone(), images.clone()))
        return real(self, images)

    gpu_decode.DeviceDecodeStage.__call__ = spy
    try:
        got = list(loader(packed, train=False, decode="gpu"))
    finally:
        gpu_decode.DeviceDecodeStage.__call__ = real
    ds = stoker.loader.open_dataset(packed)
    for (blobs, flags, before), (_, _, index) in zip(seen, got, strict=True):
        for k, i in enumerate(index.tolist()):
            if flags[k]:
                assert blobs[k] == b""
            else:
                assert blobs[k] == ds.read(i) and not before[k].any()
    assert np.mean([bool(f) for _, fl, _ in seen for f in fl.tolist()]) < 0.3


def test_a_file_the_device_refuses_is_decoded_on_the_host(packed, monkeypatch):
    """nvJPEG refusing a file (a coding it does not take) sends it to the host decoder."""

    class Refusing:
        def decode(self, data):
            raise stoker.StokerError("nvJPEG: nvjpegDecode failed with status 4")

    monkeypatch.setattr(gpu_decode, "decoder_for", lambda device: Refusing())
    host = list(loader(packed, train=False))
    gpu = loader(packed, train=False, decode="gpu")
    for (x, _, _), (h, _, _) in zip(gpu, host, strict=True):
        assert all(psnr(x[k], h[k]) > 30 for k in range(len(x)))
    assert gpu.stats()["decode"] == {"device": 0, "host": 36}


def test_map_with_decode_gpu_is_refused(packed, stand_in):
    with pytest.raises(stoker.InvalidArgumentError, match="map="):
        loader(packed, decode="gpu", map=lambda s: {})
