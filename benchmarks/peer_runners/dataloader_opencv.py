"""torch DataLoader + OpenCV: cv2.imread (BGR -> RGB) and cv2.resize, torchvision's geometry.

--option interp=linear uses INTER_LINEAR for every resize instead of INTER_AREA when shrinking.
"""

from __future__ import annotations

import _common
import _dataloader

ENV = {"torch": True, "pip": ["numpy", "opencv-python-headless"]}


def make_epoch(job):
    import cv2

    def load(path):
        _dataloader.opencv_single_thread()
        # like PIL (and so torchvision) leave EXIF orientation alone: the same pixels to work on
        img = cv2.imread(path, cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
        if img is None:
            raise RuntimeError(f"cv2.imread could not read {path}")
        return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)

    resize = _dataloader.opencv_resize(job.options.get("interp", "area"))
    transform = _dataloader.ArrayTransform(job, resize)
    return _dataloader.epoch(job, _dataloader.FileDataset(job, load, transform))


def version():
    import cv2
    import numpy

    return f"opencv {cv2.__version__}, numpy {numpy.__version__}, {_dataloader.torch_version()}"


if __name__ == "__main__":
    raise SystemExit(
        _common.main(
            "DataLoader + OpenCV",
            make_epoch,
            version=version,
            notes="torchvision's geometry; cv2.imread decodes (the wheel's own libjpeg-turbo; "
            "EXIF orientation ignored, as PIL does, though imread's default applies it); "
            "cv2.resize with INTER_AREA when shrinking and INTER_LINEAR when enlarging "
            "(--option interp=linear: INTER_LINEAR always), not PIL's antialiased bilinear "
            "filter, so pixels differ from torchvision's.",
        )
    )
