"""torch DataLoader with torchvision's transforms written out (there is no CPU torchvision here),
for the DataLoader peers: each variant gives its own decode and resize, the rest is shared.

Geometry is torchvision's exactly: RandomResizedCrop.get_params drawn from torch's RNG, flip with
p=0.5, Resize(shorter side) with int() truncation of the longer side, CenterCrop rounding.
Needs torch and numpy in the runner's environment. random_resized_crop_params and resize_shorter
repeat stoker.tools.bench's on purpose: the peers' environments have no stoker to import.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from _common import Job

# (path) -> HxWx3 uint8 array (what the variant's decoder gives)
Decode = Callable[[str], Any]
# (HxWx3 array, (width, height)) -> resized HxWx3 array, bilinear/antialiased as the variant does
Resize = Callable[[Any, tuple[int, int]], Any]


def random_resized_crop_params(
    width: int, height: int, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0)
) -> tuple[int, int, int, int]:
    """torchvision.transforms.RandomResizedCrop.get_params: (top, left, height, width)."""
    import torch

    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect = math.exp(torch.empty(1).uniform_(float(log_ratio[0]), float(log_ratio[1])).item())
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            i = int(torch.randint(0, height - h + 1, size=(1,)).item())
            j = int(torch.randint(0, width - w + 1, size=(1,)).item())
            return i, j, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def resize_shorter(width: int, height: int, size: int) -> tuple[int, int]:
    """torchvision Resize(size)'s output (width, height)."""
    if width <= height:
        return size, int(size * height / width)
    return int(size * width / height), size


class ArrayTransform:
    """The two pipelines on HxWx3 uint8 arrays, with the variant's resize; returns CHW tensors."""

    def __init__(self, job: Job, resize: Resize):
        self.train, self.size, self.resize_to, self.resize = job.train, job.size, job.resize, resize

    def __call__(self, img):
        import numpy as np
        import torch

        height, width = img.shape[:2]
        if self.train:
            i, j, h, w = random_resized_crop_params(width, height)
            img = self.resize(img[i : i + h, j : j + w], (self.size, self.size))
            if torch.rand(1).item() < 0.5:
                img = img[:, ::-1]
        else:
            img = self.resize(img, resize_shorter(width, height, self.resize_to))
            h, w = img.shape[:2]
            top, left = int(round((h - self.size) / 2.0)), int(round((w - self.size) / 2.0))
            img = img[top : top + self.size, left : left + self.size]
        return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)


class FileDataset:
    """ImageFolder's shape: one file read and decoded per __getitem__."""

    def __init__(self, job: Job, load: Callable[[str], Any], transform: Callable[[Any], Any]):
        self.files, self.load, self.transform = job.files, load, transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i):
        path, label = self.files[i]
        return self.transform(self.load(path)), label


def workers(job: Job) -> int:
    """num_workers: --option workers=N, else one per core (the best on 2 cores in
    benchmarks/run.py's sweep of the PIL DataLoader)."""
    return int(job.options.get("workers", job.threads))


def data_loader(job: Job, dataset, loader_class: Any = None, **options: Any) -> Any:
    """`loader_class` (torch's DataLoader, or a peer's own) over `dataset`: the job's batch size,
    `workers(job)` persistent workers prefetching 2 batches each, `options` on top."""
    import torch

    torch.set_num_threads(1)  # the main process only collates; the workers do the work
    n = workers(job)
    return (loader_class or torch.utils.data.DataLoader)(
        dataset,
        batch_size=job.batch_size,
        num_workers=n,
        persistent_workers=n > 0,
        prefetch_factor=2 if n > 0 else None,
        **options,
    )


def epoch(job: Job, dataset) -> Callable[[], Any]:
    loader = data_loader(job, dataset, shuffle=True)
    return lambda: iter(loader)


def torch_version() -> str:
    import torch

    return f"torch {torch.__version__}"


def opencv_resize(interpolation: str = "area") -> Resize:
    """cv2.resize as a Resize. "area": INTER_AREA when both sides shrink, else INTER_LINEAR (the
    usual OpenCV recipe, closest to PIL's antialiased bilinear); "linear": INTER_LINEAR always."""
    import cv2

    if interpolation not in ("area", "linear"):
        raise SystemExit(f"interp={interpolation}: 'area' or 'linear'")

    def resize(img, size):
        width, height = size
        shrink = width <= img.shape[1] and height <= img.shape[0]
        inter = cv2.INTER_AREA if interpolation == "area" and shrink else cv2.INTER_LINEAR
        return cv2.resize(img, (width, height), interpolation=inter)

    return resize


def opencv_single_thread() -> None:
    """cv2.setNumThreads(1) once per process (each DataLoader worker is one core's worth)."""
    import cv2

    if cv2.getNumThreads() != 1:
        cv2.setNumThreads(1)
        cv2.ocl.setUseOpenCL(False)


def pil_transform(job: Job) -> Callable[[Any], Any]:
    """torchvision's PIL transforms on a PIL image: CHW tensor."""
    from PIL import Image

    def transform(img):
        import numpy as np
        import torch

        width, height = img.size
        if job.train:
            i, j, h, w = random_resized_crop_params(width, height)
            img = img.crop((j, i, j + w, i + h)).resize((job.size, job.size), Image.BILINEAR)
            if torch.rand(1).item() < 0.5:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
        else:
            img = img.resize(resize_shorter(width, height, job.resize), Image.BILINEAR)
            w, h = img.size
            top, left = int(round((h - job.size) / 2.0)), int(round((w - job.size) / 2.0))
            img = img.crop((left, top, left + job.size, top + job.size))
        return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)

    return transform
