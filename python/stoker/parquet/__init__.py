"""Training from Parquet as it is, local or at a URL, with no packing step: every loader takes
Parquet files where it takes a pack. Row groups are the shards (the keyed order shuffles them,
then samples within a window of them, as for a remote pack), columns are the fields
(stoker.parquet.columns), and only footers and the row groups a pass reads are ever fetched
(stoker.parquet.footers, stoker.parquet.pack). docs/PARQUET.md is the user's guide.

Importing the package needs no pyarrow (a loader asks `is_parquet` of every path); opening
Parquet does, and says so."""

from typing import Any

from .files import ParquetFile, is_parquet, list_files

__all__ = ["ParquetFile", "ParquetPack", "is_parquet", "list_files"]


def __getattr__(name: str) -> Any:
    if name == "ParquetPack":  # pyarrow's, imported when Parquet is opened
        from .pack import ParquetPack

        return ParquetPack
    raise AttributeError(f"module 'stoker.parquet' has no attribute {name!r}")
