"""COCO instances: a ``.json`` of annotations and the folder of its images. Each image becomes
``KEY.jpg`` (the file), ``KEY.json`` (its boxes, class indices into the manifest's ``classes``)
and ``KEY.seg.png`` (its annotations painted as class index + 1, 0 background)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

from ...errors import InvalidArgumentError, StokerError
from .. import coco
from ..members import Options, image_field, prepare_image
from ..source import Job, Sample, SampleFailure, Source, files_fingerprint, reason


def image_sample(
    path: str, image: dict, anns: list[dict], class_of: dict[int, int], opts: Options
) -> Sample:
    from ..._core import image_info

    try:
        with open(path, "rb") as f:
            data = f.read()
        info = image_info(data)
        width, height = image["width"], image["height"]
        if (info["width"], info["height"]) != (width, height):
            raise ValueError(
                f"the image is {info['width']}x{info['height']}, "
                f"its COCO entry says {width}x{height}"
            )
        data, fmt, new_width, new_height, rewritten = prepare_image(data, opts)
        mask = coco.rasterize(anns, height, width, class_of)
        boxes, crowd = coco.box_list(anns, class_of, new_width / width, new_height / height)
        if (new_width, new_height) != (width, height):
            mask = coco.resize_nearest(mask, new_width, new_height)
        png = coco.encode_png(mask)
    except (StokerError, OSError, ValueError) as e:
        raise SampleFailure(path, reason(e)) from e
    n = len(boxes)
    return Sample(
        [(fmt, data), ("json", coco.boxes_json(boxes)), ("seg.png", png)],
        [
            image_field("jpg", data, new_width, new_height),
            ("json", "boxes", "float64", [n, 4]),
            ("seg.png", "mask", "uint8", [new_height, new_width]),
        ],
        bool(rewritten),
        box_classes=[b["category_id"] for b in boxes],
        crowd=crowd,
    )


class Coco(Source):
    format = "coco"

    def __init__(self, annotations: Path, opts: Options, images: str | Path | None = None):
        images = Path(images) if images is not None else None
        if images is None:
            raise InvalidArgumentError(
                f"{annotations}: a .json source is COCO instances: pass images= (the folder its "
                "file_name entries are in)"
            )
        if not images.is_dir():
            raise InvalidArgumentError(f"{images}: not a folder")
        self.annotations, self.images, self.opts = annotations, images, opts
        self.instances = coco.read_instances(annotations)
        self.classes = self.instances.names
        self.extra = {"category_ids": self.instances.ids}

    def __len__(self) -> int:
        return len(self.instances.images)

    def jobs(self, start: int = 0, stop: int | None = None) -> Iterator[Job]:
        instances = self.instances
        for image in instances.images[start:stop]:
            path = str(self.images / image["file_name"])
            anns = instances.annotations.get(image["id"], [])
            make = functools.partial(image_sample, path, image, anns, instances.class_of,
                                     self.opts)  # fmt: skip
            yield Job(path, -1, str(image["id"]), make)

    def fingerprint(self) -> str:
        return files_fingerprint([self.annotations], str(self.images))
