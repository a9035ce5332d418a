"""NVIDIA DALI on the CPU only (device_id=None): the file reader, DALI's CPU decoders and resize,
outputs copied to numpy (TensorListCPU.as_array(), what a user gets), uint8 HWC.

Train: fn.decoders.image_random_crop (RandomResizedCrop's area 0.08-1 and ratio 3/4-4/3, 10
attempts) + fn.resize to size x size + fn.flip(horizontal=coin_flip); eval: fn.decoders.image +
fn.resize(resize_shorter) + fn.crop (centre). The reader pads its last batch (pad_last_batch)
so that each epoch starts on a batch boundary; the padding is cut off here, so an epoch gives
exactly the listed samples. The reader's labels are the samples' indices, mapped to the listed
labels here, which also checks that every sample came once.
"""

from __future__ import annotations

import math

import _common

ENV = {"pip": ["numpy", "nvidia-dali-cuda120"]}


def make_epoch(job):
    import numpy as np
    from nvidia.dali import fn, types
    from nvidia.dali.pipeline import Pipeline

    n, bs = len(job.files), job.batch_size
    labels = np.array([label for _, label in job.files])
    pipe = Pipeline(batch_size=bs, num_threads=job.threads, device_id=None, seed=1234)
    with pipe:
        jpegs, index = fn.readers.file(
            files=[path for path, _ in job.files],
            labels=list(range(n)),
            random_shuffle=job.train,
            pad_last_batch=True,
            name="Reader",
        )
        if job.train:
            images = fn.decoders.image_random_crop(
                jpegs,
                device="cpu",
                output_type=types.RGB,
                random_area=[0.08, 1.0],
                random_aspect_ratio=[3.0 / 4.0, 4.0 / 3.0],
                num_attempts=10,
            )
            images = fn.resize(images, resize_x=job.size, resize_y=job.size)
            images = fn.flip(images, horizontal=fn.random.coin_flip())
        else:
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_shorter=job.resize)
            images = fn.crop(images, crop=(job.size, job.size))
        pipe.set_outputs(images, index)
    pipe.build()
    if pipe.epoch_size("Reader") != n:
        raise SystemExit(f"DALI's reader lists {pipe.epoch_size('Reader')} of {n} samples")
    steps = math.ceil(n / bs)

    def epoch():
        seen = np.zeros(n, np.int64)
        for step in range(steps):
            images, index = pipe.run()
            keep = min(bs, n - step * bs)
            images = images.as_array()[:keep]
            index = index.as_array().reshape(-1)[:keep]
            np.add.at(seen, index, 1)
            yield images, labels[index]
        if not (seen == 1).all():
            raise SystemExit(f"DALI: {int((seen != 1).sum())} samples not seen exactly once")

    return epoch


def version():
    import numpy
    import nvidia.dali

    return f"nvidia-dali-cuda120 {nvidia.dali.__version__} (CPU only), numpy {numpy.__version__}"


if __name__ == "__main__":
    raise SystemExit(
        _common.main(
            "DALI (CPU)",
            make_epoch,
            version=version,
            notes="DALI's own CPU operators: decoders.image_random_crop draws the crop itself "
            "(DALI's RNG, not torch's) and hands the window to the decoder, and its fallback "
            "after 10 attempts differs from torchvision's; resize is DALI's antialiased linear "
            "filter, not PIL's bilinear; eval resize_shorter rounds the longer side where "
            "torchvision truncates, and fn.crop places the centre crop with its own rounding; "
            "the train order comes from the reader's shuffle buffer (random_shuffle, "
            "initial_fill 1024), not a permutation.",
        )
    )
