"""Writers of the packs that hold no encoded files: array packs (columns of fixed-shape arrays,
one .npy file per field and shard) and token packs (flat token files). Image packs are written
by :mod:`stoker.packer`. The formats are docs/FORMAT.md's."""

from .arrays import pack_arrays
from .tokens import pack_tokens

__all__ = ["pack_arrays", "pack_tokens"]
