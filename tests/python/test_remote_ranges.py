"""stoker.remote.ranges against a real HTTP server on loopback (tests/servers/ranges.py): a
file's tail in one request, byte ranges of the version that was opened, servers that answer
suffix ranges with 416 or ignore ranges altogether, and politeness: Retry-After and RateLimit
honoured from the server's own log times, a concurrency cap and a pause shared by two
processes, a redirect's location reused."""

from __future__ import annotations

import email.utils
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from stoker.errors import ShardIOError
from stoker.remote.ranges import RangeClient, RemoteNotFoundError
from stoker.remote.retry import Retry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from servers.ranges import RangeServer, sparse_file  # noqa: E402

FAST = Retry(tries=3, backoff=0.01, max_backoff=0.02)  # a backoff far below any server's time
SIZE = 9 * 2**20 + 123  # more than two of range_into's 4 MiB reads


@pytest.fixture(scope="module")
def data() -> bytes:
    return os.urandom(SIZE)


@pytest.fixture
def server(tmp_path, data):
    www = tmp_path / "www"
    (www / "sub").mkdir(parents=True)
    (www / "data.bin").write_bytes(data)
    (www / "small.bin").write_bytes(data[:100])
    (www / "other.bin").write_bytes(data[:5000])
    with RangeServer(www) as s:
        yield s


def requests(server: RangeServer) -> list[tuple[str, str, str | None, int]]:
    """(method, path without query, Range, status) of every request, once all are answered."""
    server.wait_idle()
    return [(r.method, r.path.split("?")[0], r.range, r.status) for r in server.log]


# --- tail and range -----------------------------------------------------------------------------
def test_tail_is_one_request_with_the_size_the_etag_and_the_last_bytes(server, data):
    client = RangeClient()
    tail = client.tail(server.url + "/data.bin", 64 * 1024)
    assert tail.data == data[-64 * 1024 :]
    assert tail.size == SIZE
    st = (server.root / "data.bin").stat()
    assert tail.etag == f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
    assert requests(server) == [("GET", "/data.bin", "bytes=-65536", 206)]
    stats = client.stats()
    assert (stats["requests"], stats["bytes"], stats["status"]) == (1, 65536, {"206": 1})
    assert list(stats["hosts"]) == [server.url.removeprefix("http://")]


def test_the_tail_of_a_file_shorter_than_asked_is_the_whole_file_in_one_request(server, data):
    tail = RangeClient().tail(server.url + "/small.bin", 1000)
    assert (tail.data, tail.size) == (data[:100], 100)
    assert len(requests(server)) == 1


def test_a_range_is_exactly_its_bytes_and_range_into_writes_them_at_their_offset(
    server, data, tmp_path
):
    client = RangeClient()
    url = server.url + "/data.bin"
    etag = client.tail(url, 10).etag
    assert client.range(url, 1000, 1010, etag) == data[1000:1010]
    out = sparse_file(tmp_path / "out.bin", SIZE)
    client.range_into(url, 5, SIZE - 7, out, etag)
    assert out.read_bytes() == bytes(5) + data[5 : SIZE - 7] + bytes(7)
    log = requests(server)
    assert [r[2] for r in log[1:]] == ["bytes=1000-1009", f"bytes=5-{SIZE - 8}"]
    assert {r.headers.get("If-Match") for r in server.log[1:]} == {etag}
    with pytest.raises(ShardIOError, match=rf"data.bin: asked for bytes .*file is {SIZE:,} bytes"):
        client.range(url, SIZE - 10, SIZE + 10, etag)


def test_range_into_stops_when_asked_without_sending(server, tmp_path):
    stop = threading.Event()
    stop.set()
    out = sparse_file(tmp_path / "out.bin", SIZE)
    with pytest.raises(InterruptedError):
        RangeClient().range_into(server.url + "/data.bin", 0, SIZE, out, stop=stop)
    assert requests(server) == []


def test_a_suffix_range_answered_416_falls_back_to_head_and_one_range(server, data):
    server.suffix_416 = True  # as Hugging Face's API redirects answer
    tail = RangeClient().tail(server.url + "/data.bin", 1000)
    assert (tail.data, tail.size) == (data[-1000:], SIZE)
    assert requests(server) == [
        ("GET", "/data.bin", "bytes=-1000", 416),
        ("HEAD", "/data.bin", None, 200),
        ("GET", "/data.bin", f"bytes={SIZE - 1000}-{SIZE - 1}", 206),
    ]
    assert server.whole_file_gets("data.bin") == 0


def test_the_416_fallback_through_a_redirect_stays_a_head(server, data):
    """Python's urllib follows a HEAD's redirect with a GET (of the whole file) unless told."""
    server.suffix_416, server.redirect_prefix = True, "/resolve/"
    tail = RangeClient().tail(server.url + "/resolve/data.bin", 1000)
    assert tail.data == data[-1000:]
    assert requests(server) == [
        ("GET", "/resolve/data.bin", "bytes=-1000", 302),
        ("GET", "/cdn/data.bin", "bytes=-1000", 416),
        ("HEAD", "/resolve/data.bin", None, 302),
        ("HEAD", "/cdn/data.bin", None, 200),
        ("GET", "/cdn/data.bin", f"bytes={SIZE - 1000}-{SIZE - 1}", 206),
    ]
    assert server.whole_file_gets("data.bin") == 0


def test_a_server_that_ignores_ranges_is_refused_before_its_body_is_sent(server):
    big = 50 * 2**20
    sparse_file(server.root / "big.bin", big, b"END")
    server.ignore_ranges = True
    client = RangeClient(retry=FAST)
    with pytest.raises(ShardIOError, match=r"big.bin: the server does not serve byte ranges"):
        client.tail(server.url + "/big.bin", 1000)
    with pytest.raises(ShardIOError, match=r"big.bin: the server does not serve byte ranges"):
        client.range(server.url + "/big.bin", 100, 200)
    log = requests(server)
    assert [r[0] for r in log] == ["GET"] * 3  # the suffix, its explicit range, the range
    assert all(r.sent < big / 10 for r in server.log), [r.sent for r in server.log]
    assert client.stats()["bytes"] == 0


def test_a_range_of_a_file_changed_since_its_tail_names_it_and_is_not_retried(server):
    changing = server.root / "changing.bin"
    changing.write_bytes(b"a" * 5000)
    client = RangeClient(retry=Retry(tries=5, backoff=0.01))
    url = server.url + "/changing.bin?X-Amz-Signature=secret"
    etag = client.tail(url, 100).etag
    changing.write_bytes(b"b" * 5000)
    os.utime(changing, ns=(time.time_ns(), time.time_ns() + 10**9))
    with pytest.raises(ShardIOError, match=r"/changing.bin: changed at the source") as e:
        client.range(url, 0, 100, etag)
    assert "secret" not in str(e.value)
    assert [r[3] for r in requests(server)] == [206, 412]


def test_a_missing_file_is_not_retried(server):
    with pytest.raises(RemoteNotFoundError, match=r"nothing.bin: not there \(HTTP 404\)") as e:
        RangeClient(retry=Retry(tries=5, backoff=0.01)).tail(server.url + "/nothing.bin", 10)
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, ShardIOError)
    assert len(requests(server)) == 1


def test_the_servers_folder_index_links_files_and_subfolders(server):
    with urllib.request.urlopen(server.url + "/") as r:
        index = r.read().decode()
    for name in ("data.bin", "other.bin", "small.bin", "sub/"):
        assert f'<a href="{name}">' in index


def test_other_urls_are_read_through_fsspec(data, tmp_path):
    fsspec = pytest.importorskip("fsspec")
    fsspec.filesystem("memory").pipe_file("/ranges-test/data.bin", data)
    client, url = RangeClient(), "memory://ranges-test/data.bin"
    tail = client.tail(url, 1000)
    assert (tail.data, tail.size) == (data[-1000:], SIZE)
    assert client.range(url, 10, 20) == data[10:20]
    out = sparse_file(tmp_path / "out.bin", SIZE)
    client.range_into(url, 5, SIZE - 7, out)
    assert out.read_bytes() == bytes(5) + data[5 : SIZE - 7] + bytes(7)
    assert client.stats()["bytes"] == 1000 + 10 + SIZE - 12
    with pytest.raises(RemoteNotFoundError, match="ranges-test/nothing.bin: not there"):
        client.range("memory://ranges-test/nothing.bin", 0, 10)
    fsspec.filesystem("memory").rm("/ranges-test/data.bin")


# --- the server's times -------------------------------------------------------------------------
def _retry_after_date() -> str:
    return email.utils.formatdate(time.time() + 2, usegmt=True)


@pytest.mark.serial  # timing: the retry's arrival against the time the server gave
@pytest.mark.parametrize(
    "status, retry_after, headers",
    [
        (429, "1", {}),
        (429, _retry_after_date, {}),
        (429, None, {"RateLimit": '"default";r=0;t=1', "RateLimit-Policy": '"default";q=9;w=60'}),
        (503, None, {"RateLimit-Reset": "1"}),
    ],
    ids=["retry-after-seconds", "retry-after-date", "ratelimit-t", "ratelimit-reset"],
)
def test_the_retry_is_not_sent_before_the_servers_time(server, data, status, retry_after, headers):
    when = retry_after() if callable(retry_after) else retry_after
    server.script(status, 1, retry_after=when, headers=headers)
    client = RangeClient(retry=FAST)
    assert client.range(server.url + "/data.bin", 0, 100) == data[:100]
    requests(server)
    first, second = server.log
    if callable(retry_after):
        at = email.utils.parsedate_to_datetime(when).timestamp()
    else:
        at = first.time + 1.0
    assert (first.status, second.status) == (status, 206)
    assert second.time >= at, f"retried {at - second.time:.3f} s early"
    stats = client.stats()
    assert stats["status"] == {str(status): 1, "206": 1} and stats["retries"] == 1
    assert stats["waited_s"] >= at - first.time - 0.05


def test_a_503_storm_ends_in_an_error_naming_the_file_the_status_and_the_tries(server):
    server.script(503, 100)
    client = RangeClient(retry=FAST)
    url = server.url + "/data.bin?X-Amz-Signature=secret"
    with pytest.raises(ShardIOError, match=r"/data.bin: HTTP 503 [\w ]+ \(3 tries\)") as e:
        client.range(url, 0, 10)
    assert "secret" not in str(e.value)
    assert [r[3] for r in requests(server)] == [503] * 3
    assert client.stats()["retries"] == 2


@pytest.mark.serial  # timing
def test_requests_per_second_spaces_the_requests(server):
    client = RangeClient(requests_per_second=10)
    for _ in range(5):
        client.range(server.url + "/data.bin", 0, 10)
    times = [r.time for r in server.log]
    assert times[-1] - times[0] >= 0.3  # 0.4 s at the client: the arrivals vary by some ms


# --- two processes ------------------------------------------------------------------------------
CHILD = """
import json, sys, threading, time
from pathlib import Path
from stoker.remote.ranges import RangeClient

url, state, threads, cap = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
client = RangeClient(state_dir=Path(state), max_concurrent=cap)
print("ready", flush=True)
sys.stdin.readline()
errors = []
def one():
    try:
        client.range(url, 0, 1000)
    except Exception as e:
        errors.append(repr(e))
workers = [threading.Thread(target=one) for _ in range(threads)]
for w in workers: w.start()
for w in workers: w.join()
print(json.dumps({"stats": client.stats(), "errors": errors}), flush=True)
"""


def _children(url: str, state: Path, count: int, threads: int, cap: int) -> list[dict]:
    """`count` processes, each ranging `url` from `threads` threads through a RangeClient on
    `state`, started together once all have imported stoker; what each reports."""
    argv = [sys.executable, "-c", CHILD, url, str(state), str(threads), str(cap)]
    procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(count)]  # fmt: skip
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        reports = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [r["errors"] for r in reports] == [[]] * count
    return reports


@pytest.mark.serial  # timing: requests held in flight by the server's latency
def test_the_concurrency_cap_holds_across_two_processes_sharing_a_state_dir(server, tmp_path):
    server.latency_s = 0.25
    reports = _children(server.url + "/data.bin", tmp_path / "state", 2, threads=3, cap=2)
    assert sum(r["stats"]["requests"] for r in reports) == 6
    spans = [(round(r.time, 3), r.status) for r in server.log]
    assert server.max_in_flight == 2, spans


@pytest.mark.serial  # timing: the second process's request against the pause the first was given
def test_a_pause_one_process_was_given_makes_another_wait(server, tmp_path):
    state = tmp_path / "state"
    server.script(429, 1, retry_after=2, match="/data.bin")
    with pytest.raises(ShardIOError, match=r"data.bin: HTTP 429 Too Many Requests \(1 tries\)"):
        RangeClient(state_dir=state, retry=Retry(tries=1)).range(server.url + "/data.bin", 0, 10)
    paused = server.log[0].time + 2
    assert float((state / f".http-{server.url.removeprefix('http://').replace(':', '_')}.pause")
                 .read_text()) >= paused  # fmt: skip
    (report,) = _children(server.url + "/other.bin", state, 1, threads=1, cap=8)
    requests(server)
    second = server.log[1]
    assert (second.path, second.status) == ("/other.bin", 206)
    assert second.time >= paused, f"sent {paused - second.time:.3f} s early"
    assert report["stats"]["waited_s"] > 0


def test_the_cap_holds_within_a_process_without_a_state_dir(server):
    server.latency_s = 0.1
    client = RangeClient(max_concurrent=2)
    workers = [threading.Thread(target=client.range, args=(server.url + "/data.bin", 0, 10))
               for _ in range(6)]  # fmt: skip
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(requests(server)) == 6 and server.max_in_flight == 2


# --- redirects ----------------------------------------------------------------------------------
def test_a_redirects_location_is_reused_for_later_ranges(server, data):
    server.redirect_prefix = "/resolve/"
    client = RangeClient()
    url = server.url + "/resolve/data.bin"
    tail = client.tail(url, 100)
    for start in (0, 1000, 5000):
        assert client.range(url, start, start + 10, tail.etag) == data[start : start + 10]
    paths = [r[1] for r in requests(server)]
    assert paths == ["/resolve/data.bin"] + ["/cdn/data.bin"] * 4
    assert client.stats()["status"] == {"302": 1, "206": 4}


def test_a_location_past_its_signatures_expiry_is_not_reused(server):
    server.redirect_prefix, server.redirect_expires_s = "/resolve/", 300  # 5 min: the margin
    client = RangeClient()
    for _ in range(3):
        client.range(server.url + "/resolve/data.bin", 0, 10)
    assert [r[1] for r in requests(server)].count("/resolve/data.bin") == 3


def test_a_kept_location_that_answers_403_is_resolved_again(server, data):
    server.redirect_prefix = "/resolve/"
    client = RangeClient(retry=Retry(tries=1))
    url = server.url + "/resolve/data.bin"
    client.range(url, 0, 10)
    server.script(403, 1, match="/cdn/")  # the signature expired early
    assert client.range(url, 10, 20) == data[10:20]
    assert [(r[1], r[3]) for r in requests(server)][2:] == [
        ("/cdn/data.bin", 403),
        ("/resolve/data.bin", 302),
        ("/cdn/data.bin", 206),
    ]
