"""Datasets held whole in memory (``resident=True``): checked against the free memory before
anything is copied, then either read by the engine from host memory, or, on a GPU, held there as
tensors and made into batches by batched tensor operations: a gather of the engine's sample
indices, the Image field's geometry as index arithmetic, no host work per sample.

The GPU path (:class:`DeviceColumns`, :class:`DeviceTokens`, and the stage that uses them,
:class:`ResidentGather`) gives the engine's batches bit for bit: the geometry is drawn by the
engine's own keyed draws (the engine's draw_geometry), and only
geometries that move whole pixels (RandomCrop, flips, a Resize or CenterCrop to the size the
pixels already have) run there; one that would resample is refused, naming what to do instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InvalidArgumentError, ResourceLimitError
from . import HostBatch, Stage

if TYPE_CHECKING:
    import torch

# Memory left to everything else when a dataset is made resident: 10% of the total, at least 1 GiB.
MARGIN_FRACTION = 0.10
MARGIN_MIN = 1 << 30


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_fits(needed: int, where: str, free: int, total: int) -> None:
    """Refuses `needed` bytes when they do not fit in `free` less the margin, before anything is
    copied."""
    margin = max(MARGIN_MIN, int(MARGIN_FRACTION * total))
    if needed > free - margin:
        raise ResourceLimitError(
            f"resident=True: the dataset needs {_gib(needed)} of {where} memory, which has "
            f"{_gib(free)} free and keeps {_gib(margin)} of it for everything else "
            f"({_gib(max(0, free - margin))} available): read it from disk (resident=False), or "
            "make it smaller"
        )


def host_memory() -> tuple[int, int]:
    """(available, total) bytes of this process's memory: the machine's, or its cgroup's limit."""
    import psutil

    vm = psutil.virtual_memory()
    available, total = int(vm.available), int(vm.total)
    try:  # a container's limit (cgroup v2) can be far below the machine's
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            total = min(total, int(limit))
            available = min(available, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return available, total


def device_memory(device: "torch.device") -> tuple[int, int]:
    import torch

    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)
    return host_memory()


def _manifest(path: Any) -> dict[str, Any]:
    with open(os.path.join(os.fspath(path), "manifest.json"), encoding="utf-8") as f:
        return json.load(f)


class DeviceColumns:
    """An array pack's columns as tensors on `device`, and the batches of its fields."""

    def __init__(self, dataset: Any, fields: dict[str, Any], engine: Any, device: "torch.device"):
        import torch

        from ..fields import Array, Image, Label

        self.dataset, self.fields, self.engine, self.device = dataset, fields, engine, device
        manifest = _manifest(dataset.path) if os.path.isdir(dataset.path) else {}
        if manifest.get("format") != "stoker-arrays":
            raise InvalidArgumentError(
                "resident=True on a GPU holds an array pack (stoker.pack_arrays) or token data; "
                "for other packs, resident=True with device=None keeps them in host memory"
            )
        columns = {f["name"]: f for f in manifest["fields"]}
        self.plan: list[tuple[str, Any, str, int]] = []  # (batch key, field, column, field index)
        for k, (name, field) in enumerate(fields.items()):
            column = field.member.split(";")[0]
            if not isinstance(field, (Image, Label, Array)) or column not in columns:
                raise InvalidArgumentError(
                    f"resident=True on a GPU: field {name!r} ({type(field).__name__}) is not an "
                    "Image, Label or Array of one of the pack's columns "
                    f"({', '.join(columns)})"
                )
            if isinstance(field, Image) and field.follow:
                raise InvalidArgumentError(
                    f"resident=True on a GPU: Image {name!r} must draw its own geometry"
                )
            if isinstance(field, Image) and field.channels == 1 and column in columns:
                shape = columns[column]["shape"]
                if len(shape) == 3 and shape[2] != 1:
                    raise InvalidArgumentError(
                        f"resident=True on a GPU: Image {name!r} asks for 1 channel of column "
                        f"{column!r}, which holds {shape[2]}; pack the grey pixels, or use "
                        "resident=True with device=None (the engine converts them)"
                    )
            self.plan.append((name, field, column, k))
        needed = {c for _, _, c, _ in self.plan}
        rows = sum(s["num_samples"] for s in manifest["shards"])
        row_bytes = {
            c: int(np.prod(columns[c]["shape"], dtype=np.int64))
            * np.dtype(columns[c]["dtype"]).itemsize
            for c in needed
        }
        free, total = device_memory(device)
        check_fits(rows * sum(row_bytes.values()), str(device), free, total)
        self.columns: dict[str, torch.Tensor] = {}
        for c in needed:
            spec = columns[c]
            held = torch.empty((rows, *spec["shape"]), dtype=_torch_dtype(spec["dtype"]),
                               device=device)  # fmt: skip
            at = 0
            for shard in manifest["shards"]:
                (entry,) = [f for f in shard["files"] if f["field"] == c]
                part = np.load(Path(dataset.path) / entry["file"], mmap_mode="r")
                held[at : at + len(part)].copy_(torch.from_numpy(np.array(part)))  # a shard
                at += len(part)
            self.columns[c] = held
        self.bytes = rows * sum(row_bytes.values())

    def batch(self, indices: "torch.Tensor", epoch: int) -> dict[str, Any]:
        import torch

        from ..fields import Array, Image

        index = indices.to(self.device, non_blocking=True)
        out: dict[str, Any] = {}
        for name, field, column, k in self.plan:
            rows = self.columns[column].index_select(0, index)
            if isinstance(field, Image):
                out[name] = self._image(rows, field, k, indices, epoch)
            elif isinstance(field, Array):
                dtype = _torch_dtype(str(field.dtype or "float32"))
                out[name] = rows.to(dtype)
            else:
                out[name] = rows.to(torch.int64).reshape(len(rows))
        return out

    def _image(self, rows: "torch.Tensor", field: Any, k: int, indices: Any, epoch: int) -> Any:
        """The Image field's geometry on `rows` ([B, H, W, C] or [B, H, W] uint8): the engine's
        draws, applied as a gather (whole pixels only), then its flips."""
        import torch

        if rows.dim() == 3:
            rows = rows[..., None]
        b, h, w, c = rows.shape
        if field.channels == 1:  # a grey column (checked when the columns were loaded)
            c = 1
        elif c == 1:
            rows, c = rows.expand(b, h, w, 3), 3
        out_h, out_w = field.size
        params = self.engine.draw_geometry(
            k, epoch, np.ascontiguousarray(indices.numpy(), dtype=np.int64), w, h
        )
        box, rect = params[:, 0:4], params[:, 4:8].astype(np.int64)
        if not (
            np.array_equal(box[:, 2] - box[:, 0], rect[:, 2] - rect[:, 0])
            and np.array_equal(box[:, 3] - box[:, 1], rect[:, 3] - rect[:, 1])
            and np.array_equal(box, np.floor(box))
        ):
            raise InvalidArgumentError(
                "resident=True on a GPU applies geometries that move whole pixels (RandomCrop, "
                "flips, a Resize or CenterCrop to the size the pixels have); this one resamples: "
                "use resident=True with device=None (the engine, in host memory) and move the "
                "batches with device="
            )
        p = torch.from_numpy(np.concatenate([box.astype(np.int64), rect], 1)).to(self.device)
        bx0, by0, rx0, ry0, rx1, ry1 = p[:, 0], p[:, 1], p[:, 4], p[:, 5], p[:, 6], p[:, 7]
        oy = torch.arange(out_h, device=self.device)
        ox = torch.arange(out_w, device=self.device)
        inside_y = (oy[None, :] >= ry0[:, None]) & (oy[None, :] < ry1[:, None])  # [B, out_h]
        inside_x = (ox[None, :] >= rx0[:, None]) & (ox[None, :] < rx1[:, None])  # [B, out_w]
        sy = (oy[None, :] - ry0[:, None] + by0[:, None]).clamp(0, h - 1)
        sx = (ox[None, :] - rx0[:, None] + bx0[:, None]).clamp(0, w - 1)
        base = torch.arange(b, device=self.device)[:, None, None] * (h * w)
        flat = base + sy[:, :, None] * w + sx[:, None, :]  # [B, out_h, out_w]
        image = rows.reshape(b * h * w, c).index_select(0, flat.reshape(-1))
        image = image.reshape(b, out_h, out_w, c)
        fill = _fill(field)
        inside = (inside_y[:, :, None] & inside_x[:, None, :])[..., None]
        image = torch.where(inside, image, torch.full_like(image, fill))
        hflip = torch.from_numpy(params[:, 10] > 0).to(self.device)[:, None, None, None]
        vflip = torch.from_numpy(params[:, 11] > 0).to(self.device)[:, None, None, None]
        image = torch.where(hflip, image.flip(2), image)
        image = torch.where(vflip, image.flip(1), image)
        return image.permute(0, 3, 1, 2)  # NHWC memory seen as NCHW: channels_last


def _fill(field: Any) -> int:
    geometry = field.geometry
    return int(getattr(geometry, "fill", 0) or 0)


def _torch_dtype(name: str) -> "torch.dtype":
    import torch

    return getattr(torch, str(name).replace("torch.", ""))


class DeviceTokens:
    """A token stream held on `device`, and the batches of a TokenLoader: windows gathered at
    the offsets of the engine's window indices (`offsets`: window indices -> first tokens)."""

    def __init__(self, dataset: Any, seq_len: int, offsets: Any, eos_id: int | None,
                 device: "torch.device"):  # fmt: skip
        import torch

        self.offsets, self.eos_id, self.device = offsets, eos_id, device
        shards = [int(dataset.shard_tokens(s)) for s in range(dataset.num_shards)]
        itemsize = 4 if max(shards, default=0) < 2**31 else 8
        free, total = device_memory(device)
        check_fits(sum(shards) * itemsize, str(device), free, total)
        dtype = torch.int32 if itemsize == 4 else torch.int64
        self.stream = torch.empty(sum(shards), dtype=dtype, device=device)
        at = 0
        for s in range(dataset.num_shards):
            if shards[s] == 0:
                continue
            path, offset, name = dataset.token_source(s)
            tokens = np.memmap(path, np.dtype(name), "r", offset, (shards[s],))
            for start in range(0, shards[s], 1 << 24):  # a chunk at a time: bounded host memory
                chunk = np.asarray(tokens[start : start + (1 << 24)]).astype(np.int64)
                self.stream[at + start : at + start + len(chunk)].copy_(torch.from_numpy(chunk))
            at += shards[s]
        self.bytes = sum(shards) * itemsize
        self.span = torch.arange(seq_len + 1, device=device)

    def windows(self, indices: "torch.Tensor") -> "torch.Tensor":
        """int64 [B, seq_len + 1]: the windows of the engine's window indices."""
        import torch

        offsets = self.offsets(indices).to(self.device)
        return self.stream[offsets[:, None] + self.span].to(torch.int64)

    def batch(self, indices: "torch.Tensor", epoch: int) -> dict[str, Any]:
        """A TokenLoader's fields: its tokens, with positions and cu_seqlens made here where
        asked (eos_id)."""
        windows = self.windows(indices)
        tokens: dict[str, Any] = {"inputs": windows[:, :-1], "targets": windows[:, 1:]}
        if self.eos_id is not None:
            tokens["varlen"] = token_positions(tokens["inputs"], self.eos_id)
        return {"tokens": tokens}


def token_positions(x: "torch.Tensor", eos_id: int) -> tuple["torch.Tensor", "torch.Tensor", int]:
    """positions (restarting after each eos_id), the flattened batch's cu_seqlens (int32) and
    its longest document, from the inputs [B, L], as tensor operations on their device: what the
    Tokens field computes per row, for windows gathered on a GPU."""
    import torch

    rows, length = x.shape
    starts = torch.zeros_like(x, dtype=torch.bool)
    starts[:, 0] = True
    starts[:, 1:] = x[:, :-1] == eos_id
    at = torch.arange(length, device=x.device).expand(rows, length)
    positions = at - torch.where(starts, at, torch.zeros_like(at)).cummax(1).values
    flat = torch.nonzero(starts.reshape(-1)).reshape(-1)
    cu = torch.cat([flat, torch.tensor([rows * length], device=x.device)]).to(torch.int32)
    max_seqlen = int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0
    return positions, cu, max_seqlen


class ResidentGather(Stage):
    """resident=True on a GPU: the engine makes only each batch's sample indices (its order,
    ranks and state); the batch is gathered from the data held on the device (`holder`: a
    DeviceColumns or DeviceTokens), its images converted there as the device feed would."""

    def __init__(self, source: Stage, holder: Any, normalize: Any, image_fields: set[str]):
        super().__init__(source)
        self.holder, self.normalize, self.image_fields = holder, normalize, image_fields
        self.batches = 0  # gathered on the device

    def apply(self, batch: HostBatch) -> HostBatch:
        fields = self.holder.batch(batch.indices, batch.epoch)
        for name in self.image_fields & set(fields):
            fields[name] = self.normalize(fields[name])
        batch.fields = fields
        batch.indices = batch.indices.to(self.holder.device)
        self.batches += 1
        return batch

    def stats(self, into: dict[str, Any]) -> None:
        super().stats(into)
        into["resident"] = {"device": str(self.holder.device), "bytes": int(self.holder.bytes),
                            "batches": self.batches}  # fmt: skip
