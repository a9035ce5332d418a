"""Token data for language models: stoker.pack_tokens and stoker.TokenLoader against the token
stream itself (every window checked against numpy slices), the epoch's order, exact and elastic
resume, disjoint ranks, document positions against a reference written here, and bad files."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import stoker

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

EOS = 0
L = 16  # seq_len


@pytest.fixture(scope="module")
def documents():
    rng = np.random.default_rng(0)
    return [rng.integers(1, 60000, int(rng.integers(3, 40))).astype(np.uint16) for _ in range(300)]


@pytest.fixture(scope="module")
def stream(documents):
    return np.concatenate([np.append(d, np.uint16(EOS)) for d in documents])


@pytest.fixture(scope="module")
def pack(documents, tmp_path_factory):
    out = tmp_path_factory.mktemp("tokens") / "pack"
    stoker.pack_tokens(documents, out, eos_id=EOS, shard_size="4KB", progress=False)
    return out


def shard_streams(pack):
    import json

    manifest = json.loads((pack / "manifest.json").read_text())
    return [np.fromfile(pack / s["file"], dtype=np.uint16) for s in manifest["shards"]]


def windows_of(shards):
    """The windows the format defines: every seq_len tokens of each shard, seq_len + 1 long."""
    out = []
    for shard in shards:
        for w in range((len(shard) - 1) // L):
            out.append(shard[w * L : w * L + L + 1])
    return out


def test_the_pack_is_the_stream_in_flat_shards(pack, stream):
    shards = shard_streams(pack)
    assert len(shards) > 3 and np.array_equal(np.concatenate(shards), stream)


def test_every_window_once_an_epoch_and_targets_shifted_by_one(pack, stream):
    loader = stoker.TokenLoader(pack, seq_len=L, batch_size=8, return_offsets=True, threads=2)
    windows = windows_of(shard_streams(pack))
    assert len(loader.dataset) == len(windows) and len(loader) == -(-len(windows) // 8)
    offsets = []
    for x, y, off in loader:
        assert x.dtype == y.dtype == torch.int64 and x.shape[1] == L
        for row in range(len(x)):
            o = int(off[row])
            assert np.array_equal(x[row].numpy(), stream[o : o + L])
            assert np.array_equal(y[row].numpy(), stream[o + 1 : o + L + 1])
        offsets += off.tolist()
    assert len(set(offsets)) == len(windows)  # each once
    assert offsets != sorted(offsets)  # shuffled
    loader.set_epoch(1)
    second = [o for _, _, off in loader for o in off.tolist()]
    assert sorted(second) == sorted(offsets) and second != offsets  # another permutation


def test_offsets_are_computed_on_the_indices_device(pack):
    """A resident loader on a GPU has its indices there: the offsets table follows them (on a
    GPU torch.searchsorted refuses a table on the host). The meta device stands in for it."""
    loader = stoker.TokenLoader(pack, seq_len=L, batch_size=8, return_offsets=True, threads=2)
    host = loader._offsets(torch.tensor([0, 5, 40]))
    assert host.device.type == "cpu"
    assert loader._offsets(torch.tensor([0, 5, 40], device="meta")).device.type == "meta"
    assert torch.equal(loader._offsets(torch.tensor([0, 5, 40])), host)


def test_a_nanogpt_bin_and_an_npy_are_read_directly(tmp_path, stream):
    stream.tofile(tmp_path / "train.bin")
    np.save(tmp_path / "train.npy", stream)
    expected = windows_of([stream])
    for path, dtype in ((tmp_path / "train.bin", "uint16"), (tmp_path / "train.npy", None)):
        loader = stoker.TokenLoader(path, seq_len=L, batch_size=len(expected), shuffle=False,
                                    dtype=dtype)  # fmt: skip
        x, y = next(iter(loader))
        assert np.array_equal(x.numpy(), np.stack([w[:L] for w in expected]))
        assert np.array_equal(y.numpy(), np.stack([w[1:] for w in expected]))


def test_resume_exactly_and_at_another_world_size_with_disjoint_ranks(pack):
    def loader(**kw):
        return stoker.TokenLoader(pack, seq_len=L, batch_size=4, seed=5, return_offsets=True,
                                  threads=2, **kw)  # fmt: skip

    whole = [off.tolist() for _, _, off in loader()]
    first = loader()
    it = iter(first)
    head = [next(it)[2].tolist() for _ in range(7)]
    again = loader()
    again.load_state_dict(first.state_dict())
    assert head + [off.tolist() for _, _, off in again] == whole
    # 2 ranks: disjoint windows, the same number of batches; after 3 batches each, resumed on 3.
    ranks = [loader(rank=r, world_size=2) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1])
    seen, state = [], None
    for r, rank_loader in enumerate(ranks):
        it = iter(rank_loader)
        for _ in range(3):
            seen += next(it)[2].tolist()
        if r == 0:
            state = rank_loader.state_dict()
    for r in range(3):
        rest = loader(rank=r, world_size=3)
        rest.load_state_dict(state)
        seen += [o for _, _, off in rest for o in off.tolist()]
    windows = {o for batch in whole for o in batch}
    assert windows <= set(seen) and len(seen) - len(windows) < 3  # the padding only


def reference_positions(x: np.ndarray) -> tuple[np.ndarray, list[int]]:
    positions, bounds, start = np.zeros(len(x), np.int64), [0], 0
    for i, token in enumerate(x):
        positions[i] = i - start
        if token == EOS and i + 1 < len(x):
            start = i + 1
            bounds.append(start)
    return positions, bounds + [len(x)]


def test_positions_and_cu_seqlens_follow_the_documents(pack):
    loader = stoker.TokenLoader(pack, seq_len=L, batch_size=6, return_positions=True, threads=1)
    assert loader.eos_id == EOS  # from the pack's manifest
    for x, _, positions, cu, max_seqlen in loader:
        expected_cu, row_max = [0], 0
        for row in range(len(x)):
            p, bounds = reference_positions(x[row].numpy())
            assert np.array_equal(positions[row].numpy(), p)
            expected_cu += [b + row * L for b in bounds[1:]]
            row_max = max(row_max, max(np.diff(bounds)))
        assert cu.dtype == torch.int32 and cu.tolist() == expected_cu
        assert max_seqlen == row_max


def test_pack_tokens_from_files_and_the_errors_of_bad_ones(tmp_path, stream):
    stream.tofile(tmp_path / "a.bin")
    stoker.pack_tokens([tmp_path / "a.bin", tmp_path / "a.bin"], tmp_path / "p", progress=False)
    assert np.array_equal(np.concatenate(shard_streams(tmp_path / "p")), np.tile(stream, 2))
    with pytest.raises(stoker.InvalidArgumentError, match="does not fit in uint16"):
        stoker.pack_tokens([[1, 2, 70000]], tmp_path / "q", progress=False)
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")  # 1.5 uint16 tokens
    with pytest.raises(stoker.InvalidArgumentError, match="whole number"):
        stoker.pack_tokens(tmp_path / "odd.bin", tmp_path / "q", progress=False)
    with pytest.raises(stoker.CorruptDataError, match="whole number of uint16 tokens"):
        stoker.TokenLoader(tmp_path / "odd.bin", seq_len=4, batch_size=2, dtype="uint16")
    np.save(tmp_path / "two_d.npy", np.zeros((3, 3), np.uint16))
    with pytest.raises(stoker.CorruptDataError, match="1-d"):
        stoker.TokenLoader(tmp_path / "two_d.npy", seq_len=2, batch_size=1)
    np.save(tmp_path / "floats.npy", np.zeros(100, np.float32))
    with pytest.raises(stoker.UnsupportedFormatError, match="float32"):
        stoker.TokenLoader(tmp_path / "floats.npy", seq_len=2, batch_size=1)
    with pytest.raises(stoker.InvalidArgumentError, match="seq_len"):
        stoker.TokenLoader(tmp_path / "a.bin", seq_len=0, batch_size=1)


def test_inspect_and_verify_a_token_pack(pack, tmp_path, stream):
    import shutil

    info = stoker.inspect(pack)
    assert info["format"] == "stoker-tokens" and info["num_tokens"] == len(stream)
    assert info["dtype"] == "uint16" and info["eos_id"] == EOS
    assert stoker.verify(pack, progress=False).clean
    copy = tmp_path / "copy"
    shutil.copytree(pack, copy)
    shard = copy / "tokens-000001.bin"
    data = bytearray(shard.read_bytes())
    data[7] ^= 1
    shard.write_bytes(bytes(data))
    report = stoker.verify(copy, progress=False)
    assert [f.shard for f in report.failures] == ["tokens-000001.bin"]
