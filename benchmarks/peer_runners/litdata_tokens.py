"""LitData's TokensLoader (benchmarks/tokens.py): the token file written into LitData's chunks by
litdata.optimize(..., item_loader=TokensLoader()), as LitData's README and litgpt's data
preparation do it, then read from the local folder by StreamingDataset(...,
item_loader=TokensLoader(block_size=seq_len + 1), shuffle=True, drop_last=True) in a
StreamingDataLoader with one worker per core (persistent_workers=True, pin_memory=False: no GPU).
Each batch becomes the loop's (x, y) as litgpt's pretraining loop makes them:
x = batch[:, :-1].long(), y = batch[:, 1:].long() (int64 [B, seq_len]).

--data: the flat .bin of uint16 tokens. optimize() gets it as ranges of 1M tokens (each a
"document", yielded as a uint16 numpy array, so the chunks keep uint16), chunk_size
1025 x 16,000 tokens (about 33 MB a chunk; litgpt uses 2049 x 8012), one worker per core.
"""

from __future__ import annotations

from functools import partial

import _serve

# The same venv as the S3 benchmark's LitData (litdata_s3.py): litdata 0.2.76 and torch.
ENV = {"venv": "litdata_s3"}

RANGE_TOKENS = 1 << 20
CHUNK_BLOCKS = 16_000


def _read_range(path: str, bounds: tuple[int, int]):
    import numpy as np

    start, stop = bounds
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    yield np.array(tokens[start:stop])


def prepare(job: _serve.Job, seq_len: int):
    """The chunks, made once under job.work (keyed by the file's size and the block size)."""
    from litdata import TokensLoader, optimize

    size = job.data.stat().st_size
    out = job.work / f"litdata-{size}-{seq_len + 1}"
    if (out / ".done").exists():
        return out
    n = size // 2
    ranges = [(i, min(i + RANGE_TOKENS, n)) for i in range(0, n, RANGE_TOKENS)]
    optimize(fn=partial(_read_range, str(job.data)), inputs=ranges, output_dir=str(out),
             chunk_size=(seq_len + 1) * CHUNK_BLOCKS, item_loader=TokensLoader(),
             num_workers=job.threads, mode="overwrite")  # fmt: skip
    (out / ".done").touch()
    return out


def make_epoch(job: _serve.Job):
    import torch
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    seq_len = int(job.options.get("seq_len", 1024))
    folder = prepare(job, seq_len)
    dataset = StreamingDataset(
        input_dir=str(folder),
        item_loader=TokensLoader(block_size=seq_len + 1),
        shuffle=True,
        drop_last=True,
    )
    loader = StreamingDataLoader(
        dataset,
        batch_size=job.batch_size,
        num_workers=job.threads,
        pin_memory=False,
        persistent_workers=True,
    )
    blocks = len(dataset)

    def epoch(check: bool):
        rows = 0
        for batch in loader:
            x = batch[:, :-1].long()
            y = batch[:, 1:].long()
            rows += x.shape[0]
            if check:
                if tuple(x.shape) != (job.batch_size, seq_len) or x.dtype != torch.int64:
                    raise SystemExit(f"LitData: x is {x.dtype} {tuple(x.shape)}")
                if not torch.equal(x[:, 1:], y[:, :-1]):
                    raise SystemExit("LitData: y is not x shifted by one")
                if int(x.max()) >= 1 << 16 or int(x.min()) < 0:
                    raise SystemExit("LitData: token ids outside uint16")
        # drop_last: every whole batch of the epoch's blocks.
        due = blocks - blocks % job.batch_size
        if rows != due:
            raise SystemExit(f"LitData: {rows} rows in an epoch of {due}")
        note = f"{rows} blocks of {seq_len + 1} tokens, y = x shifted" if check else ""
        return rows * seq_len, note

    return epoch


def version() -> str:
    from importlib.metadata import version as v

    return f"litdata {v('litdata')}, torch {v('torch')}, numpy {v('numpy')}"


if __name__ == "__main__":
    raise SystemExit(_serve.serve("LitData TokensLoader", make_epoch, version=version))
