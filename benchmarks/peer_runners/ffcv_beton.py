"""FFCV: a .beton written with FFCV's ImageNet recipe (RGBImageField: JPEG re-encoded at quality
90, the longer side capped at 512 px), read by its Loader.

train: RandomResizedCropRGBImageDecoder((224, 224)) + RandomHorizontalFlip, order RANDOM (a full
permutation, like the other loaders'; ffcv-imagenet uses QUASI_RANDOM when not distributed, which
measured the same here, see docs/BENCHMARKS.md); eval:
CenterCropRGBImageDecoder((224, 224), ratio=224/256), order SEQUENTIAL; then ToTensor +
ToTorchImage (uint8 NCHW torch tensors, no copy), as ffcv-imagenet's train_imagenet.py minus the
device transfer and normalisation. os_cache=True, drop_last=False, num_workers=job.threads
(numba's threads: the batch is decoded by a prange over its samples).

FFCV 1.0.2 needs PIL (it imports PIL.Image) but does not declare it; it never imports
torchvision. numba 0.58.1 and numpy 1.26.4: ffcv's numba code predates numpy 2.

Options (--option k=v), to measure what ffcv-imagenet's own settings change:
    write_mode=proportion compress_probability=0.5 max_resolution=500   its ResNet-50 data: half
        the images JPEG, the other half raw pixels (no decoding at all); 0.1 and 400: ResNet-18's
    order=quasi_random   ffcv-imagenet's train order when not distributed: samples drawn from a
        few 8 MB pages of the .beton at a time
"""

from __future__ import annotations


import _common


ENV = {
    "apt": ["libopencv-dev", "libturbojpeg0-dev", "pkg-config"],
    "torch": True,
    "pip": [
        "numpy==1.26.4",
        "numba==0.58.1",
        "opencv-python==4.10.0.84",
        "pillow",
        "ffcv==1.0.2",
    ],
}

MAX_RESOLUTION = 512
JPEG_QUALITY = 90

NOTES = (
    "The .beton holds the images re-encoded by OpenCV at JPEG quality 90 with the longer side "
    "shrunk to at most 512 px (INTER_AREA), so every image is decoded from a smaller, lossier "
    "JPEG than the original file. Decoding is libjpeg-turbo with TJFLAG_FASTDCT. train: "
    "torchvision's RandomResizedCrop sampling (numpy's RNG) on the stored image, "
    "then cv2.resize INTER_AREA of the crop to 224 (torchvision/PIL: bilinear, antialiased). "
    "eval: a centered square of int(0.875 * shorter side) cropped, then resized to 224 "
    "(torchvision: resize the shorter side to 256, then crop 224) - the same region up to "
    "rounding, one resize."
)


def _write_options(job):
    mode = job.options.get("write_mode", "jpg")
    resolution = int(job.options.get("max_resolution", MAX_RESOLUTION))
    probability = float(job.options.get("compress_probability", 0.5))
    return mode, resolution, probability


def _beton(job):
    mode, resolution, probability = _write_options(job)
    if (mode, resolution) == ("jpg", MAX_RESOLUTION):
        return job.work / f"{job.key}.beton"
    return job.work / f"{job.key}.{mode}-{probability:g}-{resolution}.beton"


class _Images:
    """One entry per listed sample (a repeated file is written again), decoded with PIL."""

    def __init__(self, files):
        self.files = files

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        from PIL import Image

        path, label = self.files[i]
        with Image.open(path) as img:
            return img.convert("RGB"), label


def prepare(job):
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    out = _beton(job)
    if out.exists():
        return
    partial = out.with_suffix(".partial")
    mode, resolution, probability = _write_options(job)
    writer = DatasetWriter(
        str(partial),
        {
            "image": RGBImageField(
                write_mode=mode,
                max_resolution=resolution,
                jpeg_quality=JPEG_QUALITY,
                compress_probability=probability,
            ),
            "label": IntField(),
        },
        num_workers=job.threads,
    )
    writer.from_indexed_dataset(_Images(job.files))
    partial.rename(out)


def make_epoch(job):
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    size = (job.size, job.size)
    if job.train:
        image = [RandomResizedCropRGBImageDecoder(size), RandomHorizontalFlip()]
    else:
        image = [CenterCropRGBImageDecoder(size, ratio=job.size / job.resize)]
    image += [ToTensor(), ToTorchImage(channels_last=True)]
    order = OrderOption.RANDOM
    if job.options.get("order") == "quasi_random":
        order = OrderOption.QUASI_RANDOM
    loader = Loader(
        str(_beton(job)),
        batch_size=job.batch_size,
        num_workers=job.threads,
        order=order if job.train else OrderOption.SEQUENTIAL,
        os_cache=True,
        drop_last=False,
        pipelines={"image": image, "label": [IntDecoder(), ToTensor(), Squeeze()]},
    )
    return lambda: iter(loader)


def version():
    from importlib.metadata import version as v

    return f"ffcv {v('ffcv')}, numba {v('numba')}, numpy {v('numpy')}, torch {v('torch')}"


if __name__ == "__main__":
    raise SystemExit(
        _common.main("FFCV", make_epoch, version=version, prepare=prepare, notes=NOTES)
    )
