"""stoker.inspect: what a pack holds, from its manifest, with every index (or column header)
checked against its file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .attach import attached
from .. import _core
from .packer import MANIFEST


# An aspect histogram's bins: width / height from 1/4 to 4, even in log ratio (the middle one
# centred on square), and one more at each end for what is beyond.
ASPECT_EDGES = [2 ** (k / 4 - 2.125) for k in range(18)]
IMAGE_MEMBERS = ["jpg", "jpeg", "png", "webp", "ppm"]


def aspects(ds: Any) -> dict[str, Any] | None:
    """The images' aspect distribution (width / height of each sample's first image member),
    from the index (read once from the images' headers where it records none): counts per bin
    of ``edges`` (ASPECT_EDGES, plus below the first and above the last), portrait, square and
    landscape counts, the median aspect, and ``unknown`` (no image, or its size not readable).
    None where the samples have no image at all."""
    import numpy as np

    parts, sources = [], set()
    for s in range(ds.num_shards):
        if ds.layout(s) != "tar":
            return None
        sizes, source = ds.image_sizes(s, IMAGE_MEMBERS)
        parts.append(sizes)
        sources.add(source)
    if not parts:
        return None
    hw = np.concatenate(parts)
    known = (hw[:, 0] > 0) & (hw[:, 1] > 0)
    if not known.any():
        return None
    ratio = hw[known, 1] / hw[known, 0]
    edges = np.asarray(ASPECT_EDGES)
    counts = np.bincount(np.searchsorted(edges, ratio, side="right"), minlength=len(edges) + 1)
    return {
        "images": int(known.sum()),
        "unknown": int((~known).sum()),
        "source": sorted(sources),
        "edges": [round(float(e), 4) for e in edges],
        "counts": [int(c) for c in counts],
        "portrait": int((ratio < 1 / 1.05).sum()),
        "square": int(((ratio >= 1 / 1.05) & (ratio <= 1.05)).sum()),
        "landscape": int((ratio > 1.05).sum()),
        "median": round(float(np.median(ratio)), 4),
        "sizes": {"median_height": int(np.median(hw[known, 0])),
                  "median_width": int(np.median(hw[known, 1]))},  # fmt: skip
    }


def inspect(path: str | os.PathLike) -> dict[str, Any]:
    """What a pack holds: format version, classes and counts, shards and their sizes, fields,
    and its images' aspect distribution (``aspects``)."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.exists():
        ds = _core.Dataset.open(str(path))  # foreign WebDataset shards: indexed now
        return {
            "format": "webdataset",
            "version": None,
            "num_samples": len(ds),
            "classes": [],
            "shards": ds.num_shards,
            "bytes": None,
            "aspects": aspects(ds),
        }
    with open(manifest_path) as f:
        m = json.load(f)
    if m.get("format") == "stoker-tokens":
        ds = _core.Dataset.open(str(path), seq_len=1)  # validates every file's size
        return {
            "format": m["format"],
            "version": m["version"],
            "num_samples": int(m["num_tokens"]),  # tokens: windows depend on the reader
            "num_tokens": int(m["num_tokens"]),
            "dtype": m["dtype"],
            "eos_id": m.get("eos_id"),
            "classes": [],
            "shards": len(m["shards"]),
            "bytes": m.get("bytes"),
            "shard_bytes": [s.get("bytes") for s in m["shards"]],
            "fields": [],
        }
    ds = _core.Dataset.open(str(path))  # validates every index (or column header) against its file
    if m.get("format") == "stoker-arrays":
        return {
            "format": m["format"],
            "version": m["version"],
            "num_samples": len(ds),
            "classes": m.get("classes", []),
            "source_format": m.get("source_format"),
            "shards": len(m["shards"]),
            "bytes": m.get("bytes"),
            "shard_bytes": [sum(f["bytes"] for f in s["files"]) for s in m["shards"]],
            "fields": m["fields"],
        }
    return {
        "format": m["format"],
        "version": m["version"],
        "num_samples": len(ds),
        "classes": m["classes"],
        "class_counts": m.get("class_counts"),
        "source_format": m.get("source_format"),
        "shards": len(m["shards"]),
        "bytes": m.get("bytes"),
        "shard_bytes": [s.get("bytes") for s in m["shards"]],
        "max_side": m.get("max_side"),
        "codec": m.get("codec", "source"),
        "quality": m.get("quality"),
        "video_keyint": m.get("video_keyint"),
        "video_remux": m.get("video_remux"),
        "audio_rate": m.get("audio_rate"),
        "audio_channels": m.get("audio_channels"),
        "failed": len(m.get("failed", [])),
        "fields": m.get("fields", []),
        "aspects": aspects(ds),
        "videos": _videos(path, m),
        "attached": attached(path),
    }


def _videos(path: Path, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The videos' distributions (packing/videos.py), for a pack with a video field; read from
    the videos first for a pack that has none recorded (then kept beside its manifest)."""
    if not any(f.get("kind") == "video" for f in manifest.get("fields", [])):
        return None
    from ..errors import UnsupportedFormatError
    from .videos import video_facts

    try:
        return video_facts(path).summary()
    except UnsupportedFormatError as e:  # no stoker._media
        return {"unavailable": str(e)}
