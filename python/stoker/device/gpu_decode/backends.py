"""The device decoders decode="gpu" can use, behind one contract (``DeviceDecoder``): decode a
batch of JPEG regions into the tensors given, each the exact region asked for, and say which
failed. ``NvImageCodec`` is NVIDIA's nvImageCodec (the library under DALI's decoders): the GPU's
hardware JPEG engines (A100, H100 and later) for a share of each batch, its CUDA decoder for the
rest and for what the engines refuse, each region decoded as a region (ROI). ``HostDecoder`` is
stoker's own decoder, the host path's, region by region: the stand-in the tests run the device
path with on machines without a GPU.

nvImageCodec is loaded at run time: stoker's wheel has no CUDA in it. Without it, decode="gpu"
raises DeviceUnavailableError saying how to install it (``pip install 'stoker[gpu]'``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from ... import _core
from ...errors import DeviceUnavailableError, StokerError

INSTALL = (
    "pip install 'stoker[gpu]' (nvidia-nvimgcodec-cu12 for CUDA 12; 'stoker[gpu-cu13]' gives "
    "nvidia-nvimgcodec-cu13 for CUDA 13), or give decode='host'"
)
MIN_NVIMGCODEC = (0, 7)  # decoding into given buffers (images=), regions of a code stream


class Targets:
    """Where a batch's decoded regions go: image i, uint8 [h, w, 3] RGB (its region's size),
    starts `offsets[i]` bytes into the one-dimensional `buffer`, its rows `pitches[i]` bytes
    apart. Kept as numbers rather than a tensor view per image: a batch's views cost more host
    time than the rest of the stage's Python (three dispatched operations each)."""

    __slots__ = ("buffer", "offsets", "pitches", "heights", "widths")

    def __init__(self, buffer: torch.Tensor, offsets: Sequence[int], pitches: Sequence[int],
                 heights: Sequence[int], widths: Sequence[int]):  # fmt: skip
        self.buffer = buffer
        self.offsets, self.pitches = list(offsets), list(pitches)
        self.heights, self.widths = list(heights), list(widths)

    def __len__(self) -> int:
        return len(self.offsets)

    def view(self, i: int) -> torch.Tensor:
        """Image i as a tensor view of the buffer."""
        return self.buffer.as_strided((self.heights[i], self.widths[i], 3),
                                      (self.pitches[i], 3, 1), self.offsets[i])  # fmt: skip

    def cuda_arrays(self) -> list["_CudaArray"]:
        """Each image as an object with __cuda_array_interface__ (a pointer, shape, strides)."""
        base = self.buffer.data_ptr()
        return [_CudaArray(base + o, h, w, p) for o, h, w, p in
                zip(self.offsets, self.heights, self.widths, self.pitches)]  # fmt: skip

    def select(self, keep: Sequence[bool]) -> "Targets":
        """The images where `keep` is true."""
        rows = [i for i, k in enumerate(keep) if k]
        return Targets(self.buffer, [self.offsets[i] for i in rows],
                       [self.pitches[i] for i in rows], [self.heights[i] for i in rows],
                       [self.widths[i] for i in rows])  # fmt: skip


class _CudaArray:
    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, address: int, height: int, width: int, pitch: int):
        self.__cuda_array_interface__ = {
            "shape": (height, width, 3), "strides": (pitch, 3, 1), "typestr": "|u1",
            "data": (address, False), "version": 2,
        }  # fmt: skip


class DeviceDecoder(Protocol):
    """What the device stage asks of a decoder."""

    # The largest DCT scale denominator it decodes at (1, 2, 4 or 8): the engine plans each
    # image's decoding scale up to it.
    max_scale_denom: int

    def decode_into(self, blobs: Sequence[bytes], regions: np.ndarray,
                    targets: Targets) -> list[bool]:  # fmt: skip
        """Decode region i of JPEG blobs[i] into target i, on the current stream of the
        targets' device. regions: int [N, 5], each (scale denominator, x0, y0, x1, y1) of the
        image scaled by 1/denominator; target i: uint8 [y1 - y0, x1 - x0, 3] (RGB, a place in a
        larger buffer). Returns, per image, whether it was decoded (False: the caller decodes
        it on the host)."""
        ...

    def end_pass(self) -> None:
        """The pass ended and its stream's work is done: let go what was kept for that work."""
        ...


class DecoderFactory(NamedTuple):
    """How a device decoder is made for a device (in the stage's own thread, that device
    current) and the largest DCT scale denominator it decodes at, which the engine plans with
    beforehand."""

    build: Callable[[torch.device], DeviceDecoder]
    max_scale_denom: int

    @classmethod
    def reusing(cls, decoder: DeviceDecoder) -> "DecoderFactory":
        """A factory that hands out `decoder` itself (one already made)."""
        return cls(lambda device: decoder, decoder.max_scale_denom)


class HostDecoder:
    """stoker's own decoder (libjpeg-turbo, the host path's), one region at a time: the device
    path's stand-in on a machine without a GPU, whose pixels are the host path's exactly."""

    max_scale_denom = 8

    def __init__(self) -> None:
        self.decoded = 0

    def decode_into(self, blobs: Sequence[bytes], regions: np.ndarray,
                    targets: Targets) -> list[bool]:  # fmt: skip
        done = []
        for i, (data, (denom, x0, y0, x1, y1)) in enumerate(zip(blobs, regions.tolist(),
                                                                 strict=True)):  # fmt: skip
            try:
                pixels, ox, oy = _core.decode_region(data, denom, x0, y0, x1, y1)
            except StokerError:
                done.append(False)
                continue
            targets.view(i).copy_(torch.from_numpy(pixels[y0 - oy : y1 - oy, x0 - ox : x1 - ox]))
            self.decoded += 1
            done.append(True)
        return done

    def end_pass(self) -> None:
        """Nothing is kept between calls."""


def load_nvimgcodec() -> Any:
    """The nvimgcodec module, or DeviceUnavailableError saying what is missing."""
    try:
        from nvidia import nvimgcodec  # type: ignore[attr-defined,import-not-found,unused-ignore]
    except ImportError as e:  # also: a wheel for another CUDA than the driver's
        raise DeviceUnavailableError(
            f"decode='gpu' needs NVIDIA's nvImageCodec, which did not import ({e}): {INSTALL}"
        ) from None
    version = tuple(int(p) for p in str(getattr(nvimgcodec, "__version__", "0.0")).split(".")[:2])
    if version < MIN_NVIMGCODEC:
        raise DeviceUnavailableError(
            f"decode='gpu' needs nvImageCodec {'.'.join(map(str, MIN_NVIMGCODEC))} or later, "
            f"found {nvimgcodec.__version__}: {INSTALL}"
        )
    return nvimgcodec


class NvImageCodec:
    """nvImageCodec's batched decoder on one CUDA device: the hardware JPEG engines take
    `hardware_share` of each batch (rounded up to the engines' batch, nvImageCodec's load hint),
    its CUDA decoder the rest and whatever the engines refuse. Each image is decoded as the
    region its plan asks for, straight into the stage's buffer, on the stream current at the
    call. Where a region is refused (nvImageCodec gives no pixels), the whole image is decoded
    and the region copied out of it; where that fails too, the image is left to the host, as is
    a file whose code stream nvImageCodec's parser refuses (it raises where libjpeg only warns:
    the host path decodes it, or its error meets on_error with the sample's shard and key).

    ``options``: nvImageCodec's option string. The default keeps libjpeg's fancy chroma
    upsampling (what the host path and Pillow do) and allows it with regions, which nvImageCodec
    0.9 otherwise refuses for subsampled JPEGs before nvJPEG 13.2 (an edge pixel of the region
    may then differ: the plans' regions carry a margin of two pixels that the resampler never
    reads)."""

    max_scale_denom = 1  # nvImageCodec decodes at full size only
    DEFAULT_OPTIONS = ":fancy_upsampling=1 :enable_roi_fancy_upsampling=1"

    def __init__(
        self,
        device: torch.device,
        hardware_share: float = 0.99,
        options: str = DEFAULT_OPTIONS,
        cpu_threads: int = 4,
        batch_size: int = 0,
    ):
        codec = load_nvimgcodec()
        self.codec, self.device = codec, device
        kinds = codec.BackendKind
        backends = [codec.Backend(kinds.HW_GPU_ONLY, load_hint=hardware_share),
                    codec.Backend(kinds.GPU_ONLY), codec.Backend(kinds.HYBRID_CPU_GPU)]  # fmt: skip
        if batch_size > 0:  # the engines' memory for a whole batch, allocated now (as DALI does)
            options += (f" nvjpeg_hw_decoder:preallocate_batch_size={batch_size}"
                        " nvjpeg_cuda_decoder:preallocate_buffers=1")  # fmt: skip
        index = device.index if device.index is not None else torch.cuda.current_device()
        # At least two CPU threads: nvImageCodec parses and submits with them.
        self.decoder = codec.Decoder(device_id=index, max_num_cpu_threads=max(2, cpu_threads),
                                     backends=backends, options=options)  # fmt: skip
        # EXIF orientation is not applied (the host path, like PIL's open, does not); uint8 RGB.
        self.params = codec.DecodeParams(
            apply_exif_orientation=False, color_spec=codec.ColorSpec.SRGB
        )
        self.refused_regions = 0  # decoded whole after nvImageCodec refused the region
        self.refused_streams = 0  # files whose code stream the parser refused: left to the host
        # Whole images decoded for refused regions, each with an event after the copies out of
        # them: nvImageCodec allocates them on the stream (cudaMallocAsync) and frees them when
        # they are let go (cudaFreeAsync), and its engines write a later call's outputs when it
        # is made, not in stream order: a block let go before its copy ran could be written over.
        self._held: deque[tuple[Any, list[Any]]] = deque()

    def decode_into(self, blobs: Sequence[bytes], regions: np.ndarray,
                    targets: Targets) -> list[bool]:  # fmt: skip
        codec = self.codec
        current = torch.cuda.current_stream(self.device)
        stream = current.cuda_stream
        while self._held and self._held[0][0].query():
            self._held.popleft()
        # Each file's code stream on its own: one the parser refuses fails alone.
        streams: list[Any] = []
        sources: list[Any] = []
        for data, (_, x0, y0, x1, y1) in zip(blobs, regions.tolist(), strict=True):
            try:
                code = codec.CodeStream(data)
                sources.append(code.get_sub_code_stream(
                    region=codec.Region(start=(y0, x0), end=(y1, x1))))  # fmt: skip
                streams.append(code)
            except RuntimeError:  # nvImageCodec's parser: "Invalid marker" and the like
                self.refused_streams += 1
                streams.append(None)
                sources.append(None)
        parsed = [i for i, s in enumerate(sources) if s is not None]
        arrays = targets.cuda_arrays()
        # On the decode's stream: a buffer nvImageCodec takes to be on another stream is
        # synchronised first, image by image.
        images = [codec.as_image(arrays[i], cuda_stream=stream) for i in parsed]
        got = self.decoder.decode([sources[i] for i in parsed], images=images,
                                  params=self.params, cuda_stream=stream)  # fmt: skip
        done = [False] * len(blobs)
        for i, image in zip(parsed, got, strict=True):
            done[i] = image is not None
        retry = [i for i in parsed if not done[i]]
        if retry:
            self.refused_regions += len(retry)
            whole = self.decoder.decode([streams[i] for i in retry], params=self.params,
                                        cuda_stream=stream)  # fmt: skip
            for i, image in zip(retry, whole, strict=True):
                if image is None:
                    continue
                _, x0, y0, x1, y1 = (int(v) for v in regions[i])
                pixels = torch.utils.dlpack.from_dlpack(image)  # ordered on `stream` by DLPack
                targets.view(i).copy_(pixels[y0:y1, x0:x1, :3])
                done[i] = True
            event = torch.cuda.Event(blocking=True)
            event.record(current)
            self._held.append((event, whole))
        return done

    def end_pass(self) -> None:
        """The stream's work is done: the whole images are read no more."""
        self._held.clear()


def decoder_for(device: torch.device, batch_size: int = 0) -> DecoderFactory:
    """How to make the device decoder of `device` (in the stage's thread): nvImageCodec on a
    CUDA device, checked now (DeviceUnavailableError without it, or without CUDA), built later
    for the device each pass resolves, preallocated for `batch_size` images."""
    if device.type != "cuda":
        raise DeviceUnavailableError(
            f"decode='gpu' decodes on a CUDA device, not {device.type!r}: give device='cuda'"
        )
    load_nvimgcodec()
    return DecoderFactory(lambda on: NvImageCodec(on, batch_size=batch_size),
                          NvImageCodec.max_scale_denom)  # fmt: skip
