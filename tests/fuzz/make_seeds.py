"""Builds the seed corpora of the fuzz targets (cpp/fuzz/) from ../shared/data, under OUT/<target>/.

    python tests/fuzz/make_seeds.py build/fuzz/seeds

Nothing from the shared data is copied into the repository: the seeds are made at run time.
Deterministic (a fixed random seed), so a smoke run always starts from the same corpus.

  fuzz_decode       every JPEG/PNG of jpeg-variety, jpeg-corrupt and png-variety up to
                    MAX_SEED_BYTES, a sample of imagenet-sample, and restart-marked copies of
                    some (what stoker.pack stores); each behind an 8-byte option header that
                    varies from file to file (train/eval, sizes, DCT scaling, ...)
  fuzz_restart_roi  the JPEGs among those, behind a 6-byte header (interval, scale, rectangle)
  fuzz_tar          shards written by stoker.pack, tar files in the GNU, pax and ustar dialects
                    written by tarfile (long names, labels, directories, links), truncated ones
  fuzz_index        the sidecar .idx files of those packs, each also in the other index versions,
                    and indexes of every version written here field by field (several members
                    per sample, member names with dots, empty ones; image sizes 0 to 2^24)
  fuzz_image_size   the first 2 KiB of the images fuzz_decode starts from, and sizes files
                    (docs/FORMAT.md) for the indexes of those packs and made here
  fuzz_manifest     manifests (versions 1 and 2, with and without fields) for the pack folder
                    fuzz_manifest builds, and variations; with attached.json after a NUL (its
                    sidecar for the three shards, and variations)
  fuzz_data_pack    array and token packs: a manifest and one data file, and variations
  fuzz_npy          .npy files numpy writes: every accepted dtype, shapes () to 4-d, box arrays,
                    versions 1.0-3.0, the refused kinds (objects, big-endian, Fortran order, ...)
  fuzz_json_boxes   COCO-style box lists (alone and in a whole COCO file), "boxes" lists, plain
                    4-number lists, and a few that are refused
  fuzz_webp         small WebPs written by Pillow from those images (lossy, lossless, with alpha,
                    one animated), behind a 4-byte header (the crop rectangle)
  fuzz_mask         PNG masks: palette and grey at 1, 2, 4 and 8 bits, interlaced or not, odd
                    widths; the grey and palette PNGs of png-variety; a few PNGs that are not masks
  fuzz_video        small clips the ffmpeg command makes from two photos of jpeg-variety (H.264
                    in mp4 and mkv with B-frames, VP9 in webm, MPEG-4 in avi, MJPEG, MPEG-2 in
                    an MPEG program stream), behind the 2-byte header (first frame, stride);
                    the kept regression inputs
  fuzz_row_packing  lengths of real documents (the standard library's sources' sizes) at
                    capacities 64 to 8192, each fit, with and without max_segments and windows
  fuzz_row_group    decoded Parquet row groups: small JPEGs as a bytes column with nulls, int64
                    labels, list<int32> ids, captions, all together; and columns whose offsets,
                    lengths or validity do not describe their data, a negative row count
  fuzz_audio        short tones (wav 8/16/24-bit, flac, mp3, ogg/opus, m4a/aac, mono and stereo)
                    behind the 4-byte header (start, length, rate, mono); the regression inputs
"""

from __future__ import annotations

import hashlib
import subprocess
import io
import json
import random
import shutil
import struct
import sys
import tarfile
import tempfile
import warnings
import zlib
from pathlib import Path

from PIL import Image

import stoker
from stoker import _core

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
# Larger seeds only slow every mutation down (libFuzzer's -max_len defaults to the largest seed);
# the pixel limit paths are reached by the small bombs in jpeg-corrupt.
MAX_SEED_BYTES = 512 * 1024
IMAGENET_SAMPLE = 40
RNG = random.Random(20240611)


def shared_files(folder: str) -> list[Path]:
    root = SHARED / folder
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and p.suffix.lower() not in (".md", ".txt", ".tsv")
        and p.stat().st_size <= MAX_SEED_BYTES
    )


def write(folder: Path, name: str, data: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{hashlib.sha1(data).hexdigest()[:16]}-{name}").write_bytes(data)


def decode_header(i: int) -> bytes:
    """fuzz_decode's option header (see cpp/fuzz/fuzz_decode.cc), varied by seed number."""
    flags = RNG.getrandbits(8) & ~32  # always the full decode too
    size = (224, 64, 1, 17, 333, 7)[i % 6]
    resize = 0 if i % 3 else RNG.randrange(1, 300)
    index = RNG.randrange(1 << 16)
    return bytes(
        [
            flags,
            (size - 1) & 255,
            (size - 1) >> 8,
            resize & 255,
            resize >> 8,
            index & 255,
            index >> 8,
            RNG.getrandbits(8),
        ]
    )


def roi_header() -> bytes:
    """fuzz_restart_roi's option header (see cpp/fuzz/fuzz_restart_roi.cc)."""
    return bytes([RNG.randrange(8), RNG.randrange(8)] + [RNG.getrandbits(8) for _ in range(4)])


def restart_marked(data: bytes) -> bytes | None:
    """The file as stoker.pack stores it by default, when the rewrite applies."""
    try:
        out, _, _, _, rewritten = _core.prepare_image(data, 0, 90, RNG.choice((1, 1, 2, 4)))
    except stoker.StokerError:
        return None
    return out if rewritten else None


def image_seeds(out: Path) -> None:
    files = (
        shared_files("jpeg-variety") + shared_files("jpeg-corrupt") + shared_files("png-variety")
    )
    imagenet = sorted((SHARED / "imagenet-sample").rglob("*.JPEG")) + sorted(
        (SHARED / "imagenet-sample").rglob("*.jpg")
    )
    files += RNG.sample(imagenet, min(IMAGENET_SAMPLE, len(imagenet)))
    n = 0
    for path in files:
        data = path.read_bytes()
        variants = [data]
        if data[:3] == b"\xff\xd8\xff" and RNG.random() < 0.3:
            marked = restart_marked(data)
            if marked is not None:
                variants.append(marked)
        for v in variants:
            write(out / "fuzz_decode", path.stem, decode_header(n) + v)
            n += 1
            if v[:3] == b"\xff\xd8\xff":
                header = roi_header()
                if v is not data:
                    header = bytes([header[0] | 0x80]) + header[1:]  # already marked: as it is
                write(out / "fuzz_restart_roi", path.stem, header + v)


def small_images(limit: int = 8192) -> list[Path]:
    return [
        p
        for p in shared_files("jpeg-variety") + shared_files("png-variety")
        if p.stat().st_size <= limit and p.suffix.lower() in (".jpg", ".jpeg", ".png")
    ]


def pack_seeds(out: Path, tmp: Path) -> None:
    """Shards and indexes written by stoker.pack from small ImageFolder trees."""
    images = small_images()
    for k in range(6):
        src = tmp / f"src{k}"
        for c in range(1 + k % 3):
            d = src / f"class{c}"
            d.mkdir(parents=True)
            for p in RNG.sample(images, 1 + k):
                shutil.copy(p, d / p.name)
        dst = tmp / f"pack{k}"
        try:
            stoker.pack(src, dst, shard_size="64KB", progress=False, restart_interval=k % 2)
        except stoker.StokerError:
            continue
        for f in sorted(dst.iterdir()):
            if f.suffix == ".tar":
                write(out / "fuzz_tar", f"pack{k}-{f.stem}", f.read_bytes())
            elif f.suffix == ".idx":
                data = f.read_bytes()
                write(out / "fuzz_index", f"pack{k}-{f.stem}", data)
                # The same shard's index in the other versions: all are untrusted input.
                flags, samples, sizes = read_index(data)
                sizes = sizes or [(0, 0)] * count(samples)
                others = {1: index_v1(samples, flags), 2: index_v2(samples, flags),
                          3: index_v2(samples, flags, sizes)}  # fmt: skip
                for version, other in others.items():
                    if other is not None and version != data[8]:
                        write(out / "fuzz_index", f"pack{k}-{f.stem}-v{version}", other)
                # Its sizes file, as a reader of an older pack keeps it beside the index.
                crc = struct.unpack_from("<I", data, len(data) - 4)[0]
                write(out / "fuzz_image_size", f"pack{k}-{f.stem}.sizes", sizes_file(crc, sizes))


INDEX_MAGIC = b"STKRIDX\0"
# One sample of an index: (key, label, [(member name, offset, size, crc32c), ...]).
IndexSample = tuple[str, int, list[tuple[str, int, int, int]]]


def count(samples: list[IndexSample]) -> int:
    return sum(len(files) for _, _, files in samples)


def sizes_file(index_crc: int, sizes: list[tuple[int, int]]) -> bytes:
    """A sizes file (docs/FORMAT.md, "Image sizes of older packs") for an index of that CRC."""
    data = b"STKRSIZ\0" + struct.pack("<IIIIQ", 1, 0, index_crc, 0, len(sizes))
    data += b"".join(struct.pack("<II", w, h) for w, h in sizes)
    return data + struct.pack("<I", _core.crc32c(data))


def index_v2(samples: list[IndexSample], flags: int = 1,
             sizes: list[tuple[int, int]] | None = None) -> bytes:  # fmt: skip
    """A version 2 .idx, field by field as docs/FORMAT.md lays it out; with `sizes` (width,
    height per member), version 3."""
    names: list[str] = []
    records, members, keys = bytearray(), bytearray(), bytearray()
    for key, label, files in samples:
        first = len(members) // 24
        records += struct.pack("<QIHHq", len(keys), first, len(files), len(key.encode()), label)
        keys += key.encode()
        for name, offset, size, crc in files:
            if name not in names:
                names.append(name)
            members += struct.pack("<QQIHH", offset, size, crc, names.index(name), 0)
    table = b"".join(struct.pack("<H", len(n.encode())) + n.encode() for n in names)
    header = struct.pack(
        "<IIQQQQ", 2 if sizes is None else 3, flags, len(samples), len(members) // 24, len(keys),
        len(table),
    )
    data = INDEX_MAGIC + header + records + members + keys + table
    if sizes is not None:
        data += b"".join(struct.pack("<II", w, h) for w, h in sizes)
    return data + struct.pack("<I", _core.crc32c(data))


def index_v1(samples: list[IndexSample], flags: int = 1) -> bytes | None:
    """A version 1 .idx (docs/FORMAT.md, "Version 1 indexes"): each sample's first jpg or png
    member; None when a sample has neither."""
    records, keys = bytearray(), bytearray()
    for key, label, files in samples:
        image = next((m for m in files if m[0] in ("jpg", "png")), None)
        if image is None:
            return None
        name, offset, size, crc = image
        image_format = 1 if name == "jpg" else 2
        records += struct.pack(
            "<QQqQIHBB", offset, size, label, len(keys), crc, len(key.encode()), image_format, 0
        )
        keys += key.encode()
    data = INDEX_MAGIC + struct.pack("<IIQQ", 1, flags, len(samples), len(keys)) + records + keys
    return data + struct.pack("<I", _core.crc32c(data))


def read_index(data: bytes) -> tuple[int, list[IndexSample], list[tuple[int, int]] | None]:
    """The flags, samples and (version 3) image sizes of a valid .idx of any version (stoker's
    own: not validated)."""
    version, flags, n = struct.unpack_from("<IIQ", data, 8)
    samples: list[IndexSample] = []
    if version == 1:
        keys = 32 + 40 * n
        for i in range(n):
            offset, size, label, key_at, crc, key_size, image_format, _ = struct.unpack_from(
                "<QQqQIHBB", data, 32 + 40 * i
            )
            key = data[keys + key_at : keys + key_at + key_size].decode()
            samples.append((key, label, [(("bin", "jpg", "png")[image_format], offset, size, crc)]))
        return flags, samples, None
    m, k, s = struct.unpack_from("<QQQ", data, 24)
    members_at = 48 + 24 * n
    keys = members_at + 24 * m
    names, at = [], keys + k
    while at < keys + k + s:
        (length,) = struct.unpack_from("<H", data, at)
        names.append(data[at + 2 : at + 2 + length].decode())
        at += 2 + length
    for i in range(n):
        key_at, first, count, key_size, label = struct.unpack_from("<QIHHq", data, 48 + 24 * i)
        files = []
        for j in range(first, first + count):
            offset, size, crc, name, _ = struct.unpack_from("<QQIHH", data, members_at + 24 * j)
            files.append((names[name], offset, size, crc))
        samples.append((data[keys + key_at : keys + key_at + key_size].decode(), label, files))
    sizes = None
    if version >= 3:
        table = keys + k + s
        sizes = [struct.unpack_from("<II", data, table + 8 * j) for j in range(m)]
    return flags, samples, sizes


def index_seeds(out: Path) -> None:
    """Indexes of both versions made here: what a multi-field pack writes, and the edges."""

    def member(name: str, at: int, size: int) -> tuple[str, int, int, int]:
        return (name, 512 * at, size, RNG.getrandbits(32))

    fields = [
        (
            "00000000",
            3,
            [
                member("jpg", 1, 900),
                member("seg.png", 4, 300),
                member("boxes.npy", 6, 208),
                member("cls", 8, 1),
            ],
        ),
        ("00000001", -1, [member("jpg", 10, 1200), member("json", 14, 77)]),
        ("00000002", 0, [member("cls", 16, 1), member("png", 18, 4000), member("txt", 27, 12)]),
    ]
    single = [("a", 1, [member("jpg", 1, 100)]), ("bb", -1, [member("png", 3, 50)])]
    many_names = [
        (f"k{i}", i % 5, [member(f"f{i}.x{j}", 2 * i + j, 10) for j in range(3)]) for i in range(12)
    ]
    layouts = {
        "fields": fields,
        "single-image": single,
        "many-names": many_names,
        "zero-members": [("a", -1, []), ("b", 2, [member("cls", 1, 1)])],
        "empty-member": [("a", -1, [member("txt", 1, 0)])],
        "shard-end": [("z", 0, [("jpg", (1 << 30) - 7, 7, 0)])],
        "empty": [],
    }
    for name, samples in layouts.items():
        for flags in (1, 0):
            write(out / "fuzz_index", f"{name}-v2-flags{flags}", index_v2(samples, flags))
            sizes = [(RNG.choice([0, 1, 640, 1 << 24]), 0) for _ in range(count(samples))]
            sizes = [(w, 0 if w == 0 else RNG.choice([1, 480, 1 << 24])) for w, _ in sizes]
            write(out / "fuzz_index", f"{name}-v3-flags{flags}", index_v2(samples, flags, sizes))
            write(out / "fuzz_image_size", f"{name}-flags{flags}.sizes",
                  sizes_file(RNG.getrandbits(32), sizes))  # fmt: skip
            v1 = index_v1(samples, flags)
            if v1 is not None:
                write(out / "fuzz_index", f"{name}-v1-flags{flags}", v1)


def tar_bytes(fmt: int, members: list[tuple[str, bytes | None, bytes]]) -> bytes:
    """A tar in one dialect; members are (name, data or None for a directory, type)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            elif kind == tarfile.SYMTYPE:
                info.type = tarfile.SYMTYPE
                info.linkname = data.decode()
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tarfile_seeds(out: Path) -> None:
    """WebDataset-style tars as other tools write them: the dialects scan_tar must read."""
    images = [p.read_bytes() for p in RNG.sample(small_images(2048), 4)]
    long_dir = "a-rather-long-directory-name-" * 4
    layouts = {
        "plain": [
            ("s0.jpg", images[0], b""),
            ("s0.cls", b"3\n", b""),
            ("s1.png", images[1], b""),
            ("s1.cls", b" 12 ", b""),
        ],
        "long-names": [
            (f"{long_dir}/sample.0.jpg", images[0], b""),
            (f"{long_dir}/sample.0.cls", b"7", b""),
            (f"{long_dir}/Sample.1.JPEG", images[2], b""),
        ],
        "dirs-links": [
            ("train", None, b""),
            ("train/x.jpg", images[3], b""),
            ("train/y.jpg", b"x.jpg", tarfile.SYMTYPE),
            ("train/x.label", b"1", b""),
        ],
        # Members of one key apart, as WebDataset allows; a file without an extension.
        "multi-member-scrambled": [
            ("d/s0.jpg", images[0], b""),
            ("d/s1.seg.png", images[1], b""),
            ("d/s0.json", b'{"boxes": [[1, 2, 3, 4]]}', b""),
            ("README", b"not a sample", b""),
            ("d/s0.cls", b"5", b""),
            ("d/s1.jpg", images[2], b""),
            ("d/s0.seg.png", images[1], b""),
            ("d/s1.boxes.npy", b"\x93NUMPY", b""),
            ("d/s2.txt", b"only text", b""),
            ("d/s1.cls", b"", b""),
        ],
        "duplicates": [
            ("k.jpg", images[0], b""),
            ("k.png", images[1], b""),
            ("k.cls", b"1", b""),
            ("k.cls", b"2", b""),
            ("k.txt", b"caption", b""),
        ],
    }
    for name, members in layouts.items():
        for fmt, dialect in (
            (tarfile.GNU_FORMAT, "gnu"),
            (tarfile.PAX_FORMAT, "pax"),
            (tarfile.USTAR_FORMAT, "ustar"),
        ):
            try:
                data = tar_bytes(fmt, members)
            except ValueError:  # ustar cannot hold every long name
                continue
            write(out / "fuzz_tar", f"{name}-{dialect}", data)
            # A shard cut short mid-member and mid-header, as a failed copy leaves it.
            write(out / "fuzz_tar", f"{name}-{dialect}-cut", data[: len(data) // 2 + 100])


def manifest_seeds(out: Path) -> None:
    """Manifests for fuzz_manifest's pack folder (shard-000000: 2 samples of jpg, seg.png, cls;
    shard-000001: 3 of jpg, cls; shard-000002: 2 of jpg, cls, with a version 1 index)."""
    shards = [
        {"tar": "shard-000000.tar", "index": "shard-000000.idx", "num_samples": 2},
        {"tar": "shard-000001.tar", "index": "shard-000001.idx", "num_samples": 3},
    ]
    v1_shard = {"tar": "shard-000002.tar", "index": "shard-000002.idx", "num_samples": 2}
    fields = [
        {
            "name": "jpg",
            "kind": "image",
            "dtype": "uint8",
            "min_shape": [1, 1, 3],
            "max_shape": [1, 1, 3],
            "count": 7,
        },
        {
            "name": "seg.png",
            "kind": "mask",
            "dtype": "uint8",
            "min_shape": [1, 1],
            "max_shape": [1, 1],
            "count": 2,
        },
        {
            "name": "cls",
            "kind": "label",
            "dtype": "int64",
            "min_shape": [],
            "max_shape": [],
            "count": 7,
        },
    ]
    good = {
        "format": "stoker-pack",
        "version": 1,
        "num_samples": 5,
        "classes": ["a", "b", "c"],
        "class_counts": [2, 2, 1],
        "shards": shards,
        "bytes": 9216,
        "max_side": None,
        "restart_interval": 1,
        "source": "/data/train",
        "failed": [],
    }
    variants = [
        good,
        {**good, "shards": shards[:1], "num_samples": 2},
        {**good, "shards": shards * 2, "num_samples": 10},
        {**good, "version": 2},
        {**good, "num_samples": 4},
        {**good, "shards": [{**shards[0], "index": "shard-000001.idx"}]},
        {**good, "shards": [{**shards[0], "tar": "../shard-000000.tar"}]},
        {**good, "shards": [{**shards[0], "num_samples": -1}]},
        {**good, "classes": [1, 2]},
        {**good, "version": 1.5},
        {**good, "version": 3},
        {**good, "version": 2, "fields": fields},
        {**good, "version": 2, "fields": "not a list"},
        {**good, "version": 2, "shards": [*shards, v1_shard], "num_samples": 7, "fields": fields},
        {**good, "shards": [v1_shard], "num_samples": 2},
        {**good, "shards": [{**v1_shard, "index": "shard-000000.idx"}], "num_samples": 2},
        {**good, "shards": [{**shards[0], "index": "shard-000002.idx"}]},
    ]
    for i, m in enumerate(variants):
        write(out / "fuzz_manifest", f"manifest{i}", json.dumps(m, indent=1).encode())
    # With attached.json after a NUL ("@CRC@": the manifest's CRC32C, put in by the target).
    three = {**good, "version": 2, "shards": [*shards, v1_shard], "num_samples": 7}

    def side(n: int, **over) -> dict:
        return {"tar": f"attached/lat/shard-00000{n}.tar",
                "index": f"attached/lat/shard-00000{n}.idx", "num_samples": 2, **over}

    sidecar = {"name": "lat", "member": "lat", "pack_manifest_crc32c": "@CRC@", "samples": 7,
               "shards": [side(0), side(1, num_samples=3), side(2)]}
    listed = {"format": "stoker-attached", "version": 1, "sidecars": [sidecar]}
    attached = [
        listed,
        {**listed, "sidecars": [{**sidecar, "pack_manifest_crc32c": 12345}]},
        {**listed, "sidecars": [{**sidecar, "shards": sidecar["shards"][:2]}]},
        {**listed, "sidecars": [{**sidecar, "shards": [side(0), {**side(1), "index":
                                 "attached/lat/short.idx"}, side(2)]}]},
        {**listed, "sidecars": [{**sidecar, "shards": [side(1), side(0), side(2)]}]},
        {**listed, "sidecars": [{**sidecar, "shards": [{**side(0), "tar": "shard-000000.tar"},
                                                       side(1), side(2)]}]},
        {**listed, "sidecars": [{**sidecar, "name": "../lat"}]},
        {**listed, "sidecars": [sidecar, sidecar]},
        {**listed, "version": 0},
        {**listed, "sidecars": "lat"},
        {**listed, "sidecars": [{**sidecar, "name": 7}]},
    ]
    for i, a in enumerate(attached):
        text = json.dumps(three).encode() + b"\0" + json.dumps(a).encode().replace(
            b'"@CRC@"', b"@CRC@")
        write(out / "fuzz_manifest", f"attached{i}", text)


def data_pack_input(manifest: dict | str, data: bytes, window: int = 3) -> bytes:
    """fuzz_data_pack's input: the window byte, the manifest's length, the manifest, file d."""
    text = (manifest if isinstance(manifest, str) else json.dumps(manifest)).encode()
    return bytes([window]) + len(text).to_bytes(2, "little") + text + data


def data_pack_seeds(out: Path) -> None:
    """Array packs (a column d, with v.npy: uint8 (3, 2, 2) beside it) and token packs (d the
    tokens) for fuzz_data_pack, and variations: shapes, dtypes, rows, offsets that disagree."""
    import numpy as np

    column = npy_bytes(np.arange(3 * 4, dtype=np.float32).reshape(3, 4))

    def arrays(fields, files, rows=3, **extra):
        return {"format": "stoker-arrays", "version": 1, "num_samples": rows, "fields": fields,
                "shards": [{"num_samples": rows, "files": files, **extra}]}  # fmt: skip

    f32 = {"name": "feat", "dtype": "float32", "shape": [4]}
    u8 = {"name": "img", "dtype": "uint8", "shape": [2, 2]}
    d = {"field": "feat", "file": "d", "bytes": len(column)}
    v = {"field": "img", "file": "v.npy"}
    inputs = {
        "arrays": data_pack_input(arrays([f32], [d]), column),
        "arrays-two": data_pack_input(arrays([f32, u8], [d, v]), column),
        "arrays-rows": data_pack_input(arrays([f32], [d], rows=4), column),
        "arrays-shape": data_pack_input(arrays([{**f32, "shape": [2, 2]}], [d]), column),
        "arrays-dtype": data_pack_input(arrays([{**f32, "dtype": "int32"}], [d]), column),
        "arrays-cut": data_pack_input(arrays([f32], [d]), column[:-7]),
        "arrays-huge": data_pack_input(arrays([{**f32, "shape": [1 << 40, 1 << 40]}], [d]), column),
        "arrays-order": data_pack_input(arrays([u8, f32], [d, v]), column),
        "arrays-offset": data_pack_input(arrays([f32], [{**d, "data_offset": 4096}]), column),
    }
    tokens = np.arange(1, 200, dtype=np.uint16).tobytes()

    def token_pack(num_tokens=199, dtype="uint16", **extra):
        return {"format": "stoker-tokens", "version": 1, "dtype": dtype, "num_tokens": num_tokens,
                "eos_id": 0,
                "shards": [{"file": "d", "num_tokens": num_tokens, **extra}]}  # fmt: skip

    inputs |= {
        "tokens": data_pack_input(token_pack(), tokens),
        "tokens-long-window": data_pack_input(token_pack(), tokens, window=250),
        "tokens-count": data_pack_input(token_pack(num_tokens=300), tokens),
        "tokens-odd": data_pack_input(token_pack(), tokens[:-1]),
        "tokens-u32": data_pack_input(token_pack(num_tokens=99, dtype="uint32"), tokens[:396]),
        "tokens-float": data_pack_input(token_pack(dtype="float32"), tokens),
        "tokens-bytes": data_pack_input(token_pack(bytes=1), tokens),
        "not-json": data_pack_input('{"format": "stoker-arrays", "version":', column),
    }
    for name, data in inputs.items():
        write(out / "fuzz_data_pack", name, data)


def webp_seeds(out: Path) -> None:
    """Small WebPs in each of libwebp's bitstream kinds, behind fuzz_webp's crop header."""
    sources = small_images(16384)
    sources = [sources[i] for i in sorted(RNG.sample(range(len(sources)), min(24, len(sources))))]
    n = 0
    for path in sources:
        try:
            with warnings.catch_warnings(), Image.open(path) as im:
                warnings.simplefilter("ignore")  # PIL's remarks on odd files of png-variety
                im.load()
                rgb = im.convert("RGB")
        except (OSError, ValueError, SyntaxError):
            continue
        rgb.thumbnail((96, 96))
        rgba = rgb.convert("RGBA")
        rgba.putalpha(rgb.convert("L"))
        variants = [
            ("lossy", rgb, {"quality": RNG.choice((10, 50, 90)), "method": RNG.choice((0, 4))}),
            ("lossless", rgb, {"lossless": True, "method": RNG.choice((0, 4))}),
            ("lossy-alpha", rgba, {"quality": 70}),
            ("lossless-alpha", rgba, {"lossless": True, "exact": RNG.random() < 0.5}),
        ]
        kind, image, options = variants[n % len(variants)]
        n += 1
        buf = io.BytesIO()
        image.save(buf, "WEBP", **options)
        write(
            out / "fuzz_webp",
            f"{path.stem}-{kind}",
            bytes(RNG.getrandbits(8) for _ in range(4)) + buf.getvalue(),
        )
    frames = [Image.new("RGB", (24, 16), (40 * i, 255 - 40 * i, 90)) for i in range(3)]
    buf = io.BytesIO()
    frames[0].save(buf, "WEBP", save_all=True, append_images=frames[1:], duration=100)
    write(out / "fuzz_webp", "animated", bytes(4) + buf.getvalue())


# The seven Adam7 passes: (first column, first row, column step, row step).
ADAM7 = [
    (0, 0, 8, 8),
    (4, 0, 8, 8),
    (0, 4, 4, 8),
    (2, 0, 4, 4),
    (0, 2, 2, 4),
    (1, 0, 2, 2),
    (0, 1, 1, 2),
]


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    crc = zlib.crc32(kind + payload)
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)


def mask_png(width: int, height: int, bits: int, colour_type: int, interlaced: bool) -> bytes:
    """A grey or palette PNG of random samples, Adam7-interlaced or not (Pillow writes neither
    interlaced PNGs nor every depth)."""
    samples = [[RNG.getrandbits(bits) for _ in range(width)] for _ in range(height)]
    passes = ADAM7 if interlaced else [(0, 0, 1, 1)]
    raw = bytearray()
    for x0, y0, dx, dy in passes:
        if x0 >= width or y0 >= height:
            continue  # an empty pass has no scanlines
        for y in range(y0, height, dy):
            value, count = 0, 0
            for x in range(x0, width, dx):
                value = value << bits | samples[y][x]
                count += bits
            value <<= -count % 8
            raw.append(0)  # filter type None: the filters are libspng's, reached by mutation
            raw += value.to_bytes((count + 7) // 8, "big")
    ihdr = struct.pack(">IIBBBBB", width, height, bits, colour_type, 0, 0, int(interlaced))
    palette = bytes(RNG.getrandbits(8) for _ in range(3 << bits))
    plte = png_chunk(b"PLTE", palette) if colour_type == 3 else b""
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + plte
        + png_chunk(b"IDAT", zlib.compress(bytes(raw), 9))
        + png_chunk(b"IEND", b"")
    )


def mask_seeds(out: Path) -> None:
    for width, height in ((13, 11), (1, 1), (3, 5), (37, 9), (64, 64)):
        for bits in (1, 2, 4, 8):
            for colour_type in (0, 3):
                interlaced = (width + bits + colour_type) % 2 == 1
                data = mask_png(width, height, bits, colour_type, interlaced)
                name = f"{width}x{height}-{bits}bit-{'palette' if colour_type else 'grey'}"
                write(out / "fuzz_mask", name + ("-interlaced" if interlaced else ""), data)
    for path in shared_files("png-variety"):
        data = path.read_bytes()
        if len(data) > 16384 or data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
            continue
        bits, colour_type = data[24], data[25]
        if (colour_type in (0, 3) and bits <= 8) or RNG.random() < 0.05:
            write(out / "fuzz_mask", path.stem, data)


def npy_bytes(array, version: tuple[int, int] | None = None) -> bytes:
    import numpy as np  # only here: the other seeds do not need it

    buf = io.BytesIO()
    if version is None:
        np.save(buf, array, allow_pickle=array.dtype.hasobject)
    else:
        np.lib.format.write_array(buf, array, version=version, allow_pickle=False)
    return buf.getvalue()


def npy_seeds(out: Path) -> None:
    """.npy files numpy writes: every accepted dtype, shapes from () to 4-d, box arrays, versions
    1.0 to 3.0, and the kinds parse_npy refuses (objects, big-endian, Fortran order, ...)."""
    import numpy as np

    rng = np.random.default_rng(20240611)
    special = [0.0, -0.0, 1.5, -2.25, np.nan, np.inf, -np.inf, 6e-8, 65504.0, 1e-40]
    shapes = [(), (0,), (3,), (2, 3), (2, 2, 2), (1, 2, 1, 3)]
    for i, name in enumerate(
        ["bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"]
        + ["float16", "float32", "float64"]
    ):
        dtype = np.dtype(name)
        shape = shapes[i % len(shapes)]
        if dtype.kind == "f":
            values = rng.choice(np.array(special, dtype=np.float64), size=shape)
        else:
            info = np.iinfo(dtype) if dtype.kind != "b" else None
            low, high = (0, 2) if info is None else (int(info.min), int(info.max))
            values = rng.integers(low, high, size=shape, endpoint=info is not None)
        array = np.asarray(values).astype(dtype)
        version = (None, (2, 0), (3, 0))[i % 3]
        write(
            out / "fuzz_npy",
            f"{name}-{'x'.join(map(str, shape)) or 'scalar'}",
            npy_bytes(array, version),
        )
    boxes = rng.uniform(-10, 500, size=(5, 4))
    classes = rng.integers(-1, 80, size=(5, 1))
    scores = rng.uniform(0, 1, size=(5, 1))
    for name, array in {
        "boxes-float32-5x4": boxes.astype(np.float32),
        "boxes-float64-5x5": np.hstack([boxes, classes]),
        "boxes-int16-5x5": np.hstack([boxes, classes]).astype(np.int16),
        "boxes-float16-5x6": np.hstack([boxes, classes, scores]).astype(np.float16),
        "boxes-uint8-5x4": boxes.clip(0, 255).astype(np.uint8),
        "boxes-empty-0x4": np.zeros((0, 4), np.float32),
        "boxes-empty-0": np.zeros((0,), np.float64),
        "boxes-nan-class": np.array([[1, 2, 3, 4, np.nan]]),
    }.items():
        write(out / "fuzz_npy", name, npy_bytes(array))
    refused = {
        "object-pickled": np.array([{"a": 1}, None], dtype=object),
        "big-endian": np.arange(4, dtype=">i4"),
        "fortran-order": np.asfortranarray(np.arange(6, dtype="<u2").reshape(2, 3)),
        "structured": np.zeros(2, dtype=[("a", "<f4"), ("b", "<i2")]),
        "unicode": np.array(["ab", "c"]),
        "bytes": np.array([b"ab", b"c"]),
        "complex": np.arange(3, dtype=np.complex64),
        "datetime": np.arange(3).astype("datetime64[s]"),
    }
    for name, array in refused.items():
        write(out / "fuzz_npy", name, npy_bytes(array))
    good = npy_bytes(np.arange(6, dtype=np.float32).reshape(2, 3))
    write(out / "fuzz_npy", "truncated", good[:-3])
    write(out / "fuzz_npy", "trailing-bytes", good + b"\0\0")


def json_box_seeds(out: Path) -> None:
    """Box members: COCO-style objects (alone, or in a whole COCO file), a "boxes" list, plain
    4-number lists, empty ones, and a few that parse_json_boxes refuses."""
    coco = [
        {
            "id": i,
            "image_id": 1,
            "category_id": RNG.randrange(1, 91),
            "bbox": [round(RNG.uniform(0, 600), 2) for _ in range(4)],
            "area": RNG.uniform(0, 1e5),
            "iscrowd": 0,
            "segmentation": [[round(RNG.uniform(0, 600), 1) for _ in range(8)]],
        }
        for i in range(6)
    ]
    whole = {
        "info": {"year": 2017, "version": "1.0"},
        "images": [{"id": 1, "width": 640, "height": 480, "file_name": "000000000139.jpg"}],
        "annotations": coco,
        "categories": [{"id": 1, "name": "person", "supercategory": "person"}],
    }
    variants = {
        "coco-list": coco,
        "coco-file": whole,
        "boxes-key": {"boxes": [a["bbox"] for a in coco], "width": 640},
        "plain-lists": [[RNG.randrange(-5, 500) for _ in range(4)] for _ in range(5)],
        "mixed": [coco[0], [1, 2, 3, 4], {"bbox": [0.5, 0.5, 1e-3, 2e3]}],
        "empty-list": [],
        "empty-annotations": {"annotations": []},
        "bbox-three-numbers": [{"bbox": [1, 2, 3], "category_id": 1}],
        "category-float": [{"bbox": [1, 2, 3, 4], "category_id": 1.0}],
        "both-keys": {"annotations": [], "boxes": []},
    }
    for name, value in variants.items():
        text = json.dumps(value, indent=RNG.choice((None, 1)))
        write(out / "fuzz_json_boxes", name, text.encode())


def ffmpeg(args: list[str], out: Path) -> bytes | None:
    """What `ffmpeg ARGS OUT` writes, or None where there is no ffmpeg command."""
    cmd = ["ffmpeg", "-nostdin", "-loglevel", "error", "-y", *args, str(out)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None
    return out.read_bytes()


def media_seeds(out: Path) -> None:
    regressions = Path(__file__).resolve().parent / "regressions"
    for target in ("fuzz_video", "fuzz_audio"):
        for f in sorted((regressions / target).glob("*")):
            write(out / target, "regression-" + f.name, f.read_bytes())
    photos = [p for p in shared_files("jpeg-variety") if p.suffix.lower() in (".jpg", ".jpeg")]
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        for i, photo in enumerate(photos[:2]):
            # A slow zoom over the photo, 32x24, 12 frames at 6 fps.
            still = [
                "-loop",
                "1",
                "-i",
                str(photo),
                "-vf",
                "scale=64:48,zoompan=z='1+0.02*on':s=32x24:d=12:fps=6",
                "-frames:v",
                "12",
            ]
            for name, codec in [
                ("h264.mp4", ["-c:v", "libx264", "-bf", "2", "-g", "4"]),
                ("h264.mkv", ["-c:v", "libx264", "-bf", "3", "-g", "5"]),
                ("vp9.webm", ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-g", "4"]),
                ("mpeg4.avi", ["-c:v", "mpeg4", "-bf", "1", "-g", "4"]),
                ("mjpeg.avi", ["-c:v", "mjpeg"]),
                ("mpeg2.mpg", ["-c:v", "mpeg2video", "-bf", "2", "-g", "4", "-f", "mpeg"]),
            ]:
                data = ffmpeg(
                    still + codec + ["-pix_fmt", "yuvj420p" if "mjpeg" in name else "yuv420p"],
                    t / f"{i}-{name}",
                )
                if data is not None:
                    header = bytes([RNG.randrange(256), RNG.randrange(256)])
                    write(out / "fuzz_video", f"{i}-{name}", header + data)
        tone = ["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=16000:duration=0.4"]
        for name, codec in [
            ("s16.wav", ["-ac", "2"]),
            ("u8.wav", ["-c:a", "pcm_u8"]),
            ("s24.wav", ["-c:a", "pcm_s24le", "-ar", "44100"]),
            ("flac", ["-c:a", "flac", "-ac", "2"]),
            ("mp3", ["-c:a", "libmp3lame"]),
            ("ogg", ["-c:a", "libopus"]),
            ("m4a", ["-c:a", "aac"]),
        ]:
            data = ffmpeg(tone + codec, t / f"tone.{name.split('.')[-1]}")
            if data is not None:
                header = bytes(
                    [RNG.randrange(5), RNG.randrange(1, 6), RNG.randrange(4), RNG.randrange(2)]
                )
                write(out / "fuzz_audio", name, header + data)


def row_packing_seeds(out: Path) -> None:
    import struct
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    sizes = [f.stat().st_size + 1 for f in sorted(root.glob("*.py"))][:400]
    for k, capacity in enumerate((64, 512, 2048, 8192)):
        for fit in (0, 0x80):
            lengths = [min(s, capacity) for s in sizes[k * 50 : k * 50 + 120]]
            header = struct.pack("<HBH", capacity - 1, k % 9, 40 + k * 30)
            header = header[:4] + bytes([header[4] | fit, 0])
            name = f"capacity-{capacity}-{'first' if fit else 'best'}"
            body = struct.pack(f"<{len(lengths)}H", *lengths)
            write(out / "fuzz_row_packing", name, header + body)


def row_group_seeds(out: Path) -> None:
    """fuzz_row_group's inputs (see cpp/fuzz/fuzz_row_group.cc): the row count, then columns."""
    rng = random.Random(20261203)  # its own: the other targets' seeds stay as they were
    kinds = {"bytes": 0, "number": 1, "list": 2}
    dtypes = ["bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"]
    dtypes += ["float16", "float32", "float64"]

    def column(name, kind, dtype, data, offsets=(), present=b""):
        return (
            bytes([len(name)])
            + name.encode()
            + bytes([kinds[kind], dtypes.index(dtype)])
            + struct.pack("<I", len(data))
            + data
            + struct.pack(f"<I{len(offsets)}Q", len(offsets), *offsets)
            + struct.pack("<I", len(present))
            + present
        )

    def cells(values):  # offsets of cells back to back
        offsets = [0]
        for v in values:
            offsets.append(offsets[-1] + len(v))
        return b"".join(values), offsets

    def jpeg(side):
        pixels = bytes(rng.randrange(256) for _ in range(side * side * 3))
        buffer = io.BytesIO()
        Image.frombytes("RGB", (side, side), pixels).save(buffer, "JPEG", quality=80)
        return buffer.getvalue()

    images, image_offsets = cells([jpeg(8), b"", jpeg(12), jpeg(6)])
    image = column("image", "bytes", "uint8", images, image_offsets, bytes([1, 0, 1, 1]))
    label = column("label", "number", "int64", struct.pack("<4q", 7, -1, 3, 0))
    lists = [struct.pack(f"<{n}i", *range(n)) for n in (3, 0, 2, 5)]
    ids = column("ids", "list", "int32", *cells(lists), bytes([1, 1, 0, 1]))
    captions = column(
        "caption", "bytes", "uint8", *cells([b"a cat", b"", "\u00e9t\u00e9".encode(), b"x"])
    )
    rows = struct.pack("<q", 4)
    for name, data in [
        ("image-with-nulls", rows + image),
        ("labels-int64", struct.pack("<q", 5) + column("label", "number", "int64", bytes(40))),
        (
            "labels-float32-uint8",
            rows
            + column("y", "number", "float32", struct.pack("<4f", 1, 2, 3, 4))
            + column("k", "number", "uint8", bytes(4), present=bytes([0, 1, 1, 0])),
        ),
        ("ids-list-int32", rows + ids),
        ("image-label-ids-caption", rows + image + label + ids + captions),
        ("no-columns", struct.pack("<q", 9)),
        # A number column's offsets are not read (its cells are dtype-sized).
        ("numbers-offsets-unread", rows + column("label", "number", "int32", bytes(16), [0, 99])),
        ("empty-row-group", struct.pack("<q", 0) + column("image", "bytes", "uint8", b"", [0])),
        # Columns that do not describe their data: each must be refused, naming the column.
        (
            "offsets-past-the-data",
            rows + label + column("image", "bytes", "uint8", b"abcd", [0, 1, 2, 3, 9]),
        ),
        ("offsets-decrease", rows + column("image", "bytes", "uint8", b"abcd", [0, 3, 1, 2, 4])),
        ("offsets-one-short", rows + column("ids", "list", "int32", bytes(8), [0, 4, 8, 8])),
        (
            "offsets-not-from-zero",
            rows + column("caption", "bytes", "uint8", b"abcd", [1, 2, 3, 4, 4]),
        ),
        (
            "list-not-whole-elements",
            rows + column("ids", "list", "int32", bytes(12), [0, 6, 6, 12, 12]),
        ),
        (
            "validity-one-short",
            rows + column("image", "bytes", "uint8", images, image_offsets, b"\x01\x01\x01"),
        ),
        ("numbers-one-short", rows + column("label", "number", "int64", bytes(24))),
        ("negative-rows", struct.pack("<q", -1) + label),
    ]:
        write(out / "fuzz_row_group", name, data)


def main() -> None:
    out = Path(sys.argv[1])
    if not SHARED.exists():
        sys.exit(f"shared data not found at {SHARED}")
    shutil.rmtree(out, ignore_errors=True)
    image_seeds(out)
    for f in sorted((out / "fuzz_decode").iterdir()):  # the images, past their option header
        write(out / "fuzz_image_size", f"head-{f.name}", f.read_bytes()[8 : 8 + 2048])
    with tempfile.TemporaryDirectory() as tmp:
        pack_seeds(out, Path(tmp))
    tarfile_seeds(out)
    index_seeds(out)
    manifest_seeds(out)
    data_pack_seeds(out)
    npy_seeds(out)
    json_box_seeds(out)
    webp_seeds(out)
    mask_seeds(out)
    media_seeds(out)
    row_packing_seeds(out)
    row_group_seeds(out)
    for d in sorted(out.iterdir()):
        files = list(d.iterdir())
        print(f"{d.name}: {len(files)} seeds, {sum(f.stat().st_size for f in files) >> 10} KiB")


if __name__ == "__main__":
    main()
