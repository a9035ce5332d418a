import io
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from PIL import Image

import stoker

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def torchvision_image_folder(root) -> tuple[list[tuple[str, int]], list[str]]:
    """torchvision.datasets.ImageFolder's samples and classes, written out from its source
    (find_classes + make_dataset): the class folders are every directory entry at the root
    (symlinks followed, hidden ones included) sorted by code point, each class its position;
    under each, in sorted(os.walk(..., followlinks=True)) order, the files in sorted order whose
    lowercased name ends with an image extension."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    class_to_idx = {name: i for i, name in enumerate(classes)}
    samples = []
    for target_class in sorted(class_to_idx):
        target_dir = os.path.join(root, target_class)
        for dirpath, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(dirpath, fname)
                if path.lower().endswith(IMG_EXTENSIONS):
                    samples.append((path, class_to_idx[target_class]))
    return samples, classes


def test_pack_order_labels_and_manifest(image_folder, packed):
    samples, classes = torchvision_image_folder(image_folder)
    assert classes == ["cat", "dog", "eel"]
    info = stoker.inspect(packed)
    assert info["version"] == 2
    assert info["num_samples"] == len(samples) == 36
    assert info["class_counts"] == [12, 12, 12]
    assert info["shards"] > 1  # 128 KB shards
    ds = stoker.load.loader.open_dataset(packed)
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


def _tricky_tree(root):
    """Class folders whose order a careless sort gets wrong (upper case before lower, "10"
    before "2", a space, a hidden folder, non-ASCII, a folder named like a JPEG, a symlinked
    one) holding upper-case extensions, nested and symlinked folders, a hidden image, and files
    ImageFolder leaves out (other extensions, one at the root)."""
    rng = np.random.default_rng(3)
    n = 0

    def image(path, fmt):
        nonlocal n
        n += 1
        path.parent.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (12 + n % 5, 16, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path, format=fmt, **({"lossless": True}
                                                          if fmt == "WEBP" else {}))  # fmt: skip

    files = {
        "a/b.jpg": "JPEG", "a/A.JPG": "JPEG", "a/c.Jpeg": "JPEG", "a/Sub/z.png": "PNG",
        "a/sub/y.png": "PNG", "a/sub/deeper/x.webp": "WEBP", "a/.hidden.jpg": "JPEG",
        "B/one.png": "PNG", "10/x.PPM": "PPM", "2/x.jpg": "JPEG", "a b/x.jpg": "JPEG",
        ".dot/x.png": "PNG", "é/x.jpg": "JPEG", "zebra.jpg/x.jpg": "JPEG", "target/t.jpg": "JPEG",
        "stray.jpg": "JPEG",  # at the root: in no class
    }  # fmt: skip
    for name, fmt in files.items():
        image(root / name, fmt)
    for name in ("a/notes.txt", "a/x.jpg.bak", "a/jpg", "B/readme"):
        (root / name).write_text("not an image")
    (root / "linked").symlink_to(root / "target", target_is_directory=True)  # a class too
    (root / "B" / "inner").symlink_to(root / "a" / "sub", target_is_directory=True)
    (root / "2" / "alias.png").symlink_to(root / "B" / "one.png")
    return root


def test_image_folder_labels_follow_torchvisions_rule_on_a_tricky_tree(tmp_path):
    """Classes, sample order and labels of stoker.pack on a tree of awkward names against
    torchvision's ImageFolder rule written out here: each packed sample is its file's bytes
    (packed as they are), with the label that rule gives it."""
    root = _tricky_tree(tmp_path / "tree")
    samples, classes = torchvision_image_folder(root)
    assert classes == [".dot", "10", "2", "B", "a", "a b", "linked", "target", "zebra.jpg", "é"]
    assert len(samples) == 19
    out = tmp_path / "pack"
    result = stoker.pack(root, out, restart_interval=None, progress=False, threads=2)
    assert result.num_samples == len(samples) and not result.failed
    assert stoker.inspect(out)["classes"] == classes
    ds = stoker.load.loader.open_dataset(out)
    assert len(ds) == len(samples)
    listed = (out / "sources.tsv").read_text().splitlines()
    for i, (path, label) in enumerate(samples):
        with open(path, "rb") as f:
            assert ds.read(i) == f.read(), (i, path)
        assert ds.record(i)["label"] == label, (i, path)
        assert listed[i].split("\t")[2] == path


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
    samples, _ = torchvision_image_folder(image_folder)
    rows = ["path,label"] + [
        f"{p},{'even' if i % 2 == 0 else 'odd'}" for i, (p, _) in enumerate(samples[:10])
    ]
    (tmp_path / "list.csv").write_text("\n".join(rows))
    stoker.pack(tmp_path / "list.csv", tmp_path / "out", progress=False)
    info = stoker.inspect(tmp_path / "out")
    assert info["classes"] == ["even", "odd"]
    ds = stoker.load.loader.open_dataset(tmp_path / "out")
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
    a, b = stoker.load.loader.open_dataset(whole), stoker.load.loader.open_dataset(out)
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


def pil_resized(path, width, height, cover=(0, 0)) -> np.ndarray:
    """PIL: the file decoded (a JPEG at the smallest DCT scale, 1/2, 1/4 or 1/8, whose sides
    still cover `cover`: Pillow's draft), as RGB, resized to width x height (BILINEAR, with
    Pillow's antialiasing)."""
    im = Image.open(path)
    w, h = im.size
    scale = 1
    if im.format == "JPEG":
        while scale < 8 and w // (2 * scale) >= cover[0] and h // (2 * scale) >= cover[1]:
            scale *= 2
        if scale > 1:
            im.draft("RGB", (w // scale, h // scale))
            assert im.size == (-(-w // scale), -(-h // scale))  # libjpeg's scaled size
    im = im.convert("RGB")
    if im.size != (width, height):
        im = im.resize((width, height), Image.Resampling.BILINEAR)
    return np.asarray(im)


def shrunk_size(width, height, max_side) -> tuple[int, int]:
    """The longer side max_side, the shorter in proportion, rounded half up."""
    s = max_side / max(width, height)
    return max(1, int(np.floor(width * s + 0.5))), max(1, int(np.floor(height * s + 0.5)))


def test_refuses_to_overwrite_and_max_side_reencodes(tmp_path, image_folder):
    """max_side=100: an image over 100 px decoded at the smallest DCT scale still 100 on its
    longer side, resized to 100 on it and re-encoded at quality 90: as close to PIL's pixels (its
    draft and BILINEAR resize) as PIL's own encoder at 90 gets; the others stored as they are."""
    out = tmp_path / "small"
    result = stoker.pack(image_folder, out, max_side=100, restart_interval=None, progress=False)
    samples, _ = torchvision_image_folder(image_folder)
    ds = stoker.load.loader.open_dataset(out)
    assert len(ds) == len(samples)
    shrunk = 0
    for i, (path, _) in enumerate(samples):
        data = ds.read(i)
        width, height = Image.open(path).size
        if max(width, height) <= 100:
            with open(path, "rb") as f:
                assert data == f.read(), path
            continue
        shrunk += 1
        info = stoker._core.image_info(data)
        w, h = info["width"], info["height"]
        assert max(w, h) == 100
        assert abs(min(w, h) - min(width, height) * 100 / max(width, height)) < 1, (w, h)
        want = pil_resized(path, w, h, cover=(100, 0) if width >= height else (0, 100))
        theirs = io.BytesIO()
        Image.fromarray(want).save(theirs, format="JPEG", quality=90)
        floor = _psnr(np.asarray(Image.open(theirs).convert("RGB")), want)
        got = stoker._core.decode_image(data)
        assert _psnr(got, want) > floor - 1, (path, _psnr(got, want), floor)
    assert shrunk == result.reencoded and shrunk > 20
    with pytest.raises(stoker.InvalidArgumentError):
        stoker.pack(image_folder, out, progress=False)
    stoker.pack(image_folder, out, progress=False, overwrite=True)
    assert stoker.inspect(out)["max_side"] is None


def test_max_side_keeps_the_sources_proportions(tmp_path, image_folder):
    samples, _ = torchvision_image_folder(image_folder)
    wrong = []
    for codec in ("source", "raw"):
        out = tmp_path / codec
        stoker.pack(image_folder, out, max_side=100, codec=codec, progress=False)
        ds = stoker.load.loader.open_dataset(out)
        assert len(ds) == len(samples)
        for i, (path, _) in enumerate(samples):
            info = stoker._core.image_info(ds.read(i))
            width, height = Image.open(path).size
            want = shrunk_size(width, height, 100) if max(width, height) > 100 else (width, height)
            if (info["width"], info["height"]) != want:
                wrong.append((codec, (width, height), (info["width"], info["height"]), want))
    assert not wrong, wrong


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
    samples, _ = torchvision_image_folder(image_folder)
    ds = stoker.load.loader.open_dataset(plain)
    for i, (path, _) in enumerate(samples):
        with open(path, "rb") as f:
            assert ds.read(i) == f.read()  # stored as is, byte for byte
    result = stoker.pack(image_folder, marked, progress=False)  # restart_interval=1 by default
    assert result.reencoded > 20  # the baseline JPEGs; PNG and progressive files stay as they are
    a, b = stoker.load.loader.open_dataset(plain), stoker.load.loader.open_dataset(marked)
    changed = sum(a.read(i) != b.read(i) for i in range(len(a)))
    assert changed == result.reencoded
    for i in range(len(a)):
        assert (stoker._core.decode_image(a.read(i)) == stoker._core.decode_image(b.read(i))).all()
    # Crops cut through the restart intervals decode exactly as from the plain pack.
    import torch

    for train in (True, False):
        x = [t.clone() for t, _ in stoker.ImageLoader(plain, batch_size=9, size=48, train=train)]
        y = [t.clone() for t, _ in stoker.ImageLoader(marked, batch_size=9, size=48, train=train)]
        assert len(x) == 4  # 36 samples, 9 a batch
        assert all(torch.equal(p, q) for p, q in zip(x, y, strict=True))


def test_scan_index_crops_decode_exactly_as_whole_files(tmp_path, image_folder):
    # A pack of JPEGs without restart markers: the first epoch indexes them, the later ones cut
    # each file through its index; every batch equals the one decoded without indexes.
    import torch

    plain = tmp_path / "plain"
    stoker.pack(image_folder, plain, restart_interval=None, progress=False)

    def epochs(**options):
        loader = stoker.ImageLoader(plain, batch_size=9, size=48, seed=3, **options)
        out = []
        for epoch in range(3):
            loader.set_epoch(epoch)
            out.append([t.clone() for t, _ in loader])
        return out, loader.stats()["scan_index"]

    indexed, stats = epochs()
    unindexed, none = epochs(scan_index_memory=0)
    assert stats["images"] > 20 and stats["bytes"] > 0  # the baseline JPEGs
    assert none == {"images": 0, "bytes": 0}
    for a, b in zip(indexed, unindexed, strict=True):
        assert len(a) == 4
        assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    with pytest.raises(stoker.InvalidArgumentError, match="scan_index_memory"):
        stoker.ImageLoader(plain, batch_size=9, scan_index_memory=-1)


def _psnr(a, b) -> float:
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
    samples, _ = torchvision_image_folder(image_folder)
    assert result.reencoded == len(samples) == 36
    ds = stoker.load.loader.open_dataset(out)
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
