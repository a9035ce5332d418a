"""torch DataLoader + PIL: torchvision's ImageFolder recipe (PIL decode, PIL bilinear resize)."""

from __future__ import annotations

import _common
import _dataloader

ENV = {"venv": "main"}


def make_epoch(job):
    from PIL import Image

    def load(path):
        with open(path, "rb") as f:
            img = Image.open(f)
            return img.convert("RGB")

    def transform(img):
        import numpy as np
        import torch

        width, height = img.size
        if job.train:
            i, j, h, w = _dataloader.random_resized_crop_params(width, height)
            img = img.crop((j, i, j + w, i + h)).resize((job.size, job.size), Image.BILINEAR)
            if torch.rand(1).item() < 0.5:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
        else:
            img = img.resize(_dataloader.resize_shorter(width, height, job.resize), Image.BILINEAR)
            w, h = img.size
            top, left = int(round((h - job.size) / 2.0)), int(round((w - job.size) / 2.0))
            img = img.crop((left, top, left + job.size, top + job.size))
        return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)

    return _dataloader.epoch(job, _dataloader.FileDataset(job, load, transform))


def version():
    import PIL

    return f"Pillow {PIL.__version__}, {_dataloader.torch_version()}"


if __name__ == "__main__":
    raise SystemExit(_common.main("DataLoader + PIL", make_epoch, version=version))
