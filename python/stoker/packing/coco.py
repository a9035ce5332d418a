"""COCO instances annotations, read for packing: categories, images and their annotations; a
semantic mask rasterised from polygons and RLE (uncompressed counts lists and COCO's compressed
strings); the boxes of the annotations that are not crowds.

pycocotools is not needed: its compressed-RLE decoder (maskApi.c, rleFrString) is written out
here, and polygons are filled by Pillow's ImageDraw.polygon (which fills a few edge pixels
differently from pycocotools' rasteriser).
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError

MAX_CLASSES = 255  # a mask pixel holds class index + 1 in 8 bits


@dataclass
class Instances:
    names: list[str]  # category names, in id order: class i
    ids: list[int]  # ids[i]: COCO's category id of class i
    class_of: dict[int, int]  # COCO's category id -> class index
    images: list[dict[str, Any]]  # the file's images, in its order
    annotations: dict[Any, list[dict[str, Any]]]  # image id -> its annotations, in file order


def _pil():
    try:
        from PIL import Image, ImageDraw
    except ImportError:
        raise InvalidArgumentError(
            "packing COCO needs Pillow (pip install pillow) to draw polygons and write PNGs"
        ) from None
    return Image, ImageDraw


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_instances(path: str | os.PathLike) -> Instances:
    """Reads and checks the file's structure; what is wrong with one annotation is found when
    its image is packed, and fails that image only."""
    _pil()
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise InvalidArgumentError(f"{path}: not JSON: {e}") from None
    if not (
        isinstance(data, dict)
        and isinstance(data.get("images"), list)
        and isinstance(data.get("categories"), list)
        and isinstance(data.get("annotations", []), list)
    ):
        raise InvalidArgumentError(
            f"{path}: not COCO instances (expected 'images', 'annotations' and 'categories' lists)"
        )
    categories = data["categories"]
    for i, c in enumerate(categories):
        if not (isinstance(c, dict) and _is_int(c.get("id")) and isinstance(c.get("name"), str)):
            raise InvalidArgumentError(f"{path}: category {i} needs an integer id and a name")
    categories = sorted(categories, key=lambda c: c["id"])
    ids = [c["id"] for c in categories]
    if len(set(ids)) != len(ids):
        raise InvalidArgumentError(f"{path}: two categories have the same id")
    if len(ids) > MAX_CLASSES:
        raise InvalidArgumentError(
            f"{path}: {len(ids)} categories; an 8-bit mask holds at most {MAX_CLASSES}"
        )
    images = data["images"]
    seen = set()
    for i, im in enumerate(images):
        ok = (
            isinstance(im, dict)
            and isinstance(im.get("file_name"), str)
            and all(_is_int(im.get(k)) and im[k] > 0 for k in ("width", "height"))
            and isinstance(im.get("id"), (int, str))
        )
        if not ok:
            raise InvalidArgumentError(
                f"{path}: image {i} needs an id, a file_name, and a positive width and height"
            )
        if im["id"] in seen:
            raise InvalidArgumentError(f"{path}: image id {im['id']!r} appears twice")
        seen.add(im["id"])
    annotations: dict[Any, list[dict[str, Any]]] = {}
    for i, ann in enumerate(data.get("annotations", [])):
        if not isinstance(ann, dict) or "image_id" not in ann:
            raise InvalidArgumentError(f"{path}: annotation {i} has no image_id")
        annotations.setdefault(ann["image_id"], []).append(ann)
    return Instances(
        names=[c["name"] for c in categories],
        ids=ids,
        class_of={id_: i for i, id_ in enumerate(ids)},
        images=images,
        annotations=annotations,
    )


def rle_counts_from_string(s: str) -> list[int]:
    """COCO's compressed RLE (pycocotools maskApi.c, rleFrString): each count in 5-bit groups,
    least significant first, as characters from '0' (48); bit 5 says another group follows, bit 4
    of the last group is the sign; from the third count on, each is stored as the difference from
    the count two before it."""
    counts: list[int] = []
    p, n = 0, len(s)
    while p < n:
        x = k = 0
        more = True
        while more:
            if p >= n:
                raise ValueError("compressed RLE: the string ends inside a count")
            c = ord(s[p]) - 48
            if not 0 <= c < 64 or k > 12:
                raise ValueError(f"compressed RLE: bad character at {p}")
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        if len(counts) > 2:
            x += counts[-2]
        counts.append(x)
    return counts


def rle_decode(counts: list[int], height: int, width: int) -> np.ndarray:
    """Runs of 0s and 1s, alternating from 0s, over the pixels in column-major order (COCO's)."""
    if not all(_is_int(c) and c >= 0 for c in counts):
        raise ValueError("RLE counts must be integers >= 0")
    if sum(counts) != height * width:
        raise ValueError(f"RLE counts sum to {sum(counts)}, not {height}x{width}")
    flat = np.zeros(height * width, dtype=bool)
    ends = np.cumsum(np.asarray(counts, dtype=np.int64))
    for start, end in zip(ends[0::2], ends[1::2]):
        flat[start:end] = True
    return flat.reshape(width, height).T


def _polygons_mask(polygons: list, height: int, width: int) -> np.ndarray | None:
    Image, ImageDraw = _pil()
    image = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(image)
    drawn = False
    for poly in polygons:
        if not isinstance(poly, list) or len(poly) % 2:
            raise ValueError("a polygon must be a list of x, y numbers")
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in poly):
            raise ValueError("polygon coordinates must be finite numbers")
        if len(poly) >= 6:
            draw.polygon([float(v) for v in poly], fill=1)
            drawn = True
    return np.asarray(image, dtype=bool) if drawn else None


def segmentation_mask(segmentation: Any, height: int, width: int) -> np.ndarray | None:
    """A boolean [height, width] mask of an annotation's segmentation (None: it has none)."""
    if segmentation is None or segmentation == []:
        return None
    if isinstance(segmentation, list):
        return _polygons_mask(segmentation, height, width)
    if isinstance(segmentation, dict) and "counts" in segmentation:
        size = segmentation.get("size")
        if size != [height, width]:
            raise ValueError(f"RLE size {size} is not the image's [{height}, {width}]")
        counts = segmentation["counts"]
        if isinstance(counts, str):
            counts = rle_counts_from_string(counts)
        elif not isinstance(counts, list):
            raise ValueError("RLE counts must be a list or a compressed string")
        return rle_decode(counts, height, width)
    raise ValueError("a segmentation must be polygons or RLE")


def _class(ann: dict[str, Any], class_of: dict[int, int]) -> int:
    cid = ann.get("category_id")
    if not _is_int(cid) or cid not in class_of:
        raise ValueError(f"annotation {ann.get('id')}: category_id {cid!r} is not a category")
    return class_of[cid]


def rasterize(
    annotations: list[dict[str, Any]], height: int, width: int, class_of: dict[int, int]
) -> np.ndarray:
    """uint8 [height, width]: class index + 1 of the annotation covering each pixel (later ones
    painted over earlier ones, crowds included), 0 where none does."""
    mask = np.zeros((height, width), dtype=np.uint8)
    for ann in annotations:
        value = _class(ann, class_of) + 1
        try:
            covered = segmentation_mask(ann.get("segmentation"), height, width)
        except ValueError as e:
            raise ValueError(f"annotation {ann.get('id')}: {e}") from None
        if covered is not None:
            mask[covered] = value
    return mask


def box_list(
    annotations: list[dict[str, Any]], class_of: dict[int, int], sx: float = 1.0, sy: float = 1.0
) -> tuple[list[dict[str, Any]], int]:
    """([{"bbox": [x, y, w, h], "category_id": class index}] of the annotations that are not
    crowds, scaled by (sx, sy); the number of crowds left out)."""
    boxes, crowd = [], 0
    for ann in annotations:
        cls = _class(ann, class_of)
        if ann.get("iscrowd"):
            crowd += 1
            continue
        bbox = ann.get("bbox")
        if not (
            isinstance(bbox, list)
            and len(bbox) == 4
            and all(isinstance(v, (int, float)) and math.isfinite(v) for v in bbox)
        ):
            raise ValueError(f"annotation {ann.get('id')}: bbox must be 4 finite numbers")
        if (sx, sy) != (1.0, 1.0):
            bbox = [bbox[0] * sx, bbox[1] * sy, bbox[2] * sx, bbox[3] * sy]
        boxes.append({"bbox": list(bbox), "category_id": cls})
    return boxes, crowd


def boxes_json(boxes: list[dict[str, Any]]) -> bytes:
    return json.dumps(boxes, separators=(",", ":")).encode()


def resize_nearest(mask: np.ndarray, width: int, height: int) -> np.ndarray:
    """The mask at another size, each output pixel the source pixel its centre falls in."""
    h, w = mask.shape
    ys = np.minimum(((np.arange(height) + 0.5) * h / height).astype(np.int64), h - 1)
    xs = np.minimum(((np.arange(width) + 0.5) * w / width).astype(np.int64), w - 1)
    return mask[ys[:, None], xs[None, :]]


def encode_png(mask: np.ndarray) -> bytes:
    """An 8-bit grey PNG of a uint8 [height, width] mask."""
    Image, _ = _pil()
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(mask, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()
