"""Array packs (stoker.pack_arrays) read by stoker.Loader: rows exactly as packed, the Image
field's geometry on raw pixels against a reference written here (numpy), the Loader's state,
ranks and mix, and hostile files that are refused with clear errors."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch

import stoker

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

N = 200


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return {
        "image": rng.integers(0, 256, (N, 32, 32, 3), dtype=np.uint8),
        "label": rng.integers(0, 10, N).astype(np.int64),
        "feat": rng.standard_normal((N, 5, 2)).astype(np.float32),
    }


@pytest.fixture(scope="module")
def pack(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("arrays") / "pack"
    result = stoker.pack_arrays(data, out, shard_size="128KB", classes=list("abcdefghij"),
                                progress=False)  # fmt: skip
    assert result.num_samples == N and result.num_shards > 1
    return out


def fields(**image):
    return {
        "image": stoker.Image("image", size=32, **image),
        "label": stoker.Label("label"),
        "feat": stoker.Array("feat"),
    }


def test_the_pack_is_npy_files_numpy_reads_and_a_manifest(pack, data):
    manifest = json.loads((pack / "manifest.json").read_text())
    assert manifest["format"] == "stoker-arrays" and manifest["num_samples"] == N
    assert [f["name"] for f in manifest["fields"]] == ["image", "label", "feat"]
    assert manifest["fields"][0] == {"name": "image", "kind": "array", "dtype": "uint8",
                                     "shape": [32, 32, 3]}  # fmt: skip
    rows = [np.load(pack / s["files"][0]["file"], mmap_mode="r") for s in manifest["shards"]]
    assert np.array_equal(np.concatenate(rows), data["image"])
    feat = np.concatenate([np.load(pack / s["files"][2]["file"]) for s in manifest["shards"]])
    assert feat.dtype == np.float32 and np.array_equal(feat, data["feat"])


def test_without_augmentation_a_batch_is_the_rows_it_indexes(pack, data):
    loader = stoker.Loader(pack, batch_size=32, fields=fields(geometry=stoker.Resize()),
                           train=True, threads=2, return_index=True)  # fmt: skip
    seen = []
    for batch in loader:
        i = batch["index"].numpy()
        seen += i.tolist()
        assert torch.equal(batch["image"].permute(0, 2, 3, 1), torch.from_numpy(data["image"][i]))
        assert torch.equal(batch["label"], torch.from_numpy(data["label"][i]))
        assert torch.equal(batch["feat"], torch.from_numpy(data["feat"][i]))
    assert sorted(seen) == list(range(N)) and seen != list(range(N))  # shuffled, each once
    assert loader.classes == list("abcdefghij")


def torchvision_crop_flip(image: np.ndarray, seed: int, epoch: int, index: int) -> tuple:
    """RandomCrop(32, padding=4) + RandomHorizontalFlip() on a numpy image, drawn here from the
    engine's generator for (seed, epoch, sample): the window's top, its left (each uniform over
    the 9 places of a 32-pixel window in the zero-padded 40), then the flip."""
    rng = stoker._core.KeyedRandom(seed, epoch, index)
    top, left = rng.below(9), rng.below(9)
    flip = rng.uniform(0.0, 1.0) < 0.5
    padded = np.pad(image, ((4, 4), (4, 4), (0, 0)))
    out = padded[top : top + 32, left : left + 32]
    return (out[:, ::-1] if flip else out), flip, (top, left)


def test_random_crop_with_padding_and_flips_on_raw_pixels_match_numpy(pack, data):
    loader = stoker.Loader(
        pack, batch_size=50, train=True, threads=2, return_index=True, seed=6,
        fields={"image": stoker.Image("image", size=32, geometry=stoker.RandomCrop(32, padding=4),
                                      hflip=0.5, return_params=True)},
    )  # fmt: skip
    loader.set_epoch(2)
    seen = flipped = shifted = 0
    for batch in loader:
        params = batch["image_params"]
        for k, i in enumerate(batch["index"].tolist()):
            got = batch["image"][k].permute(1, 2, 0).numpy()
            want, flip, (top, left) = torchvision_crop_flip(data["image"][i], 6, 2, i)
            assert np.array_equal(got, want), i
            assert bool(params["hflip"][k]) == flip  # and the loader reports what it did
            seen += 1
            flipped += flip
            shifted += top < 4 or left < 4
    assert seen == N
    # Offsets uniform in [0, 8] on each axis: the image starts inside the output (padding
    # shows on the top or left) with probability 1 - (5/9)^2, 0.69.
    assert 60 < flipped < 140 and 100 < shifted < 175


def test_other_geometries_and_grey_work_on_raw_pixels(tmp_path):
    rng = np.random.default_rng(1)
    grey = rng.integers(0, 256, (8, 40, 60), dtype=np.uint8)
    stoker.pack_arrays({"image": grey}, tmp_path / "grey", progress=False)
    loader = stoker.Loader(tmp_path / "grey", batch_size=8, train=False, shuffle=False,
                           fields={"image": stoker.Image("image", size=(40, 60),
                                                         geometry=stoker.Resize())})  # fmt: skip
    rgb = next(iter(loader))["image"]  # grey rows come out as RGB, each channel the grey
    assert torch.equal(rgb[:, 0], torch.from_numpy(grey)) and torch.equal(rgb[:, 2], rgb[:, 0])
    for geometry in (stoker.RandomResizedCrop(), stoker.CenterCrop(), stoker.Letterbox()):
        loader = stoker.Loader(
            tmp_path / "grey",
            batch_size=4,
            train=True,
            fields={"image": stoker.Image("image", size=24, geometry=geometry)},
        )
        assert next(iter(loader))["image"].shape == (4, 3, 24, 24)


def test_state_resume_ranks_pickle_and_mix_work_on_an_array_pack(pack):
    def make(**kw):
        options = dict(batch_size=16, train=True, threads=2, seed=3, return_index=True)
        image = dict(geometry=stoker.RandomCrop(32, padding=4), hflip=0.5)
        return stoker.Loader(pack, fields=fields(**image), **{**options, **kw})

    whole = [b["index"].tolist() for b in make()]
    first = make()
    it = iter(first)
    head = [next(it)["index"].tolist() for _ in range(4)]
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    assert head + [b["index"].tolist() for b in resumed] == whole
    copy = pickle.loads(pickle.dumps(first))
    assert [b["index"].tolist() for b in copy] == whole[4:]
    shares = [sum((b["index"].tolist() for b in make(rank=r, world_size=3)), []) for r in range(3)]
    assert len(sum(shares, [])) - N < 3  # each sample once, but the padding
    assert set(sum(shares, [])) == set(range(N)) and len({len(s) for s in shares}) == 1
    mixed = stoker.mix([make(), make(seed=4)], weights=[1, 1])
    assert sum(1 for _ in mixed) > 0


def test_pack_arrays_from_memmaps_tensors_and_per_sample_dicts(tmp_path, data):
    memmap = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.uint8,
                                       shape=data["image"].shape)  # fmt: skip
    memmap[:] = data["image"]
    memmap.flush()
    image, label = data["image"], data["label"]
    sources = {
        "memmap": {"image": np.load(tmp_path / "x.npy", mmap_mode="r"), "label": label},
        "tensor": {"image": torch.from_numpy(image), "label": torch.from_numpy(label)},
        "dicts": ({"image": image[i], "label": label[i]} for i in range(N)),
    }
    for name, source in sources.items():
        out = tmp_path / name
        stoker.pack_arrays(source, out, shard_size="64KB", progress=False)
        whole = {"image": stoker.Image("image", size=32, geometry=stoker.Resize()),
                 "label": stoker.Label("label")}  # fmt: skip
        loader = stoker.Loader(out, batch_size=N, shuffle=False, train=False, fields=whole)
        batch = next(iter(loader))
        assert torch.equal(batch["image"].permute(0, 2, 3, 1), torch.from_numpy(data["image"])), (
            name
        )
        assert torch.equal(batch["label"], torch.from_numpy(data["label"])), name


def test_pack_arrays_refuses_what_it_cannot_store(tmp_path):
    with pytest.raises(stoker.InvalidArgumentError, match="different numbers of samples"):
        stoker.pack_arrays({"a": np.zeros(3), "b": np.zeros(4)}, tmp_path / "x", progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="not one stoker reads"):
        stoker.pack_arrays({"a": np.array(["x", "y"])}, tmp_path / "x", progress=False)
    samples = [{"a": np.zeros(3)}, {"a": np.zeros(4)}]
    with pytest.raises(stoker.InvalidArgumentError, match="sample 1: field 'a' has shape"):
        stoker.pack_arrays(samples, tmp_path / "x", progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="name"):
        stoker.pack_arrays({"../a": np.zeros(3)}, tmp_path / "x", progress=False)
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x.partial-*"))


def damaged(pack, tmp_path, edit):
    """A copy of the pack with `edit(folder, manifest)` applied."""
    import shutil

    out = tmp_path / "damaged"
    shutil.copytree(pack, out)
    manifest = json.loads((out / "manifest.json").read_text())
    edit(out, manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_damaged_array_packs_are_refused_naming_the_file(pack, tmp_path):
    def truncate(folder, manifest):
        path = folder / manifest["shards"][1]["files"][0]["file"]
        path.write_bytes(path.read_bytes()[:-100])

    def other_dtype(folder, manifest):
        manifest["fields"][1]["dtype"] = "int32"

    def other_shape(folder, manifest):
        manifest["fields"][0]["shape"] = [32, 32, 4]

    def huge_shape(folder, manifest):
        manifest["fields"][0]["shape"] = [1 << 30, 1 << 30, 3]

    cases = {
        truncate: (stoker.CorruptDataError, "shard-000001.image.npy"),
        other_dtype: (stoker.CorruptDataError, "int64 .* the manifest says int32"),
        other_shape: (stoker.CorruptDataError, "the manifest says uint8"),
        huge_shape: (stoker.ResourceLimitError, "too large"),
    }
    for edit, (error, message) in cases.items():
        folder = damaged(pack, tmp_path / edit.__name__, edit)
        with pytest.raises(error, match=message):
            stoker.Loader(folder, batch_size=4, fields={"label": stoker.Label("label")})


def test_inspect_and_verify_an_array_pack(pack, tmp_path):
    import shutil

    info = stoker.inspect(pack)
    assert info["format"] == "stoker-arrays" and info["num_samples"] == N
    assert [f["name"] for f in info["fields"]] == ["image", "label", "feat"]
    report = stoker.verify(pack, progress=False)
    assert report.clean and report.checked == N and report.files == 3 * info["shards"]
    copy = tmp_path / "copy"
    shutil.copytree(pack, copy)
    column = copy / "shard-000002.feat.npy"
    data = bytearray(column.read_bytes())
    data[-3] ^= 0x40  # a float's byte: still a valid file, no longer what was packed
    column.write_bytes(bytes(data))
    report = stoker.verify(copy, progress=False)
    assert [(f.shard, f.error) for f in report.failures] == [
        ("shard-000002.feat.npy", "CorruptDataError")
    ]
    assert "CRC32C mismatch" in report.failures[0].reason


def test_a_column_truncated_mid_pass_is_a_named_error_not_a_crash(data, tmp_path):
    """Column files are mapped (a pread per 3 KB row costs more than the copy); a page past the
    new end of a file cut under a running pass raises SIGBUS, which the read turns into a
    ShardIOError naming the file."""
    stoker.pack_arrays(data, tmp_path / "pack", progress=False)  # one shard
    fields = {"image": stoker.Image("image", size=32, geometry=stoker.Resize())}
    loader = stoker.Loader(tmp_path / "pack", batch_size=10, fields=fields, threads=1, prefetch=1)
    it = iter(loader)
    next(it)
    (column,) = (tmp_path / "pack").glob("*.image.npy")
    os.truncate(column, 4096)  # the header and a row: the rest of the pass reads past the end
    with pytest.raises(stoker.ShardIOError, match=r"image\.npy.*truncated after it was opened"):
        for _ in it:
            pass
    loader.close()
