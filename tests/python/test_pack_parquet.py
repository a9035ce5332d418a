"""stoker.pack from Parquet files and Hugging Face datasets (the object, its save_to_disk folder,
its Parquet export): images byte for byte, ClassLabel names as the classes, other columns as
arrays, text and JSON; damaged files located; any range of rows read without the rows before
it; and a file far larger than the memory the pack uses."""

import json
import pickle
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import os

import pytest
from conftest import shared_data

import stoker
from stoker import _core
from stoker.packing.members import Options
from stoker.packing.sources import detect, open_source

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it


def jpegs(n):
    files = sorted((shared_data() / "imagenet-sample").glob("*.JPEG"))[:n]
    assert len(files) == n
    return files


def manifest(out):
    return json.loads((out / "manifest.json").read_text())


def packed(out):
    """[(label, {member: bytes})] of every sample of a pack."""
    ds = _core.Dataset.open(str(out))
    samples = []
    for i in range(len(ds)):
        rec = ds.record(i)
        samples.append((rec["label"], {m["name"]: ds.read(i, m["name"]) for m in rec["members"]}))
    return samples


def sources(out):
    return [line.split("\t") for line in (out / "sources.tsv").read_text().splitlines()]


def pack(src, out, **kw):
    return stoker.pack(src, out, restart_interval=None, progress=False, **kw)


def npy(data):
    import io

    return np.load(io.BytesIO(data), allow_pickle=False)


# --- plain Parquet written by pyarrow -----------------------------------------------------------


def write_table(path, n=5, row_group_size=2, **kw):
    files = jpegs(n)
    table = pa.table(
        {
            "key": [f"k{i}" for i in range(n)],
            "jpg": [f.read_bytes() for f in files],
            "label": pa.array([i % 3 for i in range(n)], pa.int32()),
            "emb": pa.array([[i, i + 0.5, -1.0] for i in range(n)], pa.list_(pa.float32())),
            "caption": [f"caption {i} \u00e9" for i in range(n)],
            "meta": [{"id": i, "tags": ["a", "b"][: i % 3]} for i in range(n)],
            "score": pa.array([i / 4 for i in range(n)], pa.float16()),
        }
    )
    pq.write_table(table, path, row_group_size=row_group_size, **kw)
    return table


def test_parquet_columns_round_trip(tmp_path):
    src = tmp_path / "t.parquet"
    table = write_table(src)
    out = tmp_path / "out"
    result = pack(src, out)
    assert result.num_samples == 5 and not result.failed
    m = manifest(out)
    assert m["source_format"] == "parquet"
    assert m["classes"] == ["0", "1", "2"] and m["class_counts"] == [2, 2, 1]
    fields = {f["name"]: f for f in m["fields"]}
    assert list(fields) == ["jpg", "emb.npy", "caption.txt", "meta.json", "score.npy", "cls"]
    assert fields["emb.npy"]["dtype"] == "float32" and fields["emb.npy"]["max_shape"] == [3]
    assert fields["score.npy"]["dtype"] == "float16" and fields["score.npy"]["max_shape"] == []
    rows = table.to_pylist()
    for (label, members), row in zip(packed(out), rows, strict=True):
        assert label == row["label"]
        assert members["jpg"] == row["jpg"]  # byte for byte
        assert npy(members["emb.npy"]).tolist() == row["emb"]
        assert npy(members["emb.npy"]).dtype == np.float32
        assert npy(members["score.npy"]) == np.float16(row["score"])
        assert members["caption.txt"].decode() == row["caption"]
        assert json.loads(members["meta.json"]) == row["meta"]
        assert "key.txt" not in members  # the key is the record's reference
    assert [s[2:] for s in sources(out)] == [[f"{src}: row {i}", f"k{i}"] for i in range(5)]


def test_images_as_structs_nulls_and_relative_paths(tmp_path):
    a, b = jpegs(2)
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "b.jpg").write_bytes(b.read_bytes())
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # Image() without metadata
    table = pa.table(
        {
            "image": pa.array(
                [
                    {"bytes": a.read_bytes(), "path": "a.jpg"},
                    {"bytes": None, "path": "img/b.jpg"},  # read from the file, beside the table
                    None,
                    {"bytes": b"not an image", "path": None},
                    {"bytes": None, "path": "img/missing.jpg"},
                ],
                image,
            ),
            "class": [4, 1, 0, 2, 3],
            "note": ["x", None, "z", "w", "v"],
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    out = tmp_path / "out"
    result = pack(tmp_path / "t.parquet", out)
    assert result.num_samples == 2
    where = [w for w, _ in result.failed]
    assert where == [f"{tmp_path / 't.parquet'}: row {i}" for i in (2, 3, 4)]
    assert "no image (a null value)" in result.failed[0][1]
    assert "missing.jpg" in result.failed[2][1]
    (la, ma), (lb, mb) = packed(out)
    assert (la, lb) == (4, 1)  # a column named "class" is the label
    assert ma == {"jpg": a.read_bytes(), "note.txt": b"x", "cls": b"4"}
    assert mb == {"jpg": b.read_bytes(), "cls": b"1"}  # a null: a member the row does not have
    with pytest.raises(stoker.CorruptDataError, match=r"t\.parquet: row 2: .*no image"):
        pack(tmp_path / "t.parquet", tmp_path / "raise", on_error="raise")


def test_members_and_label_named(tmp_path):
    files = jpegs(4)
    table = pa.table(
        {
            "picture": [f.read_bytes() for f in files],
            "species": ["eel", "cat", "eel", "dog"],
            "text": [f"t{i}" for i in range(4)],
            "target": [3, 1, 0, 2],
            "other": [0.5] * 4,
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    out = tmp_path / "out"
    members = {"jpg": "picture", "caption.txt": "text"}
    pack(tmp_path / "t.parquet", out, members=members, label="target")
    assert [f["name"] for f in manifest(out)["fields"]] == ["jpg", "caption.txt", "cls"]
    got = packed(out)
    assert [label for label, _ in got] == [3, 1, 0, 2]
    assert [m["jpg"] for _, m in got] == [f.read_bytes() for f in files]
    assert [m["caption.txt"] for _, m in got] == [b"t0", b"t1", b"t2", b"t3"]

    out = tmp_path / "by-name"
    pack(tmp_path / "t.parquet", out, members={"jpg": "picture"}, label="species")
    assert manifest(out)["classes"] == ["cat", "dog", "eel"]  # names, ids in sorted order
    assert [label for label, _ in packed(out)] == [2, 0, 2, 1]

    for bad in ({"members": {"jpg": "photo"}}, {"label": "labels"}):
        with pytest.raises(stoker.InvalidArgumentError, match="picture, species, text, target"):
            pack(tmp_path / "t.parquet", tmp_path / "bad", **bad)
    with pytest.raises(stoker.InvalidArgumentError, match="not a member name"):
        pack(tmp_path / "t.parquet", tmp_path / "bad", members={"a b": "text"})
    with pytest.raises(stoker.InvalidArgumentError, match="holds double"):
        pack(tmp_path / "t.parquet", tmp_path / "bad", label="other")


# --- Hugging Face datasets --------------------------------------------------------------------


NAMES = ["tench", "goldfish", "shark"]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """A datasets.Dataset of real JPEGs with Image and ClassLabel features, its save_to_disk
    folder and its Parquet export."""
    datasets = pytest.importorskip("datasets")
    files = jpegs(12)
    features = datasets.Features(
        image=datasets.Image(),
        label=datasets.ClassLabel(names=NAMES),
        caption=datasets.Value("string"),
        emb=datasets.Sequence(datasets.Value("float32")),
        id=datasets.Value("int64"),
    )
    rows = {
        "image": [str(f) for f in files],  # paths: the object and Parquet export keep them
        "label": [i % 3 for i in range(12)],
        "caption": [f.stem for f in files],
        "emb": [[i, -i / 2] for i in range(12)],
        "id": [100 + i for i in range(12)],
    }
    ds = datasets.Dataset.from_dict(rows, features=features)
    root = tmp_path_factory.mktemp("hf")
    ds.save_to_disk(str(root / "saved"))  # embeds the images' bytes
    ds.to_parquet(str(root / "export.parquet"))
    return ds, root, files


def check_hf_pack(out, files, order, source_format):
    m = manifest(out)
    assert m["source_format"] == source_format
    assert m["classes"] == NAMES
    assert [f["name"] for f in m["fields"]] == ["jpg", "caption.txt", "emb.npy", "id.npy", "cls"]
    got = packed(out)
    assert len(got) == len(order)
    for (label, members), i in zip(got, order, strict=True):
        assert label == i % 3
        assert members["jpg"] == files[i].read_bytes()
        assert members["caption.txt"].decode() == files[i].stem
        assert npy(members["emb.npy"]).tolist() == [i, -i / 2]
        assert npy(members["id.npy"]) == 100 + i
    assert [s[3] for s in sources(out)] == [str(100 + i) for i in order]  # the id: its reference


@pytest.mark.parametrize("form", ["object", "save_to_disk", "parquet export"])
def test_hugging_face_dataset_round_trips(tmp_path, hf, form):
    ds, root, files = hf
    src = {"object": ds, "save_to_disk": root / "saved", "parquet export": root / "export.parquet"}
    out = tmp_path / "out"
    result = pack(src[form], out, shard_size="300KB")
    assert result.num_samples == 12 and not result.failed
    fmt = "parquet" if form == "parquet export" else "huggingface"
    check_hf_pack(out, files, list(range(12)), fmt)
    assert len(manifest(out)["shards"]) > 1


def test_a_shuffled_selection_packs_in_its_visible_order(tmp_path, hf):
    import datasets

    _, root, files = hf
    saved = datasets.load_from_disk(str(root / "saved"))  # memory-mapped
    view = saved.shuffle(seed=0).select(range(10))
    order = [i - 100 for i in view["id"]]
    assert order != list(range(10))
    out = tmp_path / "out"
    pack(view, out)
    check_hf_pack(out, files, order, "huggingface")


def test_hugging_face_pack_through_the_loader(tmp_path, hf):
    pytest.importorskip("torch")
    ds, _, _ = hf
    out = tmp_path / "out"
    pack(ds, out)
    fields = {
        "image": stoker.Image("jpg", size=(32, 32), geometry=stoker.Resize()),
        "label": stoker.Label("cls"),
        "caption": stoker.Text("caption.txt"),
    }
    seen_labels, seen_captions = [], []
    for batch in stoker.Loader(out, batch_size=5, train=False, fields=fields):
        assert batch["image"].shape[1:] == (3, 32, 32)
        seen_labels += batch["label"].tolist()
        seen_captions += list(batch["caption"])
    assert seen_labels == ds["label"] and seen_captions == ds["caption"]


# --- damaged files ------------------------------------------------------------------------------


def test_a_truncated_file_is_one_located_failure(tmp_path):
    (tmp_path / "src").mkdir()
    write_table(tmp_path / "src" / "a.parquet", n=4)
    write_table(tmp_path / "src" / "b.parquet", n=3)
    whole = (tmp_path / "src" / "b.parquet").read_bytes()
    (tmp_path / "src" / "b.parquet").write_bytes(whole[: len(whole) // 2])
    out = tmp_path / "out"
    result = pack(tmp_path / "src", out)
    assert result.num_samples == 4
    ((where, why),) = result.failed
    assert where == str(tmp_path / "src" / "b.parquet")
    assert "not a readable Parquet file" in why
    with pytest.raises(stoker.CorruptDataError, match=r"b\.parquet: not a readable Parquet"):
        pack(tmp_path / "src", tmp_path / "raise", on_error="raise")


def damage_row_group(path, group):
    """Flips bytes in the middle of a row group's image data (the file has page checksums)."""
    column = pq.read_metadata(path).row_group(group).column(1)
    assert column.path_in_schema == "jpg"
    middle = column.data_page_offset + column.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[middle : middle + 16] = bytes(b ^ 0xFF for b in data[middle : middle + 16])
    path.write_bytes(bytes(data))


def test_a_damaged_row_group_is_one_located_failure_the_rest_packed(tmp_path):
    src = tmp_path / "t.parquet"
    table = write_table(src, n=6, row_group_size=2, write_page_checksum=True,
                        use_dictionary=False)  # fmt: skip
    damage_row_group(src, 1)
    out = tmp_path / "out"
    result = pack(src, out)
    assert result.failed == [(f"{src}: row group 1 (rows 2-3)", result.failed[0][1])]
    assert "unreadable" in result.failed[0][1]
    got = packed(out)
    assert [m["jpg"] for _, m in got] == [table["jpg"][i].as_py() for i in (0, 1, 4, 5)]
    assert [s[2] for s in sources(out)] == [f"{src}: row {i}" for i in (0, 1, 4, 5)]
    with pytest.raises(stoker.CorruptDataError, match=r"t\.parquet: row group 1 \(rows 2-3\)"):
        pack(src, tmp_path / "raise", on_error="raise")
    # A range after the damage reads nothing before it: no failure.
    source = open_source(src, None, Options())
    assert [j.make().members[0][1] for j in source.jobs(4)] == table["jpg"].to_pylist()[4:]


def test_a_pack_interrupted_after_a_damaged_row_group_resumes_without_repeating(
    tmp_path, monkeypatch
):
    """A damaged row group fails as one job standing for all its rows: a resumed pack starts
    after them, not in their middle (no row written twice)."""
    from stoker.packing.sources import parquet

    src = tmp_path / "t.parquet"
    write_table(src, n=12, row_group_size=2, write_page_checksum=True, use_dictionary=False)
    damage_row_group(src, 1)
    options = dict(shard_size="64KB", threads=1)  # a shard, so a checkpoint, per image
    whole = pack(src, tmp_path / "whole", **options)
    assert whole.num_samples == 10
    real, calls = parquet.row_sample, {"n": 0}

    def interrupted(*args):
        calls["n"] += 1
        if calls["n"] == 7:  # rows 0, 1, then 4..7 written; row 8 interrupted
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(parquet, "row_sample", interrupted)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        pack(src, out, **options)
    monkeypatch.setattr(parquet, "row_sample", real)
    result = pack(src, out, **options)
    assert result.resumed >= 4
    assert result.num_samples == 10 and result.failed == whole.failed
    assert sources(out) == sources(tmp_path / "whole")
    assert packed(out) == packed(tmp_path / "whole")


# --- formats, ranges, pickling, the command line --------------------------------------------------


def test_format_named_and_detected(tmp_path, hf):
    ds, root, files = hf
    write_table(tmp_path / "t.parquet", n=3)
    (tmp_path / "folder").mkdir()
    write_table(tmp_path / "folder" / "part-1.parquet", n=2)
    table = pq.read_table(tmp_path / "t.parquet")
    with pa.OSFile(str(tmp_path / "t.arrow"), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table, max_chunksize=2)
    with pa.OSFile(str(tmp_path / "s.arrow"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table, max_chunksize=2)
    assert detect(tmp_path / "t.parquet") == "parquet"
    assert detect(tmp_path / "folder") == "parquet"
    assert detect(str(tmp_path / "*.parquet")) == "parquet"
    assert detect(tmp_path / "t.arrow") == "parquet"
    assert detect(root / "saved") == "huggingface"
    assert detect(ds) == "huggingface"
    for src, fmt, n in [
        (tmp_path / "t.arrow", None, 3),
        (tmp_path / "s.arrow", None, 3),
        (str(tmp_path / "*.parquet"), None, 3),
        (tmp_path / "folder", None, 2),
        (tmp_path / "t.parquet", "huggingface", 3),  # a Parquet export named as what it is
        (root / "saved", "parquet", 12),  # its Arrow files, features from their metadata
    ]:
        out = tmp_path / f"out-{src.name if hasattr(src, 'name') else 'glob'}-{fmt}"
        result = pack(src, out, format=fmt)
        assert result.num_samples == n
        assert manifest(out)["source_format"] == (fmt or "parquet")
        first = packed(out)[0][1]
        assert first["jpg"] == files[0].read_bytes()
    assert manifest(tmp_path / "out-saved-parquet")["classes"] == NAMES
    with pytest.raises(stoker.InvalidArgumentError, match="IterableDataset: stoker.pack reads"):
        stoker.pack(ds.to_iterable_dataset(), tmp_path / "x", progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="does not take images="):
        stoker.pack(tmp_path / "t.parquet", tmp_path / "x", images=tmp_path, progress=False)


def job_outputs(jobs):
    return [(j.where, j.ref, j.make().members) for j in jobs]


def test_any_range_reads_as_the_whole(tmp_path):
    src = tmp_path / "t.parquet"
    write_table(src, n=11, row_group_size=3)
    assert pq.read_metadata(src).num_row_groups == 4
    source = open_source(src, None, Options())
    assert len(source) == 11
    whole = job_outputs(source.jobs())
    assert len(whole) == 11
    for start, stop in [(4, 9), (3, 6), (7, 8), (10, None), (0, 2), (5, 5), (9, 40)]:
        assert job_outputs(source.jobs(start, stop)) == whole[start:stop]
    parts = source.partitions(3)
    assert [p for p, _ in parts] == [0, 3, 7]
    assert [o for _, part in parts for o in job_outputs(part.jobs())] == whole


def test_sources_pickle(tmp_path, hf):
    ds, root, _ = hf
    write_table(tmp_path / "t.parquet", n=4)
    for src in (tmp_path / "t.parquet", root / "saved", ds):
        source = open_source(src, None, Options())
        twin = pickle.loads(pickle.dumps(source))
        assert len(twin) == len(source) and twin.classes == source.classes
        assert job_outputs(twin.jobs(1, 3)) == job_outputs(source.jobs(1, 3))
        assert twin.fingerprint() == source.fingerprint() is not None


def test_command_line(tmp_path):
    write_table(tmp_path / "t.parquet", n=4)
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "stoker", "pack", str(tmp_path / "t.parquet"), str(out),
         "--label", "label", "--quiet", "--restart-interval", "0"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "packed 4 samples" in r.stdout
    assert manifest(out)["source_format"] == "parquet"
    assert [label for label, _ in packed(out)] == [0, 1, 2, 0]


# --- memory -------------------------------------------------------------------------------------


WRITE_BIG = """
import sys
from pathlib import Path
import pyarrow as pa, pyarrow.parquet as pq
out, target, folder = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
images = [p.read_bytes() for p in sorted(folder.glob("*.JPEG"))[:200]]  # about 20 MB
schema = pa.schema([("jpg", pa.binary()), ("label", pa.int64())])
written = i = 0
with pq.ParquetWriter(out, schema, compression="none", use_dictionary=False) as writer:
    while written < target:  # row groups of about 8 MB, written one at a time
        rows = []
        while sum(map(len, rows)) < 8 << 20:
            rows.append(images[i % len(images)])
            i += 1
        writer.write_table(pa.table({"jpg": rows, "label": [k % 10 for k in range(len(rows))]}))
        written += sum(map(len, rows))
print(i)
"""

PACK_BIG = """
import sys
import stoker, pyarrow.parquet, numpy

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

open("/proc/self/clear_refs", "w").write("5")  # the high-water mark restarts from here
before = status("VmRSS")
result = stoker.pack(sys.argv[1], sys.argv[2], threads=2, restart_interval=0, progress=False)
print(result.num_samples, len(result.failed), status("VmHWM") - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.slow("a 192 MB Parquet file made, then packed under a 128 MB budget: 4-5 s")
def test_a_file_larger_than_the_memory_budget_packs_in_flat_memory(tmp_path):
    if "libasan" in os.environ.get("LD_PRELOAD", ""):  # make test-asan-python
        pytest.skip("AddressSanitizer keeps freed memory in quarantine: the peak says nothing")
    # measured: about 60 MB of growth at any size. A file half as large again as the budget is
    # enough: a pack that held it whole (or all its row groups) would grow past the budget.
    size, budget = 192 << 20, 128 << 20
    src = tmp_path / "big.parquet"
    folder = shared_data() / "imagenet-sample"
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(WRITE_BIG), str(src), str(size),
                        str(folder)], capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = int(r.stdout)
    assert src.stat().st_size > size
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(PACK_BIG), str(src),
                        str(tmp_path / "out")], capture_output=True, text=True)  # fmt: skip
    src.unlink()
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
    assert r.returncode == 0, r.stderr
    samples, failed, growth = map(int, r.stdout.split())
    assert (samples, failed) == (rows, 0)
    assert growth < budget, f"packing a {size >> 20} MB file grew the process {growth >> 20} MB"
