"""hf://datasets/ORG/NAME URLs resolved to the Parquet files they name (stoker.remote.hf), against
a loopback stand-in for the Hub (tests/servers/fake_hub.py) answering huggingface_hub's own
requests: which files, pinned to which commit, in how many requests, cached where, and the errors
that name what went wrong."""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import threading
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stoker.errors import InvalidArgumentError, ShardIOError
from stoker.remote import hf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from servers.fake_hub import FakeHub  # noqa: E402

MAIN, TAG, CSV, CONVERTED = "a" * 40, "b" * 40, "c" * 40, "d" * 40
PARQUET_MAIN = [
    "data/sub/val-00000-of-00001.parquet",
    "data/test-00000-of-00001.parquet",
    "data/train-00000-of-00002.parquet",
    "data/train-00001-of-00002.parquet",
]


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    """Small real Parquet files, and the repositories that hold them: org/ds (main and tag v1),
    org/csv (no Parquet, but the Hub's conversion), org/empty (neither), org/private."""
    root = tmp_path_factory.mktemp("hub")

    def parquet(name: str, rows: int) -> Path:
        path = root / f"{name}.parquet"
        pq.write_table(
            pa.table({"id": list(range(rows)), "text": [f"row {i}" for i in range(rows)]}), path
        )
        return path

    def text(name: str, content: str) -> Path:
        path = root / name
        path.write_text(content)
        return path

    readme = text("README.md", "# a dataset\n")
    main = {p: parquet(p.replace("/", "_"), 10 + 7 * i) for i, p in enumerate(PARQUET_MAIN)}
    main["data/notes.txt"] = text("notes.txt", "not Parquet\n")
    return {
        "org/ds": {
            "main": (MAIN, {"README.md": readme, **main}),
            "v1": (TAG, {"README.md": readme, "data/train.parquet": parquet("v1", 3)}),
        },
        "org/csv": {
            "main": (CSV, {"README.md": readme, "data/train.csv": text("train.csv", "id\n1\n")}),
            "refs/convert/parquet": (
                CONVERTED,
                {
                    "default/train/0000.parquet": parquet("converted-train", 5),
                    "default/partial-test/0000.parquet": parquet("converted-test", 4),
                },
            ),
        },
        "org/empty": {"main": ("e" * 40, {"README.md": readme})},
        "org/private": {"main": ("f" * 40, {"x.parquet": parquet("private", 2)})},
    }


@pytest.fixture
def hub(repos):
    with FakeHub(repos, token="hf_right_secret", private={"org/private"}) as server:
        yield server


def resolve(hub: FakeHub, url: str, **kwargs) -> hf.HubListing:
    kwargs.setdefault("token", False)  # never a token of the machine's own
    return hf.resolve(url, endpoint=hub.endpoint, **kwargs)


def test_the_whole_repo_is_every_parquet_file_pinned_to_the_commit(hub, repos):
    listing = resolve(hub, "hf://datasets/org/ds")
    assert (listing.repo, listing.revision, listing.sha) == ("org/ds", "main", MAIN)
    assert listing.endpoint == hub.endpoint
    assert [f.path for f in listing.files] == PARQUET_MAIN
    local = repos["org/ds"]["main"][1]
    for f in listing.files:
        data = local[f.path].read_bytes()
        assert f.size == len(data)
        assert f.etag == hashlib.sha256(data).hexdigest()  # the LFS sha256
        assert f.url == f"{hub.endpoint}/datasets/org/ds/resolve/{MAIN}/{f.path}"
        request = urllib.request.Request(f.url, headers={"Range": "bytes=4-11"})
        with urllib.request.urlopen(request) as r:
            assert r.status == 206 and r.read() == data[4:12]
            assert r.headers["ETag"] == f'"{f.etag}"'
        footer = urllib.request.Request(f.url, headers={"Range": "bytes=-8"})  # Parquet's footer
        with urllib.request.urlopen(footer) as r:
            assert r.read() == data[-8:] and data[-4:] == b"PAR1"
    assert (hub.count("info"), hub.count("tree")) == (1, 1)


@pytest.mark.parametrize(
    "pattern, expected",
    [
        ("/data/train-*.parquet", PARQUET_MAIN[2:]),
        ("/data/*.parquet", PARQUET_MAIN[1:]),
        ("/d*/*.parquet", PARQUET_MAIN[1:]),  # '*' stays within a folder
        ("/**", PARQUET_MAIN),  # only the .parquet files a glob matches
        ("/**/*.parquet", PARQUET_MAIN),
        ("/data/**/val-*.parquet", PARQUET_MAIN[:1]),
        ("/data/train-0000[!0]-*.parquet", PARQUET_MAIN[3:]),
        ("/data", PARQUET_MAIN),
        ("/data/sub/", PARQUET_MAIN[:1]),
        ("/data/test-00000-of-00001.parquet", PARQUET_MAIN[1:2]),
    ],
)
def test_a_glob_a_folder_or_a_file_selects_its_parquet_files(hub, pattern, expected):
    listing = resolve(hub, f"hf://datasets/org/ds{pattern}")
    assert [f.path for f in listing.files] == expected
    assert (hub.count("info"), hub.count("tree")) == (1, 1)


def test_the_folder_above_a_glob_is_listed_alone_and_not_recursively(hub):
    resolve(hub, "hf://datasets/org/ds/data/train-*.parquet")
    (tree,) = [r.path for r in hub.requests if r.kind == "tree"]
    assert "/tree/" + MAIN + "/data?" in tree and "recursive=false" in tree


def test_a_revision_by_tag_or_sha(hub, repos):
    tagged = resolve(hub, "hf://datasets/org/ds@v1")
    assert (tagged.revision, tagged.sha) == ("v1", TAG)
    assert [f.path for f in tagged.files] == ["data/train.parquet"]
    with urllib.request.urlopen(tagged.files[0].url) as r:
        assert r.read() == repos["org/ds"]["v1"][1]["data/train.parquet"].read_bytes()
    hub.clear()
    pinned = resolve(hub, f"hf://datasets/org/ds@{MAIN}/data/sub")
    assert (pinned.revision, pinned.sha) == (MAIN, MAIN)
    assert [f.path for f in pinned.files] == PARQUET_MAIN[:1]
    assert (hub.count("info"), hub.count("tree")) == (0, 1)  # a sha needs no lookup


@pytest.mark.parametrize(
    "url",
    [
        "hf://datasets/org/csv@refs/convert/parquet",
        "hf://datasets/org/csv@refs%2Fconvert%2Fparquet",
    ],
)
def test_a_revision_with_slashes_plain_or_url_encoded(hub, url):
    listing = resolve(hub, url + "/default/train")
    assert (listing.revision, listing.sha) == ("refs/convert/parquet", CONVERTED)
    assert [f.path for f in listing.files] == ["default/train/0000.parquet"]
    assert "/resolve/" + CONVERTED + "/" in listing.files[0].url


def test_a_repo_without_parquet_is_read_from_the_hubs_conversion(hub, caplog):
    with caplog.at_level(logging.WARNING, logger="stoker.remote.hf"):
        listing = resolve(hub, "hf://datasets/org/csv")
    assert (listing.revision, listing.sha) == ("refs/convert/parquet", CONVERTED)
    assert [f.path for f in listing.files] == [
        "default/partial-test/0000.parquet",
        "default/train/0000.parquet",
    ]
    assert "first 5 GB of the splits test" in caplog.text
    assert (hub.count("info"), hub.count("tree")) == (2, 2)
    with pytest.raises(
        InvalidArgumentError, match="no Parquet files in the repository at revision main"
    ):
        resolve(hub, "hf://datasets/org/csv@main")  # a revision asked for is the one read


def test_a_listing_over_pages_follows_the_link_header(repos):
    with FakeHub(repos, page_size=2) as hub:
        listing = resolve(hub, "hf://datasets/org/ds")
        # 6 files and 2 folders (data, data/sub): 4 pages of 2
        assert (hub.count("info"), hub.count("tree")) == (1, 4)
        assert [f.path for f in listing.files] == PARQUET_MAIN
        assert all("cursor=" in r.path for r in hub.requests[2:])


def test_a_cached_listing_of_a_sha_is_never_listed_again(hub, tmp_path):
    first = resolve(hub, f"hf://datasets/org/ds@{MAIN}", cache_dir=tmp_path)
    (kept,) = tmp_path.glob("hf-*.json")
    assert len(kept.stem) == len("hf-") + 16
    hub.clear()
    again = resolve(hub, f"hf://datasets/org/ds@{MAIN}", cache_dir=tmp_path, max_age_s=0)
    assert again == first and hub.count() == 0


def test_a_cached_listing_of_a_branch_is_listed_again_once_old(hub, repos, tmp_path):
    url = "hf://datasets/org/ds"
    first = resolve(hub, url, cache_dir=tmp_path)
    hub.clear()
    assert resolve(hub, url, cache_dir=tmp_path) == first and hub.count() == 0
    hub.repos["org/ds"]["main"] = hub.repos["org/ds"]["v1"]  # main moves on
    (kept,) = tmp_path.glob("hf-*.json")
    old = json.loads(kept.read_text())
    kept.write_text(json.dumps({**old, "listed_at": old["listed_at"] - 601}))
    moved = resolve(hub, url, cache_dir=tmp_path)
    assert moved.sha == TAG and [f.path for f in moved.files] == ["data/train.parquet"]
    assert (hub.count("info"), hub.count("tree")) == (1, 1)
    hub.clear()
    resolve(hub, url, cache_dir=tmp_path, max_age_s=0)
    assert hub.count() == 2
    resolve(hub, url + "/data", cache_dir=tmp_path)  # another pattern: another listing
    assert len(list(tmp_path.glob("hf-*.json"))) == 2


def test_processes_sharing_a_cache_list_the_repo_once(hub, tmp_path):
    listings: list[hf.HubListing] = []

    def one() -> None:
        listings.append(resolve(hub, "hf://datasets/org/ds", cache_dir=tmp_path))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(listings) == 8 and all(x == listings[0] for x in listings)
    assert hub.count() == 2  # the lock file's flock serialises them: one lists, seven read


def test_the_endpoint_comes_from_hf_endpoint(hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint + "/")
    listing = hf.resolve("hf://datasets/org/ds@v1", token=False)
    assert listing.endpoint == hub.endpoint
    assert listing.files[0].url.startswith(hub.endpoint + "/datasets/org/ds/resolve/")


def test_a_private_repo_needs_the_token_and_no_message_shows_it(hub):
    listing = resolve(hub, "hf://datasets/org/private", token="hf_right_secret")
    assert [f.path for f in listing.files] == ["x.parquet"]
    with pytest.raises(ShardIOError, match="org/private: no such dataset") as e:
        resolve(hub, "hf://datasets/org/private", token="hf_wrong_secret")
    assert "secret" not in str(e.value) and "secret" not in repr(e.value.__cause__)


@pytest.mark.parametrize(
    "url, match",
    [
        ("hf://datasets/org/nope", "hf://datasets/org/nope: no such dataset"),
        ("hf://datasets/org/ds@v9", "hf://datasets/org/ds: no revision 'v9'"),
        ("hf://datasets/org/ds@refs/pr/3", "no revision 'refs/pr/3'"),
        (f"hf://datasets/org/ds@{'9' * 40}", f"no revision '{'9' * 40}'"),
    ],
)
def test_an_unknown_repo_or_revision_is_a_shard_io_error_naming_it(hub, url, match):
    with pytest.raises(ShardIOError, match=match):
        resolve(hub, url)


@pytest.mark.parametrize(
    "url",
    [
        "hf://datasets/org",
        "hf://org/model",
        "hf://datasets/org/name@",
        "hf://datasets/org/na me",
        "hf://datasets/org/ds/../x.parquet",
        "https://huggingface.co/datasets/org/ds",
    ],
)
def test_a_malformed_url_is_an_invalid_argument_and_asks_nothing(hub, url):
    with pytest.raises(InvalidArgumentError, match="hf://datasets/ORG/NAME|'.'|empty revision"):
        resolve(hub, url)
    assert hub.count() == 0


def test_no_parquet_is_an_invalid_argument_naming_repo_revision_and_pattern(hub):
    with pytest.raises(InvalidArgumentError, match=r"org/empty: .*at revision main.*conversion"):
        resolve(hub, "hf://datasets/org/empty")
    with pytest.raises(
        InvalidArgumentError, match=r"org/ds: .*'nothing-\*.parquet' at revision v1"
    ):
        resolve(hub, "hf://datasets/org/ds@v1/nothing-*.parquet")
    with pytest.raises(InvalidArgumentError, match=r"'no/such/folder' at revision v1"):
        resolve(hub, "hf://datasets/org/ds@v1/no/such/folder")


@pytest.mark.parametrize(
    "url, repo, revision, pattern",
    [
        ("hf://datasets/org/ds", "org/ds", None, ""),
        ("hf://datasets/org/ds/", "org/ds", None, ""),
        ("hf://datasets/org/ds@v1.0/data/", "org/ds", "v1.0", "data/"),
        ("hf://datasets/org/ds@refs/pr/12/a.parquet", "org/ds", "refs/pr/12", "a.parquet"),
        ("hf://datasets/org/ds@refs%2Fpr%2F12", "org/ds", "refs/pr/12", ""),
        ("hf://datasets/org/ds@refs/prs/x", "org/ds", "refs", "prs/x"),
        ("hf://datasets/org/ds/file@2.parquet", "org/ds", None, "file@2.parquet"),
    ],
)
def test_a_url_names_repo_revision_and_pattern(url, repo, revision, pattern):
    where = hf._parse(url)
    assert (where.repo, where.revision, where.pattern) == (repo, revision, pattern)


def test_is_hf():
    assert hf.is_hf("hf://datasets/org/ds") and hf.is_hf("HF://org/model")
    assert not hf.is_hf("https://huggingface.co/datasets/org/ds")
    assert not hf.is_hf(Path("hf:/x"))


def test_without_huggingface_hub_the_error_says_what_to_install(hub, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ImportError, match="pip install huggingface_hub"):
        resolve(hub, "hf://datasets/org/ds")
