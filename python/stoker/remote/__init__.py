"""Packs and WebDataset shards in object storage: ``s3://``, ``gs://``, ``http(s)://`` or any
fsspec URL.

A remote pack is read through a local cache folder. Its manifest and shard indexes (small) are
fetched when it is opened; each shard (a .tar) is fetched whole when the pass needs it, into the
same folder, and the C++ engine reads it there as a local file (`_core.ShardGate` is where the
engine's threads wait for a shard and where the fetcher hands it over).

Foreign WebDataset shards (a ``.tar`` URL, WebDataset's brace notation
``s3://b/train-{000000..000099}.tar``, a glob, a list of URLs, or a folder URL with ``.tar`` files
and no manifest) have no index: the first open on a machine fetches each shard once, indexes it
(every member's CRC32C included) and keeps the indexes in the cache folder with a manifest made
for them, so that from then on they are read exactly like a pack. A shard whose size or ETag
changes at the source is indexed again.

The cache folder:
- a download goes to ``NAME.part-PID`` and becomes ``NAME`` by rename only once its size and
  every member's CRC32C (from the index) are right, so a reader never sees a partial shard; a
  part whose process was killed is deleted by the next one to open the folder or make room;
- it holds at most ``cache_limit`` bytes of shards (finished and in progress: a download reserves
  its full size before it starts). To make room, shards that no process on the machine has
  asked to keep are deleted first; this process's own, least soon needed, next;
- processes on one machine (the ranks of a job) share it: a shard is fetched by one of them, the
  others wait for it (an flock per shard), and each process holds a shared flock on the shards
  it keeps, so that another does not delete them;
- a deleted shard that a reader still has open is read to the end: the engine keeps each
  fetched shard open until it is evicted from the gate, so deleting a file never breaks a read
  (the kernel frees its space when the last reader closes it).

Credentials come the way fsspec and its backends take them (environment variables, config
files, instance roles); stoker has no option for them, and the URLs in its messages have any
``user:password@`` removed.

The package, one concern a module: `urls` (what a URL names, and removing its credentials),
`retry` (how a failed fetch is tried again), `cache` (the shared bounded cache folder: its locks,
its downloads in progress, one shard fetched into it, room made in it), `fetcher` (the threads
that fetch what the pass needs next), `foreign` (WebDataset shards indexed on first open),
`pack` (RemotePack: the pack or shards at a URL opened, their manifest and indexes fetched; a
ShardCache with its Fetcher threads and ForeignShards), `plain_get` (one streamed HTTP GET per
object), `ranges` (byte ranges of a remote file, read politely: a file's tail, the ranges of the
version it saw), with `answers` (reading an HTTP answer: its size, ETag, the wait a 429 or 503
asks for) and `host_gate` (per host: the machine-wide cap on requests in flight, the rate, the
pause every process sharing the cache keeps after a 429), and `hf` (an ``hf://datasets/...``
URL resolved to its Parquet files at one commit). stoker.parquet reads Parquet through these.
"""

from .cache import DEFAULT_CACHE_LIMIT, default_cache_dir
from .pack import MAX_MANIFEST_BYTES, RemotePack
from .retry import DEFAULT_RETRY, Retry
from .urls import is_remote, is_url, redact

__all__ = [
    "DEFAULT_CACHE_LIMIT",
    "DEFAULT_RETRY",
    "MAX_MANIFEST_BYTES",
    "RemotePack",
    "Retry",
    "default_cache_dir",
    "is_remote",
    "is_url",
    "redact",
]
