"""Packed batches are correct by the model: a small causal transformer (float64, learned position
embeddings looked up by ``position_ids``) gives the same loss on a packed batch of
``TokenLoader(packing="best_fit")``, masked block-diagonally by its ``cu_seqlens``, as on each of
its documents (pieces) alone, from 0, unpadded, with labels built here from the documents packed.
The flattened batch, ``shift_labels=True`` and ``num_items_in_batch`` give the same loss and count;
a mask without blocks, or positions that do not restart, give another loss (the check notices)."""

from __future__ import annotations

import inspect
import json
import textwrap

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import stoker

S = 128  # seq_len
B = 4  # batch_size
EOS = 256  # byte-level tokens: the 256 bytes, then eos
VOCAB = 257


def byte_tokens(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int64)


def make_documents() -> list[dict]:
    """Chunks of real text (the sources of json and textwrap) of varied lengths, from 1 byte to
    over two rows: plain ones with loss everywhere, and SFT-style ones of two turns (a prompt
    without loss, then a response), among them a prompt longer than a row (a piece without any
    loss)."""
    text = inspect.getsource(json) + inspect.getsource(textwrap)
    rng = np.random.default_rng(0)
    lengths = [1, 2, S - 1, S, S + 1, 3 * S + 5] + rng.integers(3, 200, 50).tolist()
    documents, at = [], 0
    for k, n in enumerate(lengths):
        tokens = byte_tokens(text[at : at + n])
        at += n
        if k % 3 == 2 and len(tokens) > 4:
            # Two turns: prompt, response, prompt, response (loss on the responses).
            turns = np.sort(rng.choice(np.arange(1, len(tokens)), 3, replace=False))
            turn = np.searchsorted(turns, np.arange(len(tokens)), side="right")
            mask = (turn % 2).astype(np.uint8)
            documents.append({"input_ids": tokens, "loss_mask": mask, "source": "sft"})
        else:
            documents.append({"input_ids": tokens, "source": "text"})
    tokens = byte_tokens(text[at : at + 2 * S + 30])  # a prompt longer than two rows
    mask = (np.arange(len(tokens)) >= 2 * S + 10).astype(np.uint8)
    documents.append({"input_ids": tokens, "loss_mask": mask, "source": "sft"})
    return documents


class TinyLM(nn.Module):
    """A causal transformer (pre-norm, 2 layers, d_model 64, 4 heads) whose positions are
    learned embeddings indexed by position_ids; attention takes any boolean mask [B, S, S]."""

    def __init__(self, vocab: int = VOCAB, d: int = 64, heads: int = 4, layers: int = 2):
        super().__init__()
        self.heads = heads
        self.tokens = nn.Embedding(vocab, d)
        self.positions = nn.Embedding(B * S, d)  # room for positions that fail to restart
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"norm1": nn.LayerNorm(d), "qkv": nn.Linear(d, 3 * d),
                           "out": nn.Linear(d, d), "norm2": nn.LayerNorm(d),
                           "up": nn.Linear(d, 4 * d), "down": nn.Linear(4 * d, d)})
            for _ in range(layers)
        )  # fmt: skip
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, input_ids, position_ids, mask):
        x = self.tokens(input_ids) + self.positions(position_ids)
        b, s, d = x.shape
        for block in self.blocks:
            q, k, v = block["qkv"](block["norm1"](x)).view(b, s, 3, self.heads, -1).unbind(2)
            a = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask[:, None]
            )
            x = x + block["out"](a.transpose(1, 2).reshape(b, s, d))
            x = x + block["down"](F.gelu(block["up"](block["norm2"](x))))
        return self.head(self.norm(x))


def causal(s: int) -> torch.Tensor:
    return torch.ones(s, s, dtype=torch.bool).tril()


def block_mask(cu_seqlens: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """[rows, width, width]: causal within each segment of cu_seqlens (of the rows flattened)."""
    cu = cu_seqlens.to(torch.int64)
    assert cu[0] == 0 and cu[-1] == rows * width and bool((cu.diff() > 0).all())
    segment = (torch.searchsorted(cu, torch.arange(rows * width), right=True) - 1).view(rows, -1)
    return (segment[:, :, None] == segment[:, None, :]) & causal(width)


def seq_idx_mask(seq_idx: torch.Tensor) -> torch.Tensor:
    """The same mask from each token's document index within its row."""
    return (seq_idx[:, :, None] == seq_idx[:, None, :]) & causal(seq_idx.shape[1])


def loss_sum(logits: torch.Tensor, labels: torch.Tensor, shift: bool = True):
    """Cross-entropy summed over labels that are not -100, and their count; ``shift`` as Hugging
    Face's models shift (logits[:, :-1] against labels[:, 1:])."""
    if shift:
        logits, labels = logits[:, :-1], labels[:, 1:]
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                            ignore_index=-100, reduction="sum")  # fmt: skip
    return total, int((labels != -100).sum())


def batch_loss(model, batch, *, mask=None, positions=None, shift=True) -> float:
    ids = batch["input_ids"]
    if mask is None:
        mask = block_mask(batch["cu_seqlens"], *ids.shape)
    total, count = loss_sum(model(ids, batch["position_ids"] if positions is None else positions,
                                  mask), batch["labels"], shift)  # fmt: skip
    return float(total) / count


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    # Small float64 ops on 2 shared cores: torch's intra-op threads wait on each other (10x).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def documents():
    return make_documents()


@pytest.fixture(scope="module")
def pack(documents, tmp_path_factory):
    out = tmp_path_factory.mktemp("packed-loss") / "pack"
    stoker.pack_tokens(documents, out, eos_id=EOS, progress=False)
    return out


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    model = TinyLM().double().eval()
    with torch.no_grad():  # sharper than the default init, so that what a token sees matters
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3 if p.shape[0] in (VOCAB, B * S) else 0.15)
    return model


def loader(pack, **options):
    return stoker.TokenLoader(pack, seq_len=S, batch_size=B, packing="best_fit", seed=3,
                              threads=2, **options)  # fmt: skip


def alone(model, documents, rows) -> tuple[float, int]:
    """The token-weighted mean loss of the pieces of `rows` (sample_ids), each alone: its tokens
    from the documents packed (eos appended, with loss), positions from 0, labels -100 where the
    document's loss mask is 0, no padding, a plain causal mask."""
    losses, counts = [], []
    for row in rows:
        for piece in row:
            doc = documents[piece["document"]]
            tokens = np.append(doc["input_ids"], EOS)
            mask = np.append(doc.get("loss_mask", np.ones(len(tokens) - 1)), 1)
            window = slice(piece["start"], piece["start"] + piece["length"])
            ids = torch.from_numpy(tokens[window].astype(np.int64))[None]
            labels = torch.where(torch.from_numpy(mask[window] == 1)[None], ids, -100)
            n = ids.shape[1]
            total, count = loss_sum(model(ids, torch.arange(n)[None], causal(n)[None]), labels)
            if count:
                losses.append(float(total) / count)
                counts.append(count)
    weights = np.asarray(counts, dtype=np.float64)
    return float(np.dot(losses, weights) / weights.sum()), int(weights.sum())


def check_batches(model, documents, rows, batch, one_row, ahead, one_row_ahead):
    """The loss of a step's batch (padded, flattened, labels shifted, both) against its rows'
    pieces alone; returns the rows."""
    assert len(rows) == B
    expected, count = alone(model, documents, rows)

    assert batch["input_ids"].shape == (B, S)
    assert torch.equal(block_mask(batch["cu_seqlens"], B, S), seq_idx_mask(batch["seq_idx"]))
    got = batch_loss(model, batch)
    assert abs(got - expected) < 1e-9, (rows[0][:2], got, expected)
    assert int(batch["num_items_in_batch"]) == count

    # The same rows as one row without padding, masked by cu_seq_lens_q.
    n = one_row["input_ids"].shape[1]
    assert n == sum(p["length"] for r in rows for p in r)
    mask = block_mask(one_row["cu_seq_lens_q"], 1, n)
    assert torch.equal(mask, seq_idx_mask(one_row["seq_idx"]))
    got = batch_loss(model, one_row, mask=mask)
    assert abs(got - expected) < 1e-9, (rows[0][:2], got, expected)

    # Labels shifted by the loader: the loss takes logits and labels as they are.
    assert torch.equal(ahead["input_ids"], batch["input_ids"])
    got = batch_loss(model, ahead, mask=block_mask(ahead["cu_seqlens"], B, S), shift=False)
    assert abs(got - expected) < 1e-9, (rows[0][:2], got, expected)
    assert torch.equal(one_row_ahead["input_ids"], one_row["input_ids"])
    mask = block_mask(one_row_ahead["cu_seq_lens_q"], 1, n)
    got = batch_loss(model, one_row_ahead, mask=mask, shift=False)
    assert abs(got - expected) < 1e-9, (rows[0][:2], got, expected)
    return rows


@torch.no_grad()
def test_packed_loss_is_each_document_alone(pack, documents, model):
    with (
        loader(pack, num_items_in_batch=True) as padded,
        loader(pack, flatten=True) as flat,
        loader(pack, shift_labels=True) as shifted,
        loader(pack, flatten=True, shift_labels=True) as flat_shifted,
    ):
        steps = len(padded)
        assert steps >= 4 and len(flat) == len(shifted) == len(flat_shifted) == steps
        batches = zip(padded, flat, shifted, flat_shifted)
        taken = [check_batches(model, documents, padded.sample_ids(0, step, rank=0), *four)
                 for step, four in enumerate(batches)]  # fmt: skip
    assert len(taken) == steps
    # Every token of every document once in the epoch (the long ones in several pieces).
    covered = sorted((p["document"], p["start"], p["length"]) for rows in taken for row in rows
                     for p in row)  # fmt: skip
    tiles = {}
    for doc, start, length in covered:
        assert tiles.get(doc, 0) == start, (doc, start)
        tiles[doc] = start + length
    assert tiles == {k: len(d["input_ids"]) + 1 for k, d in enumerate(documents)}


@torch.no_grad()
def test_the_check_notices_a_wrong_mask_or_positions(pack, documents, model):
    with loader(pack) as packed:
        # The batch with the most documents in its rows: the most a wrong mask can mix.
        step = max(range(len(packed)), key=lambda k: sum(map(len, packed.sample_ids(0, k, 0))))
        rows = packed.sample_ids(0, step, rank=0)
        batch = packed.batch_at(0, step)
    assert sum(map(len, rows)) >= 2 * B
    expected, _ = alone(model, documents, rows)
    assert batch_loss(model, batch) == pytest.approx(expected, abs=1e-9)
    # Every token sees the documents before it in its row: another loss.
    seen = batch_loss(model, batch, mask=causal(S).expand(B, S, S))
    assert abs(seen - expected) > 0.01, (seen, expected)
    # The right blocks, but positions 0..S-1 along the row rather than from 0 in each document.
    counted = batch_loss(model, batch, positions=torch.arange(S).expand(B, S))
    assert abs(counted - expected) > 0.01, (counted, expected)


def test_the_documents_are_what_the_pack_indexes(pack, documents):
    """The reference reads documents by their index in the pack: that is the order packed."""
    manifest = json.loads((pack / "manifest.json").read_text())
    with np.load(pack / manifest["documents"]["file"]) as index:
        lengths = index["length"]
    assert lengths.tolist() == [len(d["input_ids"]) + 1 for d in documents]
