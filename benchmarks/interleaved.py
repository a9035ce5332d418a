"""What benchmarks/arrays.py and benchmarks/tokens.py share: loaders timed in interleaved rounds
after a warm-up pass in which every batch is checked, peers driven pass by pass in their own
process and venv (benchmarks/peer_runners/_serve.py), and the cells of the report.

A round times one pass of every loader in turn, so that a change in the machine's load falls on
all of them; a loader's figure is the median over rounds, and a ratio is given both as the ratio
of the medians and round by round (each round's pair measured minutes apart at most).
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import setup_peers

ROOT = Path(__file__).resolve().parents[1]
RUNNERS = ROOT / "benchmarks" / "peer_runners"


class Contender:
    """One loader. `run(check)` makes one pass and returns (items, note): items delivered to the
    loop (images, tokens), and with check=True (the warm-up) what its checks found."""

    def __init__(self, name: str, run: Callable[[bool], tuple[int, str]] | None = None,
                 close: Callable[[], None] | None = None, loader: Any = None):  # fmt: skip
        self.name = name
        self.loader = loader  # a stoker loader, for its stats()
        self.threads = 0  # a stoker loader's worker threads
        self._run = run
        self._close = close
        self.runs: list[float] = []  # items/s, one a round
        self.note = ""  # what the warm-up's checks found
        self.error = ""  # why it has no figure (or lost its later rounds)
        self.version = ""

    def warm_up(self) -> float:
        """One checked pass; its seconds."""
        assert self._run is not None
        t0 = time.perf_counter()
        _, self.note = self._run(True)
        return time.perf_counter() - t0

    def timed(self) -> tuple[int, float]:
        """One pass: (items, seconds)."""
        assert self._run is not None
        t0 = time.perf_counter()
        items, _ = self._run(False)
        return items, time.perf_counter() - t0

    def close(self) -> None:
        if self._close is not None:
            self._close()

    @property
    def median(self) -> float | None:
        return statistics.median(self.runs) if self.runs else None


class PeerProcess(Contender):
    """A runner of benchmarks/peer_runners/ serving passes in its venv (_serve.py). It prepares
    its data and makes its checked warm-up pass when started; `timed` asks for one more pass and
    takes the seconds the peer measured around it (the pipe's time is not the loader's)."""

    def __init__(self, name: str, runner: str, *, data: Path, work: Path, threads: int,
                 batch_size: int, options: dict[str, str] | None = None,
                 timeout: float = 900):  # fmt: skip
        super().__init__(name)
        self.runner = runner
        self.timeout = timeout
        self.proc: subprocess.Popen[str] | None = None
        status = setup_peers.status(runner)
        if not status.get("ok"):
            self.error = f"its venv could not be set up: {status.get('error', '?')}"
            return
        work.mkdir(parents=True, exist_ok=True)
        self.log_path = work / f"{runner}.log"
        cmd = [
            str(setup_peers.python_of(runner)), str(RUNNERS / f"{runner}.py"),
            "--data", str(data), "--work", str(work), "--threads", str(threads),
            "--batch-size", str(batch_size),
        ] + [f"--option={k}={v}" for k, v in (options or {}).items()]  # fmt: skip
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, cwd=ROOT, env=env)  # fmt: skip

    def _tail(self, lines: int = 8) -> str:
        self._log.flush()
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:])

    def _answer(self) -> dict:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        if not ready:
            self.proc.kill()
            raise RuntimeError(f"no answer within {self.timeout:.0f} s; its log: {self._tail()}")
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise RuntimeError(f"it exited with {code}; its log: {self._tail()}")
        message = json.loads(line)
        if "error" in message:
            raise RuntimeError(f"{message['error']}; its log: {self._tail()}")
        return message

    def warm_up(self) -> float:
        """Waits for the peer's prepared data and its checked warm-up pass."""
        if self.proc is None:
            raise RuntimeError(self.error)
        message = self._answer()
        self.version = message.get("version", "?")
        self.note = message.get("check", "")
        print(f"  {self.name}: prepared in {message['prepare_s']:.1f} s ({self.version})",
              flush=True)  # fmt: skip
        return float(message["warmup_s"])

    def timed(self) -> tuple[int, float]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write("epoch\n")
        self.proc.stdin.flush()
        message = self._answer()
        return int(message["items"]), float(message["seconds"])

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self.proc = None


def warm_up(contenders: list[Contender]) -> list[Contender]:
    """Each contender's checked warm-up pass; those that fail keep their error and are dropped."""
    kept = []
    for c in contenders:
        if c.error:
            print(f"  {c.name}: not measured: {c.error}", flush=True)
            continue
        try:
            seconds = c.warm_up()
        except Exception as e:  # reported in the results, never a figure
            c.error = f"{type(e).__name__}: {e}"
            print(f"  {c.name}: FAILED its warm-up: {c.error}", flush=True)
            c.close()
            continue
        print(f"  warm-up {c.name}: {seconds:.1f} s, {c.note}", flush=True)
        kept.append(c)
    return kept


def run_rounds(contenders: list[Contender], rounds: int, show: Callable[[float], str]) -> None:
    """`rounds` rounds, each timing one pass of every contender in turn."""
    for r in range(rounds):
        cells = []
        for c in contenders:
            if c.error:
                continue
            try:
                items, seconds = c.timed()
            except Exception as e:
                c.error = f"round {r + 1}: {type(e).__name__}: {e}"
                print(f"  {c.name}: FAILED in {c.error}", flush=True)
                continue
            c.runs.append(items / seconds)
            cells.append(f"{c.name} {show(c.runs[-1])}")
        print(f"  round {r + 1}: " + ", ".join(cells), flush=True)


def per_round_ratios(mine: Contender, theirs: list[Contender]) -> list[float]:
    """Round by round, `mine` over the best of `theirs` in that round."""
    rounds = min([len(mine.runs)] + [len(c.runs) for c in theirs])
    return [mine.runs[i] / max(c.runs[i] for c in theirs) for i in range(rounds)]


def table(contenders: list[Contender], show: Callable[[float], str], unit: str) -> list[str]:
    """Markdown rows: each loader's rounds and median."""
    rounds = max(len(c.runs) for c in contenders)
    head = " | ".join(f"round {i + 1}" for i in range(rounds))
    lines = [f"| loader ({unit}) | {head} | median |", "|---" + "|---:" * (rounds + 1) + "|"]
    for c in contenders:
        cells = [show(v) for v in c.runs] + ["-"] * (rounds - len(c.runs))
        median = f"**{show(c.median)}**" if c.median is not None else "-"
        lines.append(f"| {c.name} | " + " | ".join(cells) + f" | {median} |")
    return lines


def verdict(ratio: float, target: float) -> str:
    return f"target >= {target:g}x: **{'met' if ratio >= target else 'missed'}**"
