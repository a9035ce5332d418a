"""The facts of a pack's videos (videos.npz beside the manifest): each sample's exact frame count
(every packet of its video stream, counted once without decoding), duration, average frame rate
and whether it varies, frame size, codec, and its keyframes' times. `stoker.pack` writes them for
a pack with videos; a pack made before gets them on first use, once (the file is then written
beside its manifest where the folder is writable). Video buckets read durations and sizes from
here; `stoker inspect` shows their distributions. Layout: docs/FORMAT.md, "Video facts"."""

from __future__ import annotations

import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptDataError, InvalidArgumentError, StokerError, UnsupportedFormatError
from ._files import file_crc32c
from .members import VIDEO_MEMBER_EXTENSIONS

VIDEOS_FILE = "videos.npz"
VERSION = 2  # 2: span
MAX_UNREADABLE_LISTED = 100


@dataclass
class VideoFacts:
    """Per sample (pack order); a sample without a video member, or whose video does not open,
    has frames -1 and zeros (`unreadable` lists the first of the latter, with their reasons)."""

    frames: np.ndarray  # int64 [N]: frames in the video stream, exactly
    seconds: np.ndarray  # float64 [N]: first frame to the last one's end
    span: np.ndarray  # float64 [N]: first frame's time to the last one's (what a clip fits in)
    # float64 [N]: (frames - 1) / (last frame's time - first's), or the container's rate where
    # that is within 0.5% of it and the rate is constant; 0 for a single frame
    fps: np.ndarray
    variable: np.ndarray  # bool [N]: frames not evenly spaced (by more than 2 ms or 10%)
    height: np.ndarray  # int32 [N]
    width: np.ndarray  # int32 [N]
    codec: np.ndarray  # uint16 [N]: index into `codecs`
    codecs: list[str]
    keyframe_ptr: np.ndarray  # int64 [N + 1]: sample i's keyframes are [ptr[i], ptr[i + 1])
    keyframe_seconds: np.ndarray  # float64: their times from the first frame
    unreadable: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    unreadable_count: int = 0

    def __len__(self) -> int:
        return len(self.frames)

    def keyframes(self, sample: int) -> np.ndarray:
        """The times of sample `sample`'s keyframes, in seconds from its first frame."""
        return self.keyframe_seconds[self.keyframe_ptr[sample] : self.keyframe_ptr[sample + 1]]

    def summary(self) -> dict[str, Any] | None:
        """Distributions for `stoker inspect`: durations (quantiles), frame rates and sizes (the
        most common), codecs, how many vary their rate. None without videos."""
        have = self.frames >= 0
        if not have.any():
            return None
        seconds = self.seconds[have]
        quantiles = np.quantile(seconds, [0, 0.1, 0.5, 0.9, 1])

        def common(values: list[Any], top: int = 6) -> list[list[Any]]:
            kinds, counts = np.unique(np.asarray(values), return_counts=True, axis=0)
            order = np.argsort(-counts, kind="stable")[:top]
            return [[kinds[i].tolist(), int(counts[i])] for i in order]

        return {
            "videos": int(have.sum()),
            "without": int((~have).sum()),
            "seconds": dict(zip(("min", "p10", "median", "p90", "max"),
                                [round(float(q), 3) for q in quantiles], strict=True)),
            "total_seconds": round(float(seconds.sum()), 3),
            "frames": int(self.frames[have].sum()),
            "fps": common(np.round(self.fps[have], 2).tolist()),
            "variable_rate": int(self.variable[have].sum()),
            "sizes": common(np.stack([self.height[have], self.width[have]], axis=1).tolist()),
            "codecs": {self.codecs[int(c)]: int(n)
                       for c, n in zip(*np.unique(self.codec[have], return_counts=True),
                                       strict=True)},  # fmt: skip
            "keyframe_gap_median_seconds": _median_keyframe_gap(self, have),
            "unreadable": self.unreadable_count,
        }


def _median_keyframe_gap(facts: VideoFacts, have: np.ndarray) -> float | None:
    gaps = [np.diff(facts.keyframes(int(i))) for i in np.flatnonzero(have)]
    gaps = [g for g in gaps if len(g)]
    return round(float(np.median(np.concatenate(gaps))), 3) if gaps else None


def probe(data: bytes) -> dict[str, Any]:
    """One video's facts, from its packets (nothing decoded), with stoker's own reader."""
    from .. import _media

    reader = _media.VideoReader(data)
    info = reader.info
    times = np.asarray(reader.frame_times(), dtype=np.float64)
    frames = len(times)
    span = float(times[-1] - times[0]) if frames > 1 else 0.0
    gaps = np.diff(times)
    variable = bool(len(gaps) > 1 and np.ptp(gaps) > max(0.002, 0.1 * float(np.median(gaps))))
    fps = (frames - 1) / span if span > 0 else 0.0
    stated = float(info["frames_per_second"])
    # A constant rate measured from rounded times (mkv and webm keep milliseconds): the stated one.
    if not variable and stated > 0 and abs(fps - stated) <= 0.005 * stated:
        fps = stated
    return {
        "frames": frames,
        "seconds": float(info["duration_seconds"]),
        "span": span,
        "fps": fps,
        "variable": variable,
        "height": int(info["height"]),
        "width": int(info["width"]),
        "codec": str(info["codec"]),
        "keyframes": times[np.asarray(reader.keyframes, dtype=np.int64)] - times[0],
    }


def _manifest_crc(pack: Path) -> int:
    return file_crc32c(pack / "manifest.json")


def _load(path: Path, manifest_crc: int, samples: int) -> VideoFacts | None:
    """The facts in `path` if it is this pack's (its manifest's CRC, its sample count) and every
    array is as docs/FORMAT.md says; None for anything else (it is then made anew)."""
    kinds = {"frames": "i", "seconds": "f", "span": "f", "fps": "f", "variable": "b",
             "height": "i", "width": "i", "codec": "u", "keyframe_ptr": "i",
             "keyframe_seconds": "f"}  # fmt: skip
    try:
        with np.load(path, allow_pickle=False) as z:
            if set(z.files) != {"meta", *kinds}:
                return None
            # Shapes from the headers first: a crafted header must not make numpy allocate.
            for name in kinds:
                with z.zip.open(name + ".npy") as member:
                    version = np.lib.format.read_magic(member)
                    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                            else np.lib.format.read_array_header_2_0)  # fmt: skip
                    shape = read(member)[0]
                rows = samples + 1 if name == "keyframe_ptr" else samples
                if name != "keyframe_seconds" and shape != (rows,):
                    return None
                if name == "keyframe_seconds" and (
                        len(shape) != 1 or shape[0] * 8 > path.stat().st_size):
                    return None  # fmt: skip
            arrays = {name: z[name] for name in kinds}
            meta = json.loads(bytes(z["meta"]).decode())
    except Exception:  # a truncated, empty or foreign file: made anew
        return None
    if not isinstance(meta, dict) or meta.get("version") != VERSION:
        return None
    codecs, unreadable = meta.get("codecs"), meta.get("unreadable", [])
    if (meta.get("manifest_crc32c") != manifest_crc or not isinstance(codecs, list)
            or not all(isinstance(c, str) for c in codecs) or not isinstance(unreadable, list)):
        return None  # fmt: skip
    if any(a.ndim != 1 or a.dtype.kind != kinds[n] for n, a in arrays.items()):
        return None
    ptr, frames, codec = arrays["keyframe_ptr"], arrays["frames"], arrays["codec"]
    if (ptr[0] != 0 or np.any(np.diff(ptr) < 0) or ptr[-1] != len(arrays["keyframe_seconds"])
            or np.any(frames < -1) or (samples and int(codec.max()) >= max(len(codecs), 1))):
        return None  # fmt: skip
    return VideoFacts(**arrays, codecs=codecs, unreadable=unreadable,
                      unreadable_count=int(meta.get("unreadable_count", len(unreadable))))


def load_facts(pack: Path, samples: int) -> VideoFacts | None:
    """The facts in the videos.npz beside `pack`'s manifest if they are its, else None."""
    return _load(pack / VIDEOS_FILE, _manifest_crc(pack), samples)


def _save(facts: VideoFacts, path: Path, manifest_crc: int) -> None:
    meta = {"version": VERSION, "manifest_crc32c": manifest_crc, "codecs": facts.codecs,
            "unreadable": facts.unreadable, "unreadable_count": facts.unreadable_count}  # fmt: skip
    fd, tmp = tempfile.mkstemp(prefix=".videos-", suffix=".npz", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # readable as the pack's other files are (mkstemp: 0600)
        with os.fdopen(fd, "wb") as f:
            np.savez(f, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
                     frames=facts.frames, seconds=facts.seconds, span=facts.span, fps=facts.fps,
                     variable=facts.variable, height=facts.height, width=facts.width,
                     codec=facts.codec, keyframe_ptr=facts.keyframe_ptr,
                     keyframe_seconds=facts.keyframe_seconds)  # fmt: skip
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def video_facts(pack: str | os.PathLike, *, threads: int | None = None,
                progress: bool = True) -> VideoFacts:  # fmt: skip
    """The facts of every sample's video in a local pack (its first member of a video field, as
    the manifest names them, or named mp4, mkv, webm, avi, mov, mpg or mpeg), from videos.npz,
    or read from the videos once and written there (where the folder is writable). A video that
    does not open gets frames -1 and is listed in ``unreadable`` with its shard, key and reason.
    Needs stoker._media (UnsupportedFormatError without it)."""
    from .. import _core

    pack = Path(pack)
    if not (pack / "manifest.json").is_file():
        raise InvalidArgumentError(f"{pack}: video facts are read from a local stoker pack")
    dataset = _core.Dataset.open(str(pack))
    manifest = json.loads((pack / "manifest.json").read_text())
    members = [f["name"] for f in manifest.get("fields", [])
               if isinstance(f, dict) and f.get("kind") == "video"]  # fmt: skip
    members += [m for m in VIDEO_MEMBER_EXTENSIONS if m not in members]
    crc = _manifest_crc(pack)
    found = _load(pack / VIDEOS_FILE, crc, len(dataset))
    if found is not None:
        return found
    try:
        from .. import _media  # noqa: F401
    except ImportError as e:
        raise UnsupportedFormatError(
            f"video facts are read with stoker._media, which links FFmpeg (docs/INSTALL.md): {e}"
        ) from None
    n = len(dataset)
    unreadable: list[dict[str, Any]] = []

    def one(i: int) -> dict[str, Any] | None:
        record = dataset.record(i)
        names = {m["name"] for m in record["members"]}
        member = next((m for m in members if m in names), None)
        if member is None:
            return None
        try:
            return probe(dataset.read(i, member))
        except StokerError as e:  # a video that does not open: no facts, and why
            unreadable.append({"index": i, "shard": record["shard"], "key": record["key"],
                               "member": member, "reason": str(e)})  # fmt: skip
            return None

    from tqdm.auto import tqdm

    workers = threads or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers, thread_name_prefix="stoker-videos") as pool:
        rows = list(tqdm(pool.map(one, range(n)), total=n, desc="video facts", unit="video",
                         disable=not progress))  # fmt: skip
    codecs: dict[str, int] = {}
    keyframes = [r["keyframes"] if r else np.zeros(0) for r in rows]
    facts = VideoFacts(
        frames=np.array([r["frames"] if r else -1 for r in rows], dtype=np.int64),
        seconds=np.array([r["seconds"] if r else 0.0 for r in rows], dtype=np.float64),
        span=np.array([r["span"] if r else 0.0 for r in rows], dtype=np.float64),
        fps=np.array([r["fps"] if r else 0.0 for r in rows], dtype=np.float64),
        variable=np.array([r["variable"] if r else False for r in rows], dtype=bool),
        height=np.array([r["height"] if r else 0 for r in rows], dtype=np.int32),
        width=np.array([r["width"] if r else 0 for r in rows], dtype=np.int32),
        codec=np.array([codecs.setdefault(r["codec"], len(codecs)) if r else 0 for r in rows],
                       dtype=np.uint16),  # fmt: skip
        codecs=list(codecs),
        keyframe_ptr=np.concatenate(([0], np.cumsum([len(k) for k in keyframes]))).astype(
            np.int64),
        keyframe_seconds=np.concatenate([np.zeros(0), *keyframes]).astype(np.float64),
        unreadable=sorted(unreadable, key=lambda u: u["index"])[:MAX_UNREADABLE_LISTED],
        unreadable_count=len(unreadable),
    )
    if len(codecs) > 65535:
        raise CorruptDataError(f"{pack}: {len(codecs)} codecs")
    try:
        _save(facts, pack / VIDEOS_FILE, crc)
    except OSError:
        pass  # a read-only pack: read again by the next process
    return facts
