"""stoker.pack run again: the same source with the same options finds its pack done (a script
that packs and trains runs twice, as the README's quick start does); another source or other
options at the same place are refused, naming overwrite=True."""

from __future__ import annotations

import shutil

import pytest

import stoker
from conftest import make_image_folder

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it


def test_the_same_pack_again_is_found_done_and_anything_else_refused(tmp_path):
    folder = make_image_folder(tmp_path / "train", per_class=4)
    first = stoker.pack(folder, tmp_path / "pack", progress=False)
    assert not first.already_packed
    manifest = (tmp_path / "pack" / "manifest.json").read_bytes()

    again = stoker.pack(folder, tmp_path / "pack", progress=False)
    assert again.already_packed and "already a pack" in str(again)
    assert (again.num_samples, again.num_shards, again.bytes, again.classes) == (
        first.num_samples, first.num_shards, first.bytes, first.classes)  # fmt: skip
    assert (tmp_path / "pack" / "manifest.json").read_bytes() == manifest  # nothing written

    with pytest.raises(stoker.InvalidArgumentError, match="overwrite=True"):
        stoker.pack(folder, tmp_path / "pack", max_side=16, progress=False)  # other options
    shutil.copy(next(folder.rglob("*.jpg")), folder / "cat" / "added.jpg")
    with pytest.raises(stoker.InvalidArgumentError, match="not a pack of this source"):
        stoker.pack(folder, tmp_path / "pack", progress=False)  # a file more
    redone = stoker.pack(folder, tmp_path / "pack", overwrite=True, progress=False)
    assert not redone.already_packed and redone.num_samples == first.num_samples + 1


def test_a_folder_that_is_not_a_pack_is_refused(tmp_path):
    folder = make_image_folder(tmp_path / "train", per_class=2)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(stoker.InvalidArgumentError, match="already exists"):
        stoker.pack(folder, tmp_path / "out", progress=False)
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"
