"""``decode="gpu"``: JPEG decoding on the batch's CUDA device, for machines short of cores.

The engine's workers read each sample and draw its geometry as for the host path (the same keyed
crop and flips), but a sequential JPEG of 1 or 3 components is not decoded there: its compressed
bytes ride with the batch (``ImageOptions.device_decode``, cpp/src/fields/image_field.cc). Once
the batch is on the device, on the feed's side stream, ``DeviceDecodeStage`` decodes those files
there (nvJPEG), crops each to its box, resizes it to its rectangle (bilinear with antialiasing,
torch's), flips it and writes it into the batch before the batch is augmented and normalised.
Any other file (progressive, CMYK, PNG, WebP) was decoded by the workers as usual: the host
fallback, counted in ``stats()["decode"]``.

nvJPEG is loaded at run time (ctypes) from NVIDIA's pip package or the system: stoker is built
and installed without CUDA, and without nvJPEG ``decode="gpu"`` raises DeviceUnavailableError
saying how to install it. The decoder is an object with ``decode(blob) -> uint8 [H, W, 3]`` on
the stage's device, so that the stage itself (crop, resize, flip, placement) runs with a host
stand-in on the CPU in the tests.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
from collections import deque
from pathlib import Path
from typing import Any, Protocol

import torch

from . import _core
from .errors import DeviceUnavailableError, InvalidArgumentError, StokerError

INSTALL = (
    "pip install 'stoker[nvjpeg]' (that is, nvidia-nvjpeg-cu12, for CUDA 12; nvidia-nvjpeg for "
    "CUDA 13), or give decode='host'"
)


class Decoder(Protocol):
    def decode(self, data: bytes) -> torch.Tensor:
        """The whole image, uint8 [H, W, 3] RGB, on the stage's device."""
        ...


def _library_candidates() -> list[str]:
    """Where libnvjpeg may be: NVIDIA's pip packages (nvidia-nvjpeg-cu12 and its CUDA 13 form),
    then the system's loader path."""
    found: list[str] = []
    try:
        import nvidia  # type: ignore[import-not-found]  # a namespace package of NVIDIA's wheels

        for root in getattr(nvidia, "__path__", []):
            for sub in ("nvjpeg", "cu13", "cu12"):
                found += sorted(str(p) for p in (Path(root) / sub / "lib").glob("libnvjpeg.so*"))
    except ImportError:
        pass
    system = ctypes.util.find_library("nvjpeg")
    if system:
        found.append(system)
    return found


def load_nvjpeg() -> ctypes.CDLL:
    """libnvjpeg, or DeviceUnavailableError saying what is missing and how to install it."""
    tried = _library_candidates()
    for path in tried:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    where = f" (tried {', '.join(tried)})" if tried else ""
    raise DeviceUnavailableError(
        f"decode='gpu' needs NVIDIA's nvJPEG library (libnvjpeg.so), not found in the nvidia "
        f"pip packages nor on the system's library path{where}: {INSTALL}"
    )


class _Image(ctypes.Structure):
    """nvjpegImage_t: a pointer and a pitch per component (NVJPEG_MAX_COMPONENT = 4)."""

    _fields_ = [("channel", ctypes.c_void_p * 4), ("pitch", ctypes.c_size_t * 4)]


_OUTPUT_RGBI = 5  # nvjpegOutputFormat_t NVJPEG_OUTPUT_RGBI: interleaved RGB


class NvJpeg:
    """nvJPEG's single-image decode into a uint8 [H, W, 3] tensor on `device`, on the device's
    current stream (the feed's side stream while the stage runs)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.lib = load_nvjpeg()
        self.handle, self.state = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(self.lib.nvjpegCreateSimple(ctypes.byref(self.handle)), "nvjpegCreateSimple")
        self._check(
            self.lib.nvjpegJpegStateCreate(self.handle, ctypes.byref(self.state)),
            "nvjpegJpegStateCreate",
        )

    @staticmethod
    def _check(status: int, call: str) -> None:
        if status != 0:
            raise StokerError(f"nvJPEG: {call} failed with status {status}")

    def decode(self, data: bytes) -> torch.Tensor:
        components = ctypes.c_int()
        subsampling = ctypes.c_int()
        widths, heights = (ctypes.c_int * 4)(), (ctypes.c_int * 4)()
        self._check(
            self.lib.nvjpegGetImageInfo(
                self.handle,
                data,
                ctypes.c_size_t(len(data)),
                ctypes.byref(components),
                ctypes.byref(subsampling),
                widths,
                heights,
            ),  # fmt: skip
            "nvjpegGetImageInfo",
        )
        out = torch.empty((heights[0], widths[0], 3), dtype=torch.uint8, device=self.device)
        image = _Image()
        image.channel[0], image.pitch[0] = out.data_ptr(), widths[0] * 3
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self._check(
            self.lib.nvjpegDecode(self.handle, self.state, data, ctypes.c_size_t(len(data)),
                                  _OUTPUT_RGBI, ctypes.byref(image), ctypes.c_void_p(stream)),
            "nvjpegDecode",
        )  # fmt: skip
        return out

    def __del__(self) -> None:
        try:
            self.lib.nvjpegJpegStateDestroy(self.state)
            self.lib.nvjpegDestroy(self.handle)
        except Exception:  # at exit the library may be gone
            pass


def place(out: torch.Tensor, image: torch.Tensor, params: Any, fill: int) -> None:
    """Write `image` (uint8 [H, W, 3], the whole file decoded) into `out` (uint8 [3, h, w]) as
    the host path renders it from its geometry `params` (ImageOptions' 14 values): the box
    (source pixels, to the nearest pixel) resized to the rect (bilinear, antialiased), `fill`
    elsewhere, then the flips."""
    x0, y0, x1, y1 = (float(v) for v in params[0:4])
    r0, s0, r1, s1 = (int(v) for v in params[4:8])
    hflip, vflip = bool(params[10]), bool(params[11])
    height, width = image.shape[0], image.shape[1]
    cx0 = min(max(int(math.floor(x0 + 0.5)), 0), width - 1)
    cy0 = min(max(int(math.floor(y0 + 0.5)), 0), height - 1)
    cx1 = min(max(int(math.floor(x1 + 0.5)), cx0 + 1), width)
    cy1 = min(max(int(math.floor(y1 + 0.5)), cy0 + 1), height)
    _, out_h, out_w = out.shape
    # the rect may run past the output (RandomCrop's padding): only its visible part is written
    vx0, vy0, vx1, vy1 = max(r0, 0), max(s0, 0), min(r1, out_w), min(s1, out_h)
    if (vx0, vy0, vx1, vy1) != (0, 0, out_w, out_h):
        out.fill_(fill)
    if vx1 > vx0 and vy1 > vy0:
        crop = image[cy0:cy1, cx0:cx1].permute(2, 0, 1).unsqueeze(0).to(torch.float32)
        resized = torch.nn.functional.interpolate(
            crop, size=(s1 - s0, r1 - r0), mode="bilinear", antialias=True, align_corners=False
        )[0]
        pixels = resized.round_().clamp_(0, 255).to(torch.uint8)
        out[:, vy0:vy1, vx0:vx1] = pixels[:, vy0 - s0 : vy1 - s0, vx0 - r0 : vx1 - r0]
    if hflip:
        out.copy_(out.flip(2))
    if vflip:
        out.copy_(out.flip(1))


def decoder_for(device: torch.device) -> Decoder:
    """The decoder of `device`: nvJPEG on a CUDA device (DeviceUnavailableError without it)."""
    if device.type != "cuda":
        raise InvalidArgumentError(
            f"decode='gpu' decodes on a CUDA device, not {device.type!r}: give device='cuda'"
        )
    return NvJpeg(device)


class DeviceDecodeStage:
    """Decodes the device samples of each batch into it, in the order the batches were made
    (the loader queues each batch's files as it hands the batch to the feed, the feed calls the
    stage on its side stream in the same order)."""

    def __init__(self, decoder: Decoder, fill: int = 0):
        self.decoder, self.fill = decoder, fill
        self.pending: deque[tuple[list[bytes], torch.Tensor, torch.Tensor]] = deque()
        self.device_decoded = 0
        self.host_decoded = 0
        self.device_refused = 0  # handed to the device, decoded on the host after all

    def queue(self, blobs: list[bytes], params: torch.Tensor, host_decoded: torch.Tensor) -> None:
        """A batch's files (b"" where the workers decoded it), geometry [B, 14] and flags [B]."""
        on_host = int(host_decoded.sum())
        self.host_decoded += on_host
        self.device_decoded += len(blobs) - on_host
        self.pending.append((blobs, params.clone(), host_decoded.clone()))

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """`images`: the batch's uint8 [B, 3, H, W] on the device, written in place."""
        blobs, params, host_decoded = self.pending.popleft()
        for i, data in enumerate(blobs):
            if host_decoded[i] or not data:  # decoded by the workers, or an absent optional
                continue
            place(images[i], self._decode(data), params[i], self.fill)
        return images

    def _decode(self, data: bytes) -> torch.Tensor:
        """The device's decode, or the host's where the device refuses the file (a coding it
        does not take: arithmetic, 12-bit); a file neither decodes raises CorruptDataError."""
        try:
            return self.decoder.decode(data)
        except StokerError:
            self.device_refused += 1
            image = torch.from_numpy(_core.decode_image(data))
            device = getattr(self.decoder, "device", image.device)
            return image.to(device)

    def clear(self) -> None:
        self.pending.clear()
