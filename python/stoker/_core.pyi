"""stoker's C++ engine. Use the stoker package, not this module."""

from collections.abc import Sequence
import enum
from typing import Annotated

import numpy
from numpy.typing import NDArray
from typing_extensions import CapsuleType


ERROR_CODES: tuple = ...

class Dataset:
    @staticmethod
    def open(path: str, seq_len: int = 0, token_dtype: str | None = None, sidecars: bool = True) -> Dataset:
        """
        A pack (tar, array or token pack), a .tar, a folder of .tar shards, or a token file (.bin, .npy); token data is read in windows of seq_len + 1 tokens. sidecars=False: a tar pack without its attached columns (attached.json).
        """

    @staticmethod
    def open_tars(tar_paths: Sequence[str]) -> Dataset: ...

    @staticmethod
    def open_fetched(path: str, seq_len: int = 0) -> Dataset:
        """
        A pack folder in a cache (manifest.json and the indexes) whose shards arrive through .gate while it is read.
        """

    @staticmethod
    def open_row_groups(path: str, row_groups: Sequence[tuple[str, int, int, Sequence[str]]], classes: Sequence[str]) -> Dataset:
        """
        Parquet row groups as shards: (name, rows, first row in its file, columns) each; their decoded columns arrive through .gate (ShardGate.ready_rows).
        """

    @property
    def gate(self) -> ShardGate: ...

    def verify_shard(self, shard: int, path: str) -> None:
        """
        Checks the file at path against shard's index: its size, and every member's CRC32C.
        """

    def resident(self) -> Dataset:
        """This dataset with every data file read into memory now."""

    @property
    def resident_bytes(self) -> int:
        """The bytes resident() holds: the data files' sizes."""

    def verify_file(self, entry: int, path: str) -> None:
        """
        Checks the file at path as the data file of gate entry `entry` (its size, a tar's members' CRC32C, a column's header, the file's CRC32C).
        """

    def __len__(self) -> int: ...

    @property
    def classes(self) -> list[str]: ...

    @property
    def attached(self) -> list[str]:
        """
        The names of the sidecars attached to this pack (stoker.attach), in order.
        """

    @property
    def num_shards(self) -> int: ...

    @property
    def has_crc(self) -> bool: ...

    @property
    def path(self) -> str: ...

    def page_cache(self) -> list:
        """[(shard path, bytes, bytes in the page cache)]"""

    def record(self, arg: int, /) -> dict: ...

    def read(self, i: int, member: str | None = None) -> bytes:
        """The stored bytes of sample i's member (by default its image)."""

    def image_sizes(self, shard: int, members: Sequence[str]) -> tuple:
        """
        (sizes, source): each sample's (height, width) of the first of `members` it has (0, 0: none, or unknown), int64 [n, 2], and where they were found: 'index', 'sizes file', 'headers' (read from the images now), 'layout' (an array pack's column) or 'none'.
        """

    def shard_files(self, shard: int) -> list:
        """
        The shard's data files: name, bytes, crc32c (a column's or token file's, or None) and gate entry.
        """

    def layout(self, shard: int) -> str:
        """'tar', 'columns', 'tokens' or 'row group'"""

    def shard_tokens(self, shard: int) -> int:
        """A token shard's tokens; 0 for other shards."""

    def token_source(self, shard: int) -> tuple:
        """A token shard's (file path, offset of token 0, dtype name)."""

    def member_names(self, shard: int) -> list[str]:
        """
        The member names a tar shard's index holds (any of its samples'), its sidecars' not included.
        """

    def keys(self, shard: int) -> list[str]:
        """The keys of a shard's samples, in order."""

    def shard_samples(self, shard: int) -> int: ...

def write_foreign_shard_index(tar_path: str, index_path: str) -> int:
    """
    Writes the index of a WebDataset tar stoker did not write, with every member's CRC32C; returns its number of samples.
    """

def shard_index_samples(index_path: str, shard_bytes: int) -> int:
    """
    The number of samples of a shard index, checked against its shard's size in bytes.
    """

class ShardGate:
    @property
    def num_shards(self) -> int: ...

    def ready(self, shard: int, path: str) -> None: ...

    def ready_rows(self, shard: int, source: str, rows: int, columns: Sequence[tuple[str, str, str, CapsuleType, CapsuleType]], error: str = '') -> None:
        """
        The shard is this decoded row group: per column (name, 'bytes' | 'number' | 'list', dtype, its Arrow schema and array capsules (__arrow_c_array__): large binary, a number, or a large list of numbers), the array moved out of its capsule and its buffers read in place; with `error`, one that did not decode, each of its rows failing with CorruptDataError(error). A bad length or offset is CorruptDataError naming source and the column.
        """

    def is_ready(self, shard: int) -> bool: ...

    def failed(self, shard: int, reason: str) -> None: ...

    def evict(self, shard: int) -> None: ...

    def wait_for_requests(self, timeout_ms: int) -> list[int]: ...

    def close(self) -> None: ...

    def stats(self) -> dict: ...

class ShardWriter:
    def __init__(self, tar_path: str, index_path: str) -> None: ...

    def add(self, key: str, data: bytes, label: int) -> None: ...

    def add_sample(self, key: str, members: Sequence[tuple[str, bytes]], label: int = -1) -> None:
        """
        Appends KEY.<name> for each (name, bytes), and KEY.cls for a label >= 0.
        """

    @property
    def bytes_written(self) -> int: ...

    @property
    def num_samples(self) -> int: ...

    def finish(self) -> None: ...

class AugmentStepKind(enum.Enum):
    timm_rand_augment = 0

    random_erasing = 1

    color_jitter = 2

    random_grayscale = 3

    gaussian_blur = 4

    torchvision_augment = 5

class ColorJitterOptions:
    def __init__(self) -> None: ...

    @property
    def brightness(self) -> list[float]: ...

    @brightness.setter
    def brightness(self, arg: Sequence[float], /) -> None: ...

    @property
    def contrast(self) -> list[float]: ...

    @contrast.setter
    def contrast(self, arg: Sequence[float], /) -> None: ...

    @property
    def saturation(self) -> list[float]: ...

    @saturation.setter
    def saturation(self, arg: Sequence[float], /) -> None: ...

    @property
    def hue(self) -> list[float]: ...

    @hue.setter
    def hue(self, arg: Sequence[float], /) -> None: ...

    @property
    def streams(self) -> list[int]: ...

    @streams.setter
    def streams(self, arg: Sequence[int], /) -> None: ...

class RandomGrayscaleOptions:
    def __init__(self) -> None: ...

    @property
    def p(self) -> float: ...

    @p.setter
    def p(self, arg: float, /) -> None: ...

    @property
    def stream(self) -> int: ...

    @stream.setter
    def stream(self, arg: int, /) -> None: ...

class GaussianBlurOptions:
    def __init__(self) -> None: ...

    @property
    def kernel_width(self) -> int: ...

    @kernel_width.setter
    def kernel_width(self, arg: int, /) -> None: ...

    @property
    def kernel_height(self) -> int: ...

    @kernel_height.setter
    def kernel_height(self, arg: int, /) -> None: ...

    @property
    def sigma_min(self) -> float: ...

    @sigma_min.setter
    def sigma_min(self, arg: float, /) -> None: ...

    @property
    def sigma_max(self) -> float: ...

    @sigma_max.setter
    def sigma_max(self, arg: float, /) -> None: ...

    @property
    def stream(self) -> int: ...

    @stream.setter
    def stream(self, arg: int, /) -> None: ...

class TorchvisionAugmentOptions:
    def __init__(self) -> None: ...

    @property
    def bins(self) -> int: ...

    @bins.setter
    def bins(self, arg: int, /) -> None: ...

    @property
    def magnitudes(self) -> list[float]: ...

    @magnitudes.setter
    def magnitudes(self, arg: Sequence[float], /) -> None: ...

    @property
    def fill_outside(self) -> bool: ...

    @fill_outside.setter
    def fill_outside(self, arg: bool, /) -> None: ...

    @property
    def fill(self) -> list[int]: ...

    @fill.setter
    def fill(self, arg: Sequence[int], /) -> None: ...

    @property
    def streams(self) -> list[list[int]]: ...

    @streams.setter
    def streams(self, arg: Sequence[Sequence[int]], /) -> None: ...

class Resample(enum.Enum):
    nearest = 0

    bilinear = 1

    bicubic = 2

class TimmRandAugmentOptions:
    def __init__(self) -> None: ...

    @property
    def magnitude(self) -> float: ...

    @magnitude.setter
    def magnitude(self, arg: float, /) -> None: ...

    @property
    def magnitude_std(self) -> float: ...

    @magnitude_std.setter
    def magnitude_std(self, arg: float, /) -> None: ...

    @property
    def prob(self) -> float: ...

    @prob.setter
    def prob(self, arg: float, /) -> None: ...

    @property
    def magnitude_max(self) -> float: ...

    @magnitude_max.setter
    def magnitude_max(self, arg: float, /) -> None: ...

    @property
    def fill(self) -> list[int]: ...

    @fill.setter
    def fill(self, arg: Sequence[int], /) -> None: ...

    @property
    def interpolation(self) -> list[Resample]: ...

    @interpolation.setter
    def interpolation(self, arg: Sequence[Resample], /) -> None: ...

    @property
    def streams(self) -> list[list[int]]: ...

    @streams.setter
    def streams(self, arg: Sequence[Sequence[int]], /) -> None: ...

class RandomErasingOptions:
    def __init__(self) -> None: ...

    @property
    def p(self) -> float: ...

    @p.setter
    def p(self, arg: float, /) -> None: ...

    @property
    def scale(self) -> list[float]: ...

    @scale.setter
    def scale(self, arg: Sequence[float], /) -> None: ...

    @property
    def ratio(self) -> list[float]: ...

    @ratio.setter
    def ratio(self, arg: Sequence[float], /) -> None: ...

    @property
    def value(self) -> list[int]: ...

    @value.setter
    def value(self, arg: Sequence[int], /) -> None: ...

    @property
    def streams(self) -> list[int]: ...

    @streams.setter
    def streams(self, arg: Sequence[int], /) -> None: ...

class AugmentStep:
    def __init__(self) -> None: ...

    @property
    def kind(self) -> AugmentStepKind: ...

    @kind.setter
    def kind(self, arg: AugmentStepKind, /) -> None: ...

    @property
    def timm_rand_augment(self) -> TimmRandAugmentOptions: ...

    @timm_rand_augment.setter
    def timm_rand_augment(self, arg: TimmRandAugmentOptions, /) -> None: ...

    @property
    def random_erasing(self) -> RandomErasingOptions: ...

    @random_erasing.setter
    def random_erasing(self, arg: RandomErasingOptions, /) -> None: ...

    @property
    def color_jitter(self) -> ColorJitterOptions: ...

    @color_jitter.setter
    def color_jitter(self, arg: ColorJitterOptions, /) -> None: ...

    @property
    def random_grayscale(self) -> RandomGrayscaleOptions: ...

    @random_grayscale.setter
    def random_grayscale(self, arg: RandomGrayscaleOptions, /) -> None: ...

    @property
    def gaussian_blur(self) -> GaussianBlurOptions: ...

    @gaussian_blur.setter
    def gaussian_blur(self, arg: GaussianBlurOptions, /) -> None: ...

    @property
    def torchvision_augment(self) -> TorchvisionAugmentOptions: ...

    @torchvision_augment.setter
    def torchvision_augment(self, arg: TorchvisionAugmentOptions, /) -> None: ...

def augment_images(steps: Sequence[AugmentStep], images: Annotated[NDArray[numpy.uint8], dict(shape=(None, None, None, None), order='C', device='cpu')], samples: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], seed: int, epoch: int, threads: int = 1) -> None: ...

def augment_op(images: Annotated[NDArray[numpy.uint8], dict(shape=(None, None, None, None), order='C', device='cpu')], op: str, magnitude: float = 0.0, fill: Sequence[int] = [0, 0, 0]) -> None: ...

def check_augment_step(step: AugmentStep) -> None:
    """
    Raises InvalidArgumentError where the workers would refuse this step's options.
    """

def blend_pairs(images: Annotated[NDArray[numpy.uint8], dict(shape=(None, None, None, None), order='C', device='cpu', writable=False)], out: Annotated[NDArray[numpy.uint8], dict(shape=(None, None, None, None), order='C', device='cpu')], lam: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)] | None, paste: Annotated[NDArray[numpy.bool_], dict(shape=(None, None, None), order='C', device='cpu', writable=False)] | None) -> None: ...

def fault_arm(kind: str, nth: int) -> None:
    """
    Count every kind's acquisitions from 0; the nth of `kind` fails (0: none does).
    """

def fault_disarm() -> None:
    """Stop counting and failing."""

def fault_due(kind: str) -> bool:
    """Count an acquisition of `kind`: whether it is the one to fail."""

def fault_describe(kind: str, what: str) -> str:
    """The reason an injected failure of `kind` gives."""

def fault_counts() -> list[tuple[str, int]]:
    """(kind, acquisitions) counted since fault_arm."""

def fault_fired() -> bool:
    """Whether the failure armed has happened."""

def fault_hold(point: str) -> None:
    """
    From now on, the first thread to reach hold point `point` waits there until fault_release().
    """

def fault_wait_held(timeout_ms: int) -> bool:
    """
    Wait up to timeout_ms for a thread to reach the point held: whether one has.
    """

def fault_release() -> None:
    """Let the thread held go on; no point holds any more."""

class DType(enum.Enum):
    bool = 0

    uint8 = 1

    int8 = 2

    uint16 = 3

    int16 = 4

    uint32 = 5

    int32 = 6

    uint64 = 7

    int64 = 8

    float16 = 9

    float32 = 10

    float64 = 11

class GeometryKind(enum.Enum):
    random_resized_crop = 0

    resize_center_crop = 1

    resize = 2

    letterbox = 3

    random_crop = 4

    cover_crop = 5

class FieldKind(enum.Enum):
    image = 0

    mask = 1

    boxes = 2

    label = 3

    array = 4

    bytes = 5

    tokens = 6

    video = 7

    audio = 8

class MediaStart(enum.Enum):
    random = 0

    center = 1

    start = 2

class ShortClip(enum.Enum):
    loop = 0

    pad = 1

    skip = 2

class BoxFormat(enum.Enum):
    xyxy = 0

    xywh = 1

    cxcywh = 2

class MissingPolicy(enum.Enum):
    error = 0

    skip = 1

class ErrorPolicy(enum.Enum):
    raise_ = 0

    skip = 1

    replace = 2

class ShuffleMode(enum.Enum):
    none = 0

    global_ = 1

    block = 2

class Leftovers(enum.Enum):
    carry = 0

    drop = 1

    partial = 2

class DecodeOptions:
    def __init__(self) -> None: ...

    @property
    def max_pixels(self) -> int: ...

    @max_pixels.setter
    def max_pixels(self, arg: int, /) -> None: ...

    @property
    def max_scans(self) -> int: ...

    @max_scans.setter
    def max_scans(self, arg: int, /) -> None: ...

    @property
    def max_decode_memory(self) -> int: ...

    @max_decode_memory.setter
    def max_decode_memory(self, arg: int, /) -> None: ...

    @property
    def fast_upsampling(self) -> bool: ...

    @fast_upsampling.setter
    def fast_upsampling(self, arg: bool, /) -> None: ...

    @property
    def fast_idct(self) -> bool: ...

    @fast_idct.setter
    def fast_idct(self, arg: bool, /) -> None: ...

    @property
    def progressive_shortcut(self) -> bool: ...

    @progressive_shortcut.setter
    def progressive_shortcut(self, arg: bool, /) -> None: ...

    @property
    def restart_roi(self) -> bool: ...

    @restart_roi.setter
    def restart_roi(self, arg: bool, /) -> None: ...

    @property
    def restart_huffman(self) -> bool: ...

    @restart_huffman.setter
    def restart_huffman(self, arg: bool, /) -> None: ...

    @property
    def scan_index(self) -> bool: ...

    @scan_index.setter
    def scan_index(self, arg: bool, /) -> None: ...

    @property
    def max_scan_index_memory(self) -> int: ...

    @max_scan_index_memory.setter
    def max_scan_index_memory(self, arg: int, /) -> None: ...

    @property
    def read_to_end(self) -> bool: ...

    @read_to_end.setter
    def read_to_end(self, arg: bool, /) -> None: ...

class RandomResizedCropOptions:
    def __init__(self) -> None: ...

    @property
    def scale_min(self) -> float: ...

    @scale_min.setter
    def scale_min(self, arg: float, /) -> None: ...

    @property
    def scale_max(self) -> float: ...

    @scale_max.setter
    def scale_max(self, arg: float, /) -> None: ...

    @property
    def ratio_min(self) -> float: ...

    @ratio_min.setter
    def ratio_min(self, arg: float, /) -> None: ...

    @property
    def ratio_max(self) -> float: ...

    @ratio_max.setter
    def ratio_max(self, arg: float, /) -> None: ...

    @property
    def tries(self) -> int: ...

    @tries.setter
    def tries(self, arg: int, /) -> None: ...

class GeometryOptions:
    def __init__(self) -> None: ...

    @property
    def kind(self) -> GeometryKind: ...

    @kind.setter
    def kind(self, arg: GeometryKind, /) -> None: ...

    @property
    def crop(self) -> RandomResizedCropOptions: ...

    @crop.setter
    def crop(self, arg: RandomResizedCropOptions, /) -> None: ...

    @property
    def resize_size(self) -> int: ...

    @resize_size.setter
    def resize_size(self, arg: int, /) -> None: ...

    @property
    def random_position(self) -> bool: ...

    @random_position.setter
    def random_position(self, arg: bool, /) -> None: ...

    @property
    def padding(self) -> int: ...

    @padding.setter
    def padding(self, arg: int, /) -> None: ...

    @property
    def hflip(self) -> float: ...

    @hflip.setter
    def hflip(self, arg: float, /) -> None: ...

    @property
    def vflip(self) -> float: ...

    @vflip.setter
    def vflip(self, arg: float, /) -> None: ...

class ImageOptions:
    def __init__(self) -> None: ...

    @property
    def height(self) -> int: ...

    @height.setter
    def height(self, arg: int, /) -> None: ...

    @property
    def width(self) -> int: ...

    @width.setter
    def width(self, arg: int, /) -> None: ...

    @property
    def channels(self) -> int: ...

    @channels.setter
    def channels(self, arg: int, /) -> None: ...

    @property
    def geometry(self) -> GeometryOptions: ...

    @geometry.setter
    def geometry(self, arg: GeometryOptions, /) -> None: ...

    @property
    def fill(self) -> int: ...

    @fill.setter
    def fill(self, arg: int, /) -> None: ...

    @property
    def allow_dct_scaling(self) -> bool: ...

    @allow_dct_scaling.setter
    def allow_dct_scaling(self, arg: bool, /) -> None: ...

    @property
    def decode(self) -> DecodeOptions: ...

    @decode.setter
    def decode(self, arg: DecodeOptions, /) -> None: ...

    @property
    def return_params(self) -> bool: ...

    @return_params.setter
    def return_params(self, arg: bool, /) -> None: ...

    @property
    def augment(self) -> list[AugmentStep]: ...

    @augment.setter
    def augment(self, arg: Sequence[AugmentStep], /) -> None: ...

    @property
    def device_decode(self) -> bool: ...

    @device_decode.setter
    def device_decode(self, arg: bool, /) -> None: ...

    @property
    def device_max_scale_denom(self) -> int: ...

    @device_max_scale_denom.setter
    def device_max_scale_denom(self, arg: int, /) -> None: ...

class MaskOptions:
    def __init__(self) -> None: ...

    @property
    def fill(self) -> int: ...

    @fill.setter
    def fill(self, arg: int, /) -> None: ...

    @property
    def decode(self) -> DecodeOptions: ...

    @decode.setter
    def decode(self, arg: DecodeOptions, /) -> None: ...

class BoxesOptions:
    def __init__(self) -> None: ...

    @property
    def source_format(self) -> BoxFormat: ...

    @source_format.setter
    def source_format(self, arg: BoxFormat, /) -> None: ...

    @property
    def source_normalized(self) -> bool: ...

    @source_normalized.setter
    def source_normalized(self, arg: bool, /) -> None: ...

    @property
    def format(self) -> BoxFormat: ...

    @format.setter
    def format(self, arg: BoxFormat, /) -> None: ...

    @property
    def normalized(self) -> bool: ...

    @normalized.setter
    def normalized(self, arg: bool, /) -> None: ...

    @property
    def max_boxes(self) -> int: ...

    @max_boxes.setter
    def max_boxes(self, arg: int, /) -> None: ...

    @property
    def min_visible(self) -> float: ...

    @min_visible.setter
    def min_visible(self, arg: float, /) -> None: ...

    @property
    def max_stored_boxes(self) -> int: ...

    @max_stored_boxes.setter
    def max_stored_boxes(self, arg: int, /) -> None: ...

class ArrayOptions:
    def __init__(self) -> None: ...

    @property
    def dtype(self) -> DType: ...

    @dtype.setter
    def dtype(self, arg: DType, /) -> None: ...

    @property
    def shape(self) -> list[int]: ...

    @shape.setter
    def shape(self, arg: Sequence[int], /) -> None: ...

    @property
    def max_length(self) -> int: ...

    @max_length.setter
    def max_length(self, arg: int, /) -> None: ...

    @property
    def max_elements(self) -> int: ...

    @max_elements.setter
    def max_elements(self, arg: int, /) -> None: ...

class TokensOptions:
    def __init__(self) -> None: ...

    @property
    def seq_len(self) -> int: ...

    @seq_len.setter
    def seq_len(self, arg: int, /) -> None: ...

    @property
    def eos_id(self) -> int: ...

    @eos_id.setter
    def eos_id(self, arg: int, /) -> None: ...

    @property
    def positions(self) -> bool: ...

    @positions.setter
    def positions(self, arg: bool, /) -> None: ...

class MediaLimitOptions:
    def __init__(self) -> None: ...

    @property
    def max_pixels(self) -> int: ...

    @max_pixels.setter
    def max_pixels(self, arg: int, /) -> None: ...

    @property
    def max_frames(self) -> int: ...

    @max_frames.setter
    def max_frames(self, arg: int, /) -> None: ...

    @property
    def max_seconds(self) -> float: ...

    @max_seconds.setter
    def max_seconds(self, arg: float, /) -> None: ...

    @property
    def max_decoded_frames(self) -> int: ...

    @max_decoded_frames.setter
    def max_decoded_frames(self, arg: int, /) -> None: ...

    @property
    def max_sample_rate(self) -> int: ...

    @max_sample_rate.setter
    def max_sample_rate(self, arg: int, /) -> None: ...

    @property
    def max_channels(self) -> int: ...

    @max_channels.setter
    def max_channels(self, arg: int, /) -> None: ...

class VideoOptions:
    def __init__(self) -> None: ...

    @property
    def frames(self) -> int: ...

    @frames.setter
    def frames(self, arg: int, /) -> None: ...

    @property
    def stride(self) -> int: ...

    @stride.setter
    def stride(self, arg: int, /) -> None: ...

    @property
    def fps(self) -> float: ...

    @fps.setter
    def fps(self, arg: float, /) -> None: ...

    @property
    def height(self) -> int: ...

    @height.setter
    def height(self, arg: int, /) -> None: ...

    @property
    def width(self) -> int: ...

    @width.setter
    def width(self, arg: int, /) -> None: ...

    @property
    def geometry(self) -> GeometryOptions: ...

    @geometry.setter
    def geometry(self, arg: GeometryOptions, /) -> None: ...

    @property
    def fill(self) -> int: ...

    @fill.setter
    def fill(self, arg: int, /) -> None: ...

    @property
    def start(self) -> MediaStart: ...

    @start.setter
    def start(self, arg: MediaStart, /) -> None: ...

    @property
    def short_clip(self) -> ShortClip: ...

    @short_clip.setter
    def short_clip(self, arg: ShortClip, /) -> None: ...

    @property
    def decoder_threads(self) -> int: ...

    @decoder_threads.setter
    def decoder_threads(self, arg: int, /) -> None: ...

    @property
    def limits(self) -> MediaLimitOptions: ...

    @limits.setter
    def limits(self, arg: MediaLimitOptions, /) -> None: ...

class AudioOptions:
    def __init__(self) -> None: ...

    @property
    def seconds(self) -> float: ...

    @seconds.setter
    def seconds(self, arg: float, /) -> None: ...

    @property
    def sample_rate(self) -> int: ...

    @sample_rate.setter
    def sample_rate(self, arg: int, /) -> None: ...

    @property
    def channels(self) -> int: ...

    @channels.setter
    def channels(self, arg: int, /) -> None: ...

    @property
    def start(self) -> MediaStart: ...

    @start.setter
    def start(self, arg: MediaStart, /) -> None: ...

    @property
    def limits(self) -> MediaLimitOptions: ...

    @limits.setter
    def limits(self, arg: MediaLimitOptions, /) -> None: ...

    def samples(self) -> int: ...

def install_media_plugin(plugin: CapsuleType) -> None:
    """
    Installs the media plugin (stoker._media.plugin()) the Video and Audio fields decode with.
    """

def media_plugin_library() -> str:
    """What the installed media plugin decodes with ("": none installed)."""

class FieldSpec:
    def __init__(self) -> None: ...

    @property
    def name(self) -> str: ...

    @name.setter
    def name(self, arg: str, /) -> None: ...

    @property
    def kind(self) -> FieldKind: ...

    @kind.setter
    def kind(self, arg: FieldKind, /) -> None: ...

    @property
    def member(self) -> str: ...

    @member.setter
    def member(self, arg: str, /) -> None: ...

    @property
    def follow(self) -> str: ...

    @follow.setter
    def follow(self, arg: str, /) -> None: ...

    @property
    def optional(self) -> bool: ...

    @optional.setter
    def optional(self, arg: bool, /) -> None: ...

    @property
    def max_member_bytes(self) -> int: ...

    @max_member_bytes.setter
    def max_member_bytes(self, arg: int, /) -> None: ...

    @property
    def image(self) -> ImageOptions: ...

    @image.setter
    def image(self, arg: ImageOptions, /) -> None: ...

    @property
    def mask(self) -> MaskOptions: ...

    @mask.setter
    def mask(self, arg: MaskOptions, /) -> None: ...

    @property
    def boxes(self) -> BoxesOptions: ...

    @boxes.setter
    def boxes(self, arg: BoxesOptions, /) -> None: ...

    @property
    def array(self) -> ArrayOptions: ...

    @array.setter
    def array(self, arg: ArrayOptions, /) -> None: ...

    @property
    def tokens(self) -> TokensOptions: ...

    @tokens.setter
    def tokens(self, arg: TokensOptions, /) -> None: ...

    @property
    def video(self) -> VideoOptions: ...

    @video.setter
    def video(self, arg: VideoOptions, /) -> None: ...

    @property
    def audio(self) -> AudioOptions: ...

    @audio.setter
    def audio(self, arg: AudioOptions, /) -> None: ...

class LoaderOptions:
    def __init__(self) -> None: ...

    @property
    def batch_size(self) -> int: ...

    @batch_size.setter
    def batch_size(self, arg: int, /) -> None: ...

    @property
    def fields(self) -> list[FieldSpec]: ...

    @fields.setter
    def fields(self, arg: Sequence[FieldSpec], /) -> None: ...

    @property
    def missing(self) -> MissingPolicy: ...

    @missing.setter
    def missing(self, arg: MissingPolicy, /) -> None: ...

    @property
    def shuffle(self) -> ShuffleMode: ...

    @shuffle.setter
    def shuffle(self, arg: ShuffleMode, /) -> None: ...

    @property
    def shuffle_window(self) -> int: ...

    @shuffle_window.setter
    def shuffle_window(self, arg: int, /) -> None: ...

    @property
    def seed(self) -> int: ...

    @seed.setter
    def seed(self, arg: int, /) -> None: ...

    @property
    def drop_last(self) -> bool: ...

    @drop_last.setter
    def drop_last(self, arg: bool, /) -> None: ...

    @property
    def threads(self) -> int: ...

    @threads.setter
    def threads(self, arg: int, /) -> None: ...

    @property
    def prefetch(self) -> int: ...

    @prefetch.setter
    def prefetch(self, arg: int, /) -> None: ...

    @property
    def autotune(self) -> bool: ...

    @autotune.setter
    def autotune(self, arg: bool, /) -> None: ...

    @property
    def read_latency_us(self) -> int: ...

    @read_latency_us.setter
    def read_latency_us(self, arg: int, /) -> None: ...

    @property
    def rank(self) -> int: ...

    @rank.setter
    def rank(self, arg: int, /) -> None: ...

    @property
    def world_size(self) -> int: ...

    @world_size.setter
    def world_size(self, arg: int, /) -> None: ...

    @property
    def on_error(self) -> ErrorPolicy: ...

    @on_error.setter
    def on_error(self, arg: ErrorPolicy, /) -> None: ...

    @property
    def max_errors(self) -> int: ...

    @max_errors.setter
    def max_errors(self, arg: int, /) -> None: ...

    @property
    def max_error_fraction(self) -> float: ...

    @max_error_fraction.setter
    def max_error_fraction(self, arg: float, /) -> None: ...

    @property
    def verify_crc(self) -> bool: ...

    @verify_crc.setter
    def verify_crc(self, arg: bool, /) -> None: ...

    @property
    def keep_slots(self) -> bool: ...

    @keep_slots.setter
    def keep_slots(self, arg: bool, /) -> None: ...

    @property
    def load_samples(self) -> bool: ...

    @load_samples.setter
    def load_samples(self, arg: bool, /) -> None: ...

    @property
    def grouping(self) -> GroupingOptions: ...

    @grouping.setter
    def grouping(self, arg: GroupingOptions, /) -> None: ...

    @property
    def group_image_sizes(self) -> list[tuple[int, int]]: ...

    @group_image_sizes.setter
    def group_image_sizes(self, arg: Sequence[tuple[int, int]], /) -> None: ...

    @property
    def group_frames(self) -> list[int]: ...

    @group_frames.setter
    def group_frames(self, arg: Sequence[int], /) -> None: ...

    @property
    def sized_field(self) -> int: ...

    @sized_field.setter
    def sized_field(self, arg: int, /) -> None: ...

class GroupingOptions:
    def __init__(self, group_of: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], batch_sizes: Sequence[int], same_shape_across_ranks: bool, leftovers: Leftovers) -> None: ...

    @property
    def batch_sizes(self) -> list[int]: ...

    @property
    def same_shape_across_ranks(self) -> bool: ...

    @property
    def leftovers(self) -> Leftovers: ...

    @property
    def num_samples(self) -> int: ...

class Loader:
    def __init__(self, dataset: Dataset, options: LoaderOptions) -> None: ...

    @property
    def options(self) -> LoaderOptions: ...

    @property
    def outputs(self) -> list:
        """(field name, output name) of each tensor next() returns"""

    @property
    def blob_fields(self) -> list:
        """names of the Bytes fields, in the order of next()'s lists"""

    @property
    def num_batches(self) -> int: ...

    def batches_left(self) -> int:
        """
        Batches the pass in progress has yet to hand out (at most); 0 between passes
        """

    def draw_geometry(self, field: int, epoch: int, samples: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], width: int, height: int) -> Annotated[NDArray[numpy.float64], dict(shape=(None, None))]:
        """
        The geometry params (as an Image's params output, [n, 14]) field `field` draws for each of `samples` of width x height pixels in `epoch`.
        """

    def step_samples(self, epoch: int, step: int, rank: int, world_size: int) -> list[int]: ...

    def upcoming_shards(self, max: int) -> list[int]:
        """
        The distinct shards the pass reads next, soonest first: every shard of the batches in flight, then at most `max` more (a remote pack's fetch plan).
        """

    @property
    def samples_per_rank(self) -> int: ...

    def epoch_plan(self, epoch: int, world_size: int) -> object:
        """
        With grouping: epoch `epoch`'s plan at `world_size` ranks: its steps, every batch's group and size (batch s * world_size + r is rank r's step s), and its leftovers (carried_in, carried, dropped, padded); None without grouping.
        """

    @property
    def threads(self) -> int: ...

    @property
    def max_threads(self) -> int: ...

    @property
    def slot_bytes(self) -> int: ...

    @property
    def slots_allocated(self) -> int: ...

    def set_epoch(self, arg: int, /) -> None: ...

    def set_ranks(self, rank: int, world_size: int) -> None:
        """
        This process's share of the passes begun from now on; a pass in progress keeps its own.
        """

    def state(self) -> tuple:
        """(epoch, samples_consumed by all ranks, batches_done by this rank)"""

    def load_state(self, epoch: int, samples_consumed: int, batches_done: int = 0) -> None:
        """
        Resume epoch `epoch` after samples_consumed positions (grouped: after batches_done steps)
        """

    def begin(self, max_batches: int = -1) -> None:
        """
        Start a pass (from a loaded state if any); max_batches >= 0 ends it after that many
        """

    def account_elsewhere(self, failures: list, missing: int) -> None:
        """
        load_samples=False: the last batch handed out was loaded elsewhere, where these failed (skipped_since's dicts, in batch order) and `missing` were left out: counted as this loader's own (stats, the skipped list, max_errors)
        """

    def next(self) -> object:
        """
        (images NHWC uint8, labels, indices, slot address, batch number), or None at the end
        """

    def close(self) -> None: ...

    @property
    def device_share(self) -> float:
        """
        decode="gpu"/"auto": the share of each batch begun from now on that may go to the device decoder (its first positions)
        """

    @device_share.setter
    def device_share(self, arg: float, /) -> None: ...

    def decode_on_host(self, sample: int, epoch: int, position: int) -> object:
        """
        A sample the device failed on, decoded here into a one-sample batch (next()'s tuple); the host's failure under on_error: raised, or None (skipped), or a substitute's batch (replace).
        """

    def stats(self, listed: bool = True) -> dict: ...

    def tuning(self) -> list: ...

    def skipped_since(self, arg: int, /) -> list: ...

def pack_rows(lengths: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], row_of: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu')], slot_of: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu')], capacity: int, max_segments: int, window: int, fit: str) -> int:
    """
    Writes each piece's row into row_of and its place in the row into slot_of (int64, one per piece) and returns the number of rows: pieces taken `window` at a time, each window in decreasing length, into the tightest open row (best_fit) or the first (first_fit) of `capacity` tokens and at most `max_segments` pieces (0: no bound).
    """

class TokenRows:
    """
    A token pack's stream (its shards' arrays, set as they are mapped) and the packed batches written from it.
    """

    def __init__(self, starts: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], dtype: str) -> None: ...

    def set_shard(self, shard: int, path: str | None) -> None:
        """
        Opens shard `shard`'s token file at `path` (checked against its token count), or drops it (None).
        """

    def fill(self, offset: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], span_ptr: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], spans: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], row_ptr: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], doc: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], start: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], length: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], rows: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], input_ids: Annotated[NDArray[numpy.int64], dict(order='C', device='cpu')], labels: Annotated[NDArray[numpy.int64], dict(order='C', device='cpu')], position_ids: Annotated[NDArray[numpy.int64], dict(order='C', device='cpu')], seq_idx: Annotated[NDArray[numpy.int32], dict(order='C', device='cpu')], cu_seqlens: Annotated[NDArray[numpy.int32], dict(order='C', device='cpu')], width: int, pad_id: int, flatten: bool, shift_labels: bool) -> tuple[int, int, int]:
        """
        Writes the batch of plan `rows` (-1: padding) into the outputs; returns (loss tokens, segments, longest segment). The GIL is released while it writes.
        """

def crc32c(arg: bytes, /) -> int: ...

def file_crc32c(path: str) -> int:
    """The CRC32C of a whole file (an array pack's column, a token shard)."""

def image_info(arg: bytes, /) -> dict: ...

def decode_image(arg: bytes, /) -> Annotated[NDArray[numpy.uint8], dict(shape=(None, None, None), order='C')]:
    """Decodes a whole JPEG or PNG to RGB8, HxWx3."""

def decode_region(data: bytes, scale_denom: int, x0: int, y0: int, x1: int, y1: int) -> tuple:
    """
    Decodes at least [x0, x1) x [y0, y1) of the image scaled by 1/scale_denom, as the loader's decoder does (a JPEG's whole MCUs): (HxWx3 pixels, origin x, origin y) of the region decoded.
    """

def transform_image(data: bytes, size: int = 224, train: bool = False, seed: int = 0, epoch: int = 0, index: int = 0, resize_size: int = 0, dct_scaling: bool = True) -> tuple:
    """
    One sample through the loader's decode + crop + resize: (HxWx3 pixels, DCT scale used).
    """

def resize_box(arg0: Annotated[NDArray[numpy.uint8], dict(shape=(None, None, None), order='C', device='cpu', writable=False)], arg1: float, arg2: float, arg3: float, arg4: float, arg5: int, arg6: int, /) -> Annotated[NDArray[numpy.uint8], dict(shape=(None, None, None), order='C')]:
    """
    PIL-equivalent Image.resize((width, height), BILINEAR, box=(x0, y0, x1, y1)).
    """

class KeyedRandom:
    def __init__(self, seed: int, stream: int, index: int) -> None: ...

    def uniform(self, arg0: float, arg1: float, /) -> float: ...

    def below(self, arg: int, /) -> int: ...

def random_resized_crop(width: int, height: int, rng: KeyedRandom, scale_min: float = 0.08, scale_max: float = 1.0, ratio_min: float = 0.75, ratio_max: float = 1.3333333333333333) -> tuple: ...

def prepare_image(data: bytes, max_side: int = 0, quality: int = 90, restart_interval: int = 0, codec: str = 'source', size_width: int = 0, size_height: int = 0) -> tuple:
    """
    Checks that an image decodes; if max_side is set and exceeded, returns it shrunk and re-encoded as JPEG (codec='jpeg': every image re-encoded as JPEG at quality, shrunk or not); with restart_interval, baseline JPEGs are rewritten losslessly with restart markers every that many MCUs. codec='raw': its decoded pixels as a binary PPM, at size_width x size_height when given, else shrunk to max_side. (bytes, format, width, height, rewritten).
    """

def decode_throughput(images: Sequence[bytes], threads: int, repeats: int = 1) -> float:
    """
    Seconds to fully decode every image `repeats` times on `threads` threads: the ceiling that a loader decoding at full size cannot beat.
    """

def verify_range(dataset: Dataset, begin: int, end: int, *, check_crc: bool = True, decode: bool = True, fail_on_warnings: bool = True, max_pixels: int = 268435456, max_scans: int = 256, max_decode_memory: int = 536870912) -> dict:
    """
    Checks samples [begin, end): CRC32C against the index (when the dataset has CRCs) and a full decode. Returns {'failures': [(index, error_code, shard, key, reason)], 'checked', 'bytes', 'crc_checked'}. Releases the GIL.
    """
