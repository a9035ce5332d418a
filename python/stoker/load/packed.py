"""PackedTokenLoader: whole documents of a token pack packed into rows, with labels, position ids,
cu_seqlens and seq_idx (``TokenLoader(packing="best_fit" | "first_fit")``).

The plan of each epoch (stoker.load.packing_plan) comes from the pack's document index; a
step's batch is gathered from the memory-mapped token files by ``threads`` threads, ``prefetch``
steps ahead, in numpy (one fancy-index gather per shard and batch, no Python per token). The
position is a count of the plan's units handed out by all ranks together, so a state resumes at
any world size."""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from ..errors import InvalidArgumentError, step_out_of_range
from ..loader_protocol import EpochSetter, rebuild
from .documents import DocumentPack
from .options import resolve_ranks
from .packing_plan import Plan, check_packing, counts_by_source, deal_rows, plan_epoch
from .packing_plan import steps_per_epoch
from .record import StepRecorder

if TYPE_CHECKING:
    import torch

STATE_VERSION = 1
TOKEN_KINDS = ("real", "padding", "loss", "split", "dropped")


class PackedTokenLoader:
    """Batches of whole documents packed into rows, what ``stoker.TokenLoader(pack,
    packing="best_fit" | "first_fit", ...)`` returns (docs/SEQUENCES.md).

    Each batch is a dict: ``input_ids``, ``labels`` (Hugging Face's convention: -100 at each
    document's first token, where its loss mask is off, and on padding), ``position_ids`` (from
    0 in each document), ``seq_idx``, ``cu_seqlens`` (int32) and ``max_seqlen``;
    ``flatten=True`` gives ``DataCollatorWithFlattening``'s keys and one padding-free row,
    ``max_tokens`` padded rows of one document each with an ``attention_mask``.

    Options beyond TokenLoader's: ``max_segments`` (documents a row at most),
    ``long_documents`` ("split" or "drop" those over ``seq_len``), ``buffer`` (the documents a
    window of the epoch's order packs together), ``pad_id``, ``shift_labels``,
    ``num_items_in_batch`` (adds the loss-bearing token count), ``balance="attention"``,
    ``max_tokens``, ``eos_id`` (documents end at each eos in a pack without an index).
    ``threads="auto"`` (0) makes each batch in the training thread when it is asked for.

    ``len``, ``set_epoch``, ``state_dict``/``load_state_dict`` (at any world size),
    ``sample_ids``/``batch_at``, ``stats()["tokens"]``, ``close`` and pickling behave as on every
    stoker loader."""

    def __init__(
        self,
        path: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        seq_len: int,
        batch_size: int,
        packing: str = "best_fit",
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        eos_id: int | None = None,
        pad_id: int = 0,
        max_segments: int | None = None,
        long_documents: str = "split",
        buffer: int = 10_000,
        flatten: bool = False,
        shift_labels: bool = False,
        balance: str | None = None,
        max_tokens: int | None = None,
        num_items_in_batch: bool = False,
        threads: int | str | None = "auto",
        prefetch: int = 2,
        rank: int | None = None,
        world_size: int | None = None,
        device: "str | torch.device | None" = None,
        device_prefetch: int = 2,
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int | None = None,
        record: str | os.PathLike | None = None,
    ):
        self._init_kwargs = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        check_packing(packing)

        def positive(name: str, value: Any, allow_none: bool = False) -> None:
            if value is None and allow_none:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be a positive int, not {value!r}")

        positive("seq_len", seq_len)
        positive("batch_size", batch_size)
        positive("buffer", buffer)
        positive("prefetch", prefetch)
        positive("max_segments", max_segments, allow_none=True)
        positive("max_tokens", max_tokens, allow_none=True)
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last), ("flatten", flatten),
                           ("shift_labels", shift_labels),
                           ("num_items_in_batch", num_items_in_batch)):  # fmt: skip
            if flag not in (True, False):
                raise InvalidArgumentError(f"{name} must be True or False, not {flag!r}")
        if long_documents not in ("split", "drop"):
            raise InvalidArgumentError(
                f"long_documents is 'split' or 'drop', not {long_documents!r}"
            )
        if balance not in (None, "attention"):
            raise InvalidArgumentError(f"balance is None or 'attention', not {balance!r}")
        if max_tokens is not None:
            if max_tokens < seq_len:
                raise InvalidArgumentError(
                    f"max_tokens ({max_tokens}) must hold a row of seq_len ({seq_len}) tokens"
                )
            if flatten or balance is not None or max_segments is not None:
                raise InvalidArgumentError(
                    "max_tokens makes batches of padded rows, one document each: it does not "
                    "go with flatten, balance or max_segments"
                )
        if threads == "auto" or threads is None:
            # The engine writes a batch of 8 x 2048 tokens in about 50 us: less than handing it
            # over from another thread costs (the GIL's switches). Made in the training thread,
            # 122M tokens/s reach the loop on 2 cores; from one thread ahead, 64M; from two, 47M.
            threads = 0
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
            raise InvalidArgumentError(f"threads must be an int >= 0 or 'auto', not {threads!r}")
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidArgumentError("packing reads one token pack: give its path or URL")
        self.seq_len, self.batch_size, self.packing = seq_len, batch_size, packing
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.pad_id, self.max_segments, self.long_documents = pad_id, max_segments, long_documents
        self.buffer, self.flatten, self.shift_labels = buffer, flatten, shift_labels
        self.balance, self.max_tokens = balance, max_tokens
        self.num_items_in_batch = num_items_in_batch
        self.threads, self.prefetch = int(threads), prefetch
        self._rank, self._world_size = rank, world_size
        self.pack = DocumentPack(path, eos_id=eos_id, cache_dir=cache_dir,
                                 cache_limit=cache_limit)  # fmt: skip
        self.eos_id = self.pack.eos_id
        self.epoch = 0
        self._position = 0  # units of this epoch's plan handed out, all ranks
        self._step = 0  # steps of this epoch handed out (at the world size they were taken)
        self._plans: dict[int, Plan] = {}
        self._tokens = self._zero_counts()
        self._recorder = None if record is None else StepRecorder(record)
        self._pool: ThreadPoolExecutor | None = None
        self._feed: Any = None
        if device is not None:
            from ..device import DeviceFeed

            # No image to normalise (image=()): every tensor is copied as it is.
            self._feed = DeviceFeed(_HostPasses(self), device, prefetch=device_prefetch,
                                    image=(), source_state=self._host_state)  # fmt: skip
        self._closed = False

    # --- the plan ----------------------------------------------------------------------------
    def plan(self, epoch: int) -> Plan:
        """The packing plan of `epoch` (kept for the last two epochs asked for)."""
        plan = self._plans.get(epoch)
        if plan is None:
            plan = plan_epoch(
                self.pack.length,
                seq_len=self.seq_len,
                packing=self.packing,
                seed=self.seed,
                epoch=epoch,
                shuffle=self.shuffle,
                buffer=self.buffer,
                max_segments=self.max_segments,
                long_documents=self.long_documents,
                max_tokens=self.max_tokens,
                span_ptr=self.pack.span_ptr,
                spans=self.pack.spans,
            )
            for old in sorted(self._plans)[:-1]:
                del self._plans[old]
            self._plans[epoch] = plan
        return plan

    @property
    def rank(self) -> int:
        return resolve_ranks(self._rank, self._world_size)[0]

    @property
    def world_size(self) -> int:
        return resolve_ranks(self._rank, self._world_size)[1]

    def _per_step(self, world_size: int) -> int:
        return world_size * (1 if self.max_tokens is not None else self.batch_size)

    def __len__(self) -> int:
        """Steps in the current epoch, from its start, on each rank."""
        plan = self.plan(self.epoch)
        return steps_per_epoch(plan.num_units, self._per_step(self.world_size), self.drop_last)

    def __length_hint__(self) -> int:
        plan = self.plan(self.epoch)
        per = self._per_step(self.world_size)
        return steps_per_epoch(plan.num_units, per, self.drop_last, self._position)

    @property
    def num_documents(self) -> int:
        return self.pack.num_documents

    @property
    def tokens_per_batch(self) -> int:
        """The token slots of a batch (with max_tokens, its budget): what stoker.mix's
        ``by="tokens"`` weighs a batch by."""
        return self.max_tokens or self.batch_size * self.seq_len

    @property
    def sampler(self) -> EpochSetter:
        return EpochSetter(self)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self._position, self._step = int(epoch), 0, 0
            if self._feed is not None:  # the feed's batches in flight and its state are stale
                self._feed.load_state_dict(self._host_state())

    # --- a step's batch ----------------------------------------------------------------------
    def _units(self, plan: Plan, position: int, world_size: int) -> list[np.ndarray]:
        """Each rank's rows at the step starting at `position` (-1: padding)."""
        if plan.batch_ptr is None:
            return deal_rows(plan, position, self.batch_size, world_size, self.balance)
        out: list[np.ndarray] = []
        for b in range(position, position + world_size):
            if b < plan.num_units:
                out.append(np.arange(plan.batch_ptr[b], plan.batch_ptr[b + 1], dtype=np.int64))
            else:
                out.append(np.full(1, -1, dtype=np.int64))
        return out

    def _make(self, plan: Plan, rows: np.ndarray) -> dict[str, Any]:
        """The batch of `rows` (a padding row is -1), written by the engine
        (_core.TokenRows.fill) with the GIL released."""
        import torch

        B = len(rows)
        used, S = self._row_width(plan, rows)
        width = int(used.sum()) if self.flatten else S
        shape = (1, width) if self.flatten else (B, width)
        self.pack.map_for(plan, rows)
        pieces = int(plan.row_tokens_count(rows))
        input_ids = np.empty(shape, dtype=np.int64)
        labels = np.empty(shape, dtype=np.int64)
        position_ids = np.empty(shape, dtype=np.int64)
        seq_idx = np.empty(shape, dtype=np.int32)
        cu = np.empty(pieces + B + 1, dtype=np.int32)
        loss, segments, longest = self.pack.rows.fill(
            self.pack.offset, self.pack.span_ptr, self.pack.spans_flat, plan.row_ptr, plan.doc,
            plan.start, plan.length, rows, input_ids, labels, position_ids, seq_idx, cu, width,
            self.pad_id, self.flatten, self.shift_labels,
        )  # fmt: skip
        cu = cu[: segments + 1]
        batch: dict[str, Any] = {
            "input_ids": torch.from_numpy(input_ids),
            "labels": torch.from_numpy(labels),
            "position_ids": torch.from_numpy(position_ids),
        }
        if self.flatten:  # DataCollatorWithFlattening's keys
            batch["cu_seq_lens_q"] = torch.from_numpy(cu)
            batch["cu_seq_lens_k"] = torch.from_numpy(cu.copy())
            batch["max_length_q"] = batch["max_length_k"] = int(longest)
            batch["seq_idx"] = torch.from_numpy(seq_idx)
        elif self.max_tokens is not None:
            cols = np.arange(width, dtype=np.int64)
            batch["attention_mask"] = torch.from_numpy((cols < used[:, None]).astype(np.int64))
        else:
            batch["seq_idx"] = torch.from_numpy(seq_idx)
            batch["cu_seqlens"] = torch.from_numpy(cu)
            batch["max_seqlen"] = int(longest)
        if self.num_items_in_batch:
            batch["num_items_in_batch"] = torch.tensor(loss, dtype=torch.int64)
        return batch

    def _row_width(self, plan: Plan, rows: np.ndarray) -> tuple[np.ndarray, int]:
        """Each of `rows`' tokens, and the width the batch pads them to."""
        used = plan.row_tokens(rows)
        if self.max_tokens is None:
            return used, self.seq_len
        return used, int(max(1, used.max()))

    def _step_counts(self, plan: Plan, position: int, units: list[np.ndarray]) -> np.ndarray:
        """The step's tokens of every rank, per source and kind (TOKEN_KINDS). A row's padding
        counts under its first document's source."""
        n = len(self.pack.sources)
        if n == 1 and self.max_tokens is None:  # the step's rows are a range of the plan's
            end = min(position + self._per_step(len(units)), plan.num_rows)
            tokens, loss, split = plan.range_sums(position, end)
            padding = 0 if self.flatten else len(units) * self.batch_size * self.seq_len - tokens
            dropped = plan.dropped_tokens if position == 0 else 0
            return np.array([[tokens, padding, loss, split, dropped]], dtype=np.int64)
        out = np.zeros((n, len(TOKEN_KINDS)), dtype=np.int64)
        for rows in units:
            if n == 1:  # one source: the plan's sums per row
                out[0, [0, 2, 3]] += plan.row_sums(rows)
            else:
                c = counts_by_source(plan, plan.pieces_of(rows), self.pack.source, n)
                out[:, 0] += c["real"]
                out[:, 2] += c["loss"]
                out[:, 3] += c["split"]
            if not self.flatten:
                used, width = self._row_width(plan, rows)
                if n == 1:
                    out[0, 1] += len(rows) * width - int(used.sum())
                    continue
                src = np.zeros(len(rows), dtype=np.int64)
                kept = rows >= 0
                src[kept] = self.pack.source[plan.doc[plan.row_ptr[rows[kept]]]]
                out[:, 1] += np.bincount(src, weights=width - used, minlength=n).astype(np.int64)
        if position == 0 and len(plan.dropped_docs):
            d = plan.dropped_docs
            out[:, 4] += np.bincount(self.pack.source[d], weights=self.pack.length[d],
                                     minlength=n).astype(np.int64)  # fmt: skip
        return out

    def _zero_counts(self) -> np.ndarray:
        return np.zeros((len(self.pack.sources), len(TOKEN_KINDS)), dtype=np.int64)

    # --- iteration ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._feed is not None:
            return iter(self._feed)
        return self._host_pass()

    def _host_pass(self) -> Iterator[dict[str, Any]]:
        if self._closed:
            raise InvalidArgumentError("the loader is closed")
        rank, world = resolve_ranks(self._rank, self._world_size)
        epoch = self.epoch
        plan = self.plan(epoch)
        per = self._per_step(world)
        if self._position >= plan.num_units or (
            self.drop_last and plan.num_units - self._position < per
        ):
            # The epoch was finished: this pass is the next one.
            self.epoch, self._position, self._step = epoch + 1, 0, 0
            epoch, plan = self.epoch, self.plan(self.epoch)
        steps = steps_per_epoch(plan.num_units, per, self.drop_last, self._position)
        if self._pool is None and self.threads:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="stoker-pack")
        if self._recorder is not None:
            self._recorder.begin(epoch, self._step, rank, world)
        self.pack.start_fetching(lambda: self._upcoming_shards(plan, world))
        return _PackedPass(self, plan, epoch, rank, world, steps)

    def _upcoming_shards(self, plan: Plan, world: int) -> list[int]:
        """The shards the next steps of every rank read, soonest first (what a pack at a URL
        fetches ahead). Called on the fetcher's threads."""
        start = self._position
        end = min(plan.num_units, start + self._per_step(world) * (self.prefetch + 2))
        if plan.batch_ptr is not None:
            start, end = int(plan.batch_ptr[start]), int(plan.batch_ptr[end])
        return self.pack.shards_for(plan, np.arange(start, end, dtype=np.int64))

    # --- state, replay, stats ----------------------------------------------------------------
    def _host_state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "kind": "packed_tokens",
            "epoch": self.epoch,
            "position": self._position,
            "step": self._step,
            "seed": self.seed,
            "tokens": self._tokens.tolist(),
        }

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: its epoch, the units of the epoch's plan handed out by all ranks
        together, and the token counts. A loader of another world size or thread count loads it
        and continues the same plan."""
        if self._feed is not None:
            return self._feed.state_dict()
        return self._host_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._feed is not None:  # drops what the feed holds, then loads it here
            self._feed.load_state_dict(state)
        else:
            self._load_host_state(state)

    def _load_host_state(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("kind") != "packed_tokens":
            raise InvalidArgumentError("not the state of a packing TokenLoader")
        if state.get("seed") != self.seed:
            raise InvalidArgumentError(
                f"the state was taken with seed {state.get('seed')}, this loader has {self.seed}"
            )
        tokens = np.asarray(state["tokens"], dtype=np.int64)
        if tokens.shape != self._tokens.shape:
            raise InvalidArgumentError("the state's token counts are of another pack")
        self.epoch, self._position = int(state["epoch"]), int(state["position"])
        self._step, self._tokens = int(state["step"]), tokens

    def sample_ids(
        self, epoch: int, step: int, rank: int | None = None
    ) -> list[list[dict[str, int]]] | dict[int, list[list[dict[str, int]]]]:
        """The documents of each row of batch `step` of `epoch` (from the epoch's start, at
        this world size): per row, each piece's ``document`` (its index in the pack),
        ``start`` (its first token in the document) and ``length``. `rank` None: every rank's."""
        world = self.world_size
        plan = self.plan(epoch)
        steps = steps_per_epoch(plan.num_units, self._per_step(world), self.drop_last)
        if not 0 <= step < steps:
            raise step_out_of_range(epoch, step, steps, world)
        units = self._units(plan, step * self._per_step(world), world)

        def describe(rows: np.ndarray) -> list[list[dict[str, int]]]:
            out: list[list[dict[str, int]]] = []
            for r in rows:
                if r < 0:
                    out.append([])
                    continue
                p = range(int(plan.row_ptr[r]), int(plan.row_ptr[r + 1]))
                out.append([{"document": int(plan.doc[i]), "start": int(plan.start[i]),
                             "length": int(plan.length[i])} for i in p])  # fmt: skip
            return out

        if rank is None:
            return {r: describe(units[r]) for r in range(world)}
        return describe(units[rank])

    def batch_at(self, epoch: int, step: int) -> dict[str, Any]:
        """Batch `step` of `epoch` on this rank, as a pass from the epoch's start hands it out."""
        world = self.world_size
        plan = self.plan(epoch)
        steps = steps_per_epoch(plan.num_units, self._per_step(world), self.drop_last)
        if not 0 <= step < steps:
            raise step_out_of_range(epoch, step, steps, world)
        return self._make(plan, self._units(plan, step * self._per_step(world), world)[self.rank])

    def stats(self) -> dict[str, Any]:
        """``tokens``: per source name, the tokens of the batches handed out so far by every
        rank together (the same on each rank; carried by state_dict): ``real`` (documents'
        tokens), ``padding`` (slots without one; under the first source), ``loss`` (labels that
        are not -100), ``split`` (tokens of documents cut into pieces) and ``dropped`` (of
        documents left out, counted when their epoch starts). ``efficiency``: real / (real +
        padding)."""
        tokens = {name: dict(zip(TOKEN_KINDS, map(int, row)))
                  for name, row in zip(self.pack.sources, self._tokens)}  # fmt: skip
        real = int(self._tokens[:, 0].sum())
        padding = int(self._tokens[:, 1].sum())
        out: dict[str, Any] = {
            "tokens": tokens,
            "efficiency": real / (real + padding) if real + padding else 1.0,
            "epoch": self.epoch,
            "documents": self.pack.num_documents,
        }
        if self._feed is not None:
            out["device"] = self._feed.stats()
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._feed is not None:
            self._feed.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._recorder is not None:
            self._recorder.close()
        self.pack.close()

    def __enter__(self) -> "PackedTokenLoader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        return (rebuild, (PackedTokenLoader, self._init_kwargs, self.state_dict()))

    def __repr__(self) -> str:
        return (
            f"PackedTokenLoader({self.pack.path!r}, documents={self.pack.num_documents}, "
            f"seq_len={self.seq_len}, batch_size={self.batch_size}, packing={self.packing!r})"
        )


class _PackedPass:
    """One pass: steps made `prefetch` ahead on the loader's threads, handed out in order; the
    loader's position and counts move as each is handed out."""

    def __init__(
        self, loader: PackedTokenLoader, plan: Plan, epoch: int, rank: int, world: int, steps: int
    ):
        self.loader, self.plan, self.epoch = loader, plan, epoch
        self.rank, self.world = rank, world
        self.per = loader._per_step(world)
        self.steps_left = steps
        self.next_position = loader._position
        self.queue: deque[tuple[int, list[np.ndarray], Future[dict[str, Any]]]] = deque()

    def __iter__(self) -> "_PackedPass":
        return self

    def __length_hint__(self) -> int:
        return self.steps_left + len(self.queue)

    def _submit(self) -> None:
        loader = self.loader
        ahead = loader.prefetch if loader.threads else 1
        while self.steps_left > 0 and len(self.queue) < ahead:
            units = loader._units(self.plan, self.next_position, self.world)
            future: Future[dict[str, Any]] = Future()
            if loader._pool is None:  # threads=0: made here, when asked for
                try:
                    future.set_result(loader._make(self.plan, units[self.rank]))
                except BaseException as e:  # noqa: BLE001 - raised from result() below
                    future.set_exception(e)
            else:
                future = loader._pool.submit(loader._make, self.plan, units[self.rank])
            self.queue.append((self.next_position, units, future))
            self.next_position += self.per
            self.steps_left -= 1

    def __next__(self) -> dict[str, Any]:
        loader = self.loader
        if loader._closed:
            raise StopIteration
        self._submit()
        if not self.queue:
            raise StopIteration
        position, units, future = self.queue.popleft()
        batch = future.result()
        loader._tokens += loader._step_counts(self.plan, position, units)
        loader._position = position + self.per
        loader._step += 1
        if loader._recorder is not None:
            rows = units[self.rank]
            loader._recorder.write(
                index=[int(d) for d in self.plan.doc[self.plan.pieces_of(rows)]],
                rows=[int(self.plan.row_ptr[r + 1] - self.plan.row_ptr[r]) if r >= 0 else 0
                      for r in rows],  # fmt: skip
            )
        if loader.threads:
            self._submit()
        return batch


class _HostPasses:
    """The loader's host passes, as the device feed's source."""

    def __init__(self, loader: PackedTokenLoader):
        self.loader = loader

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.loader._host_pass()

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader._load_host_state(state)
