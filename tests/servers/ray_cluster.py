"""A real Ray cluster for a test: `ray start --block` once per node (a head, then workers that
join it), each in its own session, on loopback or, given a network namespace (netns.py), on the
test host's own address inside it (where Ray's choice of an address is that host's, never the
machine's interface), stopped by SIGINT to that process (which stops
the processes it started) and SIGKILL to its process group if it lingers: never `ray stop`,
which would stop every Ray cluster on the machine. A node's raylet can be killed (SIGKILL) as a
lost machine, and nodes added while it runs. Health checks are fast, so that a node lost is
declared dead in about two seconds."""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from .ports import free_port

if TYPE_CHECKING:
    from .netns import NetworkNamespace

ENV = {
    # No token authentication: a cluster on loopback for one test, whatever ~/.ray holds.
    "RAY_AUTH_MODE": "disabled",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_failure_threshold": "4",
    "RAY_health_check_initial_delay_ms": "0",
}


_PR_SET_PDEATHSIG = 1


def _default_sigint() -> None:
    # A shell starting pytest in the background leaves SIGINT ignored, and an ignored signal
    # stays ignored across exec: the node would never see the SIGINT that stops it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # The test process ended without stopping it (pytest-timeout's os._exit, a SIGKILL): the
    # node gets the SIGINT that stops it, instead of running on in a session of its own.
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGINT)


class RayCluster:
    """`with RayCluster(head_cpus=1) as cluster:` ... `cluster.address`, `add_node(cpus)`,
    `kill_raylet(node)`; stops every node it started on exit."""

    def __init__(self, head_cpus: int = 1, object_store_bytes: int = 300 << 20,
                 netns: "NetworkNamespace | None" = None):  # fmt: skip
        ray_cli = Path(sys.executable).with_name("ray")
        if not ray_cli.exists():
            raise FileNotFoundError(f"no ray command beside {sys.executable}")
        self.ray_cli, self.store = str(ray_cli), object_store_bytes
        self.port = free_port()
        self.netns = netns
        self.host = "127.0.0.1" if netns is None else netns.address
        self.address = f"{self.host}:{self.port}"
        self.temp = tempfile.mkdtemp(prefix="stoker-ray-")  # short: socket paths are limited
        self.nodes: list[subprocess.Popen] = []
        self.output: dict[int, list[str]] = {}  # each node's `ray start` output, by pid
        self.env = {**os.environ, **ENV}
        self.env.pop("RAY_ADDRESS", None)
        self.head = self._start(["--head", f"--port={self.port}", "--include-dashboard=false",
                                 f"--dashboard-port={free_port()}", f"--temp-dir={self.temp}"],
                                head_cpus)  # fmt: skip

    def add_node(self, cpus: int = 1) -> subprocess.Popen:
        """A worker node joining the cluster, started and registered when this returns."""
        return self._start([f"--address={self.address}"], cpus)

    def _start(self, args: list[str], cpus: int) -> subprocess.Popen:
        cmd = [self.ray_cli, "start", "--block", f"--node-ip-address={self.host}",
               f"--num-cpus={cpus}", f"--object-store-memory={self.store}",
               f"--dashboard-agent-listen-port={free_port()}", "--disable-usage-stats",
               *args]  # fmt: skip
        if self.netns is not None:
            cmd = self.netns.command(cmd)  # `ip netns exec` execs it: the node's own pid
        node = subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                preexec_fn=_default_sigint)  # fmt: skip
        self.nodes.append(node)
        lines: queue.Queue = queue.Queue()
        kept = self.output.setdefault(node.pid, [])

        def drain() -> None:  # read to its end, so that the node never blocks on the pipe
            assert node.stdout is not None
            for line in node.stdout:
                lines.put(line)
                kept.append(line)
            lines.put(None)

        threading.Thread(target=drain, daemon=True).start()
        seen: list[str] = []
        while True:
            line = lines.get(timeout=120)
            if line is None:
                self.stop()
                raise RuntimeError("ray start exited:\n" + "".join(seen[-40:]))
            seen.append(line)
            if "Ray runtime started" in line:
                return node

    def raylet(self, node: subprocess.Popen):
        """The node's raylet process (psutil)."""
        import psutil

        found = [p for p in psutil.Process(node.pid).children(recursive=True)
                 if p.name() == "raylet"]  # fmt: skip
        assert len(found) == 1, found
        return found[0]

    def kill_raylet(self, node: subprocess.Popen) -> None:
        """The node as a machine lost: its raylet killed (its workers die with it)."""
        self.raylet(node).send_signal(signal.SIGKILL)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            with contextlib.suppress(ProcessLookupError):
                node.send_signal(signal.SIGINT)
        for node in reversed(self.nodes):
            try:
                node.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.pid, signal.SIGKILL)
                node.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)  # anything of its session still there
        self.nodes.clear()
        shutil.rmtree(self.temp, ignore_errors=True)

    def __enter__(self) -> "RayCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
