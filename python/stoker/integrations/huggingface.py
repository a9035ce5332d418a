"""Hugging Face's ``transformers.Trainer`` fed by a stoker loader, resumable from its checkpoints.

    from stoker.integrations.huggingface import StokerTrainer

    loader = stoker.Loader("packs/train", batch_size=64, train=True, fields={
        "pixel_values": stoker.Image(size=224), "labels": stoker.Label()},
        device="cuda", dtype=torch.bfloat16, mean=stoker.IMAGENET_MEAN, std=stoker.IMAGENET_STD)
    trainer = StokerTrainer(model=model, args=TrainingArguments(...), train_loader=loader)
    trainer.train(resume_from_checkpoint=True)   # under `accelerate launch`, torchrun or alone

The loader's dict batches go to the model as they are (``model(**batch)``): name the fields after
the model's arguments. Trainer is told nothing else: the loader takes its rank and world size
from the process group that Trainer's accelerator starts, when each pass starts.

Checkpoints: every checkpoint folder gets ``stoker_loader.json``, the loader's ``state_dict()``
as of the last optimizer step. ``train(resume_from_checkpoint=...)`` loads it, so the loader
continues exactly where the checkpoint was taken. Trainer then still "skips" the batches of the
epoch already trained (for a DataLoader it reads them again); here the loader answers those with
placeholders it neither reads nor decodes, which the skip drops, and Trainer's own step count,
learning-rate schedule and random state resume as for any DataLoader.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

import torch
import transformers
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from ..errors import InvalidArgumentError

LOADER_STATE_NAME = "stoker_loader.json"


class _Skipped(torch.utils.data.IterableDataset):
    """What accelerate's ``skip_first_batches`` iterates when Trainer resumes mid-epoch: as many
    placeholders as Trainer skips (the loader is already past those batches), then the loader's
    batches. ``batch_size=None`` on the owner makes the skip's DataLoader hand them on as they
    are."""

    def __init__(self, owner: TrainerLoader):
        self._owner = owner

    def __iter__(self) -> Iterator[Any]:
        skipped, self._owner.skipped = self._owner.skipped, 0
        for _ in range(skipped):
            yield None
        yield from self._owner.loader

    def __len__(self) -> int:
        # What Trainer logs as the number of examples: the pack's samples (a mix has no one
        # pack: Trainer then estimates from len() and the batch size).
        dataset = getattr(self._owner.loader, "dataset", None)
        if dataset is None:
            raise TypeError("no single dataset")
        return len(dataset)


class TrainerLoader:
    """A stoker loader as ``transformers.Trainer`` iterates it: ``len``, ``set_epoch``, the
    batches, and the ``dataset`` that Trainer's resume skips over."""

    # What accelerate's skip_first_batches copies into the DataLoader it makes over `dataset`:
    # no batching (the loader batches), in this process (no workers, so no prefetch factor).
    batch_size = None
    drop_last = False
    num_workers = 0
    prefetch_factor = None

    def __init__(self, loader: Any):
        self.loader = loader
        self.skipped = 0  # batches the next skip_first_batches drops (see _Skipped)
        self.dataset = _Skipped(self)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        self.skipped = 0  # iterated directly: Trainer skips nothing this pass
        return iter(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)


class _SaveLoaderState(transformers.TrainerCallback):
    """Writes the loader's state into each checkpoint folder Trainer has just saved."""

    def __init__(self, loader: TrainerLoader):
        self._loader = loader

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        # Every rank's state is the same (it counts all ranks' samples): the main process writes.
        if args.should_save and os.path.isdir(folder):
            saved = self._loader.loader.state_dict()
            with open(os.path.join(folder, LOADER_STATE_NAME), "w", encoding="utf-8") as f:
                json.dump(saved, f)
        return control


class StokerTrainer(transformers.Trainer):
    """``transformers.Trainer`` that trains on ``train_loader`` (and evaluates on
    ``eval_loader``), any stoker loader or ``stoker.mix`` of dict batches, and saves and resumes
    the loader's position with its checkpoints. Every other argument is Trainer's.
    ``args.per_device_train_batch_size`` is set to the loader's batch size (what Trainer logs
    and counts samples with)."""

    def __init__(self, *args: Any, train_loader: Any, eval_loader: Any = None, **kwargs: Any):
        for name in ("train_dataset", "eval_dataset", "data_collator"):
            if kwargs.get(name) is not None:
                raise InvalidArgumentError(
                    f"StokerTrainer: {name} is the loader's business; give train_loader= "
                    "(and eval_loader=) instead"
                )
        self.train_loader = TrainerLoader(train_loader)
        self.eval_loader = TrainerLoader(eval_loader) if eval_loader is not None else None
        super().__init__(*args, **kwargs)
        batch_size = getattr(train_loader, "batch_size", None)
        if isinstance(batch_size, int):
            self.args.per_device_train_batch_size = batch_size
            self._train_batch_size = batch_size
        self.add_callback(_SaveLoaderState(self.train_loader))

    def get_train_dataloader(self) -> Any:
        return self.train_loader

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        if eval_dataset is not None and not isinstance(eval_dataset, str):
            return TrainerLoader(eval_dataset)  # evaluate(eval_dataset=another_loader)
        if self.eval_loader is None:
            raise InvalidArgumentError("StokerTrainer: no eval_loader to evaluate on")
        return self.eval_loader

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
    ) -> transformers.trainer_utils.TrainOutput:
        """Trainer's ``train``; resuming from a checkpoint also restores the loader's position
        from the checkpoint's ``stoker_loader.json``."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise InvalidArgumentError(f"no checkpoint in {self.args.output_dir} to resume")
        if resume_from_checkpoint:
            self._restore_loader(str(resume_from_checkpoint))
        return super().train(
            resume_from_checkpoint=resume_from_checkpoint or None,
            trial=trial,
            ignore_keys_for_eval=ignore_keys_for_eval,
        )

    def _restore_loader(self, checkpoint: str) -> None:
        path = os.path.join(checkpoint, LOADER_STATE_NAME)
        if not os.path.isfile(path):
            raise InvalidArgumentError(
                f"{checkpoint} holds no {LOADER_STATE_NAME}: it was not saved by StokerTrainer, "
                "so the loader's position in it is unknown"
            )
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        loader = self.train_loader.loader
        saved_world = state.get("world_size")
        if saved_world is not None and saved_world != getattr(loader, "world_size", saved_world):
            # stoker resumes at any world size; Trainer counts its steps per process, so the
            # step it resumes at and the batches it skips would not match the loader's position.
            raise InvalidArgumentError(
                f"cannot resume {checkpoint}: it was saved with {saved_world} processes and this "
                f"run has {loader.world_size}; Trainer resumes only at the same number (a stoker "
                "loader alone resumes at any: docs/DISTRIBUTED.md)"
            )
        loader.load_state_dict(state)
        # Trainer skips the batches of the epoch it has trained: this rank's batches handed out
        # (a loader's batches_done; a mix's step).
        self.train_loader.skipped = int(state.get("batches_done", state.get("step", 0)))
