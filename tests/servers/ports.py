"""Loopback ports for the servers and launchers tests start (nginx, SeaweedFS, torchrun's and
Lightning's master port, Ray)."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port() -> int:
    """A loopback port nothing listens on, below the kernel's ephemeral range (32768-60999 by
    default): a port the kernel handed out would be free now, but a server that binds it later
    can find it taken by an outgoing connection's source port. SeaweedFS failed so ("s3 failed
    to listen on grpc port 51605: address already in use"): its own components connect to one
    another while it starts."""
    low = 20000
    try:
        low_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low_ephemeral = 32768
    for _ in range(200):
        port = random.randrange(low, max(low + 1000, low_ephemeral))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port below the ephemeral range")
