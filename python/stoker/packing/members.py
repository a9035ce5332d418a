"""Members: what a name says a member holds, a source's value made into the member's bytes, and
those bytes checked (images prepared) for the pack. Every source goes through here, so a `jpg`,
a `seg.png`, a `feat.npy`, a `txt` or a `json` is the same thing whichever format it came from.

A member's name is its kind (docs/FORMAT.md): ``jpg``/``jpeg``/``png``/``webp`` an image (a
``*seg.png``/``*mask.png`` a mask), ``mp4``/``mkv``/``webm``/``avi``/``mov`` a video,
``wav``/``flac``/``mp3``/``ogg``/``oga``/``opus``/``m4a`` audio (both stored as they are),
``*.npy`` an array (``boxes.npy`` boxes), ``cls`` the label, ``*.json`` JSON, ``*.txt`` text,
anything else bytes.
"""

from __future__ import annotations

import io
import json
import math
import struct
from dataclasses import dataclass
from typing import Any

from .. import _core
from ..errors import InvalidArgumentError

IMAGE_MEMBER_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
VIDEO_MEMBER_EXTENSIONS = ("mp4", "mkv", "webm", "avi", "mov", "mpg", "mpeg")
AUDIO_MEMBER_EXTENSIONS = ("wav", "flac", "mp3", "ogg", "oga", "opus", "m4a")
MASK_STEMS = ("seg", "mask")  # "seg.png", "mask.png", "sem_seg.png": a mask, not an image
BOXES_STEMS = ("boxes", "bbox", "bboxes")  # "boxes.npy"
FIELD_KINDS = ("image", "mask", "label", "array", "boxes", "json", "text", "bytes", "video",
               "audio")  # fmt: skip
LABEL_MEMBER = "cls"
MAX_MEMBER_NAME = 91  # a tar name is at most 100 bytes: the 8-digit key, '.', the member name

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Options:
    """How a pack stores images (stoker.pack's arguments)."""

    max_side: int = 0
    quality: int = 90
    restart_interval: int = 0
    codec: str = "source"  # "raw": decoded pixels (binary PPM), read without decoding
    size: tuple[int, int] | None = None  # (width, height) of every raw image
    image_codec: str = "png"  # how pixels (a PIL image, an array) are encoded: "png" or "jpeg"
    video_keyint: int = 0  # > 0: videos re-encoded with a keyframe every so many frames
    audio_rate: int = 0  # > 0: sounds decoded and stored as 16-bit PCM WAV at this rate
    audio_channels: int = 0  # with audio_rate: 1 their mean, 0 the file's own
    video_remux: bool = False  # videos in a container without an index copied into MP4


# One member's entry for the manifest's schema: (name, kind, dtype, shape).
FieldInfo = tuple[str, str, "str | None", "list[int] | None"]


def member_kind(name: str) -> str:
    """The schema kind of a member, from its name: an image extension is an image (a mask when
    it is a PNG named ``*seg.png`` or ``*mask.png``), a video or audio container's extension
    video or audio, ``*.npy`` an array (boxes when named ``boxes.npy``), ``cls`` a label,
    ``*.json`` JSON, ``*.txt`` text, anything else bytes."""
    stem, _, ext = name.lower().rpartition(".")
    if ext in IMAGE_MEMBER_EXTENSIONS:
        return "mask" if ext == "png" and stem.endswith(MASK_STEMS) else "image"
    if ext in VIDEO_MEMBER_EXTENSIONS:
        return "video"
    if ext in AUDIO_MEMBER_EXTENSIONS:
        return "audio"
    if ext == "npy":
        return "boxes" if stem.rpartition(".")[2] in BOXES_STEMS else "array"
    return {"cls": "label", "json": "json", "txt": "text"}.get(ext, "bytes")


def check_member_name(name: str, where: str) -> str:
    if (
        not isinstance(name, str)
        or not name
        or name.startswith(".")
        or "/" in name
        or len(name.encode()) > MAX_MEMBER_NAME
        or any(c.isspace() or not c.isprintable() for c in name)
    ):
        raise InvalidArgumentError(
            f"{where}: {name!r} is not a member name (printable, no spaces or '/', not starting "
            f"with '.', at most {MAX_MEMBER_NAME} bytes: 'jpg', 'seg.png', 'feat.npy', 'txt')"
        )
    return name


def default_name(column: str, kind: str, first_image: bool = False) -> str:
    """The member a source's column becomes when the user names none: a column already named
    as a member (``jpg``, ``seg.png``, ``caption.txt``, ``mp4``, ``clip.webm``, ``wav``) keeps
    its name; otherwise the first
    image column is the bare extension of its format (``jpg``, ``png``: what stoker.Image()
    reads by default, written ``"{ext}"`` here and resolved per sample), other images
    ``{column}.{ext}``, text ``{column}.txt``, arrays ``{column}.npy``, nested values
    ``{column}.json``. Characters a member name cannot hold become ``_``."""
    safe = "".join(c if c.isprintable() and not c.isspace() and c != "/" else "_" for c in column)
    safe = safe.lstrip(".") or "_"
    if "." in safe and member_kind(safe) != "bytes":
        return safe
    if member_kind(safe) in ("video", "audio"):  # a column named "mp4", "wav": those members
        return safe
    if kind == "image":
        return "{ext}" if first_image else safe + ".{ext}"
    ext = {"text": "txt", "array": "npy", "json": "json", "mask": "seg.png"}.get(kind, "bin")
    return f"{safe}.{ext}"


# --- a source's value as a member's bytes ----------------------------------------------------


def image_format(data: bytes | memoryview) -> str | None:
    """The extension of an encoded image stoker decodes (jpg, png, webp, ppm), from its first
    bytes; None for anything else."""
    head = bytes(data[:12])
    if head[:3] == b"\xff\xd8\xff":
        return "jpg"
    if head[:8] == _PNG_SIGNATURE:
        return "png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:2] in (b"P5", b"P6"):
        return "ppm"
    return None


def _pil_image():
    try:
        from PIL import Image
    except ImportError:
        raise InvalidArgumentError(
            "encoding pixels as an image member needs Pillow (pip install pillow)"
        ) from None
    return Image


def _as_array(value: Any) -> Any:
    import numpy as np

    if type(value).__module__.startswith("torch"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def is_pixels(value: Any) -> bool:
    """A PIL image, or a uint8 array laid out as an image: HxW, HxWx1, HxWx3 or HxWx4."""
    if type(value).__module__.startswith("PIL."):
        return True
    dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
    if shape is None or str(dtype) not in ("uint8", "torch.uint8"):
        return False
    return len(shape) == 3 and shape[2] in (1, 3, 4)


def encode_pixels(value: Any, ext: str, quality: int) -> bytes:
    """A PIL image or a uint8 HxW[xC] array as a PNG (lossless), a JPEG at `quality`, or a
    lossless WebP."""
    Image = _pil_image()
    if not type(value).__module__.startswith("PIL."):
        array = _as_array(value)
        if array.dtype.name != "uint8" or array.ndim not in (2, 3):
            raise ValueError(f"pixels are uint8 HxW or HxWxC, not {array.dtype} {array.shape}")
        if array.ndim == 3 and array.shape[2] == 1:
            array = array[:, :, 0]
        value = Image.fromarray(array)
    out = io.BytesIO()
    if ext in ("jpg", "jpeg"):
        if value.mode not in ("RGB", "L"):
            value = value.convert("RGB")
        value.save(out, format="JPEG", quality=quality)
    elif ext == "webp":
        value.save(out, format="WEBP", lossless=True)
    else:
        if value.mode not in ("1", "L", "LA", "P", "RGB", "RGBA", "I;16"):
            value = value.convert("RGBA" if "A" in value.getbands() else "RGB")
        value.save(out, format="PNG", compress_level=1)
    return out.getvalue()


def to_png(data: bytes) -> bytes:
    """An encoded image stoker does not decode (BMP, TIFF, GIF...) as a PNG, pixel for pixel."""
    Image = _pil_image()
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return encode_pixels(image, "png", 0)
    except (OSError, ValueError, SyntaxError) as e:
        raise ValueError(f"not an image stoker or Pillow can read: {e}") from None


def npy_bytes(value: Any) -> bytes:
    """An array-like (numpy, torch, a number, a list of numbers) as .npy bytes; bytes that
    already are a .npy file are kept. Object arrays are refused."""
    import numpy as np

    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        if data[:6] == b"\x93NUMPY":
            return data
        raise ValueError("bytes that are not a .npy file cannot be an array member")
    array = _as_array(value)
    if array.dtype.hasobject or array.dtype.kind in "USV":
        raise ValueError(f"{array.dtype} values are not an array of numbers")
    out = io.BytesIO()
    np.lib.format.write_array(out, np.require(array, requirements="C"), allow_pickle=False)
    return out.getvalue()


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy arrays and scalars, torch tensors
        return value.tolist()
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8")
    raise TypeError(f"{type(value).__name__} is not JSON")


def json_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8")
    if isinstance(value, str):
        json.loads(value)  # JSON text is stored as it is, once it parses
        return value.encode()
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                      default=_json_default).encode()  # fmt: skip


def label_value(value: Any) -> int:
    """A label as an int >= 0 (Python, numpy or 0-d torch integers; decimal text)."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("ascii", errors="replace")
    if isinstance(value, str):
        if not value.strip().isdigit():
            raise ValueError(f"a label must be a decimal integer >= 0, not {value[:40]!r}")
        return int(value)
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"a label must be an integer >= 0, not {value!r}")
    return value


def value_bytes(name: str, value: Any, opts: Options) -> tuple[str, bytes]:
    """(the member's name, its bytes) for `value` under `name`: a ``{ext}`` in the name becomes
    the encoded image's extension. Pixels (a PIL image, a uint8 HWC array) become an image
    encoded as the name (or `opts.image_codec`) says."""
    kind = member_kind(name.replace("{ext}", "png"))
    if kind in ("image", "mask"):
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
            ext = image_format(data)
            if ext is None:
                data, ext = to_png(data), "png"
        elif value is None:
            raise ValueError("no image (a null value)")
        else:
            if "{ext}" in name:
                ext = "jpg" if opts.image_codec == "jpeg" else "png"
            else:
                ext = name.rpartition(".")[2].lower()
            if kind == "mask":
                ext = "png"
            data = encode_pixels(value, ext, opts.quality)
        return name.replace("{ext}", ext), data
    if kind in ("array", "boxes"):
        return name, npy_bytes(value)
    if kind == "label":
        return name, str(label_value(value)).encode()
    if kind == "json":
        return name, json_bytes(value)
    if kind == "text":
        if isinstance(value, (bytes, bytearray)):
            bytes(value).decode("utf-8")  # must be UTF-8 text
            return name, bytes(value)
        if not isinstance(value, str):
            raise ValueError(f"a text member holds a string, not {type(value).__name__}")
        return name, value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return name, bytes(value)
    if isinstance(value, str):
        return name, value.encode("utf-8")
    raise ValueError(f"{name}: {type(value).__name__} is not bytes (name the member *.npy, "
                     "*.json or *.txt to convert it)")  # fmt: skip


# --- a member's bytes checked, and images prepared, for the pack ------------------------------


def prepare_image(data: bytes, opts: Options) -> tuple[bytes, str, int, int, bool]:
    """(bytes, format, width, height, rewritten) of an image as the pack stores it."""
    width, height = opts.size or (0, 0)
    return _core.prepare_image(
        data, opts.max_side, opts.quality, opts.restart_interval, opts.codec, width, height
    )


def image_field(name: str, data: bytes, width: int, height: int) -> FieldInfo:
    components = _core.image_info(data)["components"]  # the header only
    return (name, "image", "uint8", [height, width, components])


def mask_size(data: bytes) -> tuple[int, int]:
    """(height, width) of a PNG mask: grey or palette, at most 8 bits (decode::MaskDecoder's)."""
    if len(data) < 33 or data[:8] != _PNG_SIGNATURE or data[12:16] != b"IHDR":
        raise ValueError("a mask must be a PNG")
    width, height, depth, colour = struct.unpack(">IIBB", data[16:26])
    if colour not in (0, 3) or depth > 8:
        raise ValueError(
            f"a mask must be a grey or palette PNG of at most 8 bits per pixel "
            f"(this one has colour type {colour}, {depth} bits)"
        )
    _core.prepare_image(data, 0, 90, 0)  # proves that it decodes; rewrites nothing
    return height, width


def npy_header(data: bytes) -> tuple[str, list[int]]:
    """dtype name and shape from a .npy header, with the data's size checked against them.
    Headers are read by numpy's parser (a literal, never a pickle); object arrays are refused."""
    import numpy as np

    f = io.BytesIO(data)
    try:
        major, minor = np.lib.format.read_magic(f)
        if major == 1:
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        elif major in (2, 3):  # 3.0 differs from 2.0 only in the header's text encoding (utf8)
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"version {major}.{minor}")
    except (ValueError, SyntaxError, TypeError) as e:
        raise ValueError(f"not a .npy array: {e}") from e
    if dtype.hasobject:
        raise ValueError("an object array (pickled Python objects) is never packed")
    expected = math.prod(shape) * dtype.itemsize
    if len(data) - f.tell() != expected:
        raise ValueError(
            f"{len(data) - f.tell()} bytes of data, its header says {expected} "
            f"({dtype.name} {list(shape)})"
        )
    return dtype.name, list(shape)


def media_format(data: bytes | memoryview) -> str | None:
    """Whether `data` starts as a video or audio container does ("video", "audio"; mp4 and
    m4a share one signature: "media"), from its first bytes; None for anything else (an HTML
    error page saved as .mp4, a truncated download)."""
    head = bytes(data[:16])
    if head[4:8] == b"ftyp":  # ISO media: mp4, mov, m4a
        return "media"
    if head[:4] == b"\x1a\x45\xdf\xa3":  # Matroska: mkv, webm
        return "video"
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "video"
    if head[:4] in (b"\x00\x00\x01\xba", b"\x00\x00\x01\xb3"):  # MPEG program stream, ES
        return "video"
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "audio"
    if head[:4] in (b"fLaC", b"OggS") or head[:3] == b"ID3":
        return "audio"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:  # an MPEG audio frame
        return "audio"
    return None


def check_media(data: bytes, kind: str) -> None:
    """A video or audio member is stored as it is, once its first bytes say it is one."""
    found = media_format(data)
    if found is None or found not in ("media", kind):
        what = "empty" if not data else f"its first bytes are {bytes(data[:8])!r}"
        raise InvalidArgumentError(f"not a{'n' if kind == 'audio' else ''} {kind} file: {what}")


def renamed(name: str, extension: str) -> str:
    """A member's name with its last extension replaced ("jpg" -> "ppm", "clip.webm" ->
    "clip.mp4"): what a member is called once stored in another format."""
    return name.rpartition(".")[0] + ("." if "." in name else "") + extension


def member_data(name: str, kind: str, data: bytes, opts: Options) -> tuple[bytes, FieldInfo, bool]:
    """Checks (and for images, prepares) one member's bytes: (bytes, schema entry, rewritten).
    An image stored raw is renamed ``*.ppm``."""
    if kind == "image":
        rewritten = False
        if image_format(data) is None:  # BMP, TIFF, GIF...: a PNG of the same pixels
            data, rewritten = to_png(data), True
        data, fmt, width, height, prepared = prepare_image(data, opts)
        if fmt == "ppm" and name.rpartition(".")[2] != "ppm":
            name = renamed(name, "ppm")
        return data, image_field(name, data, width, height), bool(prepared) or rewritten
    if kind == "mask":  # never re-encoded: a lossy or resampled mask changes its class ids
        return data, (name, kind, "uint8", list(mask_size(data))), False
    if kind in ("video", "audio"):  # stored as they are (docs/FORMAT.md)
        check_media(data, kind)
        if kind == "video" and opts.video_keyint:  # re-encoded for cheap random access
            from .transcode import reencode_video

            data = reencode_video(data, opts.video_keyint, opts.max_side)
            name = renamed(name, "mp4")
            return data, (name, kind, None, None), True
        if kind == "video" and opts.video_remux:  # the same frames, in a container with an index
            from .transcode import indexed_container, remux_video

            if not indexed_container(data):  # MP4, MOV, Matroska and WebM stay as they are
                data, ext = remux_video(data)
                return data, (renamed(name, ext), kind, None, None), True
        if kind == "audio" and opts.audio_rate:  # decoded once, at the model's rate
            from .transcode import resample_audio

            data = resample_audio(data, opts.audio_rate, opts.audio_channels)
            name = renamed(name, "wav")
            return data, (name, kind, None, None), True
        return data, (name, kind, None, None), False
    if kind in ("array", "boxes"):
        dtype, shape = npy_header(data)
        return data, (name, kind, dtype, shape), False
    if kind == "label":
        label_value(data)
        return data, (name, kind, "int64", []), False
    if kind == "json":
        json.loads(data)
    elif kind == "text":
        data.decode("utf-8")
    return data, (name, kind, None, None), False
