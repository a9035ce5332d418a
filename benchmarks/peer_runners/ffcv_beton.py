"""FFCV: a .beton written with FFCV's ImageNet recipe (RGBImageField: JPEG re-encoded at quality
90, the longer side capped at 512 px), read by its Loader.

train: RandomResizedCropRGBImageDecoder((224, 224)) + RandomHorizontalFlip, order RANDOM; eval:
CenterCropRGBImageDecoder((224, 224), ratio=224/256), order SEQUENTIAL; then ToTensor +
ToTorchImage (uint8 NCHW torch tensors, no copy), as ffcv-imagenet's train_imagenet.py minus the
device transfer and normalisation. os_cache=True, drop_last=False, num_workers=job.threads
(numba's threads: the batch is decoded by a prange over its samples).

FFCV 1.0.2 needs PIL (it imports PIL.Image) but does not declare it; it never imports
torchvision. numba 0.58.1 and numpy 1.26.4: ffcv's numba code predates numpy 2.
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


def _beton(job):
    return job.work / f"{job.key}.beton"


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
    writer = DatasetWriter(
        str(partial),
        {
            "image": RGBImageField(
                write_mode="jpg", max_resolution=MAX_RESOLUTION, jpeg_quality=JPEG_QUALITY
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
    loader = Loader(
        str(_beton(job)),
        batch_size=job.batch_size,
        num_workers=job.threads,
        order=OrderOption.RANDOM if job.train else OrderOption.SEQUENTIAL,
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
