"""A TCP proxy on loopback that adds a fixed delay to every request (benchmarks/remote.py).

    python benchmarks/latency_proxy.py --upstream 127.0.0.1:8333 --delay-ms 20
    (prints "listening PORT" once it accepts connections; stops on SIGTERM or SIGINT)

`tc netem` would be the usual way to add latency, but this sandbox's kernel has no netem qdisc.
This proxy stands in for it, for request/response protocols such as S3 over HTTP: every burst of
bytes from the client (an HTTP request: a GET's headers arrive in one read) is sent upstream
`delay` seconds after its first byte arrived, so each request waits `delay` more for its answer;
a new connection waits `delay` once more before the proxy connects upstream (the handshake's
round trip).
The answer's bytes flow back undelayed, moved by os.splice through a pipe: they never enter
Python, which keeps the proxy's CPU cost per byte near the kernel's own copying.

Threads: one acceptor, and per connection one thread for each direction (blocking sockets: the
kernel does the waiting). The CPU the proxy uses is what /proc/PID/stat shows for this process;
benchmarks/remote.py reads it for each epoch it times.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time

PIPE_BYTES = 1 << 20  # the splice pipe's capacity: fewer system calls per megabyte


def _forward_delayed(src: socket.socket, dst: socket.socket, delay: float) -> None:
    """Client -> server: each read (a request, or a piece of an upload) is written `delay`
    seconds after it arrived. A read that arrives while an earlier one waits is sent no sooner
    than its own arrival + delay, since it is read only after the earlier one is sent and
    `delay` never shrinks: order is kept, and no request waits less than `delay`."""
    try:
        while True:
            data = src.recv(1 << 16)
            arrived = time.monotonic()
            if not data:
                break
            wait = arrived + delay - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        _shutdown(dst, socket.SHUT_WR)
        _shutdown(src, socket.SHUT_RD)


def _forward_spliced(src: socket.socket, dst: socket.socket) -> None:
    """Server -> client, undelayed: socket -> pipe -> socket with os.splice (no copy into
    user space)."""
    r, w = os.pipe()
    try:
        try:
            import fcntl

            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass  # the default 64 KiB pipe works, with more calls
        s, d = src.fileno(), dst.fileno()
        while True:
            n = os.splice(s, w, PIPE_BYTES)
            if n == 0:
                break
            while n:
                n -= os.splice(r, d, n)
    except OSError:
        pass
    finally:
        os.close(r)
        os.close(w)
        _shutdown(dst, socket.SHUT_WR)
        _shutdown(src, socket.SHUT_RD)


def _shutdown(sock: socket.socket, how: int) -> None:
    try:
        sock.shutdown(how)
    except OSError:
        pass


def _serve(client: socket.socket, upstream: tuple[str, int], delay: float) -> None:
    time.sleep(delay)  # a new connection's handshake is a round trip too
    try:
        server = socket.create_connection(upstream)
    except OSError:
        client.close()
        return
    for s in (client, server):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    up = threading.Thread(target=_forward_delayed, args=(client, server, delay), daemon=True)
    up.start()
    _forward_spliced(server, client)
    up.join()
    client.close()
    server.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="HOST:PORT")
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=0, help="on 127.0.0.1 (0: any free port)")
    args = parser.parse_args()
    host, port = args.upstream.rsplit(":", 1)
    upstream = (host, int(port))
    delay = args.delay_ms / 1000
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.port))
    listener.listen(128)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"listening {listener.getsockname()[1]}", flush=True)
    try:
        while True:
            client, _ = listener.accept()
            threading.Thread(target=_serve, args=(client, upstream, delay), daemon=True).start()
    except KeyboardInterrupt:
        pass
    finally:
        listener.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
