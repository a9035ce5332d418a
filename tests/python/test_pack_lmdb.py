"""stoker.pack from LMDB environments written with the lmdb package: encoded images keyed like
ImageNet's, labels from a mapping, a function or a .json file, record= layouts, pickled values
(refused, then allowed), Caffe Datums (encoded and raw, written by an encoder here independent of
the source's parser), values that are no image, damaged files, seeks, pickling, detection and
the command line."""

import io
import json
import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest
from conftest import shared_data
from PIL import Image

import stoker
from stoker import _core
from stoker.packing.members import Options
from stoker.packing.sources import detect
from stoker.packing.sources import lmdb as lmdb_source
from stoker.packing.sources.lmdb import LmdbSource, is_pickle, parse_datum

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

lmdb = pytest.importorskip("lmdb")


def photos(n):
    """(key, JPEG bytes) of the n smallest ImageNet sample photos, keyed as ImageNet's val set."""
    files = sorted(
        (shared_data() / "imagenet-sample").glob("*.JPEG"), key=lambda p: p.stat().st_size
    )
    return [
        (f"{p.name.split('_')[0]}/ILSVRC2012_val_{i:08d}".encode(), p.read_bytes())
        for i, p in enumerate(files[:n])
    ]


def png_bytes(w=9, h=6, seed=0, mode="RGB"):
    rng = np.random.default_rng(seed)
    shape = (h, w, 3) if mode == "RGB" else (h, w)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


def write_lmdb(path, items, **kw):
    env = lmdb.open(str(path), map_size=1 << 26, **kw)
    with env.begin(write=True) as txn:
        for key, value in items:
            txn.put(key, value)
    env.close()
    return path


def pack(src, out, **kw):
    kw.setdefault("restart_interval", 0)
    return stoker.pack(src, out, progress=False, threads=2, **kw)


def packed(out):
    """[(key from sources.tsv, label, {member: bytes})] of a pack, in order."""
    ds = _core.Dataset.open(str(out))
    refs = [line.split("\t")[3] for line in (out / "sources.tsv").read_text().splitlines()]
    samples = []
    for i, ref in enumerate(refs):
        rec = ds.record(i)
        names = [m["name"] for m in rec["members"] if m["name"] != "cls"]
        samples.append((ref, rec["label"], {name: ds.read(i, name) for name in names}))
    return samples


def manifest(out):
    return json.loads((out / "manifest.json").read_text())


# --- Caffe's Datum, encoded by hand (independent of the source's parser) -----------------------


def varint(n):
    n &= (1 << 64) - 1  # negative int32s are 10-byte varints
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def datum(data, label=None, channels=None, height=None, width=None, encoded=False):
    out = b""
    for field, v in ((1, channels), (2, height), (3, width)):
        if v is not None:
            out += varint(field << 3) + varint(v)
    out += varint(4 << 3 | 2) + varint(len(data)) + data
    if label is not None:
        out += varint(5 << 3) + varint(label)
    if encoded:
        out += varint(7 << 3) + varint(1)
    return out


# --- images, labels, metadata keys -------------------------------------------------------------


@pytest.fixture
def imagenet_lmdb(tmp_path):
    """5 JPEGs and a PNG under ImageNet-like keys, and the metadata keys conversion scripts add."""
    items = photos(5)
    items.append((b"n09999999/ILSVRC2012_val_00000099", png_bytes()))
    meta = [
        (b"__keys__", pickle.dumps([k for k, _ in items])),
        (b"__len__", str(len(items)).encode()),
        (b"length", b"6"),
        (b"num_samples", b"6"),
    ]
    db = write_lmdb(tmp_path / "db", items + meta)
    return db, sorted(items)


@pytest.mark.parametrize("how", ["dict", "bytes-dict", "function", "json-names"])
def test_images_round_trip_with_labels(tmp_path, imagenet_lmdb, how):
    db, items = imagenet_lmdb
    wnids = sorted({k.decode().split("/")[0] for k, _ in items})
    expect_classes = None
    if how == "dict":
        label = {k.decode(): i for i, (k, _) in enumerate(items)}
        expect = list(range(len(items)))
    elif how == "bytes-dict":
        label = {k: 2 * i for i, (k, _) in enumerate(items)}
        expect = [2 * i for i in range(len(items))]
    elif how == "function":
        label = lambda key: wnids.index(key.split("/")[0])  # noqa: E731
        expect = [wnids.index(k.decode().split("/")[0]) for k, _ in items]
    else:  # a .json file of class names: ids in sorted order
        names = {k.decode(): f"class-{k.decode()[-1]}" for k, _ in items}
        label = tmp_path / "labels.json"
        label.write_text(json.dumps(names))
        expect_classes = sorted(set(names.values()))
        expect = [expect_classes.index(names[k.decode()]) for k, _ in items]
    out = tmp_path / "out"
    result = pack(db, out, label=label)
    assert result.num_samples == len(items) and not result.failed  # metadata keys left out
    m = manifest(out)
    assert m["source_format"] == "lmdb"
    if expect_classes is not None:
        assert m["classes"] == expect_classes
    samples = packed(out)
    assert [s[0] for s in samples] == [k.decode() for k, _ in items]  # LMDB's key order
    assert [s[1] for s in samples] == expect
    for (_, _, members), (_, data) in zip(samples, items, strict=True):
        ext = "png" if data.startswith(b"\x89PNG") else "jpg"
        assert members == {ext: data}  # byte for byte


def test_no_labels(tmp_path, imagenet_lmdb):
    db, items = imagenet_lmdb
    out = tmp_path / "out"
    assert pack(db, out).num_samples == len(items)
    assert [s[1] for s in packed(out)] == [-1] * len(items)
    assert "cls" not in [f["name"] for f in manifest(out)["fields"]]


def test_label_mapping_missing_a_key_and_bad_label_options(tmp_path, imagenet_lmdb):
    db, items = imagenet_lmdb
    label = {k.decode(): 1 for k, _ in items[1:]}
    result = pack(db, tmp_path / "out", label=label)
    assert result.num_samples == len(items) - 1
    assert result.failed == [
        (
            f"{db / 'data.mdb'}: key {items[0][0].decode()!r}",
            "the labels (label=) have no entry for this key",
        )
    ]
    with pytest.raises(stoker.InvalidArgumentError, match="no .json file"):
        pack(db, tmp_path / "o2", label="labels")  # a column name means nothing here
    with pytest.raises(stoker.InvalidArgumentError, match="not a list"):
        pack(db, tmp_path / "o3", label=[1, 2])


# --- record= ------------------------------------------------------------------------------------


def test_record_maps_other_layouts(tmp_path):
    # A JSON header line, then the image; and .npy arrays; record() leaves one key out.
    items = []
    for i, (key, jpeg) in enumerate(photos(3)):
        header = json.dumps({"label": i + 1, "caption": f"photo {i}"}).encode()
        items.append((key, header + b"\n" + jpeg))
    items.append((b"skip-me", b"{}\n"))

    def record(key, value):
        header, _, image = value.partition(b"\n")
        meta = json.loads(header)
        if not meta:
            return None
        return {"{ext}": image, "cls": meta["label"], "txt": meta["caption"], "meta.json": meta}

    db = write_lmdb(tmp_path / "db", items)
    out = tmp_path / "out"
    result = pack(db, out, record=record)
    assert result.num_samples == 3
    assert not result.failed  # the key record() left out is not listed
    for (ref, label, members), (key, value) in zip(packed(out), sorted(items), strict=False):
        header, _, image = value.partition(b"\n")
        meta = json.loads(header)
        assert ref == key.decode() and label == meta["label"]
        meta_json = json.dumps(meta, separators=(",", ":")).encode()
        assert members == {"jpg": image, "txt": meta["caption"].encode(), "meta.json": meta_json}

    arrays = [np.arange(i + 2, dtype=np.float32) * i for i in range(3)]
    npys = []
    for a in arrays:
        buf = io.BytesIO()
        np.save(buf, a)
        npys.append(buf.getvalue())
    db2 = write_lmdb(tmp_path / "npy", [(b"%d" % i, v) for i, v in enumerate(npys)])
    out2 = tmp_path / "out2"
    result = pack(db2, out2, record=lambda key, value: {"emb.npy": value, "cls": int(key)})
    assert result.num_samples == 3 and not result.failed
    for i, (_, label, members) in enumerate(packed(out2)):
        assert label == i and members == {"emb.npy": npys[i]}
        np.testing.assert_array_equal(np.load(io.BytesIO(members["emb.npy"])), arrays[i])
    assert {f["name"]: f["dtype"] for f in manifest(out2)["fields"]}["emb.npy"] == "float32"

    def broken(key, value):
        raise KeyError("width")

    result = pack(db2, tmp_path / "out3", record=lambda k, v: {"emb.npy": v} if k != b"1" else 3)
    assert result.failed == [
        (f"{db2 / 'data.mdb'}: key '1'", "record() must return a dict of members or None, not 3")
    ]
    with pytest.raises(stoker.CorruptDataError, match=r"key '0'.*record\(\) raised KeyError"):
        pack(db2, tmp_path / "out4", record=broken, on_error="raise")


# --- pickles ------------------------------------------------------------------------------------


def test_is_pickle_reads_opcodes_only():
    for protocol in range(0, 6):
        assert is_pickle(pickle.dumps((b"\xff\xd8\xff", 3), protocol=protocol)), protocol
        assert is_pickle(pickle.dumps({"image": b"x", "label": 1}, protocol=protocol)), protocol
    jpeg = photos(1)[0][1]
    for value in (jpeg, png_bytes(), b"It is a dog.", b"(not a pickle).", b"", b"\x80\x01"):
        assert not is_pickle(value)


def test_pickled_values_refused_then_allowed(tmp_path):
    items = photos(3)
    values = [
        (items[0][0], pickle.dumps((items[0][1], 4))),  # (image bytes, label), protocol 5
        (items[1][0], pickle.dumps([items[1][1], np.int64(2)], protocol=2)),
        (
            items[2][0],
            pickle.dumps(
                {
                    "img": items[2][1],
                    "target": 7,
                    "caption": "a fish",
                    "emb": np.ones(3, np.float16),
                },
                protocol=0,
            ),
        ),
    ]
    db = write_lmdb(tmp_path / "db", values)
    with pytest.raises(stoker.InvalidArgumentError) as e:
        pack(db, tmp_path / "out")
    message = str(e.value)
    assert str(db / "data.mdb") in message and "pickled" in message
    assert "allow_pickle=True" in message and "record=fn" in message
    assert not (tmp_path / "out").exists()

    out = tmp_path / "out"
    with pytest.warns(UserWarning, match="allow_pickle=True"):
        result = pack(db, out, allow_pickle=True)
    assert result.num_samples == 3 and not result.failed
    samples = packed(out)
    by_key = dict(items)
    label_of = {items[0][0]: 4, items[1][0]: 2, items[2][0]: 7}
    assert [(s[0], s[1]) for s in samples] == [(k.decode(), label_of[k]) for k in sorted(by_key)]
    members = {ref.encode(): m for ref, _, m in samples}
    for key, _ in items[:2]:
        assert members[key] == {"jpg": by_key[key]}
    last = members[items[2][0]]
    assert list(last) == ["jpg", "caption.txt", "emb.npy"]
    assert last["jpg"] == items[2][1] and last["caption.txt"] == b"a fish"
    np.testing.assert_array_equal(np.load(io.BytesIO(last["emb.npy"])), np.ones(3, np.float16))

    # A pickle among other values, after the first: that value fails, the others pack.
    mixed = write_lmdb(tmp_path / "mixed", [items[0], (b"zz", pickle.dumps(items[1][1]))])
    result = pack(mixed, tmp_path / "out2")
    assert result.num_samples == 1
    ((where, why),) = result.failed
    assert where == f"{mixed / 'data.mdb'}: key 'zz'" and "allow_pickle=True" in why


# --- Caffe Datums -------------------------------------------------------------------------------


def test_caffe_datums_encoded_and_raw(tmp_path):
    jpegs = photos(2)
    rng = np.random.default_rng(3)
    rgb = [rng.integers(0, 256, size=(5, 7, 3), dtype=np.uint8) for _ in range(2)]
    grey = rng.integers(0, 256, size=(4, 6), dtype=np.uint8)

    def raw(pixels, label):  # as Caffe's CVMatToDatum: BGR, CHW
        chw = pixels[None] if pixels.ndim == 2 else pixels[:, :, ::-1].transpose(2, 0, 1)
        c, h, w = chw.shape
        return datum(chw.tobytes(), label, channels=c, height=h, width=w)

    items = [
        (b"00000000", datum(jpegs[0][1], 3, encoded=True)),
        (b"00000001", datum(jpegs[1][1], 0, encoded=True)),
        (b"00000002", raw(rgb[0], 5)),
        (b"00000003", raw(rgb[1], 1)),
        (b"00000004", raw(grey, 2)),
        (b"00000005", datum(png_bytes(), -1, encoded=True)),  # Caffe's "no label"
    ]
    bad = [
        (b"bad-0", datum(b"\x01" * 104, 1, channels=3, height=5, width=7)),  # 105 bytes needed
        (b"bad-1", datum(b"not an image", 1, encoded=True)),
        (b"bad-2", varint(4 << 3 | 2) + varint(1 << 62) + b"\xff\xd8\xff"),  # a length to 2^62
        (b"bad-3", varint(1 << 3) + b"\xff" * 12),  # a varint that never ends
        (b"bad-4", varint(6 << 3 | 5) + struct.pack("<f", 1.5)),  # float_data only
    ]
    db = write_lmdb(tmp_path / "db", items + bad)
    out = tmp_path / "out"
    result = pack(db, out)
    assert result.num_samples == len(items)
    where = {w.rpartition(": key ")[2]: r for w, r in result.failed}
    assert set(where) == {"'bad-0'", "'bad-1'", "'bad-2'", "'bad-3'", "'bad-4'"}
    assert "104 bytes of pixels" in where["'bad-0'"] and "channels=3" in where["'bad-0'"]
    assert "are not an image" in where["'bad-1'"]
    assert "as a Datum: a field of 4611686018427387904 bytes" in where["'bad-2'"]
    assert "as a Datum: a varint" in where["'bad-3'"]
    assert "float_data" in where["'bad-4'"]

    samples = packed(out)
    assert [s[1] for s in samples] == [3, 0, 5, 1, 2, -1]
    assert samples[0][2] == {"jpg": jpegs[0][1]} and samples[1][2] == {"jpg": jpegs[1][1]}
    assert samples[5][2] == {"png": png_bytes()}
    for (_, _, members), pixels in zip(samples[2:5], [*rgb, grey]):
        assert list(members) == ["png"]
        np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(members["png"]))), pixels)

    # Through the loader: the raw Datums' pixels, RGB, at their own size.
    sub = write_lmdb(tmp_path / "raw", items[2:4])
    out2 = tmp_path / "out2"
    pack(sub, out2)
    if not hasattr(stoker, "Loader"):
        pytest.skip("stoker.Loader is not there")
    pytest.importorskip("torch")
    fields = {
        "image": stoker.Image("png", size=(5, 7), geometry=stoker.Resize()),
        "label": stoker.Label("cls"),
    }
    (batch,) = list(stoker.Loader(out2, batch_size=2, train=False, fields=fields))
    assert batch["label"].tolist() == [5, 1]
    for got, pixels in zip(batch["image"], rgb):
        np.testing.assert_array_equal(got.permute(1, 2, 0).numpy(), pixels)


def test_datum_parser_bounds():
    d = parse_datum(datum(b"abc", -5, channels=1, height=1, width=3))
    assert (d.channels, d.height, d.width, d.data, d.label, d.encoded) == (
        1,
        1,
        3,
        b"abc",
        -5,
        False,
    )
    packed_floats = varint(6 << 3 | 2) + varint(8) + struct.pack("<2f", 1, 2)
    assert parse_datum(packed_floats).floats == 2
    for value, why in [
        (b"", "empty"),
        (varint(4 << 3 | 2) + varint(10) + b"short", "a field of 10 bytes"),
        (varint(9 << 3), "field 9"),
        (varint(4 << 3), "wire type 0"),
        (varint(6 << 3 | 2) + varint(3) + b"abc", "multiple of 4"),
        (varint(6 << 3 | 5) + b"ab", "runs past the end"),
        (b"\x08" + b"\x80" * 11, "longer than 10 bytes"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_datum(value)


# --- values that are no image, damaged files -----------------------------------------------------


def test_a_value_that_is_no_image(tmp_path):
    items = photos(2) + [(b"m/not-an-image", b'{"width": 3, "height": 4}')]
    db = write_lmdb(tmp_path / "db", items)
    result = pack(db, tmp_path / "out")
    assert result.num_samples == 2
    ((where, why),) = result.failed
    assert where == f"{db / 'data.mdb'}: key 'm/not-an-image'"
    assert why.startswith('the value (25 bytes, starting b\'{"width": 3, "he\') is not an encoded')
    assert "record=fn" in why
    with pytest.raises(stoker.CorruptDataError, match="key 'm/not-an-image': the value") as e:
        pack(db, tmp_path / "out2", on_error="raise")
    assert "is not an encoded image" in e.value.reason
    assert not (tmp_path / "out2").exists()


def test_bmp_values_become_png(tmp_path):
    bmp = io.BytesIO()
    pixels = np.asarray(Image.open(io.BytesIO(png_bytes(seed=4))))
    Image.fromarray(pixels).save(bmp, format="BMP")
    db = write_lmdb(tmp_path / "db", [(b"a", bmp.getvalue())])
    out = tmp_path / "out"
    pack(db, out)
    ((_, _, members),) = packed(out)
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(members["png"]))), pixels)


def many_images(tmp_path, n=300):
    """n small PNGs: an LMDB of two levels (a branch page above the leaves)."""
    items = [(b"k%04d" % i, png_bytes(4, 3, seed=i % 7)) for i in range(n)]
    return write_lmdb(tmp_path / "db", items), items


def test_truncated_and_foreign_files(tmp_path):
    db, _ = many_images(tmp_path)
    data = db / "data.mdb"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    for kw in ({}, {"format": "lmdb"}):
        with pytest.raises(stoker.CorruptDataError, match=f"{data}: truncated: .* pages of"):
            pack(db, tmp_path / "out", **kw)
    with pytest.raises(stoker.CorruptDataError, match="truncated"):
        pack(data, tmp_path / "out")

    other = tmp_path / "other"
    other.mkdir()
    (other / "data.mdb").write_bytes(b"\0" * 20000)
    with pytest.raises(stoker.CorruptDataError, match=f"{other / 'data.mdb'}: cannot be opened"):
        pack(other, tmp_path / "out")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(stoker.InvalidArgumentError, match="no data.mdb"):
        pack(empty, tmp_path / "out", format="lmdb")


def test_damage_found_while_reading(tmp_path):
    db, items = many_images(tmp_path)
    # A branch page's middle child pointed past the file's last page (LMDB's 64-bit layout:
    # page header pgno u64, pad u16, flags u16 (1: branch), lower u16, upper u16; then u16
    # offsets of nodes whose first 4 bytes are the child's page number).
    data = bytearray((db / "data.mdb").read_bytes())
    psize = 4096
    branches = 0
    for p in range(2, len(data) // psize):
        base = p * psize
        pgno, _, flags, lower, _ = struct.unpack_from("<QHHHH", data, base)
        if pgno == p and flags & 1:
            n = (lower - 16) // 2
            node = base + struct.unpack_from("<H", data, base + 16 + 2 * (n // 2))[0]
            struct.pack_into("<HH", data, node, 60000, 0)
            branches += 1
    assert branches == 1
    (db / "data.mdb").write_bytes(bytes(data))
    out = tmp_path / "out"
    result = pack(db, out)
    ((where, why),) = result.failed
    assert 0 < result.num_samples < len(items)
    last = items[result.num_samples - 1][0].decode()
    assert where == f"{db / 'data.mdb'}: after key {last!r}"
    assert why.startswith("the LMDB is damaged") and "MDB_PAGE_NOTFOUND" in why
    assert [s[2]["png"] for s in packed(out)] == [v for _, v in items[: result.num_samples]]
    with pytest.raises(stoker.CorruptDataError, match=f"after key {last!r}: the LMDB is damaged"):
        pack(db, tmp_path / "out2", on_error="raise")


# --- seeks, pickling, detection, the command line ------------------------------------------------


def test_jobs_from_any_start_and_pickling(tmp_path, monkeypatch):
    items = [(b"k%03d" % i, png_bytes(3, 2, seed=i)) for i in range(23)]
    items.append((b"__len__", b"23"))
    db = write_lmdb(tmp_path / "db", items)
    labels = {b"k%03d" % i: i % 4 for i in range(23)}
    source = LmdbSource(db, Options(), label=labels)
    assert len(source) == 23

    def read(src, start=0, stop=None):
        return [(j.ref, j.make().label, j.make().members) for j in src.jobs(start, stop)]

    monkeypatch.setattr(lmdb_source, "INDEX_STEP", 5)
    cold = read(LmdbSource(db, Options(), label=labels), 13, 19)  # no index yet: keys walked
    full = read(source)
    assert [r[0] for r in full] == ["k%03d" % i for i in range(23)]
    assert [r[1] for r in full] == [i % 4 for i in range(23)]
    assert source._index == [b"k000", b"k005", b"k010", b"k015", b"k020"]
    assert cold == full[13:19]
    for start, stop in [(0, 1), (4, 6), (5, 11), (13, 19), (20, None), (22, 40), (23, None)]:
        assert read(source, start, stop) == full[start:stop]  # from the index
    for part_start, part in source.partitions(3):
        assert read(part) == full[part_start : part_start + len(part)]

    copy = pickle.loads(pickle.dumps(source))
    assert copy._env is None and copy._index == []
    assert len(copy) == 23 and read(copy, 7, 12) == full[7:12]
    assert copy.fingerprint() == source.fingerprint()
    other = LmdbSource(db, Options(), label={**labels, b"k000": 3})
    assert other.fingerprint() != source.fingerprint()
    json_labels = tmp_path / "labels.json"
    json_labels.write_text(json.dumps({k.decode(): v for k, v in labels.items()}))
    from_file = pickle.loads(
        pickle.dumps(LmdbSource(db / "data.mdb", Options(), label=json_labels))
    )
    assert from_file._labels is None  # read again from the file, not carried
    assert read(from_file) == full
    source.close()
    copy.close()
    assert read(copy, 22) == full[22:]  # opened again


def test_a_forked_child_reads_its_parents_environment(tmp_path):
    # lmdb opens a file once per process: a forked worker goes on with its parent's handle.
    import multiprocessing

    db = write_lmdb(tmp_path / "db", [(b"k%d" % i, png_bytes(3, 2, seed=i)) for i in range(4)])
    source = LmdbSource(db, Options())
    assert len(source) == 4

    def child(queue):
        refs = [j.ref for j in source.jobs(1, 3)]
        source.close()
        queue.put((len(source), refs))

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    worker = ctx.Process(target=child, args=(queue,))
    worker.start()
    assert queue.get(timeout=60) == (4, ["k1", "k2"])
    worker.join(60)
    assert worker.exitcode == 0
    assert [j.ref for j in source.jobs(2)] == ["k2", "k3"]
    source.close()


def test_detection_format_and_a_single_file(tmp_path, imagenet_lmdb):
    db, items = imagenet_lmdb
    assert detect(db) == "lmdb" and detect(db / "data.mdb") == "lmdb"
    for src, kw in ((db / "data.mdb", {}), (db, {"format": "lmdb"})):
        out = tmp_path / f"out-{len(kw)}"
        assert pack(src, out, **kw).num_samples == len(items)
        assert [s[2] for s in packed(out)] == [
            {"png" if v[:4] == b"\x89PNG" else "jpg": v} for _, v in items
        ]
    single = write_lmdb(tmp_path / "images.mdb", photos(2), subdir=False)
    assert detect(single) == "lmdb"
    out = tmp_path / "single"
    assert pack(single, out).num_samples == 2
    assert [s[0] for s in packed(out)] == sorted(k.decode() for k, _ in photos(2))
    with pytest.raises(stoker.InvalidArgumentError, match="does not take members="):
        pack(db, tmp_path / "o", members={"jpg": "x"})


def test_without_the_lmdb_package(tmp_path, imagenet_lmdb, monkeypatch):
    db, _ = imagenet_lmdb
    monkeypatch.setitem(sys.modules, "lmdb", None)
    with pytest.raises(stoker.InvalidArgumentError, match="pip install lmdb"):
        pack(db, tmp_path / "out")


def test_command_line(tmp_path, imagenet_lmdb):
    db, items = imagenet_lmdb
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({k.decode(): i % 3 for i, (k, _) in enumerate(items)}))
    out = tmp_path / "out"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "stoker",
            "pack",
            str(db),
            str(out),
            "--format",
            "lmdb",
            "--label",
            str(labels),
            "--restart-interval",
            "0",
            "--quiet",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert f"packed {len(items)} samples" in r.stdout
    samples = packed(out)
    assert [s[1] for s in samples] == [i % 3 for i in range(len(items))]
    assert [next(iter(s[2].values())) for s in samples] == [v for _, v in items]
