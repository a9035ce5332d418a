"""TokenLoader: windows of a token stream for language models, from a token pack
(stoker.pack_tokens) or a nanoGPT .bin / .npy file, with the Loader's order, state, ranks,
device feed and remote cache."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import InvalidArgumentError
from .fields import Tokens
from .chain import Preset
from .layout import TokenLayout
from .loader import Loader

if TYPE_CHECKING:
    from .workers import RayWorkers
    import torch


# The options of packing="best_fit" / "first_fit" only, and those of "concat" only.
_PACKING_ONLY = ("pad_id", "max_segments", "long_documents", "buffer", "flatten", "shift_labels",
                 "balance", "max_tokens", "num_items_in_batch")  # fmt: skip
_CONCAT_ONLY = ("dtype", "return_offsets", "return_positions", "cpu_budget", "resident",
                "remote_workers")  # fmt: skip


class TokenLoader(Loader):
    """Language-model batches from a token pack: whole documents packed into rows
    (``packing="best_fit"`` or ``"first_fit"``: a :class:`PackedTokenLoader`, docs/SEQUENCES.md)
    or windows of the token stream (``packing="concat"``, the default, below).

    ``packing="best_fit"`` gives dict batches: ``input_ids``, ``labels`` (Hugging Face's
    convention: aligned, -100 at each document's first token, where its loss mask is off and on
    padding; ``shift_labels=True`` shifted), ``position_ids`` (from 0 in each document),
    ``seq_idx``, ``cu_seqlens`` and ``max_seqlen``; ``flatten=True`` gives
    ``DataCollatorWithFlattening``'s padding-free row and keys. Each row holds whole documents
    (``max_segments`` at most; a longer one than ``seq_len`` is split or dropped:
    ``long_documents``), filled by best (or first) fit decreasing within windows of ``buffer``
    documents of the epoch's keyed order. The plan comes from the pack's document index, so
    ``state_dict`` resumes exactly at any world size; ``balance="attention"`` evens each step's
    attention cost across ranks; ``max_tokens`` makes padded batches of one document per row
    within a token budget; ``stats()["tokens"]`` counts every token per source.

    ``packing="concat"``: batches of ``(x, y)``, int64 ``[batch_size, seq_len]``: each row a
    window of ``seq_len + 1`` consecutive tokens, ``y`` being ``x`` shifted by one (nanoGPT's
    ``get_batch``, without its Python per row).

    ``path``: a token pack (``stoker.pack_tokens``; local or at a URL with ``cache_dir``), or a
    token file: nanoGPT's flat ``.bin`` (give ``dtype``, e.g. ``"uint16"``) or a 1-d ``.npy``.
    The stream is cut into windows starting every ``seq_len`` tokens (they share only their
    boundary token: no token is an input twice in an epoch); a window never crosses a shard's
    end. Each epoch visits every window once, in a permutation keyed by (``seed``, epoch) that
    does not depend on the world size (``shuffle=False``: in order).

    Everything else is the Loader's: ``len``, ``set_epoch``, ``state_dict`` /
    ``load_state_dict`` (exact mid-epoch resume, at another world size too), ranks taken from
    torch.distributed when each pass starts (disjoint shares, the same number of batches),
    ``threads``, ``device="cuda"`` (batches copied on a side stream, ``device_prefetch`` ahead).
    ``resident=True`` reads the whole stream into memory once (refused, with both sizes, when it
    does not fit): into host memory, or with ``device="cuda"`` into GPU memory, where each batch
    is a gather of its windows with no host work per window.

    ``return_offsets=True`` appends each window's first token's offset in the stream (int64
    ``[B]``). ``return_positions=True`` (with ``eos_id``: the pack's, or given) appends
    ``positions`` (int64 ``[B, seq_len]``, restarting at 0 after each ``eos_id``),
    ``cu_seqlens`` (int32, the cumulative document lengths of the flattened batch, as
    ``flash_attn_varlen_func`` takes them) and ``max_seqlen`` (int).
    """

    def __new__(cls, path: Any = None, *args: Any, packing: str = "concat", **kwargs: Any) -> Any:
        if packing == "concat":
            given = sorted(k for k in _PACKING_ONLY if k in kwargs)
            if given:
                raise InvalidArgumentError(
                    f"{', '.join(given)}: options of packing='best_fit' or 'first_fit', not of "
                    "packing='concat'"
                )
            return super().__new__(cls)
        given = sorted(k for k in _CONCAT_ONLY if kwargs.get(k) not in (None, False))
        if given:
            raise InvalidArgumentError(
                f"{', '.join(given)}: options of packing='concat', not of packing={packing!r}"
            )
        from .packed import PackedTokenLoader

        rest = {k: v for k, v in kwargs.items() if k not in _CONCAT_ONLY}
        return PackedTokenLoader(path, *args, packing=packing, **rest)

    def __init__(
        self,
        path: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        seq_len: int,
        packing: str = "concat",
        batch_size: int,
        dtype: str | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        eos_id: int | None = None,
        return_offsets: bool = False,
        return_positions: bool = False,
        threads: int | str | None = "auto",
        cpu_budget: int | None = None,
        prefetch: int = 2,
        rank: int | None = None,
        world_size: int | None = None,
        device: "str | torch.device | None" = None,
        device_prefetch: int = 2,
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int | None = None,
        resident: bool = False,
        record: str | os.PathLike | None = None,
        remote_workers: "RayWorkers | None" = None,
    ):
        self._init_kwargs = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise InvalidArgumentError(f"seq_len must be a positive int, not {seq_len!r}")
        if shuffle not in (True, False):
            raise InvalidArgumentError(f"shuffle must be True or False, not {shuffle!r}")
        self.seq_len = seq_len
        self.return_offsets = return_offsets
        self.return_positions = return_positions
        if eos_id is None and return_positions:
            eos_id = _pack_eos_id(path)
        self.eos_id = eos_id
        self._offsets_table: tuple[Any, Any] | None = None
        dataset_options: dict[str, Any] = {"seq_len": seq_len}
        if dtype is not None:
            dataset_options["token_dtype"] = str(dtype)
        positions_eos = eos_id if return_positions else None

        def on_device(dataset: Any, fields: Any, engine: Any, device: Any) -> Any:
            from .stages.resident import DeviceTokens

            return DeviceTokens(dataset, seq_len, self._offsets, positions_eos, device)

        preset = Preset(
            layout=TokenLayout(self._offsets if return_offsets else None, return_positions),
            dataset_options=dataset_options,
            device_data=on_device,
        )
        super().__init__(
            path,
            batch_size=batch_size,
            fields={"tokens": Tokens(seq_len, eos_id=eos_id, positions=return_positions)},
            train=shuffle,
            shuffle="global" if shuffle else False,
            seed=seed,
            drop_last=drop_last,
            threads=threads,
            cpu_budget=cpu_budget,
            prefetch=prefetch,
            rank=rank,
            world_size=world_size,
            return_index=return_offsets,
            device=device,
            device_prefetch=device_prefetch,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            resident=resident,
            record=record,
            remote_workers=remote_workers,
            _preset=preset,
        )

    @property
    def tokens_per_batch(self) -> int:
        """The tokens of a batch's inputs: what stoker.mix's ``by="tokens"`` weighs it by."""
        return self.batch_size * self.seq_len

    @property
    def num_tokens(self) -> int:
        """Tokens in the stream (all shards)."""
        return sum(self._shard_tokens())

    def _shard_tokens(self) -> list[int]:
        return [int(self.dataset.shard_tokens(s)) for s in range(self.dataset.num_shards)]

    def _offsets(self, indices: Any) -> Any:
        """Each window's first token's offset in the stream: its shard's first token's plus
        seq_len per window before it in the shard."""
        import torch

        if self._offsets_table is None or self._offsets_table[0].device != indices.device:
            # On the indices' device (a resident loader's are on the GPU).
            counts = [self.dataset.shard_samples(s) for s in range(self.dataset.num_shards)]
            window_starts = torch.tensor([0, *counts], dtype=torch.int64).cumsum(0)
            token_starts = torch.tensor([0, *self._shard_tokens()], dtype=torch.int64).cumsum(0)
            device = indices.device
            self._offsets_table = (window_starts.to(device), token_starts.to(device))
        window_starts, token_starts = self._offsets_table
        shard = torch.searchsorted(window_starts, indices, right=True) - 1
        return token_starts[shard] + (indices - window_starts[shard]) * self.seq_len

    def __repr__(self) -> str:
        return (
            f"TokenLoader({self.dataset.path!r}, windows={len(self.dataset)}, "
            f"seq_len={self.seq_len}, batch_size={self.batch_size}, "
            f"threads={self.threads}, rank={self.rank}/{self.world_size}"
            + ("" if self.device is None else f", device={str(self.device)!r}")
            + ")"
        )


def _pack_eos_id(path: Any) -> int | None:
    """The eos_id a local token pack's manifest records, if any."""
    import json

    if not isinstance(path, (str, os.PathLike)):
        return None
    manifest = os.path.join(os.fspath(path), "manifest.json")
    if not os.path.isfile(manifest):
        return None
    with open(manifest, encoding="utf-8") as f:
        value = json.load(f).get("eos_id")
    return value if isinstance(value, int) else None
