"""stoker: a C++ engine that feeds PyTorch training.

import stoker
stoker.pack("imagenet/train", "packs/train")
loader = stoker.ImageLoader("packs/train", batch_size=256)
for images, labels in loader: ...

Any sample shape: stoker.Loader(path, batch_size=32, fields={"image": stoker.Image("jpg"),
"mask": stoker.Mask("seg.png", follow="image"), "boxes": stoker.Boxes("json", follow="image")}).

On a GPU: ImageLoader(..., device="cuda", dtype=torch.bfloat16, mean=stoker.IMAGENET_MEAN,
std=stoker.IMAGENET_STD), or stoker.to_device(any_dataloader, "cuda", ...).
"""

from .errors import (
    CorruptDataError,
    DeviceUnavailableError,
    ErrorBudgetExceededError,
    InvalidArgumentError,
    StepOutOfRangeError,
    ResourceLimitError,
    ShardIOError,
    StokerError,
    StokerInternalError,
    StokerWarning,
    UnsupportedFormatError,
)
from .doctor import Diagnosis, Recommendation, diagnose, watch
from .load.fields import (
    Array,
    Boxes,
    Bytes,
    CenterCrop,
    CoverCrop,
    Image,
    Json,
    Label,
    Letterbox,
    Mask,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    Text,
    Tokens,
    Video,
    Audio,
)
from .load.buckets import AspectBuckets, VideoBuckets
from .load.loader import ImageLoader, Loader
from .load.mix import Mix, mix
from .packing import (AttachResult, PackResult, VideoFacts, attach, inspect, pack, pack_arrays,
                      pack_tokens, video_facts)
from .packing.text import pack_text
from .load.record import read_record
from .tools.replay import augment_draws, show
from .doctor.sweep import SweepResult, sweep
from .load.tokens import TokenLoader
from .load.packed import PackedTokenLoader
from .load.workers import RayWorkers
from .tools.verify import VerifyReport, verify

__version__ = "0.1.0"

_DEVICE_NAMES = ("to_device", "DeviceFeed", "IMAGENET_MEAN", "IMAGENET_STD")


def __getattr__(name: str):
    # The device feed imports torch: only when it is used, so that `stoker verify` starts fast.
    if name in _DEVICE_NAMES:
        from . import device

        return getattr(device, name)
    raise AttributeError(f"module 'stoker' has no attribute {name!r}")


__all__ = [
    "Loader",
    "ImageLoader",
    "RayWorkers",
    "TokenLoader",
    "PackedTokenLoader",
    "mix",
    "Mix",
    "Image",
    "Mask",
    "Boxes",
    "Label",
    "Array",
    "Bytes",
    "Text",
    "Json",
    "Tokens",
    "Video",
    "Audio",
    "RandomResizedCrop",
    "CenterCrop",
    "Resize",
    "Letterbox",
    "RandomCrop",
    "CoverCrop",
    "AspectBuckets",
    "VideoBuckets",
    "diagnose",
    "watch",
    "Diagnosis",
    "Recommendation",
    "sweep",
    "SweepResult",
    "show",
    "augment_draws",
    "read_record",
    "to_device",
    "DeviceFeed",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "pack",
    "pack_arrays",
    "pack_tokens",
    "pack_text",
    "inspect",
    "video_facts",
    "attach",
    "AttachResult",
    "VideoFacts",
    "PackResult",
    "verify",
    "VerifyReport",
    "StokerError",
    "CorruptDataError",
    "UnsupportedFormatError",
    "ShardIOError",
    "ResourceLimitError",
    "InvalidArgumentError",
    "StepOutOfRangeError",
    "StokerInternalError",
    "ErrorBudgetExceededError",
    "DeviceUnavailableError",
    "StokerWarning",
]
