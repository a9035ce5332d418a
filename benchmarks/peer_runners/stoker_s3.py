"""stoker from S3 (benchmarks/remote.py): ImageLoader on s3://bucket/pack with a fresh cache_dir,
or on the same pack as a local folder (the baseline).

The endpoint and credentials come from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY, as for any s3fs user (stoker takes none: docs/REMOTE.md). Shuffle is the
loader's default for its source: "block" (windows of 8 shards) from a URL, "global" locally.
--option k=v passes an ImageLoader argument (ints, floats, or the strings it takes).
"""

from __future__ import annotations

import _remote

ENV = {"venv": "main"}


def _value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def build(args, job):
    import stoker

    remote = "://" in args.source
    loader = stoker.ImageLoader(
        args.source, batch_size=job.batch_size, size=job.size, train=job.train,
        threads=job.threads, return_index=True,
        **({"cache_dir": str(args.cache)} if remote else {}),
        **{k: _value(v) for k, v in job.options.items()},
    )  # fmt: skip
    build.loader = loader

    def epoch(e):
        loader.set_epoch(e)
        for images, _labels, index in loader:
            yield images, index.tolist()

    return epoch


def extra() -> dict:
    stats = build.loader.stats()
    out = {"wait_s": stats["seconds"]["wait"]}
    if "remote" in stats:
        out["remote"] = {k: v for k, v in stats["remote"].items() if k != "url"}
    return out


def version() -> str:
    import stoker

    return f"stoker {stoker.__version__}"


def prepare(files, out, shard_bytes) -> None:
    import stoker

    out.parent.mkdir(parents=True, exist_ok=True)
    listing = out.parent / f"{out.name}.csv"
    listing.write_text("".join(f"{p},{label}\n" for p, label in files))
    stoker.pack(listing, out, shard_size=shard_bytes, overwrite=True, progress=False)


def _imports():
    import torch
    import stoker

    return torch, stoker


if __name__ == "__main__":
    raise SystemExit(
        _remote.main(
            lambda: _remote.prepare_main(prepare),
            lambda: _remote.read_main("stoker", build, version, _imports, extra=extra),
        )
    )
