"""The fields of a sample: what each member of a WebDataset sample (``KEY.jpg``, ``KEY.seg.png``,
``KEY.json``, ...) becomes in a batch.

Each class here only names the C++ field kind and its options (``_core.FieldSpec``, declared in
cpp/include/stoker/fields/field.h); decoding happens on the engine's threads. A field that
``follow``s an Image takes that image's random geometry, so masks and boxes stay aligned with the
pixels they describe.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from .. import _core
from ..errors import InvalidArgumentError, UnsupportedFormatError
from .geometry import CenterCrop as CenterCrop  # the geometries are named here too
from .geometry import CoverCrop as CoverCrop
from .geometry import Geometry as Geometry
from .geometry import Letterbox as Letterbox
from .geometry import RandomCrop as RandomCrop
from .geometry import RandomResizedCrop as RandomResizedCrop
from .geometry import Resize as Resize
from .geometry import _check_geometry, _set_geometry, _size

IMAGE_MEMBERS = "jpg;jpeg;png;webp;ppm"
# As packing stores them (stoker.packing.members' video and audio extensions).
VIDEO_MEMBERS = "mp4;mkv;webm;avi;mov;mpg;mpeg"
AUDIO_MEMBERS = "wav;flac;mp3;ogg;oga;opus;m4a"

_DTYPES = {
    name: getattr(_core.DType, name)
    for name in (
        "bool",
        "uint8",
        "int8",
        "uint16",
        "int16",
        "uint32",
        "int32",
        "uint64",
        "int64",
        "float16",
        "float32",
        "float64",
    )
}
_BOX_FORMATS = {
    "xyxy": _core.BoxFormat.xyxy,
    "xywh": _core.BoxFormat.xywh,
    "cxcywh": _core.BoxFormat.cxcywh,
}


def _dtype(dtype: Any) -> _core.DType:
    """A numpy/torch dtype or its name -> _core.DType."""
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPES:
        raise InvalidArgumentError(f"unsupported dtype {dtype!r}: one of {', '.join(_DTYPES)}")
    return _DTYPES[name]


def _box_format(name: str, what: str) -> _core.BoxFormat:
    if name not in _BOX_FORMATS:
        raise InvalidArgumentError(f"{what} must be 'xyxy', 'xywh' or 'cxcywh', not {name!r}")
    return _BOX_FORMATS[name]


# --- field kinds --------------------------------------------------------------------------------


class Field:
    """Base of the field kinds. ``member`` names the sample's file (``"jpg"`` for KEY.jpg;
    alternatives separated by ``;``: the first the sample has). ``optional=True``: a sample
    without it gets the field's empty value instead of the loader's ``missing`` policy."""

    kind: Any = None
    member: str
    optional: bool
    follow: str | None = None
    max_member_bytes: int = 256 << 20

    def _spec(self, name: str, train: bool) -> _core.FieldSpec:
        spec = _core.FieldSpec()
        spec.name = name
        spec.kind = self.kind
        spec.member = self.member
        spec.follow = self.follow or ""
        spec.optional = self.optional
        spec.max_member_bytes = self.max_member_bytes
        return spec

    def _assemble(self, tensors: list[Any]) -> Any:
        return tensors[0]

    def _extras(self, name: str, tensors: list[Any]) -> dict[str, Any]:
        """Entries of the batch besides ``batch[name]`` (an Image's ``name_params``)."""
        return {}

    def __repr__(self) -> str:
        options = ", ".join(
            f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_") and v is not None
        )
        return f"{type(self).__name__}({options})"


class Image(Field):
    """An image member (JPEG, PNG, WebP, or raw pixels: a PPM of a ``codec="raw"`` pack, an
    array pack's uint8 column) -> ``uint8 [B, C, H, W]`` (channels_last memory).

    ``size``: an int (square) or ``(height, width)``. ``geometry``: RandomResizedCrop,
    CenterCrop, Resize, Letterbox or RandomCrop; by default RandomResizedCrop when the loader's
    ``train=True`` and CenterCrop otherwise, as ImageLoader does. ``hflip``/``vflip``: flip
    probabilities (``hflip`` defaults to 0.5 for the default training geometry, 0 otherwise).
    ``channels=1``: grey (PIL's ``convert("L")`` of the RGB output). ``follow``: take another
    Image field's geometry (two views of one scene). ``return_params=True`` adds
    ``batch[name + "_params"]``: each sample's ``box`` (x0, y0, x1, y1 in source pixels),
    ``rect`` (where it lands in the output, before flips), ``scale``, ``hflip``, ``vflip`` and
    ``source_size`` (width, height). Decoding limits, ``fast_idct`` and ``scan_index_memory`` as
    ImageLoader's.
    ``decode="gpu"`` (with a loader's ``device="cuda"``): sequential JPEGs decoded on the GPU's
    JPEG engines (nvImageCodec), only the region the crop needs, resampled there as the host
    path resamples (stoker.device.gpu_decode); other files on the host, counted in
    ``stats()["decode"]``. ``decode="auto"``: each batch split between the host's threads and
    the GPU by their measured rates (the host alone where there is no GPU decoder).
    """

    kind = _core.FieldKind.image

    def __init__(
        self,
        member: str = IMAGE_MEMBERS,
        *,
        size: int | tuple[int, int] = 224,
        geometry: Geometry | None = None,
        hflip: float | None = None,
        vflip: float = 0.0,
        channels: int = 3,
        follow: str | None = None,
        return_params: bool = False,
        dct_scaling: bool = True,
        max_pixels: int = 1 << 28,
        max_scans: int = 256,
        max_decode_memory: int = 512 << 20,
        fast_upsampling: bool = False,
        fast_idct: bool = False,
        exact_progressive: bool = False,
        scan_index_memory: int = 256 << 20,
        decode: str = "host",
        optional: bool = False,
    ):
        if decode not in ("host", "gpu", "auto"):
            raise InvalidArgumentError(f"decode must be 'host', 'gpu' or 'auto', not {decode!r}")
        if decode != "host" and follow is not None:
            raise InvalidArgumentError(
                f"decode={decode!r} is for an Image that follows no other field"
            )
        size = _size(size)
        _check_geometry(geometry, size)
        self.member = member
        self.size = size
        self.geometry = geometry
        self.hflip = hflip
        self.vflip = vflip
        self.channels = channels
        self.follow = follow
        self.return_params = return_params
        self.dct_scaling = dct_scaling
        self.max_pixels = max_pixels
        self.max_scans = max_scans
        self.max_decode_memory = max_decode_memory
        self.fast_upsampling = fast_upsampling
        self.fast_idct = fast_idct
        self.exact_progressive = exact_progressive
        self.scan_index_memory = scan_index_memory
        self.decode = decode
        self.optional = optional

    def _spec(self, name: str, train: bool) -> _core.FieldSpec:
        spec = super()._spec(name, train)
        o = spec.image
        o.height, o.width = self.size
        o.channels = self.channels
        o.allow_dct_scaling = self.dct_scaling
        o.return_params = self.return_params
        o.device_decode = self.decode != "host"  # the loader turns "auto" off without a GPU
        d = o.decode
        d.max_pixels = self.max_pixels
        d.max_scans = self.max_scans
        d.max_decode_memory = self.max_decode_memory
        d.fast_upsampling = self.fast_upsampling
        d.fast_idct = self.fast_idct
        d.progressive_shortcut = not self.exact_progressive
        d.scan_index = self.scan_index_memory > 0
        d.max_scan_index_memory = self.scan_index_memory
        o.fill = _set_geometry(o.geometry, self.geometry, self.hflip, self.vflip, train)
        return spec

    def _assemble(self, tensors: list[Any]) -> Any:
        return tensors[0].permute(0, 3, 1, 2)  # NHWC bytes viewed as NCHW: channels_last

    def _extras(self, name: str, tensors: list[Any]) -> dict[str, Any]:
        return {name + "_params": _params(tensors[1])} if self.return_params else {}


def _params(p: Any) -> dict[str, Any]:
    """An Image's ``params`` output [B, 14] as named views."""
    return {
        "box": p[:, 0:4],
        "rect": p[:, 4:8],
        "scale": p[:, 8:10],
        "hflip": p[:, 10] > 0,
        "vflip": p[:, 11] > 0,
        "source_size": p[:, 12:14].long(),
    }


class Mask(Field):
    """A segmentation mask (grey or palette PNG, 1-8 bits; the values are class ids) that
    follows an Image's geometry exactly, sampled nearest-neighbour: ``uint8 [B, H, W]``, ``fill``
    where the image is not (Letterbox bars, RandomCrop padding). A mask of another size than its
    image covers the same scene (the geometry is scaled)."""

    kind = _core.FieldKind.mask

    def __init__(
        self, member: str = "seg.png", *, follow: str, fill: int = 0, optional: bool = False
    ):
        self.member = member
        self.follow = follow
        self.fill = fill
        self.optional = optional

    def _spec(self, name: str, train: bool) -> _core.FieldSpec:
        spec = super()._spec(name, train)
        spec.mask.fill = self.fill
        return spec


class Boxes(Field):
    """Bounding boxes from ``.npy`` (float [N, 4], or [N, 5] with a class column) or JSON (COCO:
    a list of ``{"bbox": [x, y, w, h], "category_id": c}``), taken through the followed image's
    crop, resize, letterbox and flips, clipped to the image; a box keeping less than
    ``min_visible`` of its area is dropped. ``batch[name]`` is a dict: ``boxes`` float32
    ``[B, max_boxes, 4]`` in ``format`` (output pixels, or [0, 1] with ``normalized=True``),
    ``classes`` int64 ``[B, max_boxes]`` (-1 past the count) and ``count`` int64 ``[B]``.
    ``source_format`` is how the member stores them (default: xywh for JSON, xyxy for npy)."""

    kind = _core.FieldKind.boxes

    def __init__(
        self,
        member: str = "json",
        *,
        follow: str | None = None,
        max_boxes: int = 100,
        format: str = "xyxy",
        normalized: bool = False,
        source_format: str | None = None,
        source_normalized: bool = False,
        min_visible: float = 0.0,
        optional: bool = False,
    ):
        self.member = member
        self.follow = follow
        self.max_boxes = max_boxes
        self.format = format
        self.normalized = normalized
        self.source_format = source_format
        self.source_normalized = source_normalized
        self.min_visible = min_visible
        self.optional = optional

    def _spec(self, name: str, train: bool) -> _core.FieldSpec:
        spec = super()._spec(name, train)
        o = spec.boxes
        source = self.source_format or ("xyxy" if self.member.endswith("npy") else "xywh")
        o.source_format = _box_format(source, "source_format")
        o.format = _box_format(self.format, "format")
        o.normalized = self.normalized
        o.source_normalized = self.source_normalized
        o.max_boxes = self.max_boxes
        o.max_stored_boxes = max(o.max_stored_boxes, self.max_boxes)
        o.min_visible = float(self.min_visible)
        return spec

    def _assemble(self, tensors: list[Any]) -> Any:
        return {"boxes": tensors[0], "classes": tensors[1], "count": tensors[2]}


class Label(Field):
    """A class label (``.cls``, decimal) -> ``int64 [B]``; -1 for an absent optional one."""

    kind = _core.FieldKind.label

    def __init__(self, member: str = "cls", *, optional: bool = False):
        self.member = member
        self.optional = optional


class Array(Field):
    """A ``.npy`` member (numeric dtypes only; never a pickle) -> ``[B, *shape]`` of ``dtype``.

    ``shape`` is each sample's; a first dimension of -1 is variable, padded with zeros to
    ``max_length``, and then ``batch[name]`` is a dict of ``values`` and ``length`` [B]. Without
    ``shape``/``dtype``/``max_length``, the pack's manifest (what was packed) supplies them."""

    kind = _core.FieldKind.array

    def __init__(
        self,
        member: str = "npy",
        *,
        shape: Sequence[int] | None = None,
        dtype: Any = None,
        max_length: int | None = None,
        optional: bool = False,
    ):
        self.member = member
        self.shape = None if shape is None else tuple(int(d) for d in shape)
        self.dtype = dtype
        self.max_length = max_length
        self.optional = optional

    def _resolve(self, schema: dict[str, dict[str, Any]]) -> "Array":
        """Shape and dtype from the pack's schema where not given."""
        if self.shape is not None and self.dtype is not None:
            return self
        info = schema.get(self.member.split(";")[0])
        if info is not None and info.get("min_shape") is None and info.get("shape") is not None:
            # An array pack's column: one shape for every row.
            info = dict(info, min_shape=info["shape"], max_shape=info["shape"])
        if info is None or info.get("min_shape") is None:
            if self.shape is None:
                raise InvalidArgumentError(
                    f"Array({self.member!r}) needs shape=: the pack does not record it"
                )
            return self
        lo, hi = list(info["min_shape"]), list(info["max_shape"])
        shape, max_length = self.shape, self.max_length
        if shape is None:
            if lo == hi:
                shape = tuple(lo)
            elif len(lo) == len(hi) and lo[1:] == hi[1:]:
                shape, max_length = (-1, *lo[1:]), max_length or hi[0]
            else:
                raise InvalidArgumentError(
                    f"Array({self.member!r}): the packed arrays have shapes from {lo} to {hi}; "
                    f"give shape= (a variable first dimension is -1)"
                )
        out = Array(
            self.member,
            shape=shape,
            dtype=self.dtype or info.get("dtype"),
            max_length=max_length,
            optional=self.optional,
        )
        return out

    def _spec(self, name: str, train: bool) -> _core.FieldSpec:
        spec = super()._spec(name, train)
        o = spec.array
        o.dtype = _dtype(self.dtype or "float32")
        o.shape = list(self.shape or ())
        o.max_length = self.max_length or 0
        return spec

    def _assemble(self, tensors: list[Any]) -> Any:
        if len(tensors) == 2:
            return {"values": tensors[0], "length": tensors[1]}
        return tensors[0]


class Bytes(Field):
    """A member's bytes as they are: ``batch[name]`` is a list of ``bytes``."""

    kind = _core.FieldKind.bytes

    def __init__(self, member: str, *, optional: bool = False):
        self.member = member
        self.optional = optional

    def _convert(self, items: list[bytes]) -> list[Any]:
        return items


class Text(Bytes):
    """A text member (UTF-8) -> a list of ``str`` (captions for image-text models)."""

    def __init__(self, member: str = "txt", *, optional: bool = False):
        super().__init__(member, optional=optional)

    def _convert(self, items: list[bytes]) -> list[Any]:
        return [b.decode("utf-8") for b in items]


class Json(Bytes):
    """A JSON member -> a list of parsed values (``None`` for an absent optional one)."""

    def __init__(self, member: str = "json", *, optional: bool = False):
        super().__init__(member, optional=optional)

    def _convert(self, items: list[bytes]) -> list[Any]:
        return [json.loads(b) if b else None for b in items]


class Tokens(Field):
    """A window of ``seq_len + 1`` tokens of token data (what `stoker.TokenLoader` reads)
    -> a dict of ``inputs`` and ``targets``, int64 ``[B, seq_len]`` (targets are inputs shifted
    by one). With ``eos_id`` and ``positions=True`` also ``positions`` (int64 ``[B, seq_len]``,
    restarting at 0 after each ``eos_id``), ``cu_seqlens`` (int32 ``[B, seq_len + 1]``: each
    row's document boundaries, padded with ``seq_len``) and ``documents`` (int64 ``[B]``)."""

    kind = _core.FieldKind.tokens

    def __init__(self, seq_len: int, *, eos_id: int | None = None, positions: bool = False):
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise InvalidArgumentError(f"seq_len must be a positive int, not {seq_len!r}")
        if positions and eos_id is None:
            raise InvalidArgumentError(
                "positions need eos_id (the token that ends each document): give it, or pack "
                "the tokens with stoker.pack_tokens(..., eos_id=...)"
            )
        self.member = "tokens"
        self.optional = False
        self.seq_len = seq_len
        self.eos_id = eos_id
        self.positions = positions

    def _spec(self, name: str, train: bool) -> _core.FieldSpec:
        spec = super()._spec(name, train)
        o = spec.tokens
        o.seq_len = self.seq_len
        o.eos_id = -1 if self.eos_id is None else int(self.eos_id)
        o.positions = self.positions
        return spec

    def _assemble(self, tensors: list[Any]) -> Any:
        out = {"inputs": tensors[0], "targets": tensors[1]}
        if self.positions:
            out.update(positions=tensors[2], cu_seqlens=tensors[3], documents=tensors[4])
        return out


# --- video and audio ------------------------------------------------------------------------------

_STARTS = {"random": _core.MediaStart.random, "center": _core.MediaStart.center,
           "start": _core.MediaStart.start}  # fmt: skip
_SHORT = {"loop": _core.ShortClip.loop, "pad": _core.ShortClip.pad, "skip": _core.ShortClip.skip}


def _media_start(start: str | None, train: bool) -> Any:
    start = start or ("random" if train else "center")
    if start not in _STARTS:
        raise InvalidArgumentError(f"start must be 'random', 'center' or 'start', not {start!r}")
    return _STARTS[start]


def install_media_plugin(kind: str) -> None:
    """Hands the engine stoker._media's decoders (FFmpeg), once; a clear error without them."""
    if _core.media_plugin_library():
        return
    try:
        from .. import _media
    except ImportError as e:
        raise UnsupportedFormatError(
            f"stoker.{kind} decodes with stoker._media, which links the machine's own FFmpeg: the "
            "wheel's needs FFmpeg 5.1 (libavformat.so.59, libavcodec.so.59, libavutil.so.57, "
            "libswscale.so.6, libswresample.so.4; Debian 12: apt install libavformat59 "
            "libavcodec59 libswscale6 libswresample4); a build from source (make install) links "
            f"the FFmpeg development packages it finds (Debian: libavformat-dev ...) [{e}]"
        ) from None
    _core.install_media_plugin(_media.plugin())


def _set_limits(limits: Any, field: Any) -> None:
    for name in ("max_pixels", "max_frames", "max_seconds", "max_decoded_frames",
                 "max_sample_rate", "max_channels"):  # fmt: skip
        value = getattr(field, name, None)
        if value is not None:
            setattr(limits, name, value)


class Video(Field):
    """A clip of a video member (mp4, mkv, webm, avi, mov, mpg: H.264, HEVC, VP9, AV1, ...)
    -> ``uint8 [B, T, 3, H, W]`` (``layout="CTHW"``: ``[B, 3, T, H, W]``, as 3D CNNs take it).

    ``frames`` (T) frames ``stride`` apart, decoded on the engine's threads with FFmpeg from the
    keyframe before the clip to its last frame and no further. ``fps=8``: the frames are 1/8 s
    apart whatever the source's rate (24, 29.97, 60, variable): each output frame is the source
    frame whose presentation time is nearest its own (the earlier on a tie), the clip's start
    time drawn so that the whole clip fits between the first and the last frame's times.
    ``start``: ``"random"`` (drawn by the sample's keyed generator: the default when the loader
    trains), ``"center"`` (the default otherwise) or ``"start"``. One crop (``geometry``, as an
    Image's) and one flip drawn per clip, applied to every frame. A video with fewer frames than
    the clip spans (with ``fps``: a shorter time between its first and last frames):
    ``short="loop"`` (its frames again from the first), ``"pad"`` (zeros after its last,
    ``name_length`` says how many are real) or ``"skip"`` (left out of the batch, counted with
    ``stats()["missing"]``).
    Adds ``batch[name + "_timestamps"]`` (float64 [B, T]: each frame's time in seconds from the
    stream's first, -1 for padding) and ``batch[name + "_length"]`` (int64 [B]). Every size the
    file states is checked against the ``max_*`` limits before anything is allocated.
    ``decoder_threads``: FFmpeg's frame threads for each clip; None: the cores the loader's
    threads leave idle (``cpu_budget // threads``, at most 8: 1 when ``threads="auto"``), for
    few large clips.
    """

    kind = _core.FieldKind.video

    def __init__(
        self,
        member: str = VIDEO_MEMBERS,
        *,
        frames: int = 16,
        stride: int = 1,
        fps: float | None = None,
        size: int | tuple[int, int] = 224,
        geometry: Geometry | None = None,
        hflip: float | None = None,
        start: str | None = None,
        short: str = "loop",
        layout: str = "TCHW",
        max_pixels: int | None = None,
        max_frames: int | None = None,
        max_seconds: float | None = None,
        max_decoded_frames: int | None = None,
        decoder_threads: int | None = None,
        optional: bool = False,
    ):
        size = _size(size)
        _check_geometry(geometry, size)
        if decoder_threads is not None and (isinstance(decoder_threads, bool) or not isinstance(
                decoder_threads, int) or not 1 <= decoder_threads <= 16):  # fmt: skip
            raise InvalidArgumentError(
                f"decoder_threads must be an int in 1-16 or None, not {decoder_threads!r}"
            )
        self.decoder_threads = decoder_threads
        if short not in _SHORT:
            raise InvalidArgumentError(f"short must be 'loop', 'pad' or 'skip', not {short!r}")
        if layout not in ("TCHW", "CTHW"):
            raise InvalidArgumentError(f"layout must be 'TCHW' or 'CTHW', not {layout!r}")
        _media_start(start, True)
        self.member = member
        self.frames = frames
        self.stride = stride
        self.fps = fps
        self.size = size
        self.geometry = geometry
        self.hflip = hflip
        self.start = start
        self.short = short
        self.layout = layout
        self.max_pixels = max_pixels
        self.max_frames = max_frames
        self.max_seconds = max_seconds
        self.max_decoded_frames = max_decoded_frames
        self.optional = optional

    def _spec(self, name: str, train: bool) -> _core.FieldSpec:
        install_media_plugin("Video")
        spec = super()._spec(name, train)
        o = spec.video
        o.frames, o.stride = self.frames, self.stride
        if self.fps is not None:
            if isinstance(self.fps, bool) or not isinstance(self.fps, (int, float)):
                raise InvalidArgumentError(f"fps must be a number or None, not {self.fps!r}")
            if not 0 < self.fps <= 1000:
                raise InvalidArgumentError(f"fps must be in (0, 1000], not {self.fps!r}")
            o.fps = float(self.fps)
        o.height, o.width = self.size
        o.fill = _set_geometry(o.geometry, self.geometry, self.hflip, 0.0, train)
        o.start = _media_start(self.start, train)
        o.short_clip = _SHORT[self.short]
        o.decoder_threads = self.decoder_threads or 0  # 0: the loader's choice (chain.build)
        _set_limits(o.limits, self)
        return spec

    def _assemble(self, tensors: list[Any]) -> Any:
        # [B, T, H, W, 3] bytes viewed as the layout asked for (channels_last 3D memory)
        if self.layout == "CTHW":
            return tensors[0].permute(0, 4, 1, 2, 3)
        return tensors[0].permute(0, 1, 4, 2, 3)

    def _extras(self, name: str, tensors: list[Any]) -> dict[str, Any]:
        return {name + "_timestamps": tensors[1], name + "_length": tensors[2]}


class Audio(Field):
    """A window of an audio member (wav, flac, mp3, ogg/oga, opus, m4a) -> ``float32 [B, C,
    N]`` in [-1, 1], N = ``round(seconds * sample_rate)``: the recording resampled whole by
    soxr (as ``soxr.resample`` of the whole file, within 1e-4) and cut at a whole number of
    samples at ``sample_rate``. ``channels=1``: the mean of the file's channels; more: its own
    count. ``start``: ``"random"`` (a keyed draw: the default when the loader trains),
    ``"center"`` (``(L - N) // 2``, L the length at ``sample_rate`` the container states) or
    ``"start"`` (the default otherwise). A window past the end is padded with zeros;
    ``batch[name + "_length"]`` (int64 [B]) says how many samples are real.
    """

    kind = _core.FieldKind.audio

    def __init__(
        self,
        member: str = AUDIO_MEMBERS,
        *,
        seconds: float = 1.0,
        sample_rate: int = 16000,
        channels: int = 1,
        start: str | None = None,
        max_seconds: float | None = None,
        max_sample_rate: int | None = None,
        max_channels: int | None = None,
        optional: bool = False,
    ):
        _media_start(start, True)
        self.member = member
        self.seconds = seconds
        self.sample_rate = sample_rate
        self.channels = channels
        self.start = start
        self.max_seconds = max_seconds
        self.max_sample_rate = max_sample_rate
        self.max_channels = max_channels
        self.optional = optional

    def _spec(self, name: str, train: bool) -> _core.FieldSpec:
        install_media_plugin("Audio")
        spec = super()._spec(name, train)
        o = spec.audio
        o.seconds = float(self.seconds)
        o.sample_rate = self.sample_rate
        o.channels = self.channels
        o.start = _media_start(self.start or (None if train else "start"), train)
        _set_limits(o.limits, self)
        return spec

    def _extras(self, name: str, tensors: list[Any]) -> dict[str, Any]:
        return {name + "_length": tensors[1]}
