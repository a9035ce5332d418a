"""A network namespace of a test's own, for servers that pick their own address: Ray, asked for
a node's address, takes the machine's outward interface (the one a UDP socket "connected" to
8.8.8.8 would use), even with --node-ip-address=127.0.0.1 for the node itself. Inside the
namespace, the only interface besides loopback is one end of a veth pair whose other end stays
down in the machine's namespace: the outward address is the test host's own (ADDRESS), and no
packet leaves.

`with NetworkNamespace() as ns:` makes it (`ip netns add`; root, or CAP_SYS_ADMIN and
CAP_NET_ADMIN), `ns.command(argv)` runs a program inside, `with ns.entered():` moves the
calling thread inside (setns: the threads it starts from then on are inside too) and back.
`unavailable()` says why namespaces cannot be made here, or None."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator

ADDRESS = "10.213.0.2"  # the test host's, inside its namespace only
_CLONE_NEWNET = 0x40000000
_counter = itertools.count()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


class NetworkNamespace:
    def __init__(self, address: str = ADDRESS):
        self.address = address
        _remove_stale()
        n = next(_counter)
        self.name = f"stoker-test-{os.getpid()}-{n}"
        self._veth = f"stk{os.getpid() % 100000}x{n}"  # at most 15 characters
        try:
            _ip("netns", "add", self.name)
            _ip("-n", self.name, "link", "set", "lo", "up")
            _ip("link", "add", self._veth + "a", "type", "veth", "peer", "name", self._veth + "b")
            _ip("link", "set", self._veth + "b", "netns", self.name)  # "a" stays here, down
            _ip("-n", self.name, "addr", "add", f"{address}/24", "dev", self._veth + "b")
            _ip("-n", self.name, "link", "set", self._veth + "b", "up")
            _ip("-n", self.name, "route", "add", "default", "dev", self._veth + "b")
        except BaseException:
            self.close()
            raise

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """The calling thread inside the namespace (and the threads and processes it starts
        meanwhile), back where it was after."""
        with open("/proc/thread-self/ns/net") as home, open(f"/var/run/netns/{self.name}") as ns:
            _setns(ns.fileno())
            try:
                yield
            finally:
                _setns(home.fileno())

    def close(self) -> None:
        """Deletes the namespace and the veth pair (its end here goes with its peer)."""
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            _ip("netns", "del", self.name)
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            _ip("link", "del", self._veth + "a")

    def __enter__(self) -> "NetworkNamespace":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _remove_stale() -> None:
    """The namespaces of test processes that were killed before they could delete theirs."""
    try:
        names = os.listdir("/var/run/netns")
    except OSError:
        return
    for name in names:
        parts = name.split("-")
        if name.startswith("stoker-test-") and len(parts) == 4 and parts[2].isdigit():
            if not os.path.exists(f"/proc/{parts[2]}"):
                with contextlib.suppress(subprocess.CalledProcessError, OSError):
                    _ip("netns", "del", name)


def unavailable() -> str | None:
    """Why a network namespace cannot be made here (no `ip`, no privilege), or None."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    try:
        with NetworkNamespace():
            return None
    except subprocess.CalledProcessError as e:
        return f"`{' '.join(e.cmd)}` failed: {e.stderr.strip() or e.returncode} (needs root)"
    except OSError as e:
        return f"cannot make a network namespace: {e}"
