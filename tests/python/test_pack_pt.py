"""stoker.pack from .pt files written with torch.save: a dict, a tuple (TensorDataset's and
torchvision MNIST's layout) or a single tensor becomes an array pack whose batches equal the
tensors; files that need unpickling are refused (weights_only), never loaded."""

import collections
import json
import pickle
import subprocess
import sys

import numpy as np
import pytest

import stoker
from stoker.packing.members import Options
from stoker.packing.sources import detect, open_source

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

torch = pytest.importorskip("torch")


class Custom:  # what weights_only=True refuses to unpickle
    def __init__(self):
        self.x = torch.zeros(3)


def manifest(out):
    return json.loads((out / "manifest.json").read_text())


def whole_batch(out, n, **fields):
    loader = stoker.Loader(out, batch_size=n, train=False, fields=fields)
    (batch,) = list(loader)
    return batch, loader


def mapped_file(address):
    """The file mapped at `address` in this process (/proc/self/maps), or None."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            lo, hi = (int(a, 16) for a in parts[0].split("-"))
            if lo <= address < hi:
                return parts[5].strip() if len(parts) > 5 else None
    return None


@pytest.fixture(scope="module")
def mnist_like():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (40, 28, 28), dtype=torch.uint8, generator=g)
    targets = torch.randint(0, 10, (40,), dtype=torch.int64, generator=g)
    return images, targets


def test_a_dict_of_tensors_is_an_array_pack_equal_to_them(tmp_path):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(30, 3, 4, generator=g)
    y = torch.randint(0, 3, (30,), dtype=torch.int32, generator=g)
    mask = torch.rand(30, 5, generator=g) > 0.5
    path = tmp_path / "data.pt"
    torch.save({"x": x, "mask": mask, "y": y, "classes": ["a", "b", "c"]}, path)
    out = tmp_path / "out"
    result = stoker.pack(path, out, shard_size="64KB", progress=False)
    assert result.num_samples == 30 and result.source_format == "pt"
    m = manifest(out)
    assert m["format"] == "stoker-arrays" and m["classes"] == ["a", "b", "c"]
    assert [(f["name"], f["dtype"], f["shape"]) for f in m["fields"]] == [
        ("x", "float32", [3, 4]), ("mask", "bool", [5]), ("label", "int64", [])]  # fmt: skip
    batch, loader = whole_batch(out, 30, x=stoker.Array("x"), mask=stoker.Array("mask"),
                                label=stoker.Label("label"))  # fmt: skip
    assert torch.equal(batch["x"], x) and torch.equal(batch["mask"], mask)
    assert torch.equal(batch["label"], y.long())
    assert loader.classes == ["a", "b", "c"]


def test_an_mnist_style_tuple_is_uint8_images_and_labels(tmp_path, mnist_like):
    images, targets = mnist_like
    path = tmp_path / "training.pt"
    torch.save((images, targets), path)  # torchvision's MNIST processed/training.pt
    out = tmp_path / "out"
    stoker.pack(path, out, progress=False)
    assert [(f["name"], f["dtype"], f["shape"]) for f in manifest(out)["fields"]] == [
        ("data", "uint8", [28, 28]), ("label", "int64", [])]  # fmt: skip
    image = stoker.Image("data", size=28, geometry=stoker.Resize())
    batch, _ = whole_batch(out, 40, image=image, label=stoker.Label("label"))
    assert torch.equal(batch["image"][:, 0], images)  # grey rows: each channel the grey
    assert torch.equal(batch["label"], targets)


def test_a_single_tensor_and_tuples_of_more_fields(tmp_path):
    x = torch.arange(24, dtype=torch.float64).reshape(6, 4)
    torch.save(x, tmp_path / "one.pth")
    stoker.pack(tmp_path / "one.pth", tmp_path / "one", progress=False)
    assert [f["name"] for f in manifest(tmp_path / "one")["fields"]] == ["data"]
    batch, _ = whole_batch(tmp_path / "one", 6, data=stoker.Array("data"))
    assert torch.equal(batch["data"], x)

    z = torch.randn(6, 2)
    torch.save([x, z, x.int()], tmp_path / "three.pt")  # no integer second: no label
    stoker.pack(tmp_path / "three.pt", tmp_path / "three", progress=False)
    assert [f["name"] for f in manifest(tmp_path / "three")["fields"]] == [
        "data", "field1", "field2"]  # fmt: skip
    batch, _ = whole_batch(tmp_path / "three", 6, f=stoker.Array("field1"))
    assert torch.equal(batch["f"], z)


def test_members_and_label_pick_keys_and_indices(tmp_path, mnist_like):
    images, targets = mnist_like
    torch.save((images, targets), tmp_path / "t.pt")
    out = tmp_path / "out"
    stoker.pack(tmp_path / "t.pt", out, members={"image": 0}, label="1", progress=False)
    assert [f["name"] for f in manifest(out)["fields"]] == ["image", "label"]
    batch, _ = whole_batch(out, 40, label=stoker.Label("label"))
    assert torch.equal(batch["label"], targets)

    w = torch.randn(40, 2)
    torch.save({"feat": w, "pixels": images, "target": targets, "extra": torch.zeros(7)},
               tmp_path / "d.pt")  # fmt: skip
    out = tmp_path / "named"
    stoker.pack(tmp_path / "d.pt", out, members={"feat.npy": "feat"}, progress=False)
    assert [f["name"] for f in manifest(out)["fields"]] == ["feat", "label"]  # target: label
    batch, _ = whole_batch(out, 40, feat=stoker.Array("feat"), label=stoker.Label("label"))
    assert torch.equal(batch["feat"], w) and torch.equal(batch["label"], targets)

    with pytest.raises(stoker.InvalidArgumentError) as e:
        stoker.pack(tmp_path / "d.pt", tmp_path / "o", members={"x": "image"}, progress=False)
    assert "no key 'image'" in str(e.value) and "pixels (40, 28, 28) uint8" in str(e.value)
    with pytest.raises(stoker.InvalidArgumentError, match="different first dimensions.*extra"):
        stoker.pack(tmp_path / "d.pt", tmp_path / "o", progress=False)  # extra has 7 rows
    with pytest.raises(stoker.InvalidArgumentError, match="the label feat .* one integer"):
        stoker.pack(tmp_path / "d.pt", tmp_path / "o", members={"p": "pixels"}, label="feat",
                    progress=False)  # fmt: skip
    assert not (tmp_path / "o").exists()


def test_pickled_objects_are_refused_naming_weights_only(tmp_path):
    torch.save({"data": Custom()}, tmp_path / "objects.pt")
    with pytest.raises(stoker.InvalidArgumentError) as e:
        stoker.pack(tmp_path / "objects.pt", tmp_path / "o", progress=False)
    text = str(e.value)
    assert "objects.pt" in text and "weights_only=True" in text and "Custom" in text
    assert "never unpickles" in text and "torch.save({'x': x, 'y': y}" in text
    assert not (tmp_path / "o").exists()

    torch.save(collections.Counter(a=1), tmp_path / "counter.pt")  # loads, but holds no tensors
    with pytest.raises(stoker.InvalidArgumentError, match="holds no tensors"):
        stoker.pack(tmp_path / "counter.pt", tmp_path / "o", progress=False)
    torch.save("text", tmp_path / "str.pt")
    with pytest.raises(stoker.InvalidArgumentError, match="holds a str"):
        stoker.pack(tmp_path / "str.pt", tmp_path / "o", progress=False)
    torch.save(torch.zeros(4, 2, dtype=torch.bfloat16), tmp_path / "bf16.pt")
    with pytest.raises(stoker.InvalidArgumentError, match="bfloat16 is not a dtype"):
        stoker.pack(tmp_path / "bf16.pt", tmp_path / "o", progress=False)


def test_damaged_and_legacy_files(tmp_path, mnist_like):
    images, targets = mnist_like
    torch.save({"x": images, "y": targets}, tmp_path / "whole.pt")
    data = (tmp_path / "whole.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(stoker.CorruptDataError, match=r"cut\.pt: .*damaged"):
        stoker.pack(tmp_path / "cut.pt", tmp_path / "o", progress=False)
    # The format before torch 1.6 cannot be mapped: it is loaded whole.
    torch.save((images, targets), tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    stoker.pack(tmp_path / "legacy.pt", tmp_path / "legacy", progress=False)
    batch, _ = whole_batch(tmp_path / "legacy", 40, data=stoker.Array("data"),
                           label=stoker.Label("label"))  # fmt: skip
    assert torch.equal(batch["data"], images) and torch.equal(batch["label"], targets)


def test_columns_are_views_of_the_mapped_file_and_the_source_pickles(tmp_path, mnist_like):
    images, targets = mnist_like
    path = tmp_path / "m.pt"
    torch.save({"x": images, "y": targets}, path)
    source = open_source(path, None, Options())
    x = source.columns["x"]
    assert np.array_equal(x, images.numpy())
    assert mapped_file(x.ctypes.data) == str(path)  # the file's pages, not a copy
    blob = pickle.dumps(source)
    assert len(blob) < images.numel() // 4  # the path and choices, not the tensors
    copy = pickle.loads(blob)
    assert copy._columns is None and len(copy) == 40
    assert np.array_equal(copy.columns["label"], targets.numpy())


def test_found_from_the_extension_named_with_format_and_on_the_command_line(tmp_path):
    x = torch.randn(5, 3)
    for name in ("a.pt", "a.pth"):
        torch.save({"x": x}, tmp_path / name)
        assert detect(tmp_path / name) == "pt"
    torch.save({"x": x}, tmp_path / "weights.bin")
    result = stoker.pack(tmp_path / "weights.bin", tmp_path / "named", format="pt",
                         progress=False)  # fmt: skip
    assert result.num_samples == 5 and result.source_format == "pt"
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "stoker", "pack", str(tmp_path / "a.pt"), str(out),
                        "--quiet"], capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "packed 5 samples" in r.stdout
    assert manifest(out)["format"] == "stoker-arrays"
