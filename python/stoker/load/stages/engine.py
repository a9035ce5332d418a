"""The first stage: the C++ engine's pass (pipeline/loader.h), its batches assembled field by
field (one tensor or list per field, handed over without a copy), with the pass's position
(state), the engine's stage times and skipped samples (stats), the warnings and the
quarantine report of on_error, and a pack at a URL fetched ahead of the pass."""

from __future__ import annotations

import os
import sys
import warnings
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

from ... import _core
from ...errors import InvalidArgumentError, StokerWarning, error_class
from ..fields import Bytes
from ..options import DEFAULT_SHUFFLE_WINDOW, SHUFFLE_MODES, LoaderOptions, resolve_ranks
from . import HostBatch, Stage

# 2: the epoch's position is `samples_consumed`, counted over all ranks (a state resumes at any
# world size); 1 counted this rank's `batches_done` (and resumed only at its world size).
STATE_VERSION = 2


def engine_threads(options: LoaderOptions, cpu_budget: int) -> int:
    """The engine's worker threads: `threads`, or with "auto" the CPU budget to start from."""
    return cpu_budget if options.threads == "auto" else int(options.threads)


class EnginePass(Stage):
    """The engine's batches as `HostBatch`es, one pass per iteration."""

    def __init__(self, dataset: Any, remote: Any, fields: dict[str, Any], specs: list[Any],
                 options: LoaderOptions, cpu_budget: int, keep_slots: bool,
                 load_samples: bool, groups: Any = None):  # fmt: skip
        super().__init__(None)
        self.dataset, self.remote, self.fields, self.options = dataset, remote, fields, options
        self.groups = groups  # buckets= or group_by=: stoker.load.grouping.GroupPlan
        o = _core.LoaderOptions()
        o.batch_size = options.batch_size
        o.fields = specs
        o.missing = getattr(_core.MissingPolicy, options.missing)
        o.shuffle = SHUFFLE_MODES[options.shuffle]
        o.shuffle_window = options.shuffle_window
        o.seed = options.seed
        o.drop_last = options.drop_last
        o.threads = engine_threads(options, cpu_budget)
        o.autotune = options.threads == "auto"
        o.read_latency_us = options.read_latency_us
        o.prefetch = options.prefetch
        o.rank, o.world_size = resolve_ranks(options.rank, options.world_size, strict=False)
        o.on_error = {
            "raise": _core.ErrorPolicy.raise_,
            "replace": _core.ErrorPolicy.replace,
        }.get(options.on_error, _core.ErrorPolicy.skip)
        o.max_errors, o.max_error_fraction = options.max_errors
        o.verify_crc = options.verify_crc
        o.keep_slots = keep_slots
        o.load_samples = self.load_samples = load_samples
        if groups is not None:
            o.grouping = groups.grouping
            o.group_image_sizes = groups.image_sizes
            o.group_frames = groups.frames
            o.sized_field = list(fields).index(groups.image_field) if groups.image_field else -1
        self.engine = _core.Loader(dataset, o)
        # How next()'s flat outputs become the batch: per field, its outputs' positions.
        outputs = self.engine.outputs
        self.plan = [
            (name, f, [k for k, (field, _) in enumerate(outputs) if field == name])
            for name, f in fields.items()
        ]
        self.blob_fields = list(self.engine.blob_fields)
        self.epoch = 0  # of the pass in progress
        self.step = 0  # of this rank, where the pass started
        self.closed = False
        self.limit = -1  # batches a pass hands out at most (-1: to the end of the epoch)
        self.last_address = 0  # of the last batch's slot
        self._warned = 0  # skipped samples already warned about
        self._gate_entries: list[list[int]] | None = None

    # --- ranks and the pass -------------------------------------------------------------------
    def sync_ranks(self, strict: bool = False) -> tuple[int, int]:
        """Resolve the ranks now and give them to the engine, for the passes begun from now on
        (a pass in progress keeps its own)."""
        rank, world_size = resolve_ranks(self.options.rank, self.options.world_size,
                                         strict=strict)  # fmt: skip
        self.engine.set_ranks(rank, world_size)
        return rank, world_size

    def __iter__(self) -> Iterator[HostBatch]:
        if self.closed:
            raise InvalidArgumentError("the loader is closed")
        self.sync_ranks(strict=True)
        self.engine.begin(self.limit)
        if self.remote is not None:
            # After begin(): the fetchers find the pass's plan at once (before it, none: they
            # would idle until the workers' first requests). Weakly: the fetcher's threads must
            # not keep an abandoned pass (and so themselves) alive; once it is collected, the
            # loader's close() stops them.
            plan = weakref.WeakMethod(self._upcoming_shards)
            self.remote.start(lambda: method() if (method := plan()) is not None else ())
        self.epoch, consumed, steps = self.engine.state()
        o = self.engine.options
        self.step = steps if self.groups is not None else (
            consumed // (self.options.batch_size * o.world_size))  # fmt: skip
        return Batches(self._batches(), self.engine.batches_left)

    def _batches(self) -> Iterator[HostBatch]:
        while True:
            try:
                item: Any = self.engine.next()
            finally:
                if self.options.on_error == "warn":
                    self._warn_skipped()
            if item is None:
                self._write_quarantine()
                return
            outputs, blobs, indices, address, number = item
            self.last_address = address
            fields = self.assemble(outputs, blobs) if self.load_samples else {}
            yield HostBatch(fields, indices, self.epoch, outputs, blobs, address, number)

    def assemble(self, outputs: list[Any], blobs: list[Any]) -> dict[str, Any]:
        """The engine's flat outputs of a batch as a dict of fields."""
        batch: dict[str, Any] = {}
        for name, f, positions in self.plan:
            if isinstance(f, Bytes):
                batch[name] = f._convert(blobs[self.blob_fields.index(name)])
                continue
            tensors = [outputs[k] for k in positions]
            batch[name] = f._assemble(tensors)
            batch.update(f._extras(name, tensors))
        return batch

    def _upcoming_shards(self) -> Sequence[int]:
        """The shards this pass reads next, soonest first (what a remote pack fetches ahead)."""
        assert self.remote is not None
        # Past the shards read next, as far as a shuffle window: the fetcher looks beyond those
        # already cached for the next ones to fetch (RemotePack._wanted).
        ahead = self.remote.prefetch_shards + self.engine.threads + self.options.shuffle_window
        shards = self.engine.upcoming_shards(ahead)
        if self._gate_entries is None:  # the fetcher fetches files: each shard's, in order
            d = self.dataset
            # A sidecar's files (attached/NAME/...) only where a field reads NAME.
            used = {m for _, f, _ in self.plan for m in str(getattr(f, "member", "")).split(";")}

            def read(name: str) -> bool:
                return not name.startswith("attached/") or name.split("/")[1] in used

            self._gate_entries = [
                [int(f["gate_entry"]) for f in d.shard_files(s) if read(f["name"])]
                for s in range(d.num_shards)
            ]
        return [entry for shard in shards for entry in self._gate_entries[shard]]

    # --- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        epoch, samples_consumed, batches_done = self.engine.state()
        options, o = self.options, self.engine.options
        return {
            "version": STATE_VERSION,
            "epoch": epoch,
            # Positions of the epoch's order the ranks have consumed together: what a resume
            # reads, at any world size.
            "samples_consumed": samples_consumed,
            "batches_done": batches_done,  # this rank's, at this world size: informative
            "seed": options.seed,
            "num_samples": len(self.dataset),
            "batch_size": options.batch_size,
            "rank": o.rank,  # the ranks batches_done was counted at
            "world_size": o.world_size,
            "shuffle": options.shuffle,
            "shuffle_window": options.shuffle_window,
            "drop_last": options.drop_last,
            # Grouped batches resume at the step (batches_done), at the same world size and
            # grouping; at an epoch's start, at any world size.
            **({"grouping": self.groups.fingerprint} if self.groups is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = upgrade_state(state)
        options = self.options
        # What the epoch's order depends on must match; the world size need not (the order does
        # not depend on it, and samples_consumed counts every rank's samples).
        checks = [
            ("seed", options.seed),
            ("num_samples", len(self.dataset)),
            ("batch_size", options.batch_size),
            ("shuffle", options.shuffle),
        ]
        if options.shuffle == "block":
            checks.append(("shuffle_window", options.shuffle_window))
        if self.groups is not None:
            checks.append(("grouping", self.groups.fingerprint))
            if state["batches_done"] > 0:  # mid-epoch: the steps are this world size's
                checks.append(("world_size", self.sync_ranks()[1]))
        for name, mine in checks:
            if state.get(name) != mine:
                raise InvalidArgumentError(
                    f"cannot resume: the state has {name}={state.get(name)!r}, this loader "
                    f"{mine!r}" + (" (grouped batches resume mid-epoch at the world size they "
                                   "were saved at)" if name == "world_size" else "")
                )
        self.engine.load_state(state["epoch"], state["samples_consumed"], state["batches_done"])

    # --- stats and errors -------------------------------------------------------------------
    def stats(self, into: dict[str, Any]) -> None:
        stats = self.engine.stats()
        if self.remote is not None:
            stats["remote"] = self.remote.stats()
        for sample in stats["skipped_samples"]:
            sample["error"] = error_class(sample.pop("code")).__name__
        into.update(stats)

    def _warn_skipped(self) -> None:
        for sample in self.engine.skipped_since(self._warned):
            self._warned += 1
            warnings.warn(
                f"stoker skipped {sample['shard']}: sample {sample['key']!r}: "
                f"{error_class(sample['code']).__name__}: {sample['reason']}",
                StokerWarning,
                stacklevel=_caller_level(),
            )

    def _write_quarantine(self) -> None:
        if self.options.quarantine is None:
            return
        from ..quarantine import write_report

        stats: dict[str, Any] = {}
        self.stats(stats)
        write_report(
            self.options.quarantine,
            source=os.fspath(self.dataset.path),
            kind="loader",
            checked=stats["samples"] + stats["skipped"],
            failures=stats["skipped_samples"],
        )

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.engine.close()  # the remote pack's fetcher, acquired before, is closed after
        self._write_quarantine()


class Batches:
    """A pass's batches, with ``__length_hint__``: how many are left, at most (the engine's
    count), so that a consumer pulling ahead (the device feed) can stop short of the next() that
    ends the pass, which ends the epoch too."""

    def __init__(self, batches: Iterator[Any], left: Any):
        self._batches, self._left = batches, left

    def __iter__(self) -> "Batches":
        return self

    def __next__(self) -> Any:
        return next(self._batches)

    def __length_hint__(self) -> int:
        return self._left()

    def close(self) -> None:
        self._batches.close()  # type: ignore[attr-defined]


def _caller_level() -> int:
    """warnings.warn's stacklevel of the first frame outside stoker: the training loop's, however
    many stages the batch went through."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    level, frame = 1, sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package + os.sep):
        level, frame = level + 1, frame.f_back
    return level


def upgrade_state(state: dict[str, Any]) -> dict[str, Any]:
    """A state of any version this loader reads, as the current version."""
    version = state.get("version")
    if version == STATE_VERSION:
        return state
    if version == 1:
        # Version 1's order was today's "global" (or pack order) dealt the same way, and its
        # ranks moved in step: batches_done batches on each of world_size ranks.
        consumed = state["batches_done"] * state["batch_size"] * state["world_size"]
        return dict(
            state,
            version=STATE_VERSION,
            samples_consumed=min(consumed, state["num_samples"]),
            shuffle="global" if state["shuffle"] else False,
            shuffle_window=DEFAULT_SHUFFLE_WINDOW,
        )
    raise InvalidArgumentError(f"unknown loader state version {version!r}")
