"""``stoker.mix(loaders, weights, ...)``: the public function that makes a :class:`Mix`, with
the user's documentation of the draws, the stopping rules and the schedules."""

from __future__ import annotations

import os
from typing import Iterable, Sequence

from .draws import Weights
from .iterable import BatchT, Mix
from .position import StopRule


def mix(
    loaders: Sequence[Iterable[BatchT]],
    weights: Weights,
    *,
    seed: int = 0,
    stop: StopRule = "first_exhausted",
    length: int | None = None,
    check_structure: bool = True,
    record: str | os.PathLike | None = None,
    by: str = "batches",
) -> Mix[BatchT]:
    """Batches from several loaders in the given proportions, as one loader.

    Each step draws which loader gives the next batch, with probability ``weights[i]`` (any
    non-negative numbers, normalised; a weight of 0 leaves its loader out), from a random number
    keyed by (``seed``, epoch, step): the sequence of sources is a pure function of the seed, the
    epoch and the stopping rule, never of timing, so it is the same on every rank, run or resume.

    ``stop`` says what happens when the loader drawn has no batch left in its pass (the names
    and meanings of HuggingFace datasets' ``interleave_datasets``):

    - ``"first_exhausted"`` (default): the epoch ends there. Proportions hold to the end; each
      batch is seen at most once per epoch; what the other loaders had left is not.
    - ``"all_exhausted"``: that loader starts its next pass (oversampling) and the epoch ends
      when every loader has run out at least once. Proportions hold to the end; the smaller
      loaders' batches are seen several times.
    - ``"all_exhausted_without_replacement"``: that loader leaves the draw, the others are drawn
      with their weights renormalised, and the epoch ends when all have run out: every batch
      exactly once, but the end of the epoch is made of the largest loaders only.
    - ``"never"``: loaders restart whenever they run out; the epoch is ``length`` batches
      (endless without it).

    ``length``: at most this many batches per epoch (exactly this many with ``"never"``).

    ``by="tokens"``: the weights are proportions of tokens, not of batches, for language-model
    loaders of different ``seq_len`` or ``batch_size`` (each says its ``tokens_per_batch``): a
    loader is drawn with probability proportional to its weight over its tokens per batch. The
    proportions are of the batches' token slots; packed rows fill 99% of theirs or more, so
    the documents' tokens come within a percent of them (``stats()["tokens"]`` counts them).

    Weights on a schedule (a curriculum): ``weights=[(0, [1, 0]), (10_000, [0.5, 0.5])]``
    (``(step, weights)`` points, linear in between, the first and last held before and after)
    or ``weights=lambda step: [...]``. The step is the mix's batches handed out before this one,
    over all its epochs; ``state_dict`` carries it, so a resume continues exactly across a weight
    change. The draw stays keyed by (seed, epoch, step in the epoch). A scheduled mix starts a
    loader's pass when it is first drawn; ``len()`` replays the schedule too.

    A restarted loader's pass ``p`` (from 1) in epoch ``e`` runs at its epoch
    ``e + p * 2**32`` (``set_epoch``), so no pass repeats another's order or augmentation.

    The result iterates like a DataLoader: ``len()`` (when the loaders have one), ``set_epoch``
    (forwarded to every loader), ``state_dict()``/``load_state_dict()`` (when every loader has
    them: the mix's position plus each loader's state; a resume continues with exactly the
    batches an uninterrupted run would have given), ``stats()`` (batches per loader, realised
    proportions) and ``close()`` (closes the loaders). ``stoker.to_device`` works on top of it.

    ``check_structure``: every batch is compared with the mix's first one (container types,
    dict keys, tuple lengths, each tensor's dtype, number of dimensions and device; not sizes):
    a difference raises ``InvalidArgumentError`` naming both loaders and where they differ.

    Replay: ``source_at(epoch, step)``, ``sample_ids`` and ``batch_at`` say which loader a step
    drew and give its batch again; ``record="mix.jsonl"`` appends a line per step naming the
    loader drawn and that loader's own epoch and step (whose ``record=`` lists the samples).
    """
    return Mix(
        loaders,
        weights,
        seed=seed,
        stop=stop,
        length=length,
        check_structure=check_structure,
        record=record,
        by=by,
    )
