"""stoker inside the trainers people use, run for real: Lightning (strategy="ddp" and
"ddp_spawn", a loader built at the top of the script or by a LightningDataModule, a checkpoint
taken mid-epoch and resumed) and Hugging Face's Trainer under `accelerate launch`, each with 2
CPU processes (gloo). The scripts are in tests/integrations/; docs/INTEGRATIONS.md gives the
recipes these runs check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import pytest
from PIL import Image

import stoker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from servers.ports import free_port  # noqa: E402

INTEGRATIONS = Path(__file__).resolve().parents[1] / "integrations"
# Each trainer test runs Lightning, the Hugging Face Trainer or accelerate as a program of its
# own (tests/integrations), often twice (a run, then its resume): 10-20 s each on 2 cores.
SLOW_TRAINER = pytest.mark.slow("a trainer run as a program of its own, and resumed: 10-20 s")
# Their processes (DDP's ranks among them) use every core, and wait on one another with timeouts.
pytestmark = pytest.mark.serial
N = 43  # samples: 22 per rank of 2 (one padded), in batches of 4: 6 batches a rank


@pytest.fixture(scope="module")
def pack(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("trainers")
    rng = np.random.default_rng(0)
    for c, name in enumerate(("a", "b", "c")):
        folder = root / "folder" / name
        folder.mkdir(parents=True)
        for i in range(15 if c == 0 else 14):
            pixels = rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)
            pixels[..., c] = 220  # a class a model can learn
            Image.fromarray(pixels).save(folder / f"{i:03d}.jpg", quality=90)
    stoker.pack(root / "folder", root / "pack", shard_size="64KB", progress=False)
    return root / "pack"


def run(script: str, *args: object, launcher: list[str] | None = None, timeout: float = 300):
    """Runs a script of tests/integrations to its end; a hang fails the test at `timeout`."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK"):
        env.pop(name, None)
    # The launchers' own choice of port is in the kernel's ephemeral range, where an outgoing
    # connection may take it before the process group binds it (tests/servers/ports.py).
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    command = [*(launcher or [sys.executable]), str(INTEGRATIONS / script), *map(str, args)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done


def ranks(out: Path) -> list[dict]:
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]


# --- Lightning ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lightning_ddp(pack, tmp_path_factory) -> list[dict]:
    """Two epochs under strategy="ddp", the loader built at the top of the script."""
    out = tmp_path_factory.mktemp("ddp")
    run("lightning_train.py", pack, out, "--strategy", "ddp", "--epochs", 2)
    return ranks(out)


@SLOW_TRAINER
def test_lightning_ddp_gives_each_rank_its_share_and_the_same_batch_count(lightning_ddp):
    # Rank 0 built its loader before Lightning launched rank 1 (no world size anywhere yet),
    # rank 1 with WORLD_SIZE=2 but no RANK: both resolve their ranks when the pass starts.
    for rank in lightning_ddp:
        assert rank["world_size"] == 2
        assert rank["lengths"] == [6, 6]
        assert [(e, b) for e, b, _ in rank["steps"]] == [(e, b) for e in (0, 1) for b in range(6)]
    for epoch in (0, 1):
        shares = [
            [i for e, _, idx in rank["steps"] if e == epoch for i in idx] for rank in lightning_ddp
        ]
        assert len(shares[0]) == len(shares[1]) == 22
        assert sorted(set(shares[0]) | set(shares[1])) == list(range(N))  # one padded repeat
        assert len(set(shares[0]) & set(shares[1])) <= 1
    epochs = [[idx for e, _, idx in lightning_ddp[0]["steps"] if e == k] for k in (0, 1)]
    assert epochs[0] != epochs[1]  # the loader moved on to its next epoch's order


@SLOW_TRAINER
def test_lightning_ddp_spawn_pickles_the_loader_into_each_process(pack, tmp_path, lightning_ddp):
    run("lightning_train.py", pack, tmp_path, "--strategy", "ddp_spawn", "--epochs", 2)
    spawned = ranks(tmp_path)
    # The same batches on the same ranks as the ddp run: same seed, same order.
    assert [r["steps"] for r in spawned] == [r["steps"] for r in lightning_ddp]
    assert [r["lengths"] for r in spawned] == [[6, 6], [6, 6]]


@pytest.mark.parametrize("stop_after", [4, 9])  # in epoch 0; in epoch 1
@SLOW_TRAINER
def test_a_lightning_checkpoint_taken_mid_epoch_resumes_exactly(
    pack, tmp_path, lightning_ddp, stop_after
):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    run(
        "lightning_train.py", pack, first, "--max-steps", stop_after,
        "--checkpoint-every", stop_after,
    )  # fmt: skip
    (checkpoint,) = first.glob("*.ckpt")
    run("lightning_train.py", pack, second, "--resume", checkpoint, "--epochs", 2)
    for uninterrupted, before, after in zip(lightning_ddp, ranks(first), ranks(second)):
        assert len(before["steps"]) == stop_after
        # The loader's position came back from Lightning's checkpoint: the steps after it are
        # exactly those of the uninterrupted run, epoch, batch_idx and samples.
        assert before["steps"] + after["steps"] == uninterrupted["steps"]


@SLOW_TRAINER
def test_a_lightning_datamodule_and_an_early_stopped_epoch_follow_lightnings_epochs(
    pack, tmp_path, lightning_ddp
):
    # limit_train_batches stops each pass early; Lightning then sets the next epoch through
    # loader.sampler.set_epoch, so epoch e starts with the uninterrupted run's epoch e.
    run(
        "lightning_train.py", pack, tmp_path, "--datamodule", "--limit-train-batches", 2,
        "--epochs", 2,
    )  # fmt: skip
    for limited, uninterrupted in zip(ranks(tmp_path), lightning_ddp):
        expected = [s for s in uninterrupted["steps"] if s[1] < 2]
        assert limited["steps"] == expected


# --- Hugging Face Trainer under accelerate launch ------------------------------------------------
def accelerate(pack, out: Path, checkpoints: Path, *args: object) -> list[dict]:
    launcher = [
        str(Path(sys.executable).with_name("accelerate")),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
    ]  # fmt: skip  (--multi_gpu is accelerate's torchrun path; Trainer runs on CPU, gloo)
    out.mkdir(exist_ok=True)
    run("hf_train.py", pack, out, "--checkpoints", checkpoints, *args, launcher=launcher)
    return ranks(out)


@pytest.fixture(scope="module")
def hf_uninterrupted(pack, tmp_path_factory) -> list[dict]:
    """Two epochs of 8 batches of 3 a rank (the last of 1) with gradient accumulation 3: steps
    of 3, 3 and 2 batches, 6 steps in all."""
    root = tmp_path_factory.mktemp("hf")
    return accelerate(pack, root / "out", root / "checkpoints")


@SLOW_TRAINER
def test_hf_trainer_trains_and_evaluates_on_stoker_dict_batches(hf_uninterrupted):
    for rank in hf_uninterrupted:
        assert rank["world_size"] == 2 and rank["len"] == 8 and rank["global_step"] == 6
        assert len(rank["seen"]) == 16 and rank["delivered"] == 2 * 22
        assert len(rank["evaluated"]) == 8 and rank["eval_loss"] > 0
    epoch0 = [set(i for idx in rank["seen"][:8] for i in idx) for rank in hf_uninterrupted]
    assert epoch0[0] | epoch0[1] == set(range(N)) and len(epoch0[0] & epoch0[1]) <= 1
    assert hf_uninterrupted[0]["checksum"] == hf_uninterrupted[1]["checksum"]  # one DDP model


@pytest.mark.parametrize("stop_at", [2, 3, 4])  # 6 of 8 batches of epoch 0; its end; epoch 1
@SLOW_TRAINER
def test_hf_trainer_resumes_mid_epoch_from_its_checkpoint_without_reading_again(
    pack, tmp_path, hf_uninterrupted, stop_at
):
    checkpoints = tmp_path / "checkpoints"
    before = accelerate(
        pack, tmp_path / "before", checkpoints, "--max-steps", stop_at, "--save-steps", stop_at
    )
    assert (checkpoints / f"checkpoint-{stop_at}" / "stoker_loader.json").is_file()
    after = accelerate(pack, tmp_path / "after", checkpoints, "--resume")
    for whole, head, tail in zip(hf_uninterrupted, before, after):
        assert head["seen"] + tail["seen"] == whole["seen"]
        # The loader handed out only the batches trained on: Trainer's skip read none again.
        assert tail["delivered"] == sum(len(idx) for idx in tail["seen"])
        # Same batches, same restored random state and optimizer: the same model, bit for bit.
        assert tail["checksum"] == whole["checksum"] and tail["global_step"] == 6


def test_stoker_trainer_refuses_what_would_silently_go_wrong(packed, tmp_path):
    import transformers

    from stoker.integrations.huggingface import StokerTrainer

    loader = stoker.Loader(packed, batch_size=4, fields={"image": stoker.Image(size=16)})
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    model = torch.nn.Linear(1, 1)
    with pytest.raises(stoker.InvalidArgumentError, match="train_dataset"):
        StokerTrainer(model=model, args=args, train_loader=loader, train_dataset=[1])
    trainer = StokerTrainer(model=model, args=args, train_loader=loader)
    assert trainer.args.per_device_train_batch_size == 4
    (tmp_path / "checkpoint-5").mkdir()  # a Trainer checkpoint without the loader's position
    with pytest.raises(stoker.InvalidArgumentError, match="stoker_loader.json"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-5"))
    with pytest.raises(stoker.InvalidArgumentError, match="no eval_loader"):
        trainer.evaluate()


# --- a plain accelerate loop ---------------------------------------------------------------------
@SLOW_TRAINER
def test_an_accelerate_loop_saves_and_loads_the_loader_with_its_state(pack, tmp_path):
    def launch(out: Path, *args: object) -> list[list[list[int]]]:
        out.mkdir()
        launcher = [
            str(Path(sys.executable).with_name("accelerate")), "launch", "--multi_gpu",
            "--num_processes", "2", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(free_port()),
        ]  # fmt: skip
        run("accelerate_loop.py", pack, out, *args, launcher=launcher)
        return [rank["seen"] for rank in ranks(out)]

    whole = launch(tmp_path / "whole")
    head = launch(tmp_path / "head", "--stop-after", 8)  # 2 batches into epoch 1
    assert (tmp_path / "head" / "state" / "custom_checkpoint_0.pkl").is_file()
    tail = launch(tmp_path / "tail", "--resume", tmp_path / "head" / "state")
    for w, h, t in zip(whole, head, tail):
        assert len(w) == 12 and len(h) == 8 and h + t == w
