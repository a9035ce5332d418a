"""A peer that a benchmark drives round by round (benchmarks/arrays.py, benchmarks/tokens.py), so
that its epochs interleave with the loaders measured in the benchmark's own process.

Standard library only, like _common.py: it runs inside the peer's virtual environment.

    <venv>/bin/python benchmarks/peer_runners/<peer>.py --data DIR --work DIR --threads 2 \\
        --batch-size 512 [--option k=v ...]

The runner prepares its data (untimed: its own format, kept under --work), builds its loader,
runs one warm-up epoch in which it checks every batch, and writes one JSON line on its standard
output: {"ready": true, "version", "prepare_s", "warmup_s", "check"}. Then each line "epoch" on
its standard input runs one epoch and answers {"items", "seconds", "cpu_s"}: items (images or
tokens) delivered to the loop and the epoch's wall time, measured here so that the pipe costs
nothing; "quit", or the end of the input, ends it. A failure answers {"error": ...} and exits 1.
Whatever the libraries print goes to standard error: the protocol has standard output to itself.

A runner module calls serve(name, make_epoch, version=...) where make_epoch(job) prepares the
data and returns epoch(check) -> (items, note): one pass over the data, every sample once; with
check=True (the warm-up) it checks the batches' contents and says what it found in `note`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import _common


@dataclass
class Job:
    data: Path  # the benchmark's data (its arrays, its token file)
    work: Path  # the runner's own folder for its converted copy, kept between runs
    threads: int  # cores: the process is pinned to this many, and the peer told to use them
    batch_size: int
    options: dict[str, str]  # --option k=v, benchmark-specific (e.g. seq_len=1024)


def serve(
    name: str,
    make_epoch: Callable[[Job], Callable[[bool], tuple[int, str]]],
    *,
    version: Callable[[], str] = lambda: "?",
) -> int:
    parser = argparse.ArgumentParser(description=f"{name}: epochs on request")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--option", action="append", default=[], help="k=v")
    args = parser.parse_args()
    # The protocol keeps the real standard output; fd 1 becomes standard error for the rest.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def say(message: dict) -> None:
        out.write(json.dumps(message) + "\n")

    try:
        _common.pin_to_cores(args.threads)
        job = Job(args.data, args.work, args.threads, args.batch_size,
                  dict(o.split("=", 1) for o in args.option))  # fmt: skip
        job.work.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        epoch = make_epoch(job)
        prepare_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        _, note = epoch(True)
        say({"ready": True, "version": version(), "prepare_s": prepare_s,
             "warmup_s": time.perf_counter() - t0, "check": note})  # fmt: skip
        for line in sys.stdin:
            command = line.strip()
            if command == "quit":
                break
            if command != "epoch":
                raise SystemExit(f"{name}: unknown command {command!r}")
            t0, c0 = time.perf_counter(), time.process_time()
            items, _ = epoch(False)
            say({"items": items, "seconds": time.perf_counter() - t0,
                 "cpu_s": time.process_time() - c0})  # fmt: skip
        return 0
    except BaseException as e:  # the benchmark reports it instead of the peer's figure
        traceback.print_exc()
        say({"error": f"{type(e).__name__}: {e}"})
        return 1
