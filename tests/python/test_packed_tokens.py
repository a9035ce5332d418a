"""Whole documents packed into rows (TokenLoader(packing="best_fit" | "first_fit")) on a real
corpus (the Python standard library's sources, one document per file, its UTF-8 bytes as
tokens, lengths from tens to tens of thousands): every batch is read back against the documents
through its own keys alone (cu_seqlens, seq_idx, position_ids, labels), every document of an
epoch is in exactly one row (or its pieces, counted), resume is exact at another world size with
equal token counts, and Hugging Face's DataCollatorWithFlattening makes the same flattened
batch."""

from __future__ import annotations

import json
import os
import pickle
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

import stoker
from stoker.errors import CorruptDataError, InvalidArgumentError, StepOutOfRangeError
from stoker.load.packing_plan import plan_epoch

pytestmark = pytest.mark.sanitize  # the plans are _core.pack_rows's: make test-asan-python runs it
EOS = 256
S = 2048  # seq_len
B = 4


def corpus() -> list[np.ndarray]:
    """Every 40th .py file of the standard library (sorted) of up to 64 KiB: real documents of
    many lengths (bytes as tokens), 2.8 MB in all."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [f for f in sorted(root.rglob("*.py")) if 0 < f.stat().st_size <= 65536][::40]
    return [np.frombuffer(f.read_bytes(), dtype=np.uint8).astype(np.uint16) for f in files]


@pytest.fixture(scope="module")
def docs():
    d = corpus()
    lengths = np.array([len(x) + 1 for x in d])
    assert len(d) >= 250 and lengths.min() < 200 and lengths.max() > 20 * S  # many lengths
    return d


def sft(doc: np.ndarray, k: int) -> dict:
    """Every third document is SFT-style: its first quarter a prompt with no loss."""
    mask = np.ones(len(doc), dtype=np.int8)
    if k % 3 == 0:
        mask[: len(doc) // 4] = 0
    return {"input_ids": doc, "loss_mask": mask, "source": "lib" if k % 2 else "other"}


@pytest.fixture(scope="module")
def pack(docs, tmp_path_factory):
    out = tmp_path_factory.mktemp("packed") / "pack"
    stoker.pack_tokens([sft(d, k) for k, d in enumerate(docs)], out, eos_id=EOS,
                       shard_size="256KB", progress=False)  # fmt: skip
    return out


def full(docs, k):
    """Document k as packed: its tokens and eos, and its loss mask (eos carries loss)."""
    tokens = np.append(docs[k], EOS).astype(np.int64)
    mask = np.append(sft(docs[k], k)["loss_mask"], 1)
    return tokens, mask


def check_batch(batch, rows, docs, seq_len=S):
    """`batch` against `rows` (sample_ids: per row, its pieces) and the documents, the batch's
    keys checked against each other: cu_seqlens, seq_idx, position_ids and labels all say the
    same segments."""
    ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
    pos, seq = batch["position_ids"].numpy(), batch["seq_idx"].numpy()
    cu = batch["cu_seqlens"].numpy()
    assert ids.shape == (len(rows), seq_len) and ids.dtype == np.int64
    assert batch["cu_seqlens"].dtype == torch.int32 and batch["seq_idx"].dtype == torch.int32
    assert cu[0] == 0 and cu[-1] == ids.size and np.all(np.diff(cu) > 0)
    assert batch["max_seqlen"] == int(np.diff(cu).max())
    segments = iter(zip(cu[:-1], cu[1:]))
    for r, pieces in enumerate(rows):
        col = 0
        assert sum(p["length"] for p in pieces) <= seq_len
        for i, p in enumerate(pieces):
            a, b = next(segments)
            assert (a, b) == (r * seq_len + col, r * seq_len + col + p["length"])
            tokens, mask = full(docs, p["document"])
            want = tokens[p["start"] : p["start"] + p["length"]]
            got = slice(col, col + p["length"])
            assert np.array_equal(ids[r, got], want)
            assert np.array_equal(pos[r, got], np.arange(p["length"]))
            assert np.all(seq[r, got] == i)
            expect = np.where(mask[p["start"] : p["start"] + p["length"]] == 1, want, -100)
            expect[0] = -100
            assert np.array_equal(labels[r, got], expect)
            col += p["length"]
        if col < seq_len:  # padding: a segment of its own, positions from 0, no loss
            a, b = next(segments)
            assert (a, b) == (r * seq_len + col, (r + 1) * seq_len)
            assert np.all(labels[r, col:] == -100) and np.all(ids[r, col:] == 0)
            assert np.array_equal(pos[r, col:], np.arange(seq_len - col))
            assert np.all(seq[r, col:] == len(pieces))
    assert next(segments, None) is None


def covered(pieces_seen, docs, seq_len=S):
    """Each document's pieces cover it exactly once, in order."""
    by_doc: dict[int, list[tuple[int, int]]] = {}
    for p in pieces_seen:
        by_doc.setdefault(p["document"], []).append((p["start"], p["length"]))
    assert sorted(by_doc) == list(range(len(docs)))
    for k, parts in by_doc.items():
        parts.sort()
        n = len(docs[k]) + 1
        assert [s for s, _ in parts] == list(range(0, n, seq_len))
        assert sum(length for _, length in parts) == n


def epoch_rows(loader, epoch, world=1):
    rows = []
    for step in range(len(loader)):
        ids = loader.sample_ids(epoch, step)
        rows += [row for r in range(world) for row in ids[r]]
    return rows


@pytest.mark.parametrize("packing", ["best_fit", "first_fit"])
def test_an_epoch_holds_every_document_once_and_each_batch_says_so(pack, docs, packing):
    loader = stoker.TokenLoader(pack, seq_len=S, batch_size=B, packing=packing,
                                world_size=1, rank=0, max_segments=6)  # fmt: skip
    steps = len(loader)
    seen = []
    for step, batch in enumerate(loader):
        rows = loader.sample_ids(0, step, rank=0)
        check_batch(batch, rows, docs)
        assert all(len(r) <= 6 for r in rows)
        seen += [p for row in rows for p in row]
    assert step + 1 == steps
    covered(seen, docs)
    counts = loader.stats()["tokens"]
    total = sum(len(d) + 1 for d in docs)
    assert sum(c["real"] for c in counts.values()) == total
    assert sum(c["real"] + c["padding"] for c in counts.values()) == steps * B * S
    split = sum(len(d) + 1 for d in docs if len(d) + 1 > S)
    assert sum(c["split"] for c in counts.values()) == split
    # Loss: every token but each piece's first and the prompts' (every third document), a
    # piece that starts inside a prompt counted once.
    pieces = len(seen)
    prompts = sum(len(d) // 4 for k, d in enumerate(docs) if k % 3 == 0)
    starts_in_prompts = sum(1 for p in seen if p["document"] % 3 == 0
                            and p["start"] < len(docs[p["document"]]) // 4)  # fmt: skip
    assert sum(c["loss"] for c in counts.values()) == total - pieces - prompts + starts_in_prompts
    assert set(counts) == {"lib", "other"}
    assert counts["lib"]["real"] == sum(len(d) + 1 for k, d in enumerate(docs) if k % 2)


def test_best_fit_fills_at_least_99_percent_and_beats_first_fit_never_by_less(pack, docs):
    lengths = np.array([len(d) + 1 for d in docs])
    for seq_len in (2048, 8192):
        eff = {}
        for packing in ("best_fit", "first_fit"):
            plan = plan_epoch(lengths, seq_len=seq_len, packing=packing, seed=3)
            assert plan.length.sum() == lengths.sum()
            eff[packing] = lengths.sum() / (plan.num_rows * seq_len)
        assert eff["best_fit"] >= eff["first_fit"] - 1e-9
        assert eff["best_fit"] >= (0.99 if seq_len == 2048 else 0.95), eff


def test_the_plan_depends_on_seed_and_epoch_only(pack):
    a = stoker.TokenLoader(pack, seq_len=S, batch_size=B, packing="best_fit", threads=1,
                           world_size=1, rank=0)  # fmt: skip
    b = stoker.TokenLoader(pack, seq_len=S, batch_size=B, packing="best_fit", threads=3,
                           world_size=1, rank=0, prefetch=5)  # fmt: skip
    for x, y in zip(a, b):
        assert torch.equal(x["input_ids"], y["input_ids"])
        assert torch.equal(x["labels"], y["labels"])
    assert a.sample_ids(1, 0) != a.sample_ids(0, 0)  # another epoch, another order
    c = stoker.TokenLoader(pack, seq_len=S, batch_size=B, packing="best_fit", seed=1,
                           world_size=1, rank=0)  # fmt: skip
    assert c.sample_ids(0, 0) != a.sample_ids(0, 0)


def run(pack, world, *, state=None, steps=None, **options):
    """Every rank's batches from `state` (all ranks stepping together), and the last state."""
    loaders = [stoker.TokenLoader(pack, seq_len=S, batch_size=B, packing="best_fit",
                                  world_size=world, rank=r, **options)
               for r in range(world)]  # fmt: skip
    if state is not None:
        for loader in loaders:
            loader.load_state_dict(state)
    passes = [iter(loader) for loader in loaders]
    out = []
    taken = 0
    while steps is None or taken < steps:
        batches = [next(p, None) for p in passes]
        if batches[0] is None:
            assert all(b is None for b in batches)  # every rank has as many steps
            break
        out.append(batches)
        taken += 1
    return out, loaders[0].state_dict(), loaders[0].stats()["tokens"]


def rows_of(steps):
    """The rows handed out, in global order (step by step, rank by rank), without padding."""
    rows = []
    for batches in steps:
        for batch in batches:
            for ids, labels in zip(batch["input_ids"], batch["labels"]):
                if (labels != -100).any() or (ids != 0).any():
                    rows.append((ids.numpy().tobytes(), labels.numpy().tobytes()))
    return rows


@pytest.mark.parametrize("before,after", [(2, 1), (1, 3), (1, 1)])
def test_a_resume_mid_epoch_at_another_world_size_continues_exactly(pack, before, after):
    whole, _, whole_tokens = run(pack, 1, balance=None)
    first, state, _ = run(pack, before, steps=7)
    rest, _, tokens = run(pack, after, state=state)
    assert rows_of(first) + rows_of(rest) == rows_of(whole)
    for name, counts in tokens.items():
        for kind in ("real", "loss", "split", "dropped"):
            assert counts[kind] == whole_tokens[name][kind], (name, kind)
        if before == after == 1:
            assert counts == whole_tokens[name]


def test_a_state_taken_after_a_break_resumes_in_a_new_loader(pack):
    (whole, *_), = [run(pack, 1)]
    loader = stoker.TokenLoader(pack, seq_len=S, batch_size=B, packing="best_fit",
                                world_size=1, rank=0)  # fmt: skip
    for step, _ in enumerate(loader):
        if step == 4:
            break
    again = pickle.loads(pickle.dumps(loader))  # the state travels with the pickle
    batch = next(iter(again))
    assert torch.equal(batch["input_ids"], whole[5][0]["input_ids"])
    assert torch.equal(loader.batch_at(0, 5)["labels"], whole[5][0]["labels"])
    with pytest.raises(StepOutOfRangeError):
        loader.batch_at(0, len(loader))


def test_balance_attention_evens_each_steps_cost_across_ranks(pack):
    world = 4
    plain = stoker.TokenLoader(pack, seq_len=S, batch_size=B, packing="best_fit",
                               world_size=world, rank=0)  # fmt: skip
    even = stoker.TokenLoader(pack, seq_len=S, batch_size=B, packing="best_fit",
                              world_size=world, rank=0, balance="attention")  # fmt: skip

    def spread(loader):
        worst = []
        for step in range(len(loader) - 1):  # the last step has padding rows
            ids = loader.sample_ids(0, step)
            cost = [sum(p["length"] ** 2 for row in ids[r] for p in row) for r in range(world)]
            worst.append(max(cost) / min(cost))
        return float(np.mean(worst))

    assert spread(even) < spread(plain)
    assert spread(even) < 1.15
    # The same rows, dealt differently.
    for step in range(len(plain)):
        a = sorted(str(row) for r, rows in plain.sample_ids(0, step).items() for row in rows)
        b = sorted(str(row) for r, rows in even.sample_ids(0, step).items() for row in rows)
        assert a == b


def test_max_tokens_makes_padded_batches_within_the_budget(pack, docs):
    world, budget = 2, 4 * S
    loaders = [stoker.TokenLoader(pack, seq_len=S, batch_size=1, packing="best_fit",
                                  max_tokens=budget, world_size=world, rank=r)
               for r in range(world)]  # fmt: skip
    assert len(loaders[0]) == len(loaders[1])
    seen = []
    for step, batches in enumerate(zip(*loaders)):
        for r, batch in enumerate(batches):
            ids, mask = batch["input_ids"], batch["attention_mask"]
            assert ids.numel() <= budget and set(batch) == {"input_ids", "labels",
                                                            "position_ids", "attention_mask"}
            rows = loaders[r].sample_ids(0, step, rank=r)
            for i, row in enumerate(rows):
                if not row:
                    continue
                (p,) = row  # one document (or piece) per row
                tokens, _ = full(docs, p["document"])
                n = p["length"]
                assert np.array_equal(ids[i, :n].numpy(), tokens[p["start"] : p["start"] + n])
                assert mask[i, :n].all() and not mask[i, n:].any()
                seen.append(p)
    covered(seen, docs)


def test_long_documents_dropped_are_counted_and_never_seen(pack, docs):
    loader = stoker.TokenLoader(pack, seq_len=S, batch_size=B, packing="first_fit",
                                long_documents="drop", world_size=1, rank=0)  # fmt: skip
    seen = {p["document"] for step in range(len(loader))
            for row in loader.sample_ids(0, step, rank=0) for p in row}  # fmt: skip
    long = {k for k, d in enumerate(docs) if len(d) + 1 > S}
    assert long and not (seen & long) and seen | long == set(range(len(docs)))
    for _ in loader:
        pass
    counts = loader.stats()["tokens"]
    assert sum(c["dropped"] for c in counts.values()) == sum(len(docs[k]) + 1 for k in long)
    assert sum(c["split"] for c in counts.values()) == 0


def test_flatten_gives_what_transformers_data_collator_with_flattening_gives(pack, docs):
    transformers = pytest.importorskip("transformers")
    collator = transformers.DataCollatorWithFlattening(
        return_flash_attn_kwargs=True, return_seq_idx=True, return_tensors="pt"
    )
    loader = stoker.TokenLoader(pack, seq_len=S, batch_size=B, packing="best_fit", flatten=True,
                                world_size=1, rank=0)  # fmt: skip
    for step, batch in enumerate(loader):
        if step == 3:
            break
        features = []
        for row in loader.sample_ids(0, step, rank=0):
            for p in row:
                tokens, mask = full(docs, p["document"])
                part = slice(p["start"], p["start"] + p["length"])
                labels = np.where(mask[part] == 1, tokens[part], -100)
                features.append({"input_ids": tokens[part].tolist(), "labels": labels.tolist()})
        want = collator(features)
        assert set(batch) == set(want)
        for key, value in want.items():
            got = batch[key]
            if isinstance(value, torch.Tensor):
                assert torch.equal(got.to(value.dtype), value), key
                assert got.dtype == value.dtype, key
            else:
                assert got == value, key


def test_shift_labels_are_the_next_tokens_labels(pack):
    a = stoker.TokenLoader(pack, seq_len=S, batch_size=B, packing="best_fit", world_size=1, rank=0)
    b = stoker.TokenLoader(pack, seq_len=S, batch_size=B, packing="best_fit", world_size=1,
                           rank=0, shift_labels=True, num_items_in_batch=True)  # fmt: skip
    x, y = next(iter(a)), next(iter(b))
    assert torch.equal(y["labels"][:, :-1], x["labels"][:, 1:])
    assert (y["labels"][:, -1] == -100).all()
    assert int(y["num_items_in_batch"]) == int((x["labels"] != -100).sum())


def test_a_pack_without_an_index_has_documents_ending_at_each_eos(tmp_path, docs):
    stream = np.concatenate([np.append(d, EOS) for d in docs[:50]]).astype(np.uint16)
    stream.tofile(tmp_path / "train.bin")
    stoker.pack_tokens([tmp_path / "train.bin"], tmp_path / "flat", progress=False)
    with pytest.raises(InvalidArgumentError, match="no document index"):
        stoker.TokenLoader(tmp_path / "flat", seq_len=S, batch_size=B, packing="best_fit")
    loader = stoker.TokenLoader(tmp_path / "flat", seq_len=S, batch_size=B, packing="best_fit",
                                eos_id=EOS, world_size=1, rank=0)  # fmt: skip
    assert loader.num_documents == 50
    for _ in loader:
        pass
    assert loader.stats()["tokens"][""]["real"] == len(stream)


def test_options_are_checked_before_anything_starts(pack):
    def make(**o):
        return stoker.TokenLoader(pack, seq_len=S, batch_size=B, **o)

    with pytest.raises(InvalidArgumentError, match="packing"):
        make(packing="best")
    with pytest.raises(InvalidArgumentError, match="max_segments"):
        make(max_segments=4)  # a packing option, with packing="concat"
    with pytest.raises(InvalidArgumentError, match="return_offsets"):
        make(packing="best_fit", return_offsets=True)
    with pytest.raises(InvalidArgumentError, match="max_tokens"):
        make(packing="best_fit", max_tokens=S - 1)
    with pytest.raises(InvalidArgumentError, match="long_documents"):
        make(packing="best_fit", long_documents="truncate")
    with pytest.raises(InvalidArgumentError, match="balance"):
        make(packing="best_fit", balance="tokens")
    loader = make(packing="best_fit", world_size=1, rank=0)
    with pytest.raises(InvalidArgumentError, match="seed"):
        make(packing="best_fit", seed=5).load_state_dict(loader.state_dict())


@pytest.mark.parametrize(
    "damage,match",
    [
        (lambda z: {**z, "length": z["length"][:-1]}, "lengths differ"),
        (lambda z: {**z, "offset": z["offset"] + 10**9}, "past the stream"),
        (lambda z: {**z, "spans": z["spans"] + 10**6}, "loss span"),
        (lambda z: {**z, "source": z["source"] + 7}, "source"),
    ],
)
def test_a_damaged_document_index_is_refused_naming_it(pack, tmp_path, damage, match):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(pack, bad)
    with np.load(bad / "documents.npz") as z:
        arrays = damage({k: z[k] for k in z.files})
    np.savez(bad / "documents.npz", **arrays)
    with pytest.raises(CorruptDataError, match="CRC32C") as e:
        stoker.TokenLoader(bad, seq_len=S, batch_size=B, packing="best_fit")
    assert "documents.npz" in str(e.value)
    manifest = json.loads((bad / "manifest.json").read_text())
    del manifest["documents"]["crc32c"]  # a reader without the CRC still checks every size
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CorruptDataError, match=match) as e:
        stoker.TokenLoader(bad, seq_len=S, batch_size=B, packing="best_fit")
    assert "documents.npz" in str(e.value)
    (bad / "documents.npz").write_bytes(b"not a zip")
    with pytest.raises(CorruptDataError, match="not a document index"):
        stoker.TokenLoader(bad, seq_len=S, batch_size=B, packing="best_fit")


def test_any_damage_to_the_index_is_refused_or_read_never_a_crash(pack, tmp_path):
    """Random bytes of documents.npz changed (the CRC out of the way): every reader either
    refuses it naming the file or reads documents that stay inside the stream."""
    import shutil

    bad = tmp_path / "fuzzed"
    shutil.copytree(pack, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    del manifest["documents"]["crc32c"]
    (bad / "manifest.json").write_text(json.dumps(manifest))
    clean = (pack / "documents.npz").read_bytes()
    rng = np.random.default_rng(0)
    refused = 0
    for _ in range(200):
        data = bytearray(clean)
        for at in rng.integers(0, len(data), int(rng.integers(1, 6))):
            data[at] = int(rng.integers(0, 256))
        (bad / "documents.npz").write_bytes(bytes(data))
        try:
            loader = stoker.TokenLoader(bad, seq_len=S, batch_size=B, packing="best_fit",
                                        world_size=1, rank=0)  # fmt: skip
        except CorruptDataError as e:
            assert "documents.npz" in str(e)
            refused += 1
            continue
        next(iter(loader))
    assert refused > 0


@pytest.mark.parametrize("threads", [0, 2])
def test_a_token_file_shorter_than_its_manifest_is_refused(pack, tmp_path, threads):
    import shutil

    bad = tmp_path / "short"
    shutil.copytree(pack, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    first = bad / manifest["shards"][0]["file"]
    first.write_bytes(first.read_bytes()[:-2])
    loader = stoker.TokenLoader(bad, seq_len=S, batch_size=B, packing="best_fit", shuffle=False,
                                world_size=1, rank=0, threads=threads)  # fmt: skip
    with pytest.raises(CorruptDataError, match="tokens-000000.bin"):  # from a thread too
        next(iter(loader))
    loader.close()


def test_record_and_mix_and_a_device_feed(pack, tmp_path):
    a = stoker.TokenLoader(pack, seq_len=S, batch_size=B, packing="best_fit", world_size=1,
                           rank=0, record=tmp_path / "steps.jsonl")  # fmt: skip
    b = stoker.TokenLoader(pack, seq_len=S, batch_size=B, packing="first_fit", world_size=1,
                           rank=0, seed=9, device="cpu")  # fmt: skip
    mix = stoker.mix([a, b], [3, 1], seed=0, length=40)
    got = list(mix)
    assert len(got) == 40
    drawn = mix.stats()["batches"]
    assert drawn[0] > drawn[1] > 0
    lines = stoker.read_record(tmp_path / "steps.jsonl")
    assert len(lines) == drawn[0]
    first = a.sample_ids(0, 0, rank=0)
    assert lines[0]["index"] == [p["document"] for row in first for p in row]
    assert b.stats()["device"]["batches"] == drawn[1]


def test_a_mix_by_tokens_draws_packed_sources_in_token_proportions(pack):
    short = stoker.TokenLoader(pack, seq_len=S // 4, batch_size=B, packing="best_fit",
                               world_size=1, rank=0)  # fmt: skip
    long = stoker.TokenLoader(pack, seq_len=S, batch_size=B, packing="best_fit", world_size=1,
                              rank=0, seed=4)  # fmt: skip
    mix = stoker.mix([short, long], [1, 1], by="tokens", stop="never", length=400)
    assert mix.weights == pytest.approx((0.8, 0.2))  # 1:1 in tokens is 4:1 in batches
    slots = [0, 0]
    for batch in mix:
        slots[batch["input_ids"].shape[1] == S] += batch["input_ids"].numel()
    assert 0.75 < slots[0] / slots[1] < 1.33  # 400 draws: within 3 standard deviations
    with pytest.raises(InvalidArgumentError, match="tokens_per_batch"):
        stoker.mix([short, [1, 2]], [1, 1], by="tokens")


def test_a_device_feed_resumes_from_the_state_of_the_batch_it_handed_out(pack):
    def make():
        return stoker.TokenLoader(pack, seq_len=S, batch_size=B, packing="best_fit", rank=0,
                                  world_size=1, device="cpu", device_prefetch=3)  # fmt: skip

    whole = [b["input_ids"] for _, b in zip(range(6), make())]
    loader = make()
    for step, _ in enumerate(loader):
        if step == 2:
            break
    state = loader.state_dict()  # the feed has made batches ahead: the state is the third's
    again = make()
    again.load_state_dict(state)
    assert torch.equal(next(iter(again))["input_ids"], whole[3])
    again.set_epoch(4)
    assert again.state_dict()["epoch"] == 4 and again.state_dict()["position"] == 0


@pytest.mark.parametrize("options", [{}, {"long_documents": "drop", "flatten": True},
                                     {"max_tokens": 3 * S}])  # fmt: skip
def test_a_single_source_packs_counts_over_two_ranks(docs, tmp_path, options):
    """One source (the counts' fast path): real, padding, loss, split and dropped tokens of an
    epoch on two ranks, against what the documents and the rows handed out say."""
    out = tmp_path / "one"
    stoker.pack_tokens(docs[:120], out, eos_id=EOS, progress=False)
    loaders = [stoker.TokenLoader(out, seq_len=S, batch_size=B, packing="best_fit", world_size=2,
                                  rank=r, **options) for r in range(2)]  # fmt: skip
    slots = pieces = 0
    for step, batches in enumerate(zip(*loaders)):
        for r, batch in enumerate(batches):
            slots += batch["input_ids"].numel()
            pieces += sum(len(row) for row in loaders[r].sample_ids(0, step, rank=r))
    counts = loaders[0].stats()["tokens"][""]
    assert counts == loaders[1].stats()["tokens"][""]
    lengths = [len(d) + 1 for d in docs[:120]]
    kept = [n for n in lengths if n <= S] if options.get("long_documents") else lengths
    assert counts["real"] == sum(kept)
    assert counts["dropped"] == sum(lengths) - sum(kept)
    assert counts["padding"] == slots - sum(kept)
    assert counts["loss"] == sum(kept) - pieces
    assert counts["split"] == sum(n for n in kept if n > S)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda m: m["documents"].update(file="../../manifest.json"), "not a file name"),
        (lambda m: m["documents"].update(file="gone.npz"), "not there"),
        (lambda m: m["shards"][0].update(num_tokens=-5), "negative"),
        (lambda m: m.update(dtype="float64"), "float64"),
        (lambda m: m["shards"][0].pop("file"), "KeyError"),
    ],
)
def test_a_damaged_manifest_is_refused_naming_it(pack, tmp_path, change, match):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(pack, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    change(manifest)
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CorruptDataError, match=match):
        stoker.TokenLoader(bad, seq_len=S, batch_size=B, packing="best_fit")


def test_a_token_file_truncated_mid_pass_is_a_named_error_not_a_crash(docs, tmp_path):
    out = tmp_path / "cut"
    stoker.pack_tokens(docs[:120], out, eos_id=EOS, shard_size="128KB", progress=False)
    loader = stoker.TokenLoader(out, seq_len=S, batch_size=B, packing="best_fit", shuffle=False,
                                world_size=1, rank=0)  # fmt: skip
    passing = iter(loader)
    next(passing)  # every token file is open now
    manifest = json.loads((out / "manifest.json").read_text())
    last = out / manifest["shards"][-1]["file"]
    os.truncate(last, 0)
    with pytest.raises(stoker.StokerError, match=last.name):
        for _ in passing:  # reaches the cut file's pages: SIGBUS, turned into the error
            pass
    loader.close()
