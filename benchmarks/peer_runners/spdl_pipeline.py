"""SPDL (Meta's Scalable and Performant Data Loading): a PipelineBuilder over the file list, the
files decoded one by one by FFmpeg through spdl.io with the crop and resize in the filter graph.

    source (the list; shuffled each epoch for train)
      -> pipe(demux + decode + crop + scale [+ hflip] of one image, concurrency=job.threads)
      -> aggregate(batch_size)            (the last batch kept)
      -> pipe(spdl.io.convert_frames: the frames copied into one contiguous batch; to_numpy)
      -> sink, built with num_threads=job.threads

The geometry is torchvision's: RandomResizedCrop's parameters and the flip come from
_dataloader (torch's RNG), Resize(256) + CenterCrop(224) with torchvision's rounding; FFmpeg
does the work: crop=w:h:x:y:exact=1,scale=224:224:flags=bilinear[,hflip],format=rgb24 for
train, scale=W:H:flags=bilinear,crop=224:224:x:y:exact=1,format=rgb24 for eval. Each decoder
runs single-threaded (SPDL's default); the pipe's concurrency gives the parallelism.
"""

from __future__ import annotations


import _common
import _dataloader


ENV = {
    "apt": [
        "libavcodec59",
        "libavdevice59",
        "libavfilter8",
        "libavformat59",
        "libavutil57",
        "libswresample4",
        "libswscale6",
    ],
    "torch": True,
    "pip": ["spdl==0.8.0", "spdl_io==0.8.0", "spdl_core==0.8.0", "numpy==2.2.6"],
}

NOTES = (
    "Geometry is torchvision's (its RandomResizedCrop parameters, flip p=0.5, Resize(256) + "
    "CenterCrop(224) rounding). Decoding is FFmpeg's mjpeg decoder (Debian's FFmpeg 5.1, "
    "full-size, to YUV), and the crop and resize are FFmpeg filters: the crop is taken on the YUV "
    "planes (exact=1: chroma offsets of odd x/y round to the 4:2:0 grid), the resize is swscale's "
    "bilinear (its filter widens when shrinking, so antialiased like PIL's, but not the same "
    "weights), fused with the YUV->RGB conversion; for train the crop is resized then flipped."
)


def make_epoch(job):
    import random

    import numpy as np
    import spdl.io
    import torch
    from spdl.pipeline import PipelineBuilder

    torch.set_num_threads(1)  # torch only draws the crop parameters
    size = job.size

    def filter_desc(width: int, height: int) -> str:
        if job.train:
            top, left, h, w = _dataloader.random_resized_crop_params(width, height)
            steps = [
                f"crop=w={w}:h={h}:x={left}:y={top}:exact=1",
                f"scale=w={size}:h={size}:flags=bilinear",
            ]
            if torch.rand(1).item() < 0.5:
                steps.append("hflip")
        else:
            w, h = _dataloader.resize_shorter(width, height, job.resize)
            top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
            steps = [
                f"scale=w={w}:h={h}:flags=bilinear",
                f"crop=w={size}:h={size}:x={left}:y={top}:exact=1",
            ]
        steps.append("format=pix_fmts=rgb24")
        return ",".join(steps)

    def load(item):
        path, label = item
        packets = spdl.io.demux_image(path)
        desc = filter_desc(packets.width, packets.height)
        frames = spdl.io.decode_packets(packets, filter_desc=desc)
        return frames, label

    def collate(items):
        buffer = spdl.io.convert_frames([frames for frames, _ in items])
        images = spdl.io.to_numpy(buffer)  # N x H x W x 3 uint8
        return images, np.array([label for _, label in items], dtype=np.int64)

    def run():
        files = list(job.files)
        if job.train:
            random.shuffle(files)
        pipeline = (
            PipelineBuilder()
            .add_source(files)
            .pipe(load, concurrency=job.threads, output_order="completion")
            .aggregate(job.batch_size)
            .pipe(collate)
            .add_sink(3)
            .build(num_threads=job.threads)
        )
        with pipeline.auto_stop():
            yield from pipeline

    return run


def version():
    from importlib.metadata import version as v

    from spdl.io.utils import get_ffmpeg_versions

    libavcodec = ".".join(str(n) for n in get_ffmpeg_versions()["libavcodec"])
    return f"spdl {v('spdl')} (spdl_io {v('spdl_io')}), libavcodec {libavcodec}"


if __name__ == "__main__":
    raise SystemExit(_common.main("SPDL", make_epoch, version=version, notes=NOTES))
