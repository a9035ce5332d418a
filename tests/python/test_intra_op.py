"""The consumer's share of torch's intra-op threads for stoker's batch ops on the CPU
(stoker/load/intra_op.py): set for the calling thread only, restored after, and used by
augment= on host batches."""

from __future__ import annotations

import threading

import pytest
import torch

import stoker
from stoker.load import intra_op

needs_openmp = pytest.mark.skipif(
    intra_op._runtime() is None or torch.get_num_threads() < 2,
    reason="torch without an OpenMP runtime here, or one core",
)


@needs_openmp
def test_the_calling_thread_alone_runs_on_fewer_threads_until_the_block_ends():
    before = torch.get_num_threads()
    seen = {}

    def other():
        seen["other"] = torch.get_num_threads()

    with intra_op.intra_op_threads(1):
        assert torch.get_num_threads() == 1
        t = threading.Thread(target=other)  # started inside the block: not touched
        t.start()
        t.join()
        with intra_op.intra_op_threads(5):  # never more than outside
            assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    assert seen["other"] == before


@needs_openmp
def test_the_count_is_restored_when_the_block_raises():
    before = torch.get_num_threads()
    with pytest.raises(ValueError), intra_op.intra_op_threads(1):
        raise ValueError("an op failed")
    assert torch.get_num_threads() == before


def test_the_consumers_share_is_the_cores_the_engine_leaves():
    cores = intra_op.consumer_share(0)
    assert cores >= 1
    assert intra_op.consumer_share(cores - 1) == 1
    assert intra_op.consumer_share(cores + 8) == 1


@needs_openmp
def test_augment_on_a_host_batch_runs_in_the_share_the_engine_leaves(tmp_path, monkeypatch):
    """augment= on the CPU: each op sees the consumer's share (the cores less the engine's
    threads), and the caller's count is back once the batch is out."""
    from PIL import Image

    from stoker.augment import ops

    for i in range(8):
        (tmp_path / "photos" / "x").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (24, 24), (i * 30, 0, 0)).save(tmp_path / "photos" / "x" / f"{i}.png")
    seen = []

    class Probe(ops.BatchOp):
        name = "probe"

        def apply(self, x, draws):
            seen.append(torch.get_num_threads())
            return x

    pack = stoker.pack(tmp_path / "photos", tmp_path / "pack", progress=False).out
    before = torch.get_num_threads()
    loader = stoker.ImageLoader(pack, batch_size=4, size=16, threads=1, augment=[Probe()])
    batches = list(loader)
    assert len(batches) == 2 and seen == [intra_op.consumer_share(1)] * 2
    assert torch.get_num_threads() == before
