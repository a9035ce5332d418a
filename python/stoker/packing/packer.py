"""stoker.pack: any source (sources/) through the one writer (writer.py) into a pack, written in
a partial folder beside `out` that is checkpointed shard by shard (an interrupted pack of the
same source resumes), locked against a second packer, and renamed into place at the end."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import (
    InvalidArgumentError,
    ShardIOError,
    StokerError,
    StokerWarning,
    UnsupportedFormatError,
)
from . import ray as pack_ray
from ._files import parse_size, remove_stale_partials
from .transcode import AUDIO_ENCODING, ENCODING
from .members import Options
from .result import PackResult
from .source import Source
from .sources import open_source
from .writer import Part, merge_parts, part_starts, rekey_part, write_part

FORMAT_NAME = "stoker-pack"
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
RESUME = "resume.json"
LOCK = "lock"

log = logging.getLogger("stoker")


def _describe(value: Any) -> Any:
    """An option as the resume fingerprint sees it: a function by its name, not its address."""
    if callable(value):
        return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}"
    if isinstance(value, Mapping):
        return {str(k): _describe(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_describe(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


class _Partial:
    """The partial folder `.OUT.partial`: locked while a packer writes it, and holding the
    checkpoints (resume.json) of the pack it was started for."""

    def __init__(self, out: Path, fingerprint: str | None, resume: bool):
        self.folder = out.parent / f".{out.name}.partial"
        self.fingerprint = fingerprint
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.folder / LOCK, "a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise InvalidArgumentError(
                f"another stoker pack is writing {out} (its partial folder {self.folder} is "
                "locked); wait for it, or stop it"
            ) from None
        self.parts: dict[str, dict[str, Any]] = {}
        state = self._read()
        if resume and fingerprint is not None and state.get("fingerprint") == fingerprint:
            self.parts = state.get("parts", {})
        else:
            if state or any(p.name != LOCK for p in self.folder.iterdir()):
                log.info("%s: an earlier, different pack's partial output removed", self.folder)
            for p in self.folder.iterdir():
                if p.name != LOCK:
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
            self._write()

    def _read(self) -> dict[str, Any]:
        try:
            return json.loads((self.folder / RESUME).read_text())
        except (OSError, ValueError):
            return {}

    def _write(self) -> None:
        tmp = self.folder / f".{RESUME}"
        tmp.write_text(json.dumps({"fingerprint": self.fingerprint, "parts": self.parts}))
        os.replace(tmp, self.folder / RESUME)

    def part(self, prefix: str) -> Part | None:
        state = self.parts.get(prefix)
        return Part.from_json(state) if state is not None else None

    def save(self, prefix: str, part: Part) -> None:
        self.parts[prefix] = part.to_json()
        self._write()

    @property
    def resumed_samples(self) -> int:
        return sum(p["num_samples"] for p in self.parts.values())

    @property
    def resumed_records(self) -> int:
        return sum(p["records"] for p in self.parts.values())

    def publish(self, out: Path) -> None:
        """The finished pack renamed into place (its checkpoints and lock removed)."""
        (self.folder / RESUME).unlink(missing_ok=True)
        (self.folder / LOCK).unlink(missing_ok=True)
        if out.exists():
            shutil.rmtree(out)
        os.rename(self.folder, out)
        self.close()

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        self.close()

    def close(self) -> None:
        if not self._lock.closed:
            self._lock.close()  # releases the lock


def pack(
    src: Any,
    out: str | os.PathLike,
    *,
    format: str | None = None,
    members: Mapping[str, Any] | None = None,
    label: Any = None,
    record: Callable[[bytes, bytes], Mapping[str, Any]] | None = None,
    allow_pickle: bool = False,
    images: str | os.PathLike | None = None,
    compression: str | None = None,
    max_side: int | None = None,
    shard_size: int | str = "256MB",
    quality: int = 90,
    restart_interval: int | None = 1,
    image_codec: str = "png",
    codec: str = "source",
    size: tuple[int, int] | None = None,
    video_keyint: int | None = None,
    video_remux: bool = False,
    audio_rate: int | None = None,
    audio_channels: int | None = None,
    threads: int | None = None,
    on_error: str = "skip",
    overwrite: bool = False,
    resume: bool = True,
    progress: bool = True,
    engine: str = "local",
    ray_address: str | None = None,
    tasks: int | None = None,
) -> PackResult:
    """Pack a dataset into shards at ``out``, from any of the formats below (found from the
    object, the path's extension, a folder's layout or a file's first bytes, or named with
    ``format=``). One mental model for every source: ``members`` maps a member name, whose
    extension says what the value becomes (``jpg`` an image, ``seg.png`` a mask, ``feat.npy``
    an array, ``txt`` text, ``json`` JSON), to the source's column, feature, dataset or key;
    ``label`` names the label's column (for key-value stores: a mapping or a function of the
    key). Where they are omitted, each format's own conventions apply:

    - an ImageFolder tree (``ROOT/CLASS/IMAGE``): torchvision ImageFolder's order and labels;
      each sample is ``KEY.jpg`` (or ``.png``, ``.webp``) + ``KEY.cls``;
    - a ``.csv`` of ``path,label`` rows (a header starting with path/file/filename, or none);
      labels are integers or class names (ids in sorted order);
    - a table, ``.csv`` with a header or ``.jsonl``: each column a member named by the column
      (files named relative to the table's folder are stored; other values as they are);
      ``cls``/``label`` the label, ``key``/``__key__`` recorded in sources.tsv;
    - a COCO instances ``.json`` with ``images=`` the folder of its ``file_name`` entries: each
      image, ``KEY.json`` of its boxes and ``KEY.seg.png`` of its annotations (docs/FORMAT.md);
    - WebDataset ``.tar`` shards (a file, a folder or a glob): members kept by name;
    - Parquet files or folders and Hugging Face datasets (a ``datasets.Dataset``, a
      ``save_to_disk`` folder): an ``Image`` feature is an image member, a ``ClassLabel`` the
      label (its names kept), numbers and lists arrays, strings text, nested values JSON;
    - LMDB: values are encoded images, ``label=`` a mapping or function of the key;
      ``record=fn(key, value) -> dict`` maps any other layout; pickled values are refused
      unless ``allow_pickle=True``;
    - TFRecord files of ``tf.train.Example`` (uncompressed, GZIP, ZLIB; ``compression=`` or
      found from the file): ``image/encoded`` and ``image/class/label`` by default;
    - HDF5: datasets of encoded images (variable-length uint8) or arrays, e.g.
      ``members={"jpg": "images"}, label="labels"``; arrays alone make an array pack;
    - ``.pt``/``.pth`` files (``torch.load(weights_only=True)``): a tensor, a tuple or a dict of
      tensors with one first dimension: an array pack;
    - any map-style torch ``Dataset``, read through a DataLoader with ``threads`` workers: a PIL
      image or HxWxC uint8 array becomes an image (``image_codec`` "png", lossless, or "jpeg"
      at ``quality``), a tensor or array an ``.npy`` member, an int the label, a str text, a
      dict one member per key.

    Encoded images are stored as they are unless an option below says otherwise (an image in a
    format stoker does not decode becomes a PNG of the same pixels). ``max_side`` shrinks the
    larger images once, now, instead of every epoch: lossy for those, each decoded, resized and
    re-encoded as a JPEG at ``quality``; smaller ones are kept. ``restart_interval`` (in MCUs;
    the default 1 is finest; None or 0 keeps files byte for byte) rewrites baseline JPEGs
    losslessly with restart markers, so the loader entropy-decodes only the part of each image a
    crop covers. ``codec="raw"``
    stores decoded pixels (``KEY.ppm``, read without decoding), shrunk to ``max_side`` or
    resized to ``size=(height, width)``. ``codec="jpeg"`` is the one lossy choice, FFCV's
    writer's: every image decoded and re-encoded as a JPEG at ``quality`` (shrunk to
    ``max_side`` first), smaller and faster to decode than large originals, at a cost in
    fidelity that ``stoker doctor`` measures on the pack (PSNR) before recommending it; the
    manifest records it (``codec``, ``quality``) and ``stoker inspect`` shows it. ``quality``
    also applies to images that ``max_side`` shrinks.

    Video and audio members (mp4, mkv, webm, avi, mov, mpg; wav, flac, mp3, ogg, oga, opus, m4a)
    are stored as they are. ``video_keyint=K`` re-encodes every video with the ffmpeg command as
    an MP4 of H.264 (x264, rate factor 18, tuned for fast decoding) with a keyframe every K
    frames and none elsewhere, its frames shrunk to ``max_side`` on the longer side if given: a
    clip is decoded from the keyframe before it, so K bounds the frames decoded beyond the
    clip's own (a file as it was downloaded may have one keyframe in 250). ``video_remux=True``
    copies videos in a container without an index (MPEG program or transport streams, AVI, raw
    streams) into MP4 (Matroska where MP4 cannot hold a stream) without re-encoding: the same
    frames, which a clip's reader then finds from the MP4's tables instead of parsing the whole
    file on every read (video_keyint, which writes MP4 anyway, takes precedence).
    ``audio_rate=R`` decodes every sound once and stores it as 16-bit PCM WAV at R Hz (soxr,
    python-soxr's "HQ"), with ``audio_channels=1`` the mean of its channels: an Audio field at
    that rate then reads its windows instead of decoding and resampling them every epoch. The
    manifest records both (``video_keyint``, ``video_encoding``, ``audio_rate``,
    ``audio_channels``).

    Records that cannot be read (a missing or broken file, a value that is not what its member
    needs, a damaged record) are skipped and listed (where and why) in the result and the
    manifest under ``on_error="skip"``; ``on_error="raise"`` stops at the first with a
    CorruptDataError naming it, and leaves nothing behind.

    Run again with the same source and the same options, ``pack`` finds the pack at ``out`` done
    and returns its result without writing (``already_packed``), so that a script that packs and
    then trains can run twice. The source is compared as an interrupted pack's is: a folder or
    table by its listing of files and labels, a file or store by its size and modification
    time. Anything else already at ``out`` is refused unless ``overwrite=True``.

    Keys are positions (``00000000``...); sources.tsv maps each to its source. The pack is
    written in ``.OUT.partial`` beside ``out`` and renamed into place at the end, so nothing
    that loads appears at ``out`` before it is whole. That folder is checkpointed after each
    shard: an interrupted pack (Ctrl-C, a crash, a full disk) run again with the same source
    and options resumes where it stopped (``resume=False`` starts over).

    ``engine="ray"`` packs on a Ray cluster: the records are split into ``tasks`` contiguous
    ranges (by default one per ``threads`` of the cluster's CPUs), each written by a Ray task
    into its own shards; the pack is the local pack's sample for sample. Every node must see
    the source and ``out``'s folder at the same paths. See docs/PACKING_RAY.md.
    """
    t0 = time.perf_counter()
    out = Path(os.path.expanduser(os.fspath(out)))
    if engine not in ("local", "ray"):
        raise InvalidArgumentError(f"engine must be 'local' or 'ray', not {engine!r}")
    if engine == "local" and (ray_address is not None or tasks is not None):
        raise InvalidArgumentError("ray_address= and tasks= go with engine='ray'")
    if tasks is not None and tasks < 1:
        raise InvalidArgumentError(f"tasks must be at least 1, not {tasks}")
    if on_error not in ("skip", "raise"):
        raise InvalidArgumentError(f"on_error must be 'skip' or 'raise', not {on_error!r}")
    if codec not in ("source", "raw", "jpeg"):
        raise InvalidArgumentError(f"codec must be 'source', 'raw' or 'jpeg', not {codec!r}")
    if not 1 <= quality <= 100:
        raise InvalidArgumentError(f"quality must be 1-100, not {quality}")
    if image_codec not in ("png", "jpeg"):
        raise InvalidArgumentError(f"image_codec must be 'png' or 'jpeg', not {image_codec!r}")
    if size is not None:
        if codec != "raw":
            raise InvalidArgumentError("size= stores every image at one size: with codec='raw'")
        if (
            not isinstance(size, (tuple, list))
            or len(size) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in size)
        ):
            raise InvalidArgumentError(f"size must be (height, width), not {size!r}")
    if allow_pickle:
        warnings.warn(
            "allow_pickle=True: pickled values are unpickled, which runs code the data names; "
            "pack only data you trust",
            stacklevel=2,
        )
    if video_keyint is not None and (
        isinstance(video_keyint, bool) or not isinstance(video_keyint, int)
        or not 1 <= video_keyint <= 1000
    ):  # fmt: skip
        raise InvalidArgumentError(f"video_keyint must be 1-1000 frames, not {video_keyint!r}")
    if audio_rate is not None and (
        isinstance(audio_rate, bool) or not isinstance(audio_rate, int)
        or not 1000 <= audio_rate <= 384000
    ):  # fmt: skip
        raise InvalidArgumentError(f"audio_rate must be 1000-384000 Hz, not {audio_rate!r}")
    if audio_channels not in (None, 1):
        raise InvalidArgumentError("audio_channels is 1 (the channels' mean) or None (kept)")
    if audio_channels is not None and not audio_rate:
        raise InvalidArgumentError("audio_channels= goes with audio_rate=")
    if not isinstance(video_remux, bool):
        raise InvalidArgumentError(f"video_remux is True or False, not {video_remux!r}")
    if video_keyint or video_remux or audio_rate:
        from .transcode import ffmpeg_command

        ffmpeg_command()  # a clear error now, not one per video or sound
    raw_size = None if size is None else (int(size[1]), int(size[0]))  # (width, height)
    opts = Options(max_side or 0, quality, restart_interval or 0, codec, raw_size, image_codec,
                   video_keyint or 0, audio_rate or 0, audio_channels or 0,
                   video_remux and not video_keyint)  # fmt: skip
    limit = parse_size(shard_size)
    if limit < 1 << 16:
        raise InvalidArgumentError("shard_size must be at least 64 KiB")
    exists = out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir()))
    threads = threads or (1 if engine == "ray" else os.cpu_count() or 1)
    source_options = dict(members=members, label=label, record=record, images=images,
                          allow_pickle=allow_pickle or None, compression=compression)  # fmt: skip
    source = open_source(src, format, opts, **source_options, threads=threads)
    if exists:
        # The same source packed with the same options already: nothing to do (a script that
        # packs, then trains, runs again). Anything else at `out` is refused.
        fingerprint = _fingerprint(source, opts, limit, "local", None, 1, source_options)
        source.close()
        done = _already_packed(out, fingerprint, t0)
        if done is None:
            raise InvalidArgumentError(
                f"{out} already exists and is not a pack of this source with these options "
                "(pass overwrite=True to replace it)"
            )
        log.info("%s: already packed from this source with these options", out)
        return done
    if source.columns is not None:  # arrays only (HDF5 arrays, a .pt file): an array pack
        from .arrays import write_arrays

        if engine == "ray":  # a copy of rows at disk speed: nothing for a cluster to share
            log.info("%s: an array pack is written here, not on Ray", src)

        try:
            result = write_arrays(source.columns, out, shard_size=shard_size,
                                 classes=source.classes, overwrite=overwrite,
                                 progress=progress, source_format=source.format)  # fmt: skip
        finally:
            source.close()
        result.source_format = source.format
        return result

    if engine == "ray":
        pack_ray.require()  # the install hint, before anything is written
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(out)  # what packs before resumable ones left
    fingerprint = _fingerprint(source, opts, limit, engine, tasks, threads, source_options)
    partial = _Partial(out, fingerprint, resume)
    # What a later pack() of the same source and options compares to find it done: the split
    # (engine, tasks) changes how the shards are cut, not the samples, so it is left out.
    done_fingerprint = _fingerprint(source, opts, limit, "local", None, 1, source_options)
    resumed = partial.resumed_samples
    try:
        with _progress(progress, source, out, partial.resumed_records) as on_progress:
            if engine == "ray":
                parts = _ray_parts(partial, source, limit, threads, tasks, ray_address, progress,
                                   on_error)  # fmt: skip
            else:
                previous = partial.part("shard-")
                if previous is not None and previous.done:
                    part = previous
                else:
                    part = write_part(
                        str(partial.folder), "shard-", source, 0, limit, threads, on_error,
                        on_progress, previous, lambda p: partial.save("shard-", p),
                    )  # fmt: skip
                parts = [part]
        classes = source.classes
        merged = merge_parts(partial.folder, parts, len(classes or []))
        if classes is None:  # integer labels without names: "0".."max"
            classes = [str(i) for i in range(len(merged.class_counts))]
        if merged.num_samples == 0:
            first = merged.failed[0] if merged.failed else ("", "the source holds no records")
            raise InvalidArgumentError(
                f"{src!s:.200}: none of its {len(merged.failed)} records could be packed; first "
                f"error: {first[0]}: {first[1]}"
            )
        manifest = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "num_samples": merged.num_samples,
            "source_format": source.format,
            "classes": classes,
            "class_counts": merged.class_counts,
            **source.extra,
            **({"crowd_annotations": merged.crowd} if source.format == "coco" else {}),
            "fields": merged.fields,
            "shards": merged.shards,
            "bytes": merged.bytes,
            "max_side": max_side,
            "restart_interval": restart_interval if codec != "raw" else None,
            "codec": codec,
            # the JPEG quality of what was re-encoded: every image (codec "jpeg") or those
            # shrunk to max_side
            "quality": quality if codec == "jpeg" or (max_side and codec == "source") else None,
            **({"size": list(size)} if size is not None else {}),
            # videos re-encoded: H.264 (video_encoding: packing/transcode.py), a keyframe every
            # video_keyint frames; sounds decoded and resampled to audio_rate
            **({"video_keyint": video_keyint, "video_encoding": ENCODING} if video_keyint else {}),
            # videos without an index copied into MP4, not re-encoded
            **({"video_remux": True} if video_remux and not video_keyint else {}),
            **(
                {
                    "audio_rate": audio_rate,
                    "audio_channels": audio_channels,
                    "audio_encoding": AUDIO_ENCODING,
                }
                if audio_rate
                else {}
            ),  # fmt: skip
            "source": f"{src!s:.1000}",
            "failed": [{"path": p, "reason": r} for p, r in merged.failed],
            **({"source_fingerprint": done_fingerprint} if done_fingerprint else {}),
        }
        with open(partial.folder / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        partial.publish(out)
        if any(f.get("kind") == "video" for f in merged.fields):
            _write_video_facts(out, progress)
    except StokerError as e:
        if isinstance(e, ShardIOError):  # writing failed (a full disk): resumable
            partial.close()
        else:  # a wrong option or bad input under on_error="raise": start over
            partial.discard()
        raise
    except BaseException:
        partial.close()  # Ctrl-C, a crash, a full disk: the checkpoints stay, to resume from
        raise
    finally:
        source.close()
    return PackResult(
        out,
        merged.num_samples,
        len(merged.shards),
        merged.bytes,
        time.perf_counter() - t0,
        classes,
        merged.failed,
        merged.reencoded,
        merged.fields,
        source.format,
        resumed,
    )


def _write_video_facts(out: Path, progress: bool) -> None:
    """videos.npz (packing/videos.py): each video's frames, times and size, read once now. Not
    part of the pack (a reader makes it where it is missing): without stoker._media, a warning."""
    from .videos import video_facts

    try:
        video_facts(out, progress=progress)
    except UnsupportedFormatError as e:
        warnings.warn(StokerWarning(f"{out}: no video facts (videos.npz) written: {e}"),
                      stacklevel=3)  # fmt: skip


def _already_packed(out: Path, fingerprint: str | None, t0: float) -> PackResult | None:
    """The result of the pack at `out` when it was made from the source and options that
    `fingerprint` identifies; None otherwise (no fingerprint, another pack, not a pack)."""
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if fingerprint is None or manifest.get("source_fingerprint") != fingerprint:
        return None
    return PackResult(out, int(manifest["num_samples"]), len(manifest["shards"]),
                      int(manifest["bytes"]), time.perf_counter() - t0, list(manifest["classes"]),
                      [(f["path"], f["reason"]) for f in manifest.get("failed", [])],
                      0, list(manifest["fields"]), str(manifest["source_format"]),
                      already_packed=True)  # fmt: skip


def _fingerprint(
    source: Source,
    opts: Options,
    limit: int,
    engine: str,
    tasks: int | None,
    threads: int,
    source_options: dict[str, Any],
) -> str | None:
    """What must be the same for an interrupted pack to resume: the source's records, how they
    are stored, and (on Ray) how they are split."""
    records = source.fingerprint()
    if records is None:
        return None
    what = {
        "version": FORMAT_VERSION,
        "records": records,
        "options": _describe(source_options),
        "store": _describe(vars(opts)),
        "shard_size": limit,
        "split": [engine, tasks, threads if engine == "ray" else None],
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


@contextlib.contextmanager
def _progress(enabled: bool, source: Source, out: Path, done: int) -> Iterator[Any]:
    """A progress bar of records (rate, ETA where the count is known) and MB written."""
    if not enabled:
        yield None
        return
    from tqdm.auto import tqdm

    try:
        total: int | None = len(source)
    except TypeError:
        total = None
    bar = tqdm(total=total, initial=done, unit=source.unit, desc=f"packing {out.name}",
               unit_scale=True, smoothing=0.05)  # fmt: skip
    last = [0.0]

    def update(records: int, written: int) -> None:
        bar.update(records)
        now = time.monotonic()
        if now - last[0] > 0.5:
            last[0] = now
            bar.set_postfix_str(f"{written / 1e6:,.0f} MB", refresh=False)

    try:
        yield update
    finally:
        bar.close()


def _ray_parts(
    partial: _Partial,
    source: Source,
    limit: int,
    threads: int,
    tasks: int | None,
    address: str | None,
    progress: bool,
    on_error: str,
) -> list[Part]:
    """The source split into contiguous ranges, one Ray task each running write_part (what a
    local pack runs) into the shared folder, parts already written by an interrupted run kept;
    then the parts after a failed record rewritten with the keys it shifted."""
    folder = str(partial.folder)
    with pack_ray.connect(address) as cpus:
        if threads > cpus:  # Ray would wait forever for a node that large
            raise InvalidArgumentError(
                f"threads={threads} per task, and the Ray cluster has {cpus} CPUs in all"
            )
        ranges = source.partitions(tasks or max(1, cpus // threads))
        prefixes = [f"part-{i:05d}-" for i in range(len(ranges))]
        parts: list[Part | None] = [partial.part(p) for p in prefixes]
        todo = [i for i, p in enumerate(parts) if p is None or not p.done]
        calls = [
            (folder, prefixes[i], ranges[i][1], ranges[i][0], limit, threads, on_error)
            for i in todo
        ]

        def finished(k: int, part: Part) -> None:
            parts[todo[k]] = part
            partial.save(prefixes[todo[k]], part)

        pack_ray.run_tasks(write_part, calls, num_cpus=threads, progress=progress,
                           desc=f"packing {source.format}", on_result=finished)  # fmt: skip
        done = [p for p in parts if p is not None]
        assert len(done) == len(parts)
        # A part keys its samples from its first record's position: right unless records before
        # it failed, which no task knew of while they ran.
        redo = [(i, start) for i, start in enumerate(part_starts(done)) if done[i].start != start]
        if redo:
            fixed = pack_ray.run_tasks(
                rekey_part,
                [(folder, done[i], start) for i, start in redo],
                num_cpus=1,
                progress=progress,
                desc="renumbering",
            )
            for (i, _), part in zip(redo, fixed, strict=True):
                done[i] = part
    return done
