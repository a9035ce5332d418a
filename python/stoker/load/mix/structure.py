"""A batch's structure, and where two batches differ in it: what the mix compares each batch
with its first one for (``check_structure``)."""

from __future__ import annotations

from typing import Any


# --- batch structure: what two sources must share for their batches to be mixed --------------


def _signature(batch: Any) -> tuple[Any, ...]:
    """A batch's structure: containers, dict keys, tuple arity, and per tensor (or array) its
    dtype, number of dimensions and device. Not sizes (a mix may be multi-resolution), and not
    inside lists (a batch's per-sample values: captions, JSON, variable-length targets)."""
    if isinstance(batch, dict):
        return ("dict", tuple(batch), tuple(_signature(v) for v in batch.values()))
    if isinstance(batch, tuple):
        return ("tuple", tuple(_signature(v) for v in batch))
    if isinstance(batch, list):
        return ("list",)
    dtype, shape = getattr(batch, "dtype", None), getattr(batch, "shape", None)
    if dtype is not None and shape is not None:
        device = str(getattr(batch, "device", "cpu"))
        return ("array", type(batch).__name__, str(dtype), len(shape), device)
    return ("value", type(batch).__name__)


def _describe(sig: tuple[Any, ...]) -> str:
    kind = sig[0]
    if kind == "dict":
        return f"a dict with keys {list(sig[1])}"
    if kind == "tuple":
        return f"a tuple of {len(sig[1])}"
    if kind == "list":
        return "a list"
    if kind == "array":
        return f"a {sig[2]} {sig[1]} with {sig[3]} dimensions on {sig[4]}"
    return f"a {sig[1]}"


def _difference(a: tuple[Any, ...], b: tuple[Any, ...], path: str = "batch") -> str | None:
    """Where and how two signatures differ in a way a training step would notice; None if they
    do not. A list and a tuple are both sequences (torch's collate makes lists, stoker tuples)."""
    if {a[0], b[0]} == {"list", "tuple"} or (a[0] == b[0] == "list"):
        return None
    if a[0] != b[0] or (a[0] in ("dict", "tuple") and len(a[-1]) != len(b[-1])):
        return f"{path} is {_describe(a)} in one and {_describe(b)} in the other"
    if a[0] == "dict":
        if a[1] != b[1]:
            return f"{path} is {_describe(a)} in one and {_describe(b)} in the other"
        for key, x, y in zip(a[1], a[2], b[2]):
            found = _difference(x, y, f"{path}[{key!r}]")
            if found:
                return found
        return None
    if a[0] == "tuple":
        for k, (x, y) in enumerate(zip(a[1], b[1])):
            found = _difference(x, y, f"{path}[{k}]")
            if found:
                return found
        return None
    if a != b:
        return f"{path} is {_describe(a)} in one and {_describe(b)} in the other"
    return None
