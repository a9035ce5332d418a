"""nginx serving a folder over HTTP on loopback, for tests: started, stopped and restarted by
the test itself (Debian's nginx-light; `make setup` installs it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from .ports import free_port

__all__ = ["NGINX", "Nginx", "free_port"]

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


class Nginx:
    """`root` served read-only at http://127.0.0.1:PORT/. `stop()` and `start()` again keep the
    port, as a server restarted in place would. `rate`: bytes per second per response (nginx's
    limit_rate; None: unlimited), read at each start."""

    def __init__(self, root: Path, workdir: Path, rate: int | None = None):
        self.root, self.workdir = Path(root), Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.rate = rate

    def _write_config(self) -> None:
        limit = f"limit_rate {self.rate};" if self.rate else ""
        (self.workdir / "nginx.conf").write_text(
            # As root, nginx's workers would run as nobody, who cannot read pytest's folders.
            ("user root;\n" if os.geteuid() == 0 else "")
            + f"""
daemon off;
worker_processes 1;
pid {self.workdir}/nginx.pid;
error_log {self.workdir}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log {self.workdir}/access.log;
    client_body_temp_path {self.workdir}/body;
    proxy_temp_path {self.workdir}/proxy;
    fastcgi_temp_path {self.workdir}/fastcgi;
    uwsgi_temp_path {self.workdir}/uwsgi;
    scgi_temp_path {self.workdir}/scgi;
    server {{
        listen 127.0.0.1:{self.port};
        root {self.root};
        location / {{ autoindex on; {limit} }}
    }}
}}
"""
        )

    def start(self) -> Nginx:
        self._write_config()
        self.proc = subprocess.Popen(
            [NGINX, "-p", str(self.workdir), "-c", str(self.workdir / "nginx.conf")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.proc.stderr.read().decode()}")  # type: ignore[union-attr]
            try:
                urllib.request.urlopen(self.url + "/", timeout=1).close()
                return self
            except urllib.error.HTTPError:  # it answered
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not answer within 10 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None

    def requests(self) -> list[str]:
        """The request lines nginx logged, e.g. 'GET /pack/shard-000000.tar HTTP/1.1'."""
        log = self.workdir / "access.log"
        if not log.exists():
            return []
        return [line.split('"')[1] for line in log.read_text().splitlines() if '"' in line]

    def __enter__(self) -> Nginx:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
