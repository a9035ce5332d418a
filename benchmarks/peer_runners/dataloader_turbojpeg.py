"""torch DataLoader + PyTurboJPEG: libjpeg-turbo's DCT scaling decodes each image at the smallest
size the crop still needs, then OpenCV crops and resizes (torchvision's geometry).

The crop (train) or the resize (eval) is drawn on the image's full size, read by decode_header;
the decoder then scales by the smallest m/8 (1/8 .. 1) at which the crop box, mapped to the scaled
image, is still at least size x size (train), or the shorter side at least `resize` (eval), so the
final resize never enlarges what full-size decoding would have shrunk. Files libjpeg-turbo's
TurboJPEG API cannot decode to RGB (CMYK JPEGs, a PNG named .JPEG) fall back to cv2.imdecode at
full size. --option interp=linear: INTER_LINEAR for every resize instead of INTER_AREA.
"""

from __future__ import annotations

import math
import os

import _common
import _dataloader

ENV = {
    "torch": True,
    "apt": ["libturbojpeg0"],
    "pip": ["numpy", "opencv-python-headless", "PyTurboJPEG>=1.8,<2"],
}

# the scaling factors at or below 1 that libjpeg-turbo's IDCT offers, smallest first, in lowest
# terms as tjGetScalingFactors lists them: 1/8, 1/4, 3/8, 1/2, 5/8, 3/4, 7/8, 1/1
FACTORS = [(m // math.gcd(m, 8), 8 // math.gcd(m, 8)) for m in range(1, 9)]


def scaled(dim: int, factor: tuple[int, int]) -> int:
    """TJSCALED: the decoder's output side at this factor."""
    num, denom = factor
    return (dim * num + denom - 1) // denom


def crop_box(width, height, factor, top, left, h, w):
    """The crop box (top, left, bottom, right) in the image decoded at `factor`: an 8x8 block
    becomes m x m pixels, so coordinates scale by exactly m/8 (the decoded size is rounded up)."""
    f = factor[0] / factor[1]
    x0, x1 = round(left * f), min(scaled(width, factor), round((left + w) * f))
    y0, y1 = round(top * f), min(scaled(height, factor), round((top + h) * f))
    return y0, x0, y1, x1


def train_factor(width, height, box, size):
    """The smallest factor at which the crop box, in the scaled image, is >= size on both sides."""
    for factor in FACTORS:
        y0, x0, y1, x1 = crop_box(width, height, factor, *box)
        if min(y1 - y0, x1 - x0) >= size:
            return factor
    return (1, 1)


def eval_factor(width, height, resize):
    """The smallest factor at which the shorter side is still >= resize."""
    shorter = min(width, height)
    return next((f for f in FACTORS if shorter * f[0] >= resize * f[1]), (1, 1))


class TurboDataset:
    """One JPEG read, header parsed, DCT-scaled decode, crop and resize per __getitem__."""

    def __init__(self, job: _common.Job, resize: _dataloader.Resize):
        self.files, self.job, self.resize = job.files, job, resize
        self.decoder, self.pid = None, -1

    def __len__(self) -> int:
        return len(self.files)

    def _turbo(self):
        if self.pid != os.getpid():  # loads libturbojpeg once per worker process
            from turbojpeg import TurboJPEG

            _dataloader.opencv_single_thread()
            self.decoder, self.pid = TurboJPEG(), os.getpid()
        return self.decoder

    def _decode(self, data: bytes, factor):
        """HxWx3 RGB at `factor`, or None where TurboJPEG cannot give RGB."""
        from turbojpeg import TJPF_RGB

        try:
            sf = None if factor == (1, 1) else factor
            return self._turbo().decode(data, pixel_format=TJPF_RGB, scaling_factor=sf)
        except OSError:
            return None

    @staticmethod
    def _fallback(data: bytes):
        import cv2
        import numpy as np

        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        if img is None:
            raise RuntimeError("neither TurboJPEG nor cv2.imdecode could decode a file")
        return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)

    def __getitem__(self, i):
        import numpy as np
        import torch

        path, label = self.files[i]
        with open(path, "rb") as f:
            data = f.read()
        job, turbo = self.job, self._turbo()
        try:
            width, height = turbo.decode_header(data)[:2]
        except OSError:  # not a JPEG: decode at full size
            img = self._fallback(data)
            width, height, factor = img.shape[1], img.shape[0], (1, 1)
        else:
            img = None
        if job.train:
            top, left, h, w = _dataloader.random_resized_crop_params(width, height)
            if img is None:
                factor = train_factor(width, height, (top, left, h, w), job.size)
                img = self._decode(data, factor)
                if img is None:
                    img, factor = self._fallback(data), (1, 1)
            y0, x0, y1, x1 = crop_box(width, height, factor, top, left, h, w)
            img = self.resize(img[y0:y1, x0:x1], (job.size, job.size))
            if torch.rand(1).item() < 0.5:
                img = img[:, ::-1]
        else:
            if img is None:
                factor = eval_factor(width, height, job.resize)
                img = self._decode(data, factor)
                if img is None:
                    img, factor = self._fallback(data), (1, 1)
            # the full image scaled by exactly m/8, plus a partly filled last row and column where
            # the decoder rounded up: resize at the exact scale, then drop what lies past the edge
            w, h = _dataloader.resize_shorter(width, height, job.resize)
            num, den = factor
            sh, sw = img.shape[:2]
            rw = max(w, round(sw * w * den / (width * num)))
            rh = max(h, round(sh * h * den / (height * num)))
            img = self.resize(img, (rw, rh))[:h, :w]
            top, left = int(round((h - job.size) / 2.0)), int(round((w - job.size) / 2.0))
            img = img[top : top + job.size, left : left + job.size]
        return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1), label


def make_epoch(job):
    resize = _dataloader.opencv_resize(job.options.get("interp", "area"))
    return _dataloader.epoch(job, TurboDataset(job, resize))


def version():
    import subprocess

    import cv2
    import turbojpeg

    deb = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "libturbojpeg0"], capture_output=True, text=True
    ).stdout.strip()
    return (
        f"PyTurboJPEG {getattr(turbojpeg, '__version__', '?')} on Debian's libturbojpeg0 "
        f"{deb or '?'}, opencv {cv2.__version__}, {_dataloader.torch_version()}"
    )


if __name__ == "__main__":
    raise SystemExit(
        _common.main(
            "DataLoader + PyTurboJPEG",
            make_epoch,
            version=version,
            notes="torchvision's geometry drawn on the full-size image; decoded with libjpeg-turbo "
            "DCT scaling (m/8, the smallest that keeps the crop >= size x size, or the shorter "
            "side >= resize for eval), so a crop is off the exact box by under a scaled pixel, and "
            "the DCT scaling filters differently from a full decode + resize; cv2.resize with "
            "INTER_AREA when shrinking and INTER_LINEAR when enlarging, not PIL's antialiased "
            "bilinear.",
        )
    )
