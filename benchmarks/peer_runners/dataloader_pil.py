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

    transform = _dataloader.pil_transform(job)
    return _dataloader.epoch(job, _dataloader.FileDataset(job, load, transform))


def version():
    import PIL

    return f"Pillow {PIL.__version__}, {_dataloader.torch_version()}"


if __name__ == "__main__":
    raise SystemExit(_common.main("DataLoader + PIL", make_epoch, version=version))
