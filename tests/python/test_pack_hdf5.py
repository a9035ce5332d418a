"""stoker.pack from HDF5 files written with h5py: encoded images kept byte for byte with their
labels, class names, features and text; a file of arrays only becomes an array pack that loads
back row for row (read from the file a chunk at a time); damaged files and rows are named."""

import io
import json
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import os

import pytest
from conftest import shared_data

import stoker
from stoker import _core
from stoker.packing.members import Options
from stoker.packing.sources import detect, open_source

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

h5py = pytest.importorskip("h5py")
torch = pytest.importorskip("torch")

CLASSES = ["tench", "goldfish", "shark"]


def jpegs(n):
    return [p.read_bytes() for p in sorted((shared_data() / "imagenet-sample").glob("*.JPEG"))[:n]]


def manifest(out):
    return json.loads((out / "manifest.json").read_text())


def write_images(path, images, dtype=None, name="images", **datasets):
    """An HDF5 file of encoded images (variable-length uint8 rows) and other datasets."""
    with h5py.File(path, "w") as f:
        d = f.create_dataset(name, (len(images),), dtype=dtype or h5py.vlen_dtype(np.uint8))
        for i, data in enumerate(images):
            d[i] = np.frombuffer(data, np.uint8)
        for key, value in datasets.items():
            f.create_dataset(key, data=value)
    return path


@pytest.fixture(scope="module")
def photos():
    return jpegs(6)


def test_images_labels_class_names_features_and_text_round_trip(tmp_path, photos):
    n = len(photos)
    labels = np.array([0, 2, 1, 2, 0, 2], np.int32)
    feat = np.random.default_rng(0).standard_normal((n, 3)).astype(np.float32)
    captions = [f"photo {i} \u00e9" for i in range(n)]
    path = write_images(tmp_path / "photos.h5", photos, labels=labels, feat=feat,
                        mean=np.zeros(3, np.float32))  # fmt: skip
    with h5py.File(path, "a") as f:
        f["labels"].attrs["class_names"] = CLASSES
        f.create_dataset("meta/caption", data=captions, dtype=h5py.string_dtype())
    out = tmp_path / "out"
    result = stoker.pack(path, out, restart_interval=0, progress=False)
    assert result.num_samples == n and not result.failed
    m = manifest(out)
    assert m["source_format"] == "hdf5" and m["classes"] == CLASSES
    assert m["class_counts"] == [2, 1, 3]
    assert [f["name"] for f in m["fields"]] == ["jpg", "feat.npy", "meta_caption.txt", "cls"]
    ds = _core.Dataset.open(str(out))
    for i in range(n):
        assert ds.record(i)["label"] == labels[i]
        assert ds.read(i, "jpg") == photos[i]
        np.testing.assert_array_equal(np.load(io.BytesIO(ds.read(i, "feat.npy"))), feat[i])
        assert ds.read(i, "meta_caption.txt").decode() == captions[i]
    where = [line.split("\t")[2] for line in (out / "sources.tsv").read_text().splitlines()]
    assert where == [f"{path}: images row {i}" for i in range(n)]

    fields = {"label": stoker.Label("cls"), "feat": stoker.Array("feat.npy"),
              "caption": stoker.Text("meta_caption.txt")}  # fmt: skip
    batches = list(stoker.Loader(out, batch_size=4, train=False, fields=fields))
    assert torch.cat([b["label"] for b in batches]).tolist() == labels.tolist()
    assert torch.equal(torch.cat([b["feat"] for b in batches]), torch.from_numpy(feat))
    assert sum((list(b["caption"]) for b in batches), []) == captions


def test_a_file_of_arrays_is_an_array_pack_equal_to_its_rows(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (70, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 3, 70).astype(np.uint8)
    path = tmp_path / "arrays.hdf5"
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=images, chunks=(7, 32, 32, 3))
        f.create_dataset("labels", data=labels)
        f.attrs["classes"] = CLASSES
    out = tmp_path / "out"
    result = stoker.pack(path, out, shard_size="64KB", progress=False)
    assert result.num_samples == 70 and result.num_shards > 1
    assert result.source_format == "hdf5" and result.classes == CLASSES
    m = manifest(out)
    assert m["format"] == "stoker-arrays"
    assert m["fields"] == [
        {"name": "images", "kind": "array", "dtype": "uint8", "shape": [32, 32, 3]},
        {"name": "label", "kind": "array", "dtype": "int64", "shape": []},
    ]
    fields = {"image": stoker.Image("images", size=32, geometry=stoker.Resize()),
              "label": stoker.Label("label")}  # fmt: skip
    loader = stoker.Loader(out, batch_size=16, train=False, fields=fields, return_index=True)
    seen = []
    for batch in loader:
        i = batch["index"].numpy()
        seen += i.tolist()
        assert torch.equal(batch["image"].permute(0, 2, 3, 1), torch.from_numpy(images[i]))
        assert torch.equal(batch["label"], torch.from_numpy(labels[i].astype(np.int64)))
    assert seen == list(range(70))
    assert loader.classes == CLASSES


def test_members_and_label_name_the_datasets(tmp_path, photos):
    n = len(photos)
    rng = np.random.default_rng(2)
    depth = rng.random((n, 4, 4)).astype(np.float16)
    pixels = rng.integers(0, 256, (n, 8, 6, 3), dtype=np.uint8)
    target = np.arange(n, dtype=np.int64)[::-1].copy()
    opaque = np.array([np.void(b.ljust(max(map(len, photos)), b"\0")) for b in photos])
    path = tmp_path / "named.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x/opaque", data=opaque)
        f.create_dataset("depth", data=depth)
        f.create_dataset("pix", data=pixels)
        f.create_dataset("target_class", data=target)
        f.create_dataset("labels", data=np.zeros(n, np.int64))  # not the label: label= says so
        f.create_dataset("other", data=np.ones((n, 2)))
    out = tmp_path / "out"
    result = stoker.pack(path, out, members={"jpg": "x/opaque", "depth.npy": "depth",
                                             "png": "pix"}, label="target_class",
                         restart_interval=0, progress=False)  # fmt: skip
    assert result.num_samples == n and not result.failed
    assert [f["name"] for f in manifest(out)["fields"]] == ["jpg", "depth.npy", "png", "cls"]
    ds = _core.Dataset.open(str(out))
    for i in range(n):
        assert ds.record(i)["label"] == target[i]
        assert ds.read(i, "jpg") == opaque[i].tobytes()  # the opaque row as it is, padding too
        np.testing.assert_array_equal(np.load(io.BytesIO(ds.read(i, "depth.npy"))), depth[i])
        np.testing.assert_array_equal(_core.decode_image(ds.read(i, "png")), pixels[i])

    # Arrays alone under names of their own: an array pack with those fields.
    arrays = tmp_path / "arrays"
    stoker.pack(path, arrays, members={"depth.npy": "depth", "other": "other"},
                label="target_class", progress=False)  # fmt: skip
    m = manifest(arrays)
    assert m["format"] == "stoker-arrays"
    assert [(f["name"], f["dtype"]) for f in m["fields"]] == [
        ("depth", "float16"), ("other", "float64"), ("label", "int64")]  # fmt: skip
    loader = stoker.Loader(arrays, batch_size=n, train=False, fields={
        "depth": stoker.Array("depth"), "label": stoker.Label("label")})  # fmt: skip
    batch = next(iter(loader))
    assert torch.equal(batch["depth"], torch.from_numpy(depth))
    assert batch["label"].tolist() == target.tolist()


def test_unknown_datasets_and_unfit_members_are_refused_listing_the_datasets(tmp_path, photos):
    path = write_images(tmp_path / "f.h5", photos[:2], labels=np.arange(2),
                        feat=np.zeros((2, 5), np.float32))  # fmt: skip
    with pytest.raises(stoker.InvalidArgumentError) as e:
        stoker.pack(path, tmp_path / "o", members={"jpg": "image"}, progress=False)
    text = str(e.value)
    assert "no dataset 'image'" in text and str(path) in text
    assert "images (2,) vlen uint8" in text and "feat (2, 5) float32" in text
    with pytest.raises(stoker.InvalidArgumentError, match="no dataset 'lbl'.*labels"):
        stoker.pack(path, tmp_path / "o", label="lbl", progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="label dataset feat .* one integer"):
        stoker.pack(path, tmp_path / "o", label="feat", progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="'txt' .* cannot hold dataset feat"):
        stoker.pack(path, tmp_path / "o", members={"txt": "feat"}, progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="name it feat.npy"):
        stoker.pack(path, tmp_path / "o", members={"jpg": "images", "feat": "feat"},
                    progress=False)  # fmt: skip
    assert not (tmp_path / "o").exists()


def test_a_truncated_or_foreign_file_is_an_error_naming_it(tmp_path, photos):
    path = write_images(tmp_path / "whole.h5", photos[:3], labels=np.arange(3))
    truncated = tmp_path / "truncated.h5"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(stoker.CorruptDataError, match=r"truncated\.h5: .*truncated or damaged"):
        stoker.pack(truncated, tmp_path / "o", progress=False)
    foreign = tmp_path / "notes.bin"
    foreign.write_bytes(b"not an HDF5 file at all" * 10)
    with pytest.raises(stoker.InvalidArgumentError, match=r"notes\.bin: not an HDF5 file"):
        stoker.pack(foreign, tmp_path / "o", format="hdf5", progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="no such file"):
        stoker.pack(tmp_path / "absent.h5", tmp_path / "o", format="hdf5", progress=False)


def test_rows_that_cannot_be_read_are_named_and_the_rest_packed(tmp_path):
    rng = np.random.default_rng(3)
    feat = rng.standard_normal((8, 64)).astype(np.float32)
    path = tmp_path / "damaged.h5"
    with h5py.File(path, "w") as f:  # one compressed chunk a row, the label beside it
        f.create_dataset("x", data=np.arange(8, dtype=np.int64))
        f.create_dataset("feat", data=feat, chunks=(1, 64), compression="gzip")
        f.create_dataset("caption", data=[f"row {i}" for i in range(8)],
                         dtype=h5py.string_dtype())  # fmt: skip
        info = f["feat"].id.get_chunk_info_by_coord((3, 0))
    with open(path, "r+b") as f:  # row 3's compressed bytes overwritten
        f.seek(info.byte_offset)
        f.write(b"\xff" * info.size)
    out = tmp_path / "out"
    result = stoker.pack(path, out, progress=False)  # a text member: a tar pack
    assert result.num_samples == 7
    assert [w for w, _ in result.failed] == [f"{path}: feat row 3"]
    assert "cannot be read" in result.failed[0][1]
    ds = _core.Dataset.open(str(out))
    kept = [i for i in range(8) if i != 3]
    for key, i in enumerate(kept):
        np.testing.assert_array_equal(np.load(io.BytesIO(ds.read(key, "feat.npy"))), feat[i])
        assert ds.read(key, "caption.txt") == f"row {i}".encode()
    with pytest.raises(stoker.CorruptDataError, match=r"damaged\.h5: feat row 3: cannot be read"):
        stoker.pack(path, tmp_path / "raised", on_error="raise", progress=False)
    assert not (tmp_path / "raised").exists()


def test_bytes_that_are_not_an_image_fail_their_row(tmp_path, photos):
    rows = [photos[0], b"not an image, just bytes", photos[1]]
    path = write_images(tmp_path / "bad.h5", rows, labels=np.array([0, 1, 2]))
    out = tmp_path / "out"
    result = stoker.pack(path, out, restart_interval=0, progress=False)
    assert result.num_samples == 2
    ((where, reason),) = result.failed
    assert where == f"{path}: images row 1" and "image:" in reason and "not an image" in reason
    ds = _core.Dataset.open(str(out))
    assert [ds.read(i, "jpg") for i in range(2)] == [photos[0], photos[1]]
    assert [ds.record(i)["label"] for i in range(2)] == [0, 2]
    with pytest.raises(stoker.CorruptDataError, match=r"bad\.h5: images row 1: image: "):
        stoker.pack(path, tmp_path / "raised", on_error="raise", progress=False)


def test_the_source_pickles_without_its_file_and_reopens_it(tmp_path, photos):
    path = write_images(tmp_path / "p.h5", photos, labels=np.arange(len(photos)))
    source = open_source(path, None, Options())
    before = [job.make().members for job in source.jobs(1, 4)]  # the file is open now
    copy = pickle.loads(pickle.dumps(source))
    assert copy._file is None
    assert [job.make().members for job in copy.jobs(1, 4)] == before
    start, part = copy.partitions(2)[1]
    assert start == 3
    assert [job.where for job in part.jobs()] == [f"{path}: images row {i}" for i in (3, 4, 5)]
    source.close()
    copy.close()


def test_found_from_the_path_named_with_format_and_packed_on_the_command_line(tmp_path, photos):
    path = write_images(tmp_path / "cli.h5", photos[:3], labels=np.array([1, 0, 1]))
    assert detect(path) == "hdf5"
    odd = tmp_path / "data.bin"
    odd.write_bytes(path.read_bytes())
    assert detect(odd) == "hdf5"  # HDF5's signature
    result = stoker.pack(odd, tmp_path / "named", format="hdf5", progress=False)
    assert result.num_samples == 3
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "stoker", "pack", str(path), str(out), "--quiet",
                        "--member", "jpeg=images", "--label", "labels"],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "packed 3 samples" in r.stdout
    m = manifest(out)
    assert m["source_format"] == "hdf5" and m["class_counts"] == [1, 2]
    assert [f["name"] for f in m["fields"]] == ["jpeg", "cls"]


MEMORY_SCRIPT = textwrap.dedent(
    """
    import sys
    import h5py, numpy as np
    import stoker

    path, out = sys.argv[1:]
    rows, width = 50_000, 1024  # 200 MiB of float32
    with h5py.File(path, "w") as f:
        d = f.create_dataset("feat", (rows, width), np.float32)
        for a in range(0, rows, 5_000):
            d[a : a + 5_000] = np.full((5_000, width), a, np.float32)
        f.create_dataset("labels", data=np.arange(rows) % 7)

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak starts again from here
    before = status("VmRSS")
    result = stoker.pack(path, out, progress=False)
    print(result.num_samples, status("VmHWM") - before)
    """
)


def test_an_array_pack_reads_the_file_a_chunk_at_a_time(tmp_path):
    if "libasan" in os.environ.get("LD_PRELOAD", ""):  # make test-asan-python
        pytest.skip("AddressSanitizer keeps freed memory in quarantine: the peak says nothing")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pytest.skip("the peak memory cannot be reset here (/proc/self/clear_refs)")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(tmp_path / "big.h5"), str(out)],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    samples, growth = map(int, r.stdout.split())
    assert samples == 50_000
    assert growth < 80 << 20, f"the peak grew by {growth >> 20} MiB packing 200 MiB"
    shard = manifest(out)["shards"][0]["files"]
    feat = np.load(out / shard[0]["file"], mmap_mode="r")
    assert feat[4_999, 0] == 0 and feat[5_000, 1023] == 5_000


def test_fixed_size_rows_of_encoded_images_are_found_by_their_first_bytes(tmp_path, photos):
    n = 3
    width = max(len(b) for b in photos)
    padded = np.zeros((n, width), np.uint8)  # one encoded image a row, zeros after it
    for i, data in enumerate(photos[:n]):
        padded[i, : len(data)] = np.frombuffer(data, np.uint8)
    codes = np.random.default_rng(4).integers(0, 256, (n, 16), dtype=np.uint8)
    path = tmp_path / "fixed.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("padded", data=padded)
        f.create_dataset("codes", data=codes)  # uint8 rows that are no image: an array
        f.create_dataset("strings", data=np.array(photos[3 : 3 + n], dtype=f"S{width}"))
        f.create_dataset("y", data=np.array([[2], [0], [1]], np.int16))  # (N, 1) labels
    out = tmp_path / "out"
    result = stoker.pack(path, out, restart_interval=0, progress=False)
    assert result.num_samples == n and not result.failed
    names = [f["name"] for f in manifest(out)["fields"]]
    assert names == ["jpg", "strings.jpg", "codes.npy", "cls"]
    ds = _core.Dataset.open(str(out))
    for i in range(n):
        assert ds.read(i, "jpg") == padded[i].tobytes()
        assert ds.read(i, "strings.jpg") == photos[3 + i]
        np.testing.assert_array_equal(np.load(io.BytesIO(ds.read(i, "codes.npy"))), codes[i])
    assert [ds.record(i)["label"] for i in range(n)] == [2, 0, 1]


def test_the_label_named_as_a_member_or_found_by_its_name(tmp_path, photos):
    path = write_images(tmp_path / "f.h5", photos[:3], labels=np.array([1, 0, 1]),
                        target=np.array([0, 1, 2]))  # fmt: skip
    for members, expected in (({"jpg": "images", "cls": "target"}, [0, 1, 2]),
                              ({"jpg": "images"}, [1, 0, 1])):  # fmt: skip
        out = tmp_path / f"out{len(members)}"
        result = stoker.pack(path, out, members=members, progress=False)
        assert [f["name"] for f in manifest(out)["fields"]] == ["jpg", "cls"]
        assert result.num_samples == 3
        ds = _core.Dataset.open(str(out))
        assert [ds.record(i)["label"] for i in range(3)] == expected
    with pytest.raises(stoker.InvalidArgumentError, match="label= names 'labels': name one"):
        stoker.pack(path, tmp_path / "o", members={"cls": "target"}, label="labels",
                    progress=False)  # fmt: skip
