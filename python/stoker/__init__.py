"""stoker: a C++ engine that feeds PyTorch training.

import stoker
stoker.pack("imagenet/train", "packs/train")
loader = stoker.ImageLoader("packs/train", batch_size=256)
for images, labels in loader: ...
"""

from .errors import (
    CorruptDataError,
    ErrorBudgetExceededError,
    InvalidArgumentError,
    ResourceLimitError,
    ShardIOError,
    StokerError,
    StokerInternalError,
    StokerWarning,
    UnsupportedFormatError,
)
from .loader import ImageLoader
from .packer import PackResult, inspect, pack
from .verify import VerifyReport, verify

__version__ = "0.1.0"

__all__ = [
    "ImageLoader",
    "pack",
    "inspect",
    "PackResult",
    "verify",
    "VerifyReport",
    "StokerError",
    "CorruptDataError",
    "UnsupportedFormatError",
    "ShardIOError",
    "ResourceLimitError",
    "InvalidArgumentError",
    "StokerInternalError",
    "ErrorBudgetExceededError",
    "StokerWarning",
]
