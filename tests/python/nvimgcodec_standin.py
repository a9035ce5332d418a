"""A stand-in for NVIDIA's nvImageCodec (`nvidia.nvimgcodec`, 0.7 and later) as stoker's
NvImageCodec decoder uses it, so that the decoder's own code runs in every `make test` on a
machine without a GPU, under cuda_standin.StandInCuda. Pixels are stoker's own decoder's
(libjpeg-turbo); what is modelled is where the real library behaves unlike a CPU decoder, as its
source (the 0.8.0 tag) and CUDA's rules say (issue 58):

- Its parser refuses what libjpeg tolerates: `CodeStream(data)` raises RuntimeError ("Invalid
  marker") on a JPEG with bytes between one segment and the next marker, which libjpeg skips
  with a warning. It raises when the code stream is made, before any decode.
- `Decoder.decode` writes its outputs when it is called, not in the order of the stream it is
  given (the hardware engines and the CUDA decoder run their own work).
- An image it allocates (a whole image, decoded without `images=`) comes from a pool that hands
  a block back to the next request on the same stream as soon as the image is let go
  (cudaFreeAsync, then cudaMallocAsync on that stream); a block let go while a copy queued on the
  stream still has to read it counts as freed early (`StandInCuda.freed_early`).
- A region of a JPEG with subsampled chroma is refused (None) unless the options allow fancy
  upsampling with regions (`enable_roi_fancy_upsampling=1`): the retry decodes the whole image.
- `garbage`: files the hardware engines decode into something and report as decoded (a file
  libjpeg refuses, here); their pixels are a constant grey.
"""

from __future__ import annotations

import ctypes
import enum
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from stoker import _core

__version__ = "0.8.0"


class BackendKind(enum.Enum):
    HW_GPU_ONLY = 1
    GPU_ONLY = 2
    HYBRID_CPU_GPU = 3


class ColorSpec(enum.Enum):
    SRGB = 1


class Backend:
    def __init__(self, kind: BackendKind, load_hint: float = 1.0):
        self.kind, self.load_hint = kind, load_hint


class DecodeParams:
    def __init__(self, apply_exif_orientation: bool = True, color_spec: Any = None):
        self.apply_exif_orientation, self.color_spec = apply_exif_orientation, color_spec


class Region:
    def __init__(self, start: tuple[int, int], end: tuple[int, int]):
        self.start, self.end = start, end


def _segments_back_to_back(data: bytes) -> bool:
    """Whether each marker segment before the first scan follows the one before directly."""
    at = 2  # after SOI
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return False
        marker = data[at + 1]
        if marker == 0xFF:  # fill bytes before a marker are allowed
            at += 1
            continue
        length = int.from_bytes(data[at + 2 : at + 4], "big")
        if marker == 0xDA:  # SOS: the entropy-coded data follows
            return True
        at += 2 + length
    return True


class CodeStream:
    def __init__(self, data: bytes, region: Region | None = None):
        if data[:2] != b"\xff\xd8" or not _segments_back_to_back(data):
            raise RuntimeError("Invalid marker")  # the parser's, before any decode
        self.data, self.region = data, region
        info = _core.image_info(data)
        self.height, self.width = info["height"], info["width"]

    def get_sub_code_stream(self, region: Region) -> CodeStream:
        return CodeStream(self.data, region)


class _Target:
    """An image the caller gave (`as_image` of an object with __cuda_array_interface__)."""

    def __init__(self, array: Any, cuda_stream: int):
        face = array.__cuda_array_interface__
        self.shape, self.strides, self.address = face["shape"], face["strides"], face["data"][0]
        self.cuda_stream = cuda_stream

    def write(self, pixels: np.ndarray) -> None:
        h, w, c = self.shape
        span = (h - 1) * self.strides[0] + (w - 1) * self.strides[1] + c
        raw = np.frombuffer((ctypes.c_uint8 * span).from_address(self.address), dtype=np.uint8)
        np.lib.stride_tricks.as_strided(raw, self.shape, self.strides)[:] = pixels


def as_image(array: Any, cuda_stream: int = 0) -> _Target:
    return _Target(array, cuda_stream)


class _Pooled:
    """A whole decoded image in a block of the decoder's pool; DLPack gives its tensor."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        return self.tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self.tensor.__dlpack_device__()


class Decoder:
    """See the module's docstring. `garbage(data)`: whether the engines "decode" the file."""

    garbage: Callable[[bytes], bool] = staticmethod(lambda data: False)
    cuda: Any = None  # the StandInCuda whose streams the copies are queued on

    def __init__(self, device_id: int = 0, max_num_cpu_threads: int = 1,
                 backends: Any = None, options: str = ""):  # fmt: skip
        self.device_id = device_id
        self.roi_fancy = "enable_roi_fancy_upsampling=1" in options
        self._free: dict[int, list[torch.Tensor]] = {}  # by stream
        self.allocated = 0  # blocks made (a block handed back is reused)

    def decode(self, sources: list[CodeStream], images: list[_Target] | None = None,
               params: Any = None, cuda_stream: int = 0) -> list[Any]:  # fmt: skip
        out: list[Any] = []
        for k, source in enumerate(sources):
            pixels = self._pixels(source)
            if pixels is None:
                out.append(None)
            elif images is not None:
                images[k].write(pixels)  # now, not when the stream gets there
                out.append(images[k])
            else:
                out.append(self._pooled(pixels, cuda_stream))
        return out

    def _pixels(self, source: CodeStream) -> np.ndarray | None:
        data, region = source.data, source.region
        if self.garbage(data):
            h, w = (source.height, source.width) if region is None else (
                region.end[0] - region.start[0], region.end[1] - region.start[1])  # fmt: skip
            return np.full((h, w, 3), 128, dtype=np.uint8)
        (y0, x0), (y1, x1) = ((0, 0), (source.height, source.width)) if region is None else (
            region.start, region.end)  # fmt: skip
        if region is not None and not self.roi_fancy and _subsampled(data):
            return None
        try:
            pixels, ox, oy = _core.decode_region(data, 1, x0, y0, x1, y1)
        except Exception:  # noqa: BLE001 - the engine's failure: no image
            return None
        return pixels[y0 - oy : y1 - oy, x0 - ox : x1 - ox]

    def _pooled(self, pixels: np.ndarray, cuda_stream: int) -> _Pooled:
        """cudaMallocAsync on the stream: the first free block of the stream large enough."""
        free = self._free.setdefault(cuda_stream, [])
        fit = next((k for k, b in enumerate(free) if b.numel() >= pixels.size), None)
        if fit is not None:
            block = free.pop(fit)
        else:
            block = torch.empty(pixels.size, dtype=torch.uint8)
            if self.cuda is not None:
                self.cuda.on_device(block, self.device_id)
            self.allocated += 1
        view = block[: pixels.size].view(pixels.shape)
        view.numpy()[:] = pixels  # written when called, not in the stream's order
        image = _Pooled(view)
        weakref.finalize(image, self._let_go, cuda_stream, block)
        return image

    def _let_go(self, cuda_stream: int, block: torch.Tensor) -> None:
        """cudaFreeAsync on the image's stream: the block is the next request's at once."""
        if self.cuda is not None:
            self.cuda.let_go(block)
        self._free.setdefault(cuda_stream, []).append(block)


def _subsampled(data: bytes) -> bool:
    """Whether a JPEG's chroma is subsampled (its components' sampling factors differ)."""
    at = data.find(b"\xff\xc0")
    if at < 0:
        at = data.find(b"\xff\xc1")
    if at < 0:
        return False
    count = data[at + 9]
    factors = {data[at + 11 + 3 * k] for k in range(count)}
    return len(factors) > 1
