"""``decode="gpu"`` and ``decode="auto"``: JPEG decoding on the batch's CUDA device, beside the
host's worker threads.

The engine's workers read each sample and draw its geometry as for the host path (the same keyed
crop and flips) and plan its rendering (cpp: fields::RenderPlan: the region of the image to
decode, at which DCT scale, and the resampler's box), but a sequential JPEG of 1 or 3 components
is not decoded there: its compressed bytes ride with the batch. Once the batch is on the device,
on the feed's side stream, ``DeviceDecodeStage`` decodes all of them in one batched call
(``backends``: nvImageCodec, the GPU's hardware JPEG engines), each only its region, and renders
them into the batch in batch operations (``resample``: Pillow's antialiased bilinear in its fixed
point, byte for byte the host resampler's on the same pixels), before augment= and normalising.
Any other file (progressive, CMYK, PNG, WebP) is decoded by the workers, as is, with
decode="auto", the share of each batch ``split`` gives the host. A file the device fails on is
decoded again on the host, whose outcome (pixels, or the error under on_error) is the host path's.
"""

from .backends import DeviceDecoder, HostDecoder, NvImageCodec, decoder_for, load_nvimgcodec
from .split import HostDeviceSplit
from .stage import DeviceDecodeStage

__all__ = [
    "DeviceDecodeStage",
    "DeviceDecoder",
    "HostDecoder",
    "HostDeviceSplit",
    "NvImageCodec",
    "decoder_for",
    "load_nvimgcodec",
]
