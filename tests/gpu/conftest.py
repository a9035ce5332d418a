"""tests/gpu/: run whenever CUDA is present (`make test-gpu`, or `pytest tests/gpu`), skipped
otherwise. They need a CUDA build of torch and one GPU; nothing else beyond `make install`."""

import importlib.util
from pathlib import Path

import pytest
import torch

# make_image_folder from tests/python/conftest.py, loaded under its own name: two modules called
# `conftest` cannot both be imported as such.
_spec = importlib.util.spec_from_file_location(
    "stoker_python_test_helpers", Path(__file__).resolve().parents[1] / "python" / "conftest.py"
)
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)
make_image_folder = _helpers.make_image_folder
write_tar = _helpers.write_tar
after_passes = _helpers.after_passes

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device (torch.cuda.is_available() is False)")
    here = Path(__file__).resolve().parent
    for item in items:  # the hook sees the whole session's items: only this folder's
        if here in Path(item.fspath).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gpu_pack(tmp_path_factory) -> Path:
    """imagenet-sample packed when ../shared/data is there, else a synthetic ImageFolder."""
    import stoker

    images = SHARED / "imagenet-sample"
    if images.exists():  # a flat folder: a CSV of path,label gives each file its class
        source = tmp_path_factory.mktemp("csv") / "imagenet-sample.csv"
        files = sorted(images.glob("*.JPEG"))
        source.write_text("".join(f"{f},{i}\n" for i, f in enumerate(files)))
    else:
        source = make_image_folder(tmp_path_factory.mktemp("folder") / "train", per_class=40)
    out = tmp_path_factory.mktemp("gpu_pack") / "pack"
    stoker.pack(source, out, progress=False)
    return out
