"""``decode="gpu"`` and ``decode="auto"``: JPEG decoding on the batch's CUDA device, beside the
host's worker threads.

The engine's workers read each sample and draw its geometry as for the host path (the same keyed
crop and flips) and plan its rendering (cpp: fields::RenderPlan: the region of the image to
decode, at which DCT scale, and the resampler's box), but a sequential JPEG of 1 or 3 components
is not decoded there: its compressed bytes ride with the batch. Once the batch is copied to the
device, the feed's stage thread (device.stage_thread: a thread and CUDA stream of its own, off
the training thread) runs ``DeviceDecodeStage``: one batched decode call for all of them
(``backends``: nvImageCodec, the GPU's hardware JPEG engines), each only its region, into a ring
of buffers that the engines write only once their previous batch's render is done
(``DecodeRing``), then the render into the batch in batch operations (``resample``: Pillow's
antialiased bilinear in its fixed point, byte for byte the host resampler's on the same
pixels), then augment= and normalising.
Any other file (progressive, CMYK, PNG, WebP) is decoded by the workers, as is, with
decode="auto", the share of each batch ``split`` gives the host. A file the device fails on is
decoded again on the host, whose outcome (pixels, or the error under on_error) is the host path's.
"""

from .backends import (
    DecoderFactory,
    DeviceDecoder,
    HostDecoder,
    NvImageCodec,
    Targets,
    decoder_for,
    load_nvimgcodec,
)
from .split import HostDeviceSplit
from .stage import DecodeRing, DeviceDecodeStage

__all__ = [
    "DecodeRing",
    "DecoderFactory",
    "DeviceDecodeStage",
    "DeviceDecoder",
    "HostDecoder",
    "HostDeviceSplit",
    "NvImageCodec",
    "Targets",
    "decoder_for",
    "load_nvimgcodec",
]
