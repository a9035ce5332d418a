"""The reference suite: stoker against the libraries users trust, run by those libraries
themselves (torchvision 0.29.1 on torch 2.14.1, timm, Pillow, soundfile + python-soxr, PyAV), in
a venv of their own (`make test-reference`, docs/RELIABILITY.md "Reference checks"). Every check
names the function it compares against and the bound it holds to: exact where stoker claims
exact, else the bound docs/RELIABILITY.md states.

What the modules share is here, and only what they ask for by name: a module of the suite
(test_timm_randaugment.py among them) needs none of it, and nothing here runs at collection.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
REAL_MEDIA = ROOT / "build" / "real-media" / "root" / "usr" / "share"

# The versions the bounds in docs/RELIABILITY.md were measured against: another torchvision
# (another torch) may round differently, and the exact checks would say so as failures of
# stoker's.
PINNED = {"torch": "2.14.1", "torchvision": "0.29.1"}


def pytest_report_header(config: pytest.Config) -> list[str]:
    import importlib.metadata as md

    names = ("torch", "torchvision", "timm", "pillow", "soxr", "soundfile", "av", "stoker")
    found = []
    for name in names:
        try:
            found.append(f"{name} {md.version(name)}")
        except md.PackageNotFoundError:
            found.append(f"{name} missing")
    return ["reference libraries: " + ", ".join(found)]


def pytest_sessionstart(session: pytest.Session) -> None:
    import importlib.metadata as md

    import torch

    # The checks run the references sample by sample, in small tensor ops, where torch's pool of
    # intra-op threads costs more than it gives: one thread, 15 s of CPU for the suite against
    # 45 (and 35 s against 90 on a busy machine). Results do not depend on it.
    torch.set_num_threads(1)

    for name, version in PINNED.items():
        got = md.version(name).split("+")[0]
        if got != version:
            raise pytest.UsageError(
                f"the reference suite is measured against {name} {version}, not {got}: "
                "run it with make test-reference (its venv, build/reference-venv)"
            )


def shared_data() -> Path:
    """../shared/data beside the repository (imagenet-sample, ...)."""
    if not SHARED.exists():
        pytest.skip(f"shared data not found at {SHARED}")
    return SHARED


def recorded(path: str) -> Path:
    """A file of Debian's real recordings (`make build/.stamps/real-media`, which make
    test-reference runs first)."""
    found = REAL_MEDIA / path
    if not found.exists():
        pytest.skip(f"{found} not found: make build/.stamps/real-media fetches it")
    return found


def ffmpeg(*args: str, out: Path) -> Path:
    """The ffmpeg command's output file (skipped without the command)."""
    if shutil.which("ffmpeg") is None:
        pytest.skip("no ffmpeg command")
    subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-y", *args, str(out)],
                   check=True, timeout=300)  # fmt: skip
    return out


@pytest.fixture(scope="session")
def photos() -> list[np.ndarray]:
    """Twelve of imagenet-sample's photos, decoded by Pillow, each cropped to its central
    96 x 128 (HxWx3 uint8): real pixels, small enough for per-sample reference loops."""
    from PIL import Image

    paths = sorted((shared_data() / "imagenet-sample").glob("*.JPEG"))[::83][:12]
    assert len(paths) == 12
    out = []
    for path in paths:
        image = Image.open(path).convert("RGB")
        w, h = image.size
        left, top = (w - 128) // 2, (h - 96) // 2
        out.append(np.asarray(image.crop((left, top, left + 128, top + 96))))
    return out
