"""The loaders compared: each Peer runs a script of benchmarks/peer_runners/ in the virtual
environment benchmarks/setup_peers.py made for it, and reports images/s as JSON.
Add a loader by writing a runner and listing it here."""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import setup_peers

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Pipeline:
    name: str  # "train" | "eval"
    size: int = 224
    resize: int = 256
    batch_size: int = 256


@dataclass
class Peer:
    name: str  # as the report shows it
    runner: str  # benchmarks/peer_runners/<runner>.py
    options: dict[str, str] = field(default_factory=dict)  # --option k=v
    decodes_originals: bool = True  # False: reads its own re-encoded copy (FFCV's .beton)
    ours: bool = False
    like_ffcv: bool = False  # ours, on FFCV's kind of data: compared with FFCV, like for like

    def status(self) -> dict:
        return setup_peers.status(self.runner)

    def run(self, files: Path, pipeline: Pipeline, threads: int, epochs: int) -> dict:
        """One process: a warm-up epoch, then `epochs` timed ones; the runner's JSON result."""
        work = ROOT / "build" / "peers" / self.runner / "work"
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            cmd = [
                str(setup_peers.python_of(self.runner)),
                str(ROOT / "benchmarks" / "peer_runners" / f"{self.runner}.py"),
                "--files", str(files), "--pipeline", pipeline.name,
                "--size", str(pipeline.size), "--resize", str(pipeline.resize),
                "--batch-size", str(pipeline.batch_size), "--threads", str(threads),
                "--epochs", str(epochs), "--work", str(work), "--out", out.name,
            ] + [f"--option={k}={v}" for k, v in self.options.items()]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if done.returncode != 0:
                tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
                return {"error": f"exit {done.returncode}: {tail}"}
            return json.loads(Path(out.name).read_text())


def all_peers() -> list[Peer]:
    return [
        Peer("stoker", "stoker_pack", ours=True),
        Peer("stoker, pack --restart-interval 0", "stoker_pack", {"pack": "plain"}, ours=True),
        Peer("stoker, pack --max-side 512", "stoker_pack", {"pack": "max512"}, False, True, True),
        Peer(
            "stoker on FFCV's recipe (--codec jpeg --max-side 512 --quality 90)",
            "stoker_pack",
            {"pack": "ffcv"},
            False,
            True,
            True,
        ),  # fmt: skip
        Peer("FFCV", "ffcv_beton", decodes_originals=False),
        Peer("DALI (CPU)", "dali_cpu"),
        Peer("DataLoader + PyTurboJPEG", "dataloader_turbojpeg"),
        Peer("DataLoader + OpenCV", "dataloader_opencv"),
        Peer("DataLoader + Pillow-SIMD", "dataloader_pillow_simd"),
        Peer("DataLoader + PIL", "dataloader_pil"),
        Peer("DataLoader + WebDataset", "dataloader_webdataset"),
        Peer("tf.data", "tfdata"),
        Peer("SPDL", "spdl_pipeline"),
    ]


def variants() -> list[Peer]:
    """Peers run only when named (run.py --peers): a setting of a peer measured against its
    default, not a row of the report."""
    return [
        Peer("FFCV quasi-random order", "ffcv_beton", {"order": "quasi_random"}, False),
        Peer(
            "FFCV ResNet-50 data (half raw 500 px)",
            "ffcv_beton",
            {"write_mode": "proportion", "compress_probability": "0.5", "max_resolution": "500"},
            False,
        ),
    ]
