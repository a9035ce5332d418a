"""The packing plan of an epoch: which pieces of which documents each row holds, and which rows
(or, with a token budget, which batches) each rank's step takes. A pure function of the
documents' lengths and (seed, epoch), computed from the pack's document index without reading a
token, so that every rank computes the same plan and a resume at any world size continues it.

1. The epoch's order: the documents in a permutation keyed by (seed, epoch) (or pack order).
2. Pieces: a document of up to ``seq_len`` tokens is one piece; a longer one is cut into pieces
   of ``seq_len`` (its last piece shorter) with ``long_documents="split"``, or left out
   (counted) with ``"drop"``.
3. Rows: pieces ``window`` at a time, each window's in decreasing length into the tightest row
   that holds them (best fit) or the first (first fit), at most ``max_segments`` pieces a row
   (stoker._core.pack_rows); the rows of a window are shuffled (keyed) so that the long
   documents do not all come first. With a token budget instead: each window's pieces in
   decreasing length, one per row, cut into batches of as many rows as keep ``rows x longest``
   within ``max_tokens``, the batches shuffled.
4. Steps: a global position counts the units (rows, or batches) handed out, all ranks together.
   A step takes ``world_size`` ranks' worth of units from there: ``batch_size`` rows per rank
   (dealt by attention cost with ``balance="attention"``) or one batch per rank. Past the
   plan's end a rank gets padding rows (an empty batch), so every rank has as many steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import _core
from ..errors import InvalidArgumentError

PACKINGS = ("best_fit", "first_fit")


def keyed_generator(seed: int, epoch: int, salt: int) -> np.random.Generator:
    """A numpy Generator keyed by (seed, epoch, salt): the same on every rank and run."""
    key = np.array([seed & (2**64 - 1), (epoch << 8 | salt) & (2**64 - 1)], dtype=np.uint64)
    return np.random.Generator(np.random.Philox(key=key))


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The concatenation of arange(s, s + c) for each (s, c), without a Python loop."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(counts)
    offsets = np.repeat(np.asarray(starts, dtype=np.int64) - (ends - counts), counts)
    return offsets + np.arange(total, dtype=np.int64)


@dataclass
class Plan:
    """An epoch's rows: row ``r`` holds pieces ``row_ptr[r]:row_ptr[r + 1]``, each ``length``
    tokens of document ``doc`` from token ``start``. With a token budget each row holds one
    piece and batch ``b`` is rows ``batch_ptr[b]:batch_ptr[b + 1]``."""

    seq_len: int
    row_ptr: np.ndarray
    doc: np.ndarray
    start: np.ndarray
    length: np.ndarray
    loss: np.ndarray  # each piece's loss-bearing tokens (labels that are not -100)
    split: np.ndarray  # whether each piece is of a document that was cut
    dropped_docs: np.ndarray  # documents left out (long_documents="drop")
    batch_ptr: np.ndarray | None = None
    _row_cost: np.ndarray | None = field(default=None, repr=False)
    _row_tokens: np.ndarray | None = field(default=None, repr=False)
    _row_sums: np.ndarray | None = field(default=None, repr=False)
    _range_cum: np.ndarray | None = field(default=None, repr=False)
    dropped_tokens: int = 0  # of the documents left out

    @property
    def num_rows(self) -> int:
        return len(self.row_ptr) - 1

    @property
    def num_units(self) -> int:
        """What a step's position counts: rows, or with a token budget batches."""
        return self.num_rows if self.batch_ptr is None else len(self.batch_ptr) - 1

    def row_cost(self) -> np.ndarray:
        """Each row's attention cost: the sum of its pieces' squared lengths."""
        if self._row_cost is None:
            cum = np.concatenate(([0.0], np.cumsum(self.length.astype(np.float64) ** 2)))
            self._row_cost = cum[self.row_ptr[1:]] - cum[self.row_ptr[:-1]]
        return self._row_cost

    def row_tokens(self, rows: np.ndarray) -> np.ndarray:
        """The tokens each of `rows` holds (a padding row, -1, none)."""
        if self._row_tokens is None:
            cum = np.concatenate(([0], np.cumsum(self.length)))
            self._row_tokens = cum[self.row_ptr[1:]] - cum[self.row_ptr[:-1]]
        return np.where(rows >= 0, self._row_tokens[np.maximum(rows, 0)], 0)

    def range_sums(self, first: int, end: int) -> tuple[int, int, int]:
        """The real, loss-bearing and split tokens of rows first .. end - 1."""
        if self._range_cum is None:
            per_piece = np.stack((self.length, self.loss, np.where(self.split, self.length, 0)))
            cum = np.concatenate((np.zeros((3, 1), np.int64), np.cumsum(per_piece, axis=1)), 1)
            self._range_cum = cum[:, self.row_ptr].T.copy()  # [rows + 1, 3]
        if end <= first:
            return 0, 0, 0
        d = self._range_cum[end] - self._range_cum[first]
        return int(d[0]), int(d[1]), int(d[2])

    def row_sums(self, rows: np.ndarray) -> np.ndarray:
        """The real, loss-bearing and split tokens `rows` hold together (padding rows none)."""
        if self._row_sums is None:
            per_piece = np.stack((self.length, self.loss, np.where(self.split, self.length, 0)))
            cum = np.concatenate((np.zeros((3, 1), np.int64), np.cumsum(per_piece, axis=1)), 1)
            self._row_sums = (cum[:, self.row_ptr[1:]] - cum[:, self.row_ptr[:-1]]).T.copy()
        real = rows[rows >= 0]
        return self._row_sums[real].sum(axis=0)

    def row_tokens_count(self, rows: np.ndarray) -> int:
        """The pieces `rows` hold (padding rows none)."""
        real = rows[rows >= 0]
        return int((self.row_ptr[real + 1] - self.row_ptr[real]).sum())

    def pieces_of(self, rows: np.ndarray) -> np.ndarray:
        """The pieces of `rows` (padding rows, -1, have none), row after row."""
        rows = rows[rows >= 0]
        return ranges(self.row_ptr[rows], self.row_ptr[rows + 1] - self.row_ptr[rows])


def loss_tokens(
    doc: np.ndarray,
    start: np.ndarray,
    length: np.ndarray,
    span_ptr: np.ndarray,
    spans: np.ndarray,
) -> np.ndarray:
    """Each piece's loss-bearing tokens: all but its first (nothing before it to predict it
    from), less those of its document's loss-off spans inside it."""
    loss = length - 1
    counts = span_ptr[doc + 1] - span_ptr[doc]
    if not len(spans) or not counts.any():
        return loss
    which = np.repeat(np.arange(len(doc)), counts)
    sp = spans[ranges(span_ptr[doc], counts)]
    lo = np.maximum(sp[:, 0], start[which] + 1)
    hi = np.minimum(sp[:, 1], start[which] + length[which])
    off = np.bincount(which, weights=np.maximum(hi - lo, 0), minlength=len(doc))
    return loss - off.astype(np.int64)


def plan_epoch(
    lengths: np.ndarray,
    *,
    seq_len: int,
    packing: str = "best_fit",
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    buffer: int = 10_000,
    max_segments: int | None = None,
    long_documents: str = "split",
    max_tokens: int | None = None,
    span_ptr: np.ndarray | None = None,
    spans: np.ndarray | None = None,
) -> Plan:
    """The plan of `epoch` for documents of `lengths` (the module's docstring says how)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    order = (
        keyed_generator(seed, epoch, 1).permutation(n) if shuffle else np.arange(n, dtype=np.int64)
    )
    ordered = lengths[order]
    if long_documents == "drop":
        kept = ordered <= seq_len
        dropped = order[~kept]
        order, ordered = order[kept], ordered[kept]
        counts = np.ones(len(order), dtype=np.int64)
    else:
        dropped = np.zeros(0, dtype=np.int64)
        counts = -(-ordered // seq_len)
    doc = np.repeat(order, counts)
    first = np.cumsum(counts) - counts
    start = (np.arange(len(doc), dtype=np.int64) - np.repeat(first, counts)) * seq_len
    length = np.minimum(seq_len, lengths[doc] - start)
    split = np.repeat(counts > 1, counts)
    if span_ptr is None or spans is None:
        span_ptr, spans = np.zeros(len(lengths) + 1, dtype=np.int64), np.zeros((0, 2), np.int64)
    loss = loss_tokens(doc, start, length, span_ptr, spans)

    rng = keyed_generator(seed, epoch, 2)
    window = max(1, int(buffer))
    if max_tokens is None:
        row_of = np.empty(len(doc), dtype=np.int64)
        slot_of = np.empty(len(doc), dtype=np.int64)
        num_rows = _core.pack_rows(length, row_of, slot_of, seq_len, max_segments or 0, window,
                                   packing)  # fmt: skip
        # Rows open window after window: each window's are a range, shuffled (keyed) in place.
        new_row = np.arange(num_rows, dtype=np.int64)
        if shuffle and len(doc):
            firsts = np.arange(0, len(doc), window)
            ends = np.maximum.reduceat(row_of, firsts) + 1
            begins = np.concatenate(([0], ends[:-1]))
            for a, b in zip(begins.tolist(), ends.tolist()):
                new_row[a:b] = a + rng.permutation(b - a)
        row = new_row[row_of]
        row_ptr = np.zeros(num_rows + 1, dtype=np.int64)
        np.cumsum(np.bincount(row, minlength=num_rows), out=row_ptr[1:])
        by_row = np.empty(len(doc), dtype=np.int64)  # a counting sort by (row, slot)
        by_row[row_ptr[row] + slot_of] = np.arange(len(doc), dtype=np.int64)
        batch_ptr = None
    else:
        # One piece per row; each window's in decreasing length, cut into batches within budget.
        window_id = np.arange(len(doc)) // window
        by_row = np.lexsort((-length, window_id))
        sorted_len = length[by_row]
        sorted_win = window_id[by_row]
        cuts = [0]
        i = 0
        while i < len(by_row):
            rows = max(1, int(max_tokens // sorted_len[i]))  # the first is the longest
            end = min(i + rows, len(by_row))
            same = np.flatnonzero(sorted_win[i:end] != sorted_win[i])
            if len(same):
                end = i + int(same[0])
            cuts.append(end)
            i = end
        bounds = np.asarray(cuts, dtype=np.int64)
        batch_order = rng.permutation(len(bounds) - 1) if shuffle else np.arange(len(bounds) - 1)
        sizes = np.diff(bounds)[batch_order]
        by_row = by_row[ranges(bounds[:-1][batch_order], sizes)]
        row_ptr = np.arange(len(doc) + 1, dtype=np.int64)
        batch_ptr = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    return Plan(
        seq_len=seq_len,
        row_ptr=row_ptr,
        doc=doc[by_row],
        start=start[by_row],
        length=length[by_row],
        loss=loss[by_row],
        split=split[by_row],
        dropped_docs=dropped,
        dropped_tokens=int(lengths[dropped].sum()),
        batch_ptr=batch_ptr,
    )


def steps_per_epoch(units: int, per_step: int, drop_last: bool, done: int = 0) -> int:
    """Steps from global position `done` to the plan's end, `per_step` units a step."""
    left = max(0, units - done)
    return left // per_step if drop_last else -(-left // per_step)


def deal_rows(
    plan: Plan, position: int, batch_size: int, world_size: int, balance: str | None
) -> list[np.ndarray]:
    """Each rank's rows at the step starting at global row `position` (-1: a padding row)."""
    per_step = batch_size * world_size
    rows = np.arange(position, position + per_step, dtype=np.int64)
    rows[rows >= plan.num_rows] = -1
    if balance is None:
        return [rows[r * batch_size : (r + 1) * batch_size] for r in range(world_size)]
    # Longest processing time first: each row, costliest first, to the rank with the least
    # cost so far among those with room.
    cost = np.where(rows >= 0, plan.row_cost()[np.maximum(rows, 0)], 0.0)
    dealt: list[list[int]] = [[] for _ in range(world_size)]
    load = np.zeros(world_size)
    for i in np.argsort(-cost, kind="stable"):
        open_ranks = [r for r in range(world_size) if len(dealt[r]) < batch_size]
        r = min(open_ranks, key=lambda k: (load[k], k))
        dealt[r].append(int(rows[i]))
        load[r] += cost[i]
    return [np.asarray(sorted(d, key=lambda x: (x < 0, x)), dtype=np.int64) for d in dealt]


def check_packing(packing: str) -> None:
    if packing not in PACKINGS:
        raise InvalidArgumentError(f"packing is one of {PACKINGS + ('concat',)}, not {packing!r}")


def counts_by_source(
    plan: Plan, pieces: np.ndarray, sources: np.ndarray, num_sources: int
) -> dict[str, np.ndarray]:
    """Per source: the real, loss-bearing and split tokens of `pieces`."""
    src = sources[plan.doc[pieces]]
    length = plan.length[pieces].astype(np.float64)

    def per(weights: Any) -> np.ndarray:
        return np.bincount(src, weights=weights, minlength=num_sources).astype(np.int64)

    return {
        "real": per(length),
        "loss": per(plan.loss[pieces].astype(np.float64)),
        "split": per(np.where(plan.split[pieces], length, 0.0)),
    }
