import json
import subprocess
import sys
import tarfile

import pytest

import stoker
from stoker.packing.sources.folder import list_image_folder


def test_pack_order_labels_and_manifest(image_folder, packed):
    samples, classes = list_image_folder(image_folder)
    assert classes == ["cat", "dog", "eel"]
    info = stoker.inspect(packed)
    assert info["version"] == 2
    assert info["num_samples"] == len(samples) == 36
    assert info["class_counts"] == [12, 12, 12]
    assert info["shards"] > 1  # 128 KB shards
    ds = stoker.loader.open_dataset(packed)
    for i, (path, label) in enumerate(samples):
        rec = ds.record(i)
        assert rec["label"] == label
        with open(path, "rb") as f:
            source = f.read()
        # Baseline JPEGs get restart markers (lossless): the same pixels, not the same bytes.
        assert (stoker._core.decode_image(ds.read(i)) == stoker._core.decode_image(source)).all()
        assert stoker._core.crc32c(ds.read(i)) == rec["crc32c"]
    sources = (packed / "sources.tsv").read_text().splitlines()
    assert sources[5].split("\t")[2] == samples[5][0]
    fields = {f["name"]: f for f in json.loads((packed / "manifest.json").read_text())["fields"]}
    assert list(fields) == ["jpg", "cls", "png"]  # in the order they first appear
    assert (fields["jpg"]["count"], fields["png"]["count"], fields["cls"]["count"]) == (33, 3, 36)
    assert fields["jpg"]["kind"] == "image" and fields["jpg"]["dtype"] == "uint8"
    assert fields["jpg"]["min_shape"][2] == 1 and fields["jpg"]["max_shape"][2] == 3  # a grey one
    assert fields["cls"]["kind"] == "label" and fields["cls"]["min_shape"] == []


def test_shards_are_plain_tar_and_webdataset_reads_them(packed):
    manifest = json.loads((packed / "manifest.json").read_text())
    first = packed / manifest["shards"][0]["tar"]
    names = subprocess.run(
        ["tar", "-tf", str(first)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert names[:2] == ["00000000.jpg", "00000000.cls"]
    with tarfile.open(first) as t:
        assert t.extractfile("00000000.cls").read() == b"0"
    wds = pytest.importorskip("webdataset")
    urls = [str(packed / s["tar"]) for s in manifest["shards"]]
    seen = list(wds.WebDataset(urls, shardshuffle=False).to_tuple("__key__", "cls"))
    assert len(seen) == 36
    assert seen[0] == ("00000000", b"0")


def test_unreadable_files_are_listed_not_packed(tmp_path, image_folder):
    src = tmp_path / "src"
    import shutil

    shutil.copytree(image_folder, src)
    (src / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    (src / "dog" / "page.jpg").write_text("<html>404</html>")
    result = stoker.pack(src, tmp_path / "out", progress=False)
    assert result.num_samples == 36
    failed = dict(result.failed)
    assert set(failed) == {str(src / "cat" / "broken.jpg"), str(src / "dog" / "page.jpg")}
    assert "not a JPEG" in failed[str(src / "dog" / "page.jpg")]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert len(manifest["failed"]) == 2


def test_csv_source_with_class_names(tmp_path, image_folder):
    samples, _ = list_image_folder(image_folder)
    rows = ["path,label"] + [
        f"{p},{'even' if i % 2 == 0 else 'odd'}" for i, (p, _) in enumerate(samples[:10])
    ]
    (tmp_path / "list.csv").write_text("\n".join(rows))
    stoker.pack(tmp_path / "list.csv", tmp_path / "out", progress=False)
    info = stoker.inspect(tmp_path / "out")
    assert info["classes"] == ["even", "odd"]
    ds = stoker.loader.open_dataset(tmp_path / "out")
    assert [ds.record(i)["label"] for i in range(4)] == [0, 1, 0, 1]


def test_an_interrupted_pack_leaves_nothing_at_out_and_resumes_to_the_same_pack(
    tmp_path, image_folder, monkeypatch
):
    from stoker.packing.sources import folder

    whole = tmp_path / "whole"
    stoker.pack(image_folder, whole, shard_size="64KB", progress=False, threads=1)
    real = folder.prepare_image
    calls = {"n": 0}

    def failing(*args):
        calls["n"] += 1
        if calls["n"] == 20:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(folder, "prepare_image", failing)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        stoker.pack(image_folder, out, shard_size="64KB", progress=False, threads=1)
    assert not out.exists()  # nothing that loads at out
    partial = tmp_path / ".out.partial"
    checkpoint = json.loads((partial / "resume.json").read_text())["parts"]["shard-"]
    assert 0 < checkpoint["num_samples"] < 19 and len(checkpoint["shards"]) >= 1
    monkeypatch.setattr(folder, "prepare_image", real)
    calls["n"] = 0
    counting = lambda *args: (calls.__setitem__("n", calls["n"] + 1), real(*args))[1]  # noqa: E731
    monkeypatch.setattr(folder, "prepare_image", counting)
    result = stoker.pack(image_folder, out, shard_size="64KB", progress=False, threads=1)
    assert result.resumed == checkpoint["num_samples"]
    assert calls["n"] == result.num_samples - checkpoint["num_samples"]  # none prepared twice
    assert not partial.exists()
    assert (out / "sources.tsv").read_text() == (whole / "sources.tsv").read_text()
    a, b = stoker.loader.open_dataset(whole), stoker.loader.open_dataset(out)
    assert len(a) == len(b) == result.num_samples
    for i in range(len(a)):
        assert a.read(i) == b.read(i) and a.record(i)["label"] == b.record(i)["label"]
    # Another source (or resume=False) starts over.
    monkeypatch.setattr(folder, "prepare_image", failing)
    calls["n"] = 0
    with pytest.raises(KeyboardInterrupt):
        stoker.pack(image_folder, tmp_path / "again", shard_size="64KB", progress=False, threads=1)
    monkeypatch.setattr(folder, "prepare_image", real)
    result = stoker.pack(image_folder, tmp_path / "again", shard_size="64KB", progress=False,
                         threads=1, resume=False)  # fmt: skip
    assert result.resumed == 0 and result.num_samples == len(a)


def test_a_second_packer_into_the_same_folder_is_refused(tmp_path, image_folder):
    import fcntl

    partial = tmp_path / ".out.partial"
    partial.mkdir()
    with open(partial / "lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(stoker.InvalidArgumentError, match="another stoker pack is writing"):
            stoker.pack(image_folder, tmp_path / "out", progress=False)
    stoker.pack(image_folder, tmp_path / "out", progress=False)  # released: it goes ahead


def test_refuses_to_overwrite_and_max_side_reencodes(tmp_path, image_folder):
    out = tmp_path / "small"
    result = stoker.pack(image_folder, out, max_side=100, restart_interval=None, progress=False)
    assert result.reencoded > 0
    ds = stoker.loader.open_dataset(out)
    for i in range(len(ds)):
        info = stoker._core.image_info(ds.read(i))
        assert max(info["width"], info["height"]) <= 100
    with pytest.raises(stoker.InvalidArgumentError):
        stoker.pack(image_folder, out, progress=False)
    stoker.pack(image_folder, out, progress=False, overwrite=True)
    assert stoker.inspect(out)["max_side"] is None


def test_incomplete_pack_does_not_load(tmp_path, packed):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(packed, broken)
    (broken / "manifest.json").unlink()
    with pytest.raises(stoker.CorruptDataError, match="incomplete"):
        stoker.ImageLoader(broken, batch_size=4)


def test_restart_markers_change_bytes_not_pixels(tmp_path, image_folder):
    plain = tmp_path / "plain"
    marked = tmp_path / "marked"
    stoker.pack(image_folder, plain, restart_interval=None, progress=False)
    samples, _ = list_image_folder(image_folder)
    ds = stoker.loader.open_dataset(plain)
    for i, (path, _) in enumerate(samples):
        with open(path, "rb") as f:
            assert ds.read(i) == f.read()  # stored as is, byte for byte
    result = stoker.pack(image_folder, marked, progress=False)  # restart_interval=1 by default
    assert result.reencoded > 20  # the baseline JPEGs; PNG and progressive files stay as they are
    a, b = stoker.loader.open_dataset(plain), stoker.loader.open_dataset(marked)
    changed = sum(a.read(i) != b.read(i) for i in range(len(a)))
    assert changed == result.reencoded
    for i in range(len(a)):
        assert (stoker._core.decode_image(a.read(i)) == stoker._core.decode_image(b.read(i))).all()
    # Crops cut through the restart intervals decode exactly as from the plain pack.
    import torch

    for train in (True, False):
        x = [t.clone() for t, _ in stoker.ImageLoader(plain, batch_size=9, size=48, train=train)]
        y = [t.clone() for t, _ in stoker.ImageLoader(marked, batch_size=9, size=48, train=train)]
        assert all(torch.equal(p, q) for p, q in zip(x, y, strict=True))


def _psnr(a, b) -> float:
    import numpy as np

    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.mark.parametrize("max_side", [None, 150])
def test_codec_jpeg_reencodes_every_image_as_ffcv_s_writer(tmp_path, image_folder, max_side):
    """codec="jpeg": every image, PNG and grey and progressive ones included, decoded and
    re-encoded as a JPEG at `quality` (shrunk to max_side first): the one lossy choice, recorded
    in the manifest and shown by inspect, close to the original (PSNR)."""
    out = tmp_path / "q"
    result = stoker.pack(image_folder, out, codec="jpeg", quality=75, max_side=max_side,
                         restart_interval=None, progress=False)  # fmt: skip
    samples, _ = list_image_folder(image_folder)
    assert result.reencoded == len(samples) == 36
    ds = stoker.loader.open_dataset(out)
    for i, (path, _) in enumerate(samples):
        data = ds.read(i)
        info = stoker._core.image_info(data)
        assert data[:2] == b"\xff\xd8" and not info["progressive"]  # a baseline JPEG, always
        original = stoker._core.decode_image(open(path, "rb").read())
        if max_side is None:
            assert (info["height"], info["width"]) == original.shape[:2]
            # as lossy as PIL's encoder at the same quality, within 1 dB
            import io

            from PIL import Image as PILImage

            theirs = io.BytesIO()
            PILImage.fromarray(original).save(theirs, format="JPEG", quality=75)
            reference = _psnr(stoker._core.decode_image(theirs.getvalue()), original)
            assert _psnr(stoker._core.decode_image(data), original) > reference - 1
        else:
            assert max(info["width"], info["height"]) <= max_side
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["codec"] == "jpeg" and manifest["quality"] == 75
    assert stoker.inspect(out)["quality"] == 75
    shown = subprocess.run([sys.executable, "-m", "stoker", "inspect", str(out)], text=True,
                           capture_output=True, check=True).stdout  # fmt: skip
    assert "re-encoded at quality 75 (lossy)" in shown
    assert len(list(stoker.ImageLoader(out, batch_size=8, size=48))) == 5
    # the default stores the files as they are, and records no quality
    plain = tmp_path / "plain"
    stoker.pack(image_folder, plain, restart_interval=None, progress=False)
    assert stoker.inspect(plain)["quality"] is None and stoker.inspect(plain)["codec"] == "source"
    with pytest.raises(stoker.InvalidArgumentError, match="quality"):
        stoker.pack(image_folder, tmp_path / "bad", codec="jpeg", quality=0, progress=False)
