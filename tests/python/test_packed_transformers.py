"""A transformers model takes the packing TokenLoader's batches as they are: a small Llama (random
weights, float64, SDPA attention on the CPU) gives on a packed batch the loss it gives on each
document alone, token-weighted; flattened (DataCollatorWithFlattening's keys) and in padded rows
alike. transformers builds the block-diagonal mask from the restarting position ids only
without a KV cache (``use_cache=False``, as a training step runs): with one, every document of a
row sees those before it, and the loss says so."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import stoker

transformers = pytest.importorskip("transformers")

EOS = 255


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    rng = np.random.default_rng(0)
    documents = []
    for k in range(80):
        ids = rng.integers(1, EOS, int(rng.integers(5, 200)))
        mask = np.ones(len(ids), dtype=np.int8)
        mask[: len(ids) // 3 if k % 2 else 0] = 0  # every other one has a prompt
        documents.append({"input_ids": ids, "loss_mask": mask})
    out = tmp_path_factory.mktemp("hf") / "pack"
    stoker.pack_tokens(documents, out, eos_id=EOS, progress=False)
    return out


@pytest.fixture(scope="module")
def model():
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        attn_implementation="sdpa", initializer_range=0.6,  # weights that use the context
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).double().eval()


def alone(model, segments):
    """The token-weighted mean of the model's loss on each (input_ids, labels) alone."""
    total, count = 0.0, 0
    for ids, labels in segments:
        n = int((labels[1:] != -100).sum())
        if n:
            loss = model(input_ids=ids[None], labels=labels[None], use_cache=False).loss
            total += float(loss) * n
            count += n
    return total / count


@torch.no_grad()
def test_a_flattened_batch_goes_to_the_model_as_it_is(pack, model):
    loader = stoker.TokenLoader(pack, seq_len=256, batch_size=2, packing="best_fit",
                                flatten=True, world_size=1, rank=0)  # fmt: skip
    batch = next(iter(loader))
    cu = batch["cu_seq_lens_q"].tolist()
    assert len(cu) > 3  # several documents
    segments = [(batch["input_ids"][0, a:b], batch["labels"][0, a:b]) for a, b in zip(cu, cu[1:])]
    want = alone(model, segments)
    packed = float(model(**batch, use_cache=False).loss)
    assert packed == pytest.approx(want, rel=1e-6)
    # With a KV cache transformers does not look for packed sequences: plain causal attention.
    assert abs(float(model(**batch, use_cache=True).loss) - want) > 1e-3


@torch.no_grad()
def test_padded_rows_go_to_the_model_with_their_position_ids(pack, model):
    loader = stoker.TokenLoader(pack, seq_len=256, batch_size=3, packing="first_fit",
                                world_size=1, rank=0)  # fmt: skip
    batch = next(iter(loader))
    segments = []
    cu = batch["cu_seqlens"].tolist()
    flat_ids, flat_labels = batch["input_ids"].reshape(-1), batch["labels"].reshape(-1)
    for a, b in zip(cu, cu[1:]):
        segments.append((flat_ids[a:b], flat_labels[a:b]))  # padding has no label: left out
    want = alone(model, segments)
    inputs = {k: batch[k] for k in ("input_ids", "labels", "position_ids")}
    assert float(model(**inputs, use_cache=False).loss) == pytest.approx(want, rel=1e-6)
    no_positions = {k: batch[k] for k in ("input_ids", "labels")}
    assert abs(float(model(**no_positions, use_cache=False).loss) - want) > 1e-3
