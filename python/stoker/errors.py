"""stoker's exceptions: one class per kind of failure, each derived from the closest built-in.

Every error raised for a sample names the shard and the key it came from::

    try:
        for images, labels in loader: ...
    except stoker.CorruptDataError as e:
        print(e.shard, e.key, e.reason)
"""

from __future__ import annotations


class StokerError(Exception):
    """Base class. ``shard``, ``key``, ``member`` (the sample's file, e.g. ``"seg.png"``) and
    ``reason`` are set where known ('' otherwise)."""

    def __init__(
        self, message: str, *, reason: str = "", shard: str = "", key: str = "", member: str = ""
    ):
        super().__init__(message)
        self.reason = reason or message
        self.shard = shard
        self.key = key
        self.member = member


class CorruptDataError(StokerError, ValueError):
    """Bytes that do not parse: a truncated or damaged image, shard, index or manifest."""


class UnsupportedFormatError(StokerError, ValueError):
    """A valid file stoker does not decode (12-bit or lossless JPEG, not an image at all)."""


class ShardIOError(StokerError, OSError):
    """A file could not be opened or read, or changed size after packing."""


class ResourceLimitError(StokerError, MemoryError):
    """Decoding would exceed a limit (max_pixels, progressive scans, memory)."""


class StokerInternalError(StokerError, RuntimeError):
    """A bug in stoker: please report it."""


class InvalidArgumentError(StokerError, ValueError):
    """An option or argument stoker cannot honour."""


class StepOutOfRangeError(InvalidArgumentError, IndexError):
    """A replayed step (``sample_ids``, ``batch_at``, ``stoker show``/``trace``) past the end of
    its epoch, or before its start: the message gives the epoch's length."""


def step_out_of_range(
    epoch: int, step: int, steps: int, world_size: int = 1
) -> StepOutOfRangeError:
    """The error for `step` of an epoch of `steps` steps (per rank, at `world_size` ranks)."""
    ranks = f" on each of {world_size} ranks" if world_size > 1 else ""
    count = "1 step" if steps == 1 else f"{steps:,} steps"
    which = {0: "none", 1: "step 0"}.get(steps, f"steps 0 to {steps - 1:,}")
    return StepOutOfRangeError(
        f"epoch {epoch} has {count}{ranks} ({which}): step {step:,} is not one of them"
    )


class ErrorBudgetExceededError(StokerError):
    """A pass skipped more samples than ``max_errors`` allows. ``shard``, ``key`` and ``reason``
    describe the sample that went over the budget; ``loader.stats()`` lists the others."""


class DeviceUnavailableError(StokerError, RuntimeError):
    """``device="cuda"`` asked of a torch build or machine without CUDA."""


class StokerWarning(UserWarning):
    """Issued for each skipped sample under ``on_error="warn"``, and where the GPU feed falls
    back (page-locking refused, a slot that could not be unlocked)."""


# Order matches stoker::ErrorCode in cpp/include/stoker/core/error.h.
_BY_CODE = (
    InvalidArgumentError,
    CorruptDataError,
    ShardIOError,
    UnsupportedFormatError,
    ResourceLimitError,
    StokerInternalError,
    ErrorBudgetExceededError,
)


def _from_core(
    code: int, message: str, reason: str, shard: str, key: str, member: str = ""
) -> StokerError:
    cls = _BY_CODE[code] if 0 <= code < len(_BY_CODE) else StokerInternalError
    return cls(message, reason=reason, shard=shard, key=key, member=member)


def error_class(code: int) -> type[StokerError]:
    return _BY_CODE[code] if 0 <= code < len(_BY_CODE) else StokerInternalError
