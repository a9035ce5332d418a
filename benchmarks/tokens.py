"""stoker.TokenLoader against nanoGPT's get_batch and LitData's TokensLoader on the same uint16
tokens, in one run (issue 19, item 7); writes its section of docs/BENCHMARKS.md.

    make bench-arrays                                   # LitData's venv, then arrays.py and this
    .venv/bin/python benchmarks/tokens.py               # 3 interleaved rounds (about 1.5 min)
    .venv/bin/python benchmarks/tokens.py --rounds 1 --no-write

The data (made once, seeded, under build/bench-arrays/): 200 Mi (209,715,200) uint16 tokens,
uniform over GPT-2's 50,257 ids, as a flat nanoGPT-style .bin (400 MiB), and stoker's token pack
of it. Every loader delivers (x, y) int64 [32, 1024] to a loop that only counts the tokens of x,
y being x shifted by one:

- stoker: `stoker.TokenLoader(path, seq_len=1024, batch_size=32, dtype="uint16", threads=N)`
  on the .bin itself, and on `stoker.pack_tokens(path, pack, dtype="uint16")`; N = the cores;
  an epoch is every window of 1,025 tokens starting every 1,024, once, shuffled;
- nanoGPT: get_batch as nanoGPT's train.py writes it (np.memmap opened again for each batch,
  32 random offsets, a torch.from_numpy(...astype(np.int64)) per row, torch.stack; on a CPU
  there is no pinning), called as many times as stoker's epoch has batches;
- LitData (benchmarks/peer_runners/litdata_tokens.py, in its own venv): the tokens optimized
  into LitData's chunks, StreamingDataset(item_loader=TokensLoader(block_size=1025),
  shuffle=True) in a StreamingDataLoader with one worker per core, x and y cut from each batch
  of blocks and made int64 in the loop, as litgpt does.

Each loader makes one warm-up pass in which every batch is checked (shapes, dtypes, y = x
shifted by one; for stoker also every window once an epoch and each window equal to the file's
tokens at its offset); then --rounds rounds each time one pass of every loader in turn. Never a
timed test.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_data  # noqa: E402
import interleaved  # noqa: E402
import stoker  # noqa: E402
from interleaved import Contender, PeerProcess  # noqa: E402
from stoker.machine import usable_cores  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "bench-arrays"
BEGIN, END = bench_data.markers("benchmarks/tokens.py")
TOKENS = 200 << 20
VOCAB = 50_257
SEQ_LEN, BATCH = 1024, 32
TARGETS = {"nanoGPT get_batch": 1.0, "LitData TokensLoader": 3.0}  # issue 19's "Done when"


def make_data() -> tuple[Path, Path]:
    """The .bin (seed 0), written once in 16 Mi-token pieces, and stoker's token pack of it."""
    path = WORK / f"tokens-{TOKENS}.bin"
    WORK.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        partial = path.with_suffix(".partial")
        rng = np.random.default_rng(0)
        with open(partial, "wb") as f:
            for at in range(0, TOKENS, 1 << 24):
                n = min(1 << 24, TOKENS - at)
                f.write(rng.integers(0, VOCAB, size=n, dtype=np.uint16).tobytes())
        os.replace(partial, path)
    pack = WORK / f"tokens-{TOKENS}-pack"
    if not pack.exists():
        print(stoker.pack_tokens(path, pack, dtype="uint16", progress=False))
    return path, pack


def check_batch(name: str, x: torch.Tensor, y: torch.Tensor) -> None:
    if x.dtype != torch.int64 or y.dtype != torch.int64:
        raise AssertionError(f"{name}: x {x.dtype}, y {y.dtype}")
    if x.shape != y.shape or x.shape[1] != SEQ_LEN or not 0 < x.shape[0] <= BATCH:
        raise AssertionError(f"{name}: x {tuple(x.shape)}, y {tuple(y.shape)}")
    if not torch.equal(x[:, 1:], y[:, :-1]):
        raise AssertionError(f"{name}: y is not x shifted by one")


def check_windows(name: str, source: Path, tokens: np.ndarray, **options) -> str:
    """A whole epoch of the same loader with return_offsets=True: every window once, and each
    equal to the file's tokens at its offset."""
    offsets = []
    with stoker.TokenLoader(source, seq_len=SEQ_LEN, batch_size=BATCH, return_offsets=True,
                            **options) as loader:  # fmt: skip
        for x, y, at in loader:
            offsets.append(at)
            for row in range(0, x.shape[0], 8):  # a quarter of the rows, compared in full
                start = int(at[row])
                expected = torch.from_numpy(tokens[start : start + SEQ_LEN + 1].astype(np.int64))
                if not (torch.equal(x[row], expected[:-1]) and torch.equal(y[row], expected[1:])):
                    raise AssertionError(f"{name}: the window at {start} is not the file's")
        # Windows start every SEQ_LEN tokens from each shard's first and never cross its end.
        ds, first, expected = loader.dataset, 0, []
        for shard in range(ds.num_shards):
            count = ds.shard_samples(shard)
            expected.append(first + torch.arange(count, dtype=torch.int64) * SEQ_LEN)
            first += ds.shard_tokens(shard)
    seen = torch.sort(torch.cat(offsets)).values
    expected_all = torch.cat(expected)
    if not torch.equal(seen, expected_all):
        raise AssertionError(f"{name}: the epoch's windows are not every window once")
    return (f"every one of the {len(expected_all):,} windows ({ds.num_shards} shard(s)) once, "
            "each compared with the file's tokens at its offset")  # fmt: skip


def stoker_contender(name: str, source: Path, threads: int, tokens, **options) -> Contender:
    loader = stoker.TokenLoader(source, seq_len=SEQ_LEN, batch_size=BATCH, threads=threads,
                                **options)  # fmt: skip

    def run(check: bool):
        n = 0
        for x, y in loader:
            n += x.numel()
            if check:
                check_batch(name, x, y)
        if n != loader.num_samples * SEQ_LEN:
            raise AssertionError(f"{name}: {n} tokens, {loader.num_samples * SEQ_LEN} due")
        return n, check_windows(name, source, tokens, **options) if check else ""

    return Contender(name, run, loader.close, loader=loader)


def nanogpt_contender(path: Path, batches: int) -> Contender:
    """nanoGPT's get_batch (train.py), with its globals as arguments."""
    block_size, batch_size, device, device_type = SEQ_LEN, BATCH, "cpu", "cpu"

    def get_batch():
        # nanoGPT: "We recreate np.memmap every batch to avoid a memory leak"
        data = np.memmap(path, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - block_size, (batch_size,))
        x = torch.stack([torch.from_numpy((data[i : i + block_size]).astype(np.int64)) for i in ix])
        y = torch.stack(
            [torch.from_numpy((data[i + 1 : i + 1 + block_size]).astype(np.int64)) for i in ix]
        )
        if device_type == "cuda":
            x = x.pin_memory().to(device, non_blocking=True)
            y = y.pin_memory().to(device, non_blocking=True)
        else:
            x, y = x.to(device), y.to(device)
        return x, y

    def run(check: bool):
        n = 0
        for _ in range(batches):
            x, y = get_batch()
            n += x.numel()
            if check:
                check_batch("nanoGPT", x, y)
        return n, f"{batches:,} batches, y = x shifted" if check else ""

    return Contender("nanoGPT get_batch", run)


def show(rate: float) -> str:
    return f"{rate / 1e6:,.1f}M"


def stage_line(c: Contender, before: dict, tokens: int) -> str:
    after = c.loader.stats()["seconds"]
    spent = {k: after[k] - before[k] for k in after}
    work = {k: spent[k] for k in ("read", "decode", "transform", "collate")}
    total = sum(work.values())
    per = 1e9 * SEQ_LEN / tokens  # ns a window
    shares = ", ".join(f"{k} {v * per / 1e3:.2f}" for k, v in work.items())
    return (
        f"{c.name}: {total * per / 1e3:.2f} us of worker time a window of {SEQ_LEN + 1} "
        f"tokens ({shares}); the loop waited {spent['wait'] * per / 1e3:.2f} us a window"
    )


def section(contenders, failed, machine, command, seconds, threads, rounds, load, stages) -> str:
    by_name = {c.name: c for c in contenders}
    mine = [c for c in contenders if c.name.startswith("stoker")]
    lines = [
        BEGIN,
        "## Tokens: stoker.TokenLoader against nanoGPT's get_batch and LitData",
        "",
        "Written by `benchmarks/tokens.py` (`make bench-arrays`); every number here comes from "
        "the same run.",
        "",
        f"- command: `{command}`",
        f"- machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}; Python "
        f"{machine['python']}, torch {machine['torch']}; load average {load[0]:.2f} at the "
        f"start, {load[1]:.2f} at the end (the run's own processes included)",
        f"- date: {time.strftime('%Y-%m-%d')}, run time {seconds / 60:.1f} min",
        f"- data: {TOKENS:,} uint16 tokens, seeded uniform over {VOCAB:,} ids, in a flat .bin "
        f"({TOKENS * 2 / 2**20:,.0f} MiB, in the page cache after the warm-up); seq_len "
        f"{SEQ_LEN}, batch {BATCH}; (x, y) int64 [{BATCH}, {SEQ_LEN}] to a loop that only "
        "counts x's tokens.",
        f"- throughput: tokens/s (M = 10^6) over whole passes, median of {rounds} interleaved "
        "rounds (each times one pass of every loader in turn) after a warm-up pass of each in "
        "which every batch was checked. A stoker or LitData pass is an epoch (every window "
        "once); a nanoGPT pass is as many get_batch calls as stoker's epoch has batches.",
        "",
        *interleaved.table(contenders, show, "tokens/s"),
        "",
    ]
    for peer, target in TARGETS.items():
        theirs = by_name.get(peer)
        if theirs is None or not theirs.runs:
            continue
        for c in mine:
            ratio = c.median / theirs.median
            lines.append(
                f"- {c.name} / {peer}: **{ratio:.2f}x** (round by round: "
                + ", ".join(f"{r:.2f}x" for r in interleaved.per_round_ratios(c, [theirs]))
                + f"); {interleaved.verdict(ratio, target)}"
            )
    for c in failed:
        lines.append(f"- **{c.name}: not measured**: {c.error}")
    lines += [
        "",
        "The loaders:",
        "",
        f"- stoker: `stoker.TokenLoader(path, seq_len={SEQ_LEN}, batch_size={BATCH}, "
        f"threads={threads})` (`dtype='uint16'` for the .bin); the pack is "
        "`stoker.pack_tokens(path, pack, dtype='uint16')` (default 256 MB shards).",
        "- nanoGPT: `get_batch` of nanoGPT's train.py, verbatim but for its globals: "
        "`np.memmap(path, dtype=np.uint16, mode='r')` each batch, `torch.randint` offsets, "
        "`torch.stack([torch.from_numpy((data[i:i+block_size]).astype(np.int64)) for i in ix])` "
        "for x and for y, then `.to('cpu')` (its pinning is for CUDA only); in this process.",
    ]
    litdata = by_name.get("LitData TokensLoader")
    if litdata is not None:
        lines.append(
            f"- LitData ({litdata.version}; `benchmarks/peer_runners/litdata_tokens.py` in its "
            "own venv, pinned to the same cores): `litdata.optimize(fn, inputs=1 Mi-token "
            "ranges of the .bin, each yielded as a uint16 array, chunk_size=1025 * 16000, "
            "item_loader=TokensLoader())`; `StreamingDataset(folder, "
            "item_loader=TokensLoader(block_size=1025), shuffle=True, drop_last=True)` in "
            f"`StreamingDataLoader(batch_size={BATCH}, num_workers={threads}, "
            "persistent_workers=True)`; `x = batch[:, :-1].long(); y = batch[:, 1:].long()` in "
            "the loop (litgpt's pretraining step)."
        )
    lines += ["", "What each warm-up pass's checks found:", ""]
    lines += [f"- {c.name}: {c.note}" for c in contenders]
    if stages:
        lines += ["", "Where stoker's worker time goes (`loader.stats()['seconds']` over the "
                  "timed epochs, summed over threads):", ""]  # fmt: skip
        lines += [f"- {s}" for s in stages]
    lines += ["", END]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-litdata", action="store_true", help="leave LitData out")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    t0 = time.time()
    threads = usable_cores()
    load_start = os.getloadavg()[0]
    machine = bench_data.machine()
    print(f"machine: {machine}; load average {load_start:.2f}", flush=True)
    path, pack = make_data()
    tokens = np.memmap(path, dtype=np.uint16, mode="r")

    # LitData first: its optimize() and its workers' start take a while, in its own process.
    litdata = PeerProcess("LitData TokensLoader", "litdata_tokens", data=path,
                          work=WORK / "litdata", threads=threads, batch_size=BATCH,
                          options={"seq_len": str(SEQ_LEN)})  # fmt: skip
    if args.no_litdata:
        litdata.close()
        litdata.error = "left out (--no-litdata)"
    stokers = [
        stoker_contender("stoker, .bin", path, threads, tokens, dtype="uint16"),
        stoker_contender("stoker, token pack", pack, threads, tokens),
    ]
    nanogpt = nanogpt_contender(path, len(stokers[0].loader))
    everyone = [*stokers, nanogpt, litdata]
    interleaved.warm_up(everyone)
    contenders = [c for c in everyone if not c.error]
    before = {c.name: c.loader.stats()["seconds"] for c in stokers if not c.error}
    try:
        interleaved.run_rounds(contenders, args.rounds, show)
        stages = [
            stage_line(c, before[c.name], c.loader.num_samples * SEQ_LEN * len(c.runs))
            for c in stokers
            if c.name in before and c.runs
        ]
    finally:
        for c in contenders:
            c.close()
    for line in stages:
        print("  " + line, flush=True)
    load = (load_start, os.getloadavg()[0])
    command = "python benchmarks/tokens.py" + " ".join(
        [""] + [a for a in sys.argv[1:] if a != "--no-write"]
    )
    failed = [c for c in everyone if c.error]
    text = section([c for c in contenders if c.runs], failed, machine, command,
                   time.time() - t0, threads, args.rounds, load, stages)  # fmt: skip
    print(text)
    if not args.no_write:
        bench_data.write_section("benchmarks/tokens.py", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
