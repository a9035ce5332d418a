"""stoker.pack(engine="ray") and `stoker pack --ray ADDRESS` (issue 13, item 5): a pack written
by Ray tasks is the local pack of the same source, sample for sample, whatever the number of
tasks. "The same" is read back through the engine: every sample's key and label, and the bytes
of every member, in order; the manifests agree on everything but the shard list and the total
bytes (a pack split over more tasks has more, smaller shards), and sources.tsv is the same file.

The Ray tests run a real cluster of one head node on loopback (`ray start --head --block
--node-ip-address 127.0.0.1`, 2 CPUs), started once for the module; they are skipped where
Ray is not installed. The tests of the split and merge without Ray run everywhere."""

from __future__ import annotations

import contextlib
import json
import pickle
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import make_image_folder
from test_pack_tables import coco  # noqa: F401  (the fixture, for request.getfixturevalue)

import stoker
from stoker import _core
from stoker.packing import ray as pack_ray
from stoker.errors import InvalidArgumentError
from stoker.packing.writer import Schema as _Schema

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from servers.ray_cluster import RayCluster  # noqa: E402

pytestmark = [
    pytest.mark.slow("a Ray cluster of its own in a network namespace: 5 s to start, 13 s for the "
                     "module on 2 cores"),
    pytest.mark.serial,  # a Ray cluster of its own: its nodes use every core
]

SHARD_SIZE = "64KB"  # the smallest allowed: several shards per task
MAX_SIDE = 200  # most of the images are larger: re-encoded, as well as restart-marked


def pack_samples(path: Path) -> list[tuple[str, int, list[tuple[str, bytes]]]]:
    """Every sample of a pack as the engine reads it: key, label, and each member's name and
    bytes in the order they are stored."""
    ds = _core.Dataset.open(str(path))
    out = []
    for i in range(len(ds)):
        rec = ds.record(i)
        members = [(m["name"], ds.read(i, m["name"])) for m in rec["members"]]
        out.append((rec["key"], rec["label"], members))
    return out


def assert_same_pack(local: Path, other: Path) -> None:
    assert pack_samples(other) == pack_samples(local)
    mine, theirs = (json.loads((p / "manifest.json").read_text()) for p in (local, other))
    del mine["shards"], mine["bytes"]
    shards = theirs.pop("shards")
    assert theirs.pop("bytes") == sum(s["bytes"] for s in shards)
    assert theirs == mine  # classes, counts, fields, failed (in order), options, source
    assert [s["tar"] for s in shards] == [f"shard-{i:06d}.tar" for i in range(len(shards))]
    assert sum(s["num_samples"] for s in shards) == mine["num_samples"]
    assert (other / "sources.tsv").read_bytes() == (local / "sources.tsv").read_bytes()
    assert sorted(p.name for p in other.iterdir()) == sorted(
        ["manifest.json", "sources.tsv"] + [s[k] for s in shards for k in ("tar", "index")]
    )
    result = stoker.verify(other, progress=False)
    assert result.clean and result.checked == mine["num_samples"]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """60 images in 3 classes (a PNG, a grey and a progressive JPEG among them), and two files
    that cannot be read: the first of class cat (so every part after the first has its keys
    shifted) and the last of class eel."""
    root = make_image_folder(tmp_path_factory.mktemp("ray-src") / "train", per_class=20)
    (root / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    (root / "eel" / "zz.jpg").write_text("<html>404</html>")
    return root


@pytest.fixture(scope="module")
def local_pack(source, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ray-local") / "pack"
    result = stoker.pack(
        source, out, shard_size=SHARD_SIZE, max_side=MAX_SIDE, threads=2, progress=False
    )
    assert result.num_samples == 60 and len(result.failed) == 2 and result.num_shards > 3
    assert result.reencoded > 0  # restart markers and max_side both apply
    return out


# --- the split, the renumbering and the merge, with tasks run here (no Ray needed) --------------


@pytest.fixture
def tasks_in_process(monkeypatch):
    """pack_ray's two entry points replaced by a serial run in this process: what stays is
    exactly what engine="ray" does around Ray."""

    @contextlib.contextmanager
    def connect(address):
        yield 2

    def run_tasks(fn, calls, *, num_cpus, progress, desc, on_result=None):
        results = []
        for i, args in enumerate(calls):
            results.append(fn(*pickle.loads(pickle.dumps(args))))  # as Ray ships them
            if on_result is not None:
                on_result(i, results[-1])
        return results

    monkeypatch.setattr(pack_ray, "connect", connect)
    monkeypatch.setattr(pack_ray, "run_tasks", run_tasks)


@pytest.mark.parametrize("tasks", [1, 2, 3, 7])
def test_parts_merged_equal_the_local_pack(tasks, source, local_pack, tmp_path, tasks_in_process):
    out = tmp_path / "pack"
    result = stoker.pack(
        source, out, shard_size=SHARD_SIZE, max_side=MAX_SIDE, engine="ray", tasks=tasks,
        progress=False,
    )  # fmt: skip
    failed = json.loads((local_pack / "manifest.json").read_text())["failed"]
    assert result.num_samples == 60
    assert result.failed == [(f["path"], f["reason"]) for f in failed]
    assert_same_pack(local_pack, out)
    assert not (tmp_path / ".pack.partial").exists()


def test_an_interrupted_ray_pack_writes_only_the_parts_not_finished(
    source, local_pack, tmp_path, monkeypatch
):
    """The driver stopped (Ctrl-C) after 2 of 4 parts: the next run writes the other 2."""

    @contextlib.contextmanager
    def connect(address):
        yield 2

    ran: list[str] = []

    def run_tasks(fn, calls, *, num_cpus, progress, desc, on_result=None, stop_after=None):
        results = []
        for i, args in enumerate(calls):
            if fn.__name__ == "write_part":
                ran.append(args[1])  # the part's prefix
            results.append(fn(*pickle.loads(pickle.dumps(args))))
            if on_result is not None:
                on_result(i, results[-1])
            if stop_after is not None and len(results) == stop_after:
                raise KeyboardInterrupt
        return results

    monkeypatch.setattr(pack_ray, "connect", connect)
    out = tmp_path / "pack"
    options = dict(shard_size=SHARD_SIZE, max_side=MAX_SIDE, engine="ray", tasks=4, progress=False)
    monkeypatch.setattr(pack_ray, "run_tasks", lambda *a, **k: run_tasks(*a, **k, stop_after=2))
    with pytest.raises(KeyboardInterrupt):
        stoker.pack(source, out, **options)
    assert not out.exists() and (tmp_path / ".pack.partial").is_dir()
    assert ran == ["part-00000-", "part-00001-"]
    monkeypatch.setattr(pack_ray, "run_tasks", run_tasks)
    result = stoker.pack(source, out, **options)
    assert ran[2:] == ["part-00002-", "part-00003-"]  # the finished parts are not written again
    assert result.resumed > 0
    assert_same_pack(local_pack, out)


def _image_files(tmp_path: Path) -> list[Path]:
    return sorted(Path(make_image_folder(tmp_path / "img", per_class=8)).rglob("*.*"))


def _tfrecord_source(tmp_path: Path, files: list[Path]) -> tuple[Path, dict]:
    tfrecord = pytest.importorskip("tfrecord")
    folder = tmp_path / "records"
    folder.mkdir()
    for shard in range(3):
        writer = tfrecord.TFRecordWriter(str(folder / f"train-{shard:05d}-of-00003"))
        for i, f in enumerate(files[shard::3]):
            writer.write({"image/encoded": (f.read_bytes(), "byte"),
                          "image/class/label": (i % 4, "int")})  # fmt: skip
        writer.close()
    return folder, {}


def _lmdb_source(tmp_path: Path, files: list[Path]) -> tuple[Path, dict]:
    lmdb = pytest.importorskip("lmdb")
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for f in files:
            txn.put(f"{f.parent.name}/{f.name}".encode(), f.read_bytes())
    env.close()
    return tmp_path / "db", {"label": _label_of_key}


def _label_of_key(key: str) -> int:  # module level: pickle (Ray's cloudpickle takes lambdas)
    return len(key) % 3


def _hdf5_source(tmp_path: Path, files: list[Path]) -> tuple[Path, dict]:
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "images.h5", "w") as h5:
        images = h5.create_dataset("images", (len(files),), dtype=h5py.vlen_dtype(np.uint8))
        for i, f in enumerate(files):
            images[i] = np.frombuffer(f.read_bytes(), np.uint8)
        h5.create_dataset("labels", data=np.arange(len(files)) % 5)
    return tmp_path / "images.h5", {"members": {"jpg": "images"}, "label": "labels"}


class _FilesDataset:
    """A torch Dataset as research code writes one (module level: it must pickle)."""

    def __init__(self, files: list[Path]):
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        return self.files[i].read_bytes(), i % 3


def _dataset_source(tmp_path: Path, files: list[Path]) -> tuple[object, dict]:
    return _FilesDataset(files), {}


def _parquet_source(tmp_path: Path, files: list[Path]) -> tuple[Path, dict]:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"jpg": [f.read_bytes() for f in files],
                      "label": [i % 4 for i in range(len(files))]})  # fmt: skip
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=5)
    return tmp_path / "t.parquet", {}


def _huggingface_source(tmp_path: Path, files: list[Path]) -> tuple[object, dict]:
    hf = pytest.importorskip("datasets")
    features = hf.Features({"image": hf.Image(), "label": hf.ClassLabel(names=["a", "b", "c"])})
    rows = {"image": [{"bytes": f.read_bytes(), "path": f.name} for f in files],
            "label": [i % 3 for i in range(len(files))]}  # fmt: skip
    hf.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "hf"))
    return hf.load_from_disk(str(tmp_path / "hf")).shuffle(seed=1), {}


SPLIT_SOURCES = {"tfrecord": _tfrecord_source, "lmdb": _lmdb_source, "hdf5": _hdf5_source,
                 "dataset": _dataset_source, "parquet": _parquet_source,
                 "huggingface": _huggingface_source}  # fmt: skip


@pytest.mark.parametrize("fmt", sorted(SPLIT_SOURCES))
def test_other_formats_split_by_range_equal_the_local_pack(fmt, tmp_path, tasks_in_process):
    """Every source that knows its length splits by range the same way (its ranges pickled,
    as Ray ships them)."""
    files = _image_files(tmp_path)
    src, options = SPLIT_SOURCES[fmt](tmp_path, files)
    options.update(shard_size=SHARD_SIZE, max_side=MAX_SIDE, progress=False)
    local = stoker.pack(src, tmp_path / "local", **options)
    assert local.num_samples == len(files) and local.source_format == fmt
    other = stoker.pack(src, tmp_path / "other", engine="ray", tasks=3, **options)
    assert other.num_samples == len(files) and other.failed == local.failed
    assert_same_pack(tmp_path / "local", tmp_path / "other")


def test_schema_merged_from_parts_equals_one_pass():
    names = ["jpg", "seg.png", "json", "boxes.npy"]
    dtypes = ["uint8", "float32", None]
    shapes = [None, [3], [4, 5], [6, 2], [1, 2, 3], [7, 1, 3]]
    rng = random.Random(0)
    for _ in range(300):
        infos = [
            (rng.choice(names), "array", rng.choice(dtypes), rng.choice(shapes))
            for _ in range(rng.randint(1, 12))
        ]
        whole = _Schema()
        for info in infos:
            whole.add(*info)
        cuts = sorted(rng.sample(range(len(infos) + 1), rng.randint(0, min(3, len(infos)))))
        merged = _Schema()
        for a, b in zip([0, *cuts], [*cuts, len(infos)], strict=True):
            part = _Schema()
            for info in infos[a:b]:
                part.add(*info)
            merged.merge(part)
        assert merged.to_list() == whole.to_list(), infos


def test_engine_arguments_are_checked(source, tmp_path):
    with pytest.raises(InvalidArgumentError, match="engine"):
        stoker.pack(source, tmp_path / "a", engine="spark", progress=False)
    with pytest.raises(InvalidArgumentError, match="engine='ray'"):
        stoker.pack(source, tmp_path / "b", tasks=2, progress=False)
    with pytest.raises(InvalidArgumentError, match="engine='ray'"):
        stoker.pack(source, tmp_path / "c", ray_address="127.0.0.1:1", progress=False)
    with pytest.raises(InvalidArgumentError, match="at least 1"):
        stoker.pack(source, tmp_path / "d", engine="ray", tasks=0, progress=False)


def test_more_threads_per_task_than_the_cluster_has_is_refused(source, tmp_path, tasks_in_process):
    with pytest.raises(InvalidArgumentError, match="threads=3 per task"):
        stoker.pack(source, tmp_path / "out", engine="ray", threads=3, progress=False)
    assert not list(tmp_path.iterdir())


def test_without_ray_installed_the_error_says_what_to_install(source, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'stoker\[ray\]'"):
        stoker.pack(source, tmp_path / "out", engine="ray", progress=False)
    assert not list(tmp_path.iterdir())  # the partial folder is gone


# --- on a Ray cluster on loopback ---------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster(inside_ray_host):
    """The address of a one-node Ray cluster with 2 CPUs on the test host of the Ray tests'
    network namespace, which this process enters for the rest of the module
    (servers/ray_cluster.py: `ray start --head --block`, stopped by SIGINT, never `ray stop`)."""
    pytest.importorskip("ray")
    try:
        cluster = RayCluster(head_cpus=2, netns=inside_ray_host)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    with cluster:
        yield cluster.address


@pytest.mark.parametrize("tasks", [1, 2, 3])
def test_ray_pack_equals_the_local_pack(tasks, ray_cluster, source, local_pack, tmp_path):
    out = tmp_path / "pack"
    result = stoker.pack(
        source, out, shard_size=SHARD_SIZE, max_side=MAX_SIDE, engine="ray",
        ray_address=ray_cluster, tasks=tasks, progress=False,
    )  # fmt: skip
    assert result.num_samples == 60 and len(result.failed) == 2
    assert result.num_shards >= stoker.inspect(local_pack)["shards"]
    assert_same_pack(local_pack, out)


def test_cli_pack_ray_address_equals_the_local_pack(ray_cluster, source, local_pack, tmp_path):
    out = tmp_path / "pack"
    cmd = [
        sys.executable, "-m", "stoker", "pack", str(source), str(out), "--ray", ray_cluster,
        "--shard-size", SHARD_SIZE, "--max-side", str(MAX_SIDE), "--quiet",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "packed 60 samples" in done.stdout
    assert_same_pack(local_pack, out)  # 2 tasks: one per CPU of the cluster


def test_ray_pack_of_a_table_equals_the_local_pack(ray_cluster, tmp_path):
    """Members of every kind, a ragged .npy (the schema merged across parts), rows that fail
    in the middle of parts, no restart markers."""
    rng = np.random.default_rng(1)
    src = make_image_folder(tmp_path / "images", classes=("a",), per_class=12)
    rows = []
    for i, image in enumerate(sorted(src.rglob("*.jpg"))):
        np.save(tmp_path / f"f{i}.npy", rng.random((i % 4 + 1, 3)).astype(np.float32))
        rows.append(
            {
                "jpg": str(image.relative_to(tmp_path)) if i != 4 else "missing.jpg",
                "feat.npy": f"f{i}.npy",
                "json": {"i": i, "tags": ["x"] * (i % 3)},
                "txt": f"caption {i}",
                "label": ["even", "odd"][i % 2] if i != 7 else None,
            }
        )
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    local, ray_pack = tmp_path / "local", tmp_path / "ray"
    options = dict(shard_size=SHARD_SIZE, restart_interval=None, progress=False)
    stoker.pack(tmp_path / "t.jsonl", local, **options)
    result = stoker.pack(
        tmp_path / "t.jsonl", ray_pack, engine="ray", ray_address=ray_cluster, tasks=3, **options
    )
    assert result.num_samples == len(rows) - 1 and len(result.failed) == 1
    assert_same_pack(local, ray_pack)


def pack_coco_both_ways(tmp_path, request, **engine) -> tuple[Path, Path]:
    ann_path, images, _ = request.getfixturevalue("coco")  # 3 images and a missing one
    local, other = tmp_path / "local", tmp_path / "other"
    options = dict(images=images, shard_size=SHARD_SIZE, max_side=40, progress=False)
    stoker.pack(ann_path, local, **options)
    result = stoker.pack(ann_path, other, engine="ray", tasks=3, **options, **engine)
    assert result.num_samples == 3 and len(result.failed) == 1  # gone.jpg, the last
    return local, other


def test_coco_parts_merged_equal_the_local_pack(tmp_path, request, tasks_in_process):
    """Box class counts and crowd annotations summed over the parts; masks and boxes scaled
    by max_side alike."""
    local, other = pack_coco_both_ways(tmp_path, request)
    assert json.loads((other / "manifest.json").read_text())["crowd_annotations"] == 1
    assert_same_pack(local, other)


def test_ray_pack_of_coco_equals_the_local_pack(ray_cluster, tmp_path, request):
    assert_same_pack(*pack_coco_both_ways(tmp_path, request, ray_address=ray_cluster))
