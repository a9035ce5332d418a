"""What a loader may leave behind in this process, counted before and checked after: threads
(the engine's C++ workers, named stoker-worker* by the kernel, and Python's), open file
descriptors, child processes, shared memory (/dev/shm), loaders still registered as open."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

import psutil


def _task_names() -> list[str]:
    names = []
    for task in Path("/proc/self/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:  # ended meanwhile
            pass
    return sorted(names)


def _fds() -> dict[int, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return out


@dataclasses.dataclass
class Snapshot:
    tasks: list[str]
    python_threads: list[str]
    fds: dict[int, str]
    children: list[int]
    shm: list[str]

    @classmethod
    def now(cls) -> "Snapshot":
        return cls(
            tasks=_task_names(),
            python_threads=sorted(t.name for t in threading.enumerate()),
            fds=_fds(),
            children=sorted(p.pid for p in psutil.Process().children(recursive=True)),
            shm=sorted(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else [],
        )

    def left_since(self, before: "Snapshot") -> list[str]:
        """What this snapshot has that `before` had not: one line per thing left."""
        left = []
        tasks = list(self.tasks)
        for name in before.tasks:
            if name in tasks:
                tasks.remove(name)
        left += [f"thread {name!r}" for name in tasks]
        left += [f"python thread {t!r}" for t in self.python_threads
                 if t not in before.python_threads]  # fmt: skip
        left += [f"fd {fd} -> {target}" for fd, target in self.fds.items()
                 if before.fds.get(fd) != target]  # fmt: skip
        left += [f"child process {pid}" for pid in self.children if pid not in before.children]
        left += [f"/dev/shm/{name}" for name in self.shm if name not in before.shm]
        return left


def left_behind(before: Snapshot, settle: float = 5.0) -> list[str]:
    """What is left since `before`, once threads that are ending have had `settle` seconds to
    end (a daemon thread told to stop may still be on its way out when close() returns). The
    garbage collector is not run: what only its cycle detection would free (a loader's files
    kept open by a reference cycle) counts as left, since nothing says when it would run."""
    from stoker.load.loader import _open_loaders

    deadline = time.monotonic() + settle
    while True:
        left = Snapshot.now().left_since(before)
        left += [f"open loader {loader!r}" for loader in list(_open_loaders)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.01)
