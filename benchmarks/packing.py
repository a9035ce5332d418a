"""Packed sequences: stoker's best-fit and first-fit packing against TRL's pack_dataset and
Grain's packers on the same real documents, in one run.

    .venv/bin/python benchmarks/packing.py                      # about 5 min on 2 shared cores
    .venv/bin/python benchmarks/packing.py --quick              # 1 round, 60 training steps
    .venv/bin/python benchmarks/packing.py --parts ab           # only efficiency and planning
    .venv/bin/python benchmarks/packing.py --json build/bench-packing/result.json

The peers go into the project's venv without moving its torch, transformers or datasets
(`make bench-peers-setup`): `pip install --no-deps trl grain` and Grain's small dependencies.

The corpus (no download): every .py file of this Python's standard library (site-packages left
out) and every .rst / .txt / .md file and Debian `copyright` file under /usr/share/doc, each
file one document. A byte-level BPE (`tokenizers`, vocabulary 16,384, `<pad>` = 0, `<eos>` = 1)
is trained on it, each document is encoded and ends with `<eos>`; the tokenizer, the tokens and
stoker's pack of them (`stoker.pack_tokens` of {"input_ids": ...} dicts) are kept under
build/bench-packing/ so that a rerun starts at once.

What is measured:

a. efficiency: real tokens / row slots (rows x seq_len) over an epoch, at seq_len 2048 and 8192.
   Documents longer than seq_len are split into pieces of seq_len and a last, shorter piece
   (stoker's long_documents="split", TRL's strategy="bfd_split"; Grain's packers refuse an element
   longer than seq_len, so they are given those same pieces); TRL's default strategy="bfd"
   truncates instead, and its row is shown with the tokens it drops.
b. planning an epoch of 1M documents whose lengths are drawn from the corpus's: stoker's plan
   (stoker.load.packing_plan.plan_epoch: lengths only) against TRL's
   pack_dataset(strategy="bfd_split") on a datasets.Dataset of --trl-plan-docs such documents
   (100k: 1M take minutes and gigabytes here) whose token values are single bytes, so that the
   copy of the tokens into packed rows, which pack_dataset always makes, is the least it can be.
c. tokens/s to a training loop that does nothing but touch each batch (count its non-pad
   tokens), seq_len 2048, batch 8: stoker.TokenLoader(packing="best_fit") against TRL's packed
   dataset (bfd_split) in a torch DataLoader with TRL's padding-free collator
   (DataCollatorForLanguageModeling(padding_free=True): one row of the batch's rows end to end,
   position_ids, cu_seq_lens), num_workers 0 and 2. A warm-up epoch of each, then --rounds
   interleaved rounds of one epoch each; medians.
d. a tiny causal transformer (2 layers, d=128, 4 heads) trained --steps steps on the CPU at
   seq_len 512, batch --train-batch: packed (stoker best_fit rows, attention block-diagonal
   from seq_idx) against padded (one document a row, truncated at 512, padded to the batch's
   longest, attention masked on the padding); real tokens/s, the loss at the end, and both
   models' loss on the same evaluation rows. About 0.5 s a step here (150 steps by default).

Never a timed test.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import importlib.util
import json
import logging
import math
import os
import statistics
import sys
import sysconfig
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
# Third-party packages are imported with this folder off sys.path (no script here may shadow
# them), then bench_data.py is loaded from its file.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
logging.getLogger("absl").setLevel(logging.ERROR)  # Grain: "Failed to load jax profiler"
# TRL's collator calls torch.tensor() on the rows, which warns when they are tensors already.
warnings.filterwarnings("ignore", message="To copy construct from a tensor")
import datasets as hf_datasets  # noqa: E402
import pyarrow as pa  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_data", HERE / "bench_data.py")
assert _spec is not None and _spec.loader is not None
bench_data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_data)

import stoker  # noqa: E402

ROOT = HERE.parent
WORK = ROOT / "build" / "bench-packing"
VOCAB = 16_384
PAD, EOS = 0, 1
SEQ_LENS = (2048, 8192)
BATCH = 8
TRAIN_SEQ = 512

hf_datasets.disable_progress_bars()
hf_datasets.disable_caching()


def versions() -> dict[str, str]:
    out = {}
    for name in ("stoker", "trl", "grain", "datasets", "tokenizers", "transformers", "torch"):
        try:
            from importlib.metadata import version

            out[name] = version(name)
        except Exception:  # noqa: BLE001
            out[name] = "not installed"
    return out


# ---------------------------------------------------------------------------------------------
# The corpus


def corpus_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in stdlib.rglob("*.py")
        if "site-packages" not in p.parts and "dist-packages" not in p.parts
    )
    doc = Path("/usr/share/doc")
    if doc.is_dir():
        files += sorted(
            p
            for p in doc.rglob("*")
            if p.is_file()
            and not p.is_symlink()
            and (p.suffix in (".rst", ".txt", ".md") or p.name == "copyright")
        )
    return files


class Corpus:
    """The documents' tokens end to end (uint16) and each one's offset; its tokenizer."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray, source: str, key: str):
        self.tokens = tokens
        self.offsets = offsets
        self.lengths = np.diff(offsets)
        self.source = source
        self.key = key

    def __len__(self) -> int:
        return len(self.lengths)

    def doc(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def describe(self) -> dict[str, Any]:
        q = np.percentile(self.lengths, [10, 25, 50, 75, 90, 99])
        return {
            "documents": int(len(self)),
            "tokens": int(self.lengths.sum()),
            "source": self.source,
            "length_min": int(self.lengths.min()),
            "length_mean": float(self.lengths.mean()),
            "length_max": int(self.lengths.max()),
            "length_percentiles": dict(
                zip(("p10", "p25", "p50", "p75", "p90", "p99"), (int(v) for v in q))
            ),
            "over": {str(L): int((self.lengths > L).sum()) for L in (TRAIN_SEQ, *SEQ_LENS)},
        }


def make_corpus() -> Corpus:
    files = corpus_files()
    h = hashlib.sha256(f"v1 {VOCAB}".encode())
    for p in files:
        st = p.stat()
        h.update(f"{p}\0{st.st_size}\0{int(st.st_mtime)}\n".encode())
    key = h.hexdigest()[:12]
    WORK.mkdir(parents=True, exist_ok=True)
    cached = WORK / f"corpus-{key}.npz"
    stdlib = sysconfig.get_paths()["stdlib"]
    source = f"{stdlib}/**/*.py and /usr/share/doc/**/{{*.rst,*.txt,*.md,copyright}}"
    if cached.exists():
        z = np.load(cached)
        return Corpus(z["tokens"], z["offsets"], source, key)
    t0 = time.perf_counter()
    texts = []
    for p in files:
        text = p.read_bytes().decode("utf-8", "replace")
        if text.strip():
            texts.append(text)
    tok_path = WORK / f"tokenizer-{key}.json"
    if tok_path.exists():
        tok = Tokenizer.from_file(str(tok_path))
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=VOCAB,
            special_tokens=["<pad>", "<eos>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer)
        tok.save(str(tok_path))
    assert tok.token_to_id("<pad>") == PAD and tok.token_to_id("<eos>") == EOS
    encoded = tok.encode_batch(texts)
    lengths = np.array([len(e.ids) + 1 for e in encoded], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = np.empty(int(offsets[-1]), dtype=np.uint16)
    for i, e in enumerate(encoded):
        tokens[offsets[i] : offsets[i + 1] - 1] = e.ids
        tokens[offsets[i + 1] - 1] = EOS
    np.savez(WORK / f"corpus-{key}.partial.npz", tokens=tokens, offsets=offsets)
    os.replace(WORK / f"corpus-{key}.partial.npz", cached)
    print(
        f"corpus: {len(texts):,} documents tokenized in {time.perf_counter() - t0:.0f} s "
        f"({tok_path.name})",
        flush=True,
    )
    return Corpus(tokens, offsets, source, key)


def make_pack(corpus: Corpus) -> Path:
    out = WORK / f"pack-{corpus.key}"
    done = out / ".bench-done"
    if done.exists():
        return out
    docs = ({"input_ids": corpus.doc(i)} for i in range(len(corpus)))
    t0 = time.perf_counter()
    stoker.pack_tokens(docs, out, dtype="uint16", overwrite=True, progress=False)
    done.touch()
    print(f"stoker pack: {out} in {time.perf_counter() - t0:.1f} s", flush=True)
    return out


def pieces(corpus: Corpus, seq_len: int, order: np.ndarray) -> list[np.ndarray]:
    """Each document (in `order`) cut into pieces of seq_len and a shorter last one."""
    out = []
    for i in order:
        d = corpus.doc(int(i))
        out.extend(d[at : at + seq_len] for at in range(0, len(d), seq_len))
    return out


def shuffled(corpus: Corpus, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(len(corpus))


# ---------------------------------------------------------------------------------------------
# a. Efficiency


def eff_row(
    name: str,
    rows: int,
    real: int,
    seq_len: int,
    corpus_tokens: int,
    note: str = "",
    seconds: float = 0.0,
) -> dict[str, Any]:
    return {
        "packer": name,
        "seq_len": seq_len,
        "rows": rows,
        "real_tokens": real,
        "efficiency": real / (rows * seq_len) if rows else float("nan"),
        "dropped_tokens": corpus_tokens - real,
        "seconds": seconds,
        "note": note,
    }


def stoker_efficiency(pack: Path, corpus: Corpus, seq_len: int, packing: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    rows = real = empty = 0
    with stoker.TokenLoader(
        pack, seq_len=seq_len, batch_size=BATCH, packing=packing, seed=0, long_documents="split"
    ) as loader:
        for b in loader:
            ids = b["input_ids"]
            rows += ids.shape[0]
            # Padding is id 0 (<pad>), which no document holds.
            per_row = ids.ne(PAD).sum(1)
            real += int(per_row.sum())
            empty += int((per_row == 0).sum())
        stats = loader.stats()
    seconds = time.perf_counter() - t0
    s_real = sum(v.get("real", 0) for v in stats["tokens"].values())
    s_pad = sum(v.get("padding", 0) for v in stats["tokens"].values())
    # The last batch is filled up to batch_size with empty rows (drop_last=False): those are
    # left out here, as a DataLoader's last batch is simply smaller; stats() counts them.
    note = (
        f"+ {empty} empty rows filling the last batch; stats(): real {s_real:,}, padding "
        f"{s_pad:,}, efficiency {fmt_pct(stats['efficiency'])}"
    )
    if s_real != real or s_real + s_pad != rows * seq_len:
        note += f" (!= the batches' {real:,} real of {rows * seq_len:,} slots)"
    return eff_row(
        f"stoker {packing}", rows - empty, real, seq_len, int(corpus.lengths.sum()), note, seconds
    )


def docs_dataset(docs: list[np.ndarray]) -> hf_datasets.Dataset:
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int32)
    values = pa.array(np.concatenate(docs).astype(np.int32))
    col = pa.ListArray.from_arrays(pa.array(offsets), values)
    return hf_datasets.Dataset(pa.table({"input_ids": col}))


def trl_efficiency(
    corpus: Corpus, seq_len: int, strategy: str, map_batch: int | None
) -> dict[str, Any]:
    from trl.data_utils import pack_dataset

    ds = docs_dataset([corpus.doc(int(i)) for i in shuffled(corpus)])
    t0 = time.perf_counter()
    packed = pack_dataset(ds, seq_len, strategy, map_kwargs={"batch_size": map_batch})
    seconds = time.perf_counter() - t0
    lengths = pa.compute.list_value_length(packed.data.column("input_ids")).to_numpy()
    assert lengths.max() <= seq_len
    over = corpus.lengths[corpus.lengths > seq_len]
    if strategy == "bfd":
        note = (
            f"truncates: the {len(over):,} documents over seq_len lose "
            f"{int((over - seq_len).sum()):,} tokens"
        )
    else:
        note = f"splits the {len(over):,} documents over seq_len"
    batch = "one batch (whole corpus)" if map_batch is None else f"map batch {map_batch:,}"
    return eff_row(
        f"TRL pack_dataset {strategy}, {batch}",
        len(lengths),
        int(lengths.sum()),
        seq_len,
        int(corpus.lengths.sum()),
        note,
        seconds,
    )


def grain_efficiency(corpus: Corpus, seq_len: int, kind: str, bins: int) -> dict[str, Any]:
    import grain
    import grain.experimental as gx

    cls = {"first_fit": gx.FirstFitPackIterDataset, "best_fit": gx.BestFitPackIterDataset}[kind]
    elements = [{"input_ids": p} for p in pieces(corpus, seq_len, shuffled(corpus))]
    ds = grain.MapDataset.source(elements).to_iter_dataset()
    packed = cls(
        ds, length_struct={"input_ids": seq_len}, num_packing_bins=bins, seed=0, shuffle_bins=True
    )
    t0 = time.perf_counter()
    rows = real = 0
    for row in packed:
        seg = row["input_ids_segment_ids"]
        assert seg.shape == (seq_len,)
        rows += 1
        real += int(np.count_nonzero(seg))
    seconds = time.perf_counter() - t0
    return eff_row(
        f"Grain {kind}, {bins} bins",
        rows,
        real,
        seq_len,
        int(corpus.lengths.sum()),
        f"given the {len(elements):,} pieces",
        seconds,
    )


def lower_bound_rows(corpus: Corpus, seq_len: int) -> int:
    return math.ceil(int(corpus.lengths.sum()) / seq_len)


# ---------------------------------------------------------------------------------------------
# b. Planning an epoch


def stoker_plan(lengths: np.ndarray, seq_len: int, packing: str) -> tuple[float, Any]:
    from stoker.load.packing_plan import plan_epoch

    t0 = time.perf_counter()
    plan = plan_epoch(lengths, seq_len=seq_len, packing=packing, seed=0, epoch=0)
    return time.perf_counter() - t0, plan


def plan_rows(plan: Any) -> int | None:
    """Rows of a plan, whatever shape the function returns."""
    for attr in ("num_rows", "rows", "n_rows"):
        v = getattr(plan, attr, None)
        if isinstance(v, int):
            return v
        if v is not None and hasattr(v, "__len__"):
            return len(v)
    if isinstance(plan, dict):
        for k in ("rows", "num_rows", "row_offsets"):
            if k in plan:
                v = plan[k]
                return int(v) if isinstance(v, (int, np.integer)) else len(v) - (k == "row_offsets")
    if isinstance(plan, tuple) and plan and hasattr(plan[0], "__len__"):
        return len(plan[0]) - 1
    return None


def trl_plan(lengths: np.ndarray, seq_len: int, map_batch: int | None) -> tuple[float, int]:
    from trl.data_utils import pack_dataset

    offsets = np.concatenate([[0], np.cumsum(lengths)])
    assert offsets[-1] < 2**31, "--trl-plan-docs: too many tokens for a list<uint8> column"
    # Token values of one byte (all 0): TRL moves every token into its packed rows, and this
    # makes that copy as small as it can be.
    values = pa.array(np.zeros(int(offsets[-1]), dtype=np.uint8))
    col = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)
    ds = hf_datasets.Dataset(pa.table({"input_ids": col}))
    t0 = time.perf_counter()
    out = pack_dataset(ds, seq_len, "bfd_split", map_kwargs={"batch_size": map_batch})
    seconds = time.perf_counter() - t0
    return seconds, len(out)


# ---------------------------------------------------------------------------------------------
# c. Tokens/s to the loop


class Contender:
    def __init__(
        self, name: str, epoch: Callable[[], int], close: Callable[[], None] = lambda: None
    ):
        self.name = name
        self.epoch = epoch  # one pass: real tokens delivered
        self.close = close
        self.rates: list[float] = []
        self.error = ""

    def timed(self) -> tuple[int, float]:
        t0 = time.perf_counter()
        n = self.epoch()
        return n, time.perf_counter() - t0


def stoker_loop(pack: Path, seq_len: int) -> Contender:
    loader = stoker.TokenLoader(pack, seq_len=seq_len, batch_size=BATCH, packing="best_fit", seed=0)

    def epoch() -> int:
        n = 0
        for b in loader:
            n += int(b["input_ids"].ne(PAD).sum())
        return n

    return Contender("stoker TokenLoader best_fit", epoch, loader.close)


def trl_loop(packed: hf_datasets.Dataset, workers: int, fmt: str | None = None) -> Contender:
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    if fmt is not None:
        packed = packed.with_format(fmt)

    collator = DataCollatorForLanguageModeling(pad_token_id=PAD, padding_free=True)
    dl = torch.utils.data.DataLoader(
        packed,
        batch_size=BATCH,
        shuffle=True,
        collate_fn=collator,
        num_workers=workers,
        persistent_workers=workers > 0,
    )

    def epoch() -> int:
        n = 0
        for b in dl:
            n += int(b["input_ids"].ne(PAD).sum())
        return n

    def close() -> None:
        nonlocal dl
        del dl
        gc.collect()

    how = f"workers={workers}" + (f", with_format('{fmt}')" if fmt else "")
    return Contender(f"TRL bfd_split + DataLoader(padding_free collator, {how})", epoch, close)


def throughput(
    pack: Path | None, corpus: Corpus, rounds: int, seq_len: int = 2048
) -> list[dict[str, Any]]:
    from trl.data_utils import pack_dataset

    ds = docs_dataset([corpus.doc(int(i)) for i in shuffled(corpus)])
    packed = pack_dataset(ds, seq_len, "bfd_split")  # SFTTrainer's call: map batches of 1,000
    contenders = []
    if pack is not None:
        try:
            contenders.append(stoker_loop(pack, seq_len))
        except Exception as e:  # noqa: BLE001
            print(f"  stoker loader: {type(e).__name__}: {e}", flush=True)
    # SFTTrainer's dataset keeps datasets' Python format; with_format("torch") is the fastest
    # of the others tried (numpy; workers 2 with either).
    contenders += [trl_loop(packed, 0), trl_loop(packed, 2), trl_loop(packed, 0, "torch")]
    total = int(corpus.lengths.sum())
    for c in contenders:  # warm-up epoch, checked
        try:
            n, s = c.timed()
            if n != total:
                c.error = f"warm-up epoch delivered {n:,} real tokens, the corpus has {total:,}"
            print(f"  warm-up {c.name}: {n / s / 1e6:.2f}M tokens/s", flush=True)
        except Exception as e:  # noqa: BLE001
            c.error = f"{type(e).__name__}: {e}"
            print(f"  {c.name}: {c.error}", flush=True)
    live = [c for c in contenders if not c.error]
    for r in range(rounds):
        for c in live:
            n, s = c.timed()
            c.rates.append(n / s)
        print(
            f"  round {r + 1}: "
            + ", ".join(f"{c.name.split(' ')[0]} {c.rates[-1] / 1e6:.2f}M" for c in live),
            flush=True,
        )
    for c in contenders:
        c.close()
    return [
        {
            "loader": c.name,
            "tokens_per_s": statistics.median(c.rates) if c.rates else None,
            "rounds": c.rates,
            "error": c.error,
        }
        for c in contenders
    ]


# ---------------------------------------------------------------------------------------------
# d. A tiny GPT, packed against padded


class Block(torch.nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyGPT(torch.nn.Module):
    def __init__(
        self,
        vocab: int = VOCAB,
        d: int = 128,
        layers: int = 2,
        heads: int = 4,
        seq: int = TRAIN_SEQ,
    ):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(seq, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        for emb in (self.tok, self.pos):  # GPT-2's init: the tied head's logits start near 0
            torch.nn.init.normal_(emb.weight, std=0.02)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x, mask)
        return self.ln(x) @ self.tok.weight.T  # tied head


def packed_batches(pack: Path, batch: int, seed: int = 0):
    """stoker best_fit rows: (ids, position_ids, block-diagonal causal mask, labels)."""
    with stoker.TokenLoader(
        pack, seq_len=TRAIN_SEQ, batch_size=batch, packing="best_fit", seed=seed
    ) as loader:
        for epoch in range(1_000_000):
            loader.set_epoch(epoch)
            for b in loader:
                ids, seg = b["input_ids"], b["seq_idx"]
                t = ids.shape[1]
                causal = torch.ones(t, t, dtype=torch.bool).tril()
                mask = (seg[:, :, None] == seg[:, None, :]) & causal
                yield ids, b["position_ids"], mask[:, None], b["labels"]


def padded_batches(corpus: Corpus, batch: int, seed: int = 0):
    """One document a row, truncated at TRAIN_SEQ, padded to the batch's longest."""
    epoch = 0
    while True:
        order = shuffled(corpus, seed=seed * 1000 + epoch)
        for at in range(0, len(order) - batch + 1, batch):
            docs = [corpus.doc(int(i))[:TRAIN_SEQ] for i in order[at : at + batch]]
            t = max(len(d) for d in docs)
            ids = torch.full((batch, t), PAD, dtype=torch.int64)
            valid = torch.zeros(batch, t, dtype=torch.bool)
            for r, d in enumerate(docs):
                ids[r, : len(d)] = torch.from_numpy(d.astype(np.int64))
                valid[r, : len(d)] = True
            labels = ids.masked_fill(~valid, -100)
            labels[:, 0] = -100
            causal = torch.ones(t, t, dtype=torch.bool).tril()
            # Padding queries see their own key only (no row of the mask all False).
            mask = (causal & valid[:, None, :]) | torch.eye(t, dtype=torch.bool)
            pos = torch.arange(t).expand(batch, t)
            yield ids, pos, mask[:, None], labels
        epoch += 1


def lm_loss(model: TinyGPT, ids, pos, mask, labels) -> torch.Tensor:
    logits = model(ids, pos, mask)
    # HF convention: labels aligned with input_ids, the model shifts.
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
    )


def warm_up_allocator(batch: int, steps: int = 8) -> None:
    """A few steps of a throwaway model: the first backward passes of a process run several times
    slower (the allocator), and neither contender should pay for that."""
    torch.manual_seed(1)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(2, VOCAB, (batch, TRAIN_SEQ))
    pos = torch.arange(TRAIN_SEQ).expand(batch, TRAIN_SEQ)
    mask = torch.ones(TRAIN_SEQ, TRAIN_SEQ, dtype=torch.bool).tril().expand(batch, 1, -1, -1)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        lm_loss(model, ids, pos, mask, ids).backward()
        opt.step()


def train(batches, steps: int, evaluation: list) -> dict[str, Any]:
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    losses, real, slots, t_data, t_total = [], 0, 0, 0.0, 0.0
    it = iter(batches)
    for _ in range(steps):
        t0 = time.perf_counter()
        ids, pos, mask, labels = next(it)
        t1 = time.perf_counter()
        loss = lm_loss(model, ids, pos, mask, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        t2 = time.perf_counter()
        t_data += t1 - t0
        t_total += t2 - t0
        losses.append(loss.item())
        real += int(ids.ne(PAD).sum())
        slots += ids.numel()
    with torch.no_grad():
        model.eval()
        n = sum(int(b[3][:, 1:].ne(-100).sum()) for b in evaluation)
        held = sum(float(lm_loss(model, *b)) * int(b[3][:, 1:].ne(-100).sum()) for b in evaluation)
    tail = losses[-max(1, steps // 10) :]
    return {
        "steps": steps,
        "real_tokens": real,
        "slots": slots,
        "seconds": t_total,
        "data_seconds": t_data,
        "real_tokens_per_s": real / t_total,
        "first_loss": losses[0],
        "final_loss": sum(tail) / len(tail),
        "final_loss_steps": len(tail),
        "eval_loss": held / n,
        "eval_tokens": n,
    }


# ---------------------------------------------------------------------------------------------
# The report


def fmt_pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def report(res: dict[str, Any]) -> str:
    m, c = res["machine"], res["corpus"]
    p = c["length_percentiles"]
    lines = [
        "## Packed sequences: stoker against TRL's pack_dataset and Grain's packers",
        "",
        f"- command: `{res['command']}`",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; Python {m['python']}, "
        f"torch {m['torch']}; load average {res['load'][0]:.2f} at the start, "
        f"{res['load'][1]:.2f} at the end",
        f"- date: {res['date']}, run time {res['seconds'] / 60:.1f} min",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in res["versions"].items()),
        f"- corpus: {c['documents']:,} documents, {c['tokens']:,} tokens (byte-level BPE, "
        f"vocabulary {VOCAB:,}, an <eos> ending each document); tokens a document: min "
        f"{c['length_min']:,}, p10 {p['p10']:,}, p25 {p['p25']:,}, median {p['p50']:,}, "
        f"p75 {p['p75']:,}, p90 {p['p90']:,}, p99 {p['p99']:,}, max {c['length_max']:,}, mean "
        f"{c['length_mean']:,.0f}; over 512 / 2048 / 8192 tokens: "
        + " / ".join(f"{c['over'][str(L)]:,}" for L in (TRAIN_SEQ, *SEQ_LENS))
        + f" documents ({c['source']})",
        "",
    ]
    if res.get("efficiency"):
        lines += [
            "### a. Efficiency: real tokens / (rows x seq_len) over an epoch",
            "",
            "| packer | seq_len | rows | real tokens | efficiency | tokens dropped | epoch's time "
            "| note |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for r in res["efficiency"]:
            if r.get("error"):
                lines.append(f"| {r['packer']} | {r['seq_len']} | | | | | | **{r['error']}** |")
                continue
            lines.append(
                f"| {r['packer']} | {r['seq_len']} | {r['rows']:,} | {r['real_tokens']:,} | "
                f"**{fmt_pct(r['efficiency'])}** | {r['dropped_tokens']:,} | "
                f"{r['seconds']:.1f} s | {r['note']} |"
            )
        lines += [
            "",
            "Lower bound on rows (every slot filled): "
            + ", ".join(f"{v:,} at {k}" for k, v in res["lower_bound_rows"].items())
            + ". Documents over seq_len are split (pieces of seq_len, then the rest) for every "
            "packer but TRL's default `bfd`, which truncates them; Grain's packers get the same "
            "pieces, in the same shuffled document order. Grain packs online: it fills "
            "num_packing_bins rows and emits them all as soon as one element fits none (MaxText "
            f"uses num_packing_bins = batch size, {BATCH}). TRL's map batch of 1,000 is what "
            "SFTTrainer runs (datasets' default); each map batch is packed on its own. stoker "
            "packs window after window of buffer=10,000 pieces (its default), each in "
            "decreasing length. An epoch's time: stoker, the loader's whole epoch (plan, "
            f"tokens read, batches of {BATCH} rows made); TRL, pack_dataset (the packed "
            "dataset made, before any batch); Grain, iterating its packed rows.",
            "",
        ]
    if res.get("plan"):
        pl = res["plan"]
        lines += [
            f"### b. Planning an epoch of {pl['documents']:,} documents (lengths drawn from the "
            f"corpus's, {pl['tokens']:,} tokens), seq_len {pl['seq_len']}",
            "",
            "| planner | documents | rows | time | documents/s |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for r in pl["rows"]:
            if r.get("error"):
                lines.append(f"| {r['planner']} | {r['documents']:,} | | **{r['error']}** | |")
                continue
            rows = f"{r['rows']:,}" if r.get("rows") is not None else "?"
            lines.append(
                f"| {r['planner']} | {r['documents']:,} | {rows} | {r['seconds']:.2f} s | "
                f"{r['documents'] / r['seconds']:,.0f} |"
            )
        lines += ["", pl["note"], ""]
    if res.get("throughput"):
        lines += [
            f"### c. Tokens/s to the loop (seq_len 2048, batch {BATCH}; real tokens, median of "
            f"{res['rounds']} interleaved epochs)",
            "",
            "| loader | real tokens/s | per round |",
            "| --- | ---: | --- |",
        ]
        for r in res["throughput"]:
            if r["error"] or r["tokens_per_s"] is None:
                lines.append(f"| {r['loader']} | | **{r['error'] or 'no figure'}** |")
                continue
            lines.append(
                f"| {r['loader']} | **{r['tokens_per_s'] / 1e6:.2f}M** | "
                + ", ".join(f"{v / 1e6:.2f}M" for v in r["rounds"])
                + " |"
            )
        mine = [r for r in res["throughput"] if r["loader"].startswith("stoker") and r["rounds"]]
        theirs = [r for r in res["throughput"] if r["loader"].startswith("TRL") and r["rounds"]]
        if mine and theirs:
            best = max(theirs, key=lambda r: r["tokens_per_s"])
            lines += [
                "",
                f"stoker / the fastest TRL configuration ({best['loader']}): "
                f"**{mine[0]['tokens_per_s'] / best['tokens_per_s']:.1f}x**; SFTTrainer's own "
                "(datasets' Python format, workers 0 / 2): "
                + " / ".join(
                    f"{mine[0]['tokens_per_s'] / r['tokens_per_s']:.1f}x"
                    for r in theirs
                    if "with_format" not in r["loader"]
                )
                + ". Each epoch is the whole corpus once; stoker's batches are [8, 2048] rows "
                "(padding id 0 after the last piece of a row), TRL's padding-free collator's are "
                "one row of the 8 rows' tokens end to end, without padding.",
            ]
        lines += [""]
    if res.get("training"):
        tr = res["training"]
        lines += [
            f"### d. A tiny GPT on the CPU (2 layers, d=128, 4 heads, vocabulary {VOCAB:,}), "
            f"seq_len {TRAIN_SEQ}, batch {tr['batch']}, {tr['steps']} steps, AdamW 1e-3",
            "",
            "| input | real tokens (of the slots) | real tokens/s | loading's share | loss at "
            "step 1 | training loss at the end | loss on the evaluation rows |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for name in ("packed", "padded"):
            r = tr.get(name)
            if not r:
                continue
            if r.get("error"):
                lines.append(f"| {name} | | | | | | **{r['error']}** |")
                continue
            lines.append(
                f"| {name} | {r['real_tokens']:,} ({fmt_pct(r['real_tokens'] / r['slots'])}) | "
                f"**{r['real_tokens_per_s']:,.0f}** | "
                f"{fmt_pct(r['data_seconds'] / r['seconds'])} | {r['first_loss']:.3f} | "
                f"{r['final_loss']:.3f} (mean of the last {r['final_loss_steps']} steps) | "
                f"**{r['eval_loss']:.3f}** |"
            )
        lines += [
            "",
            "packed: stoker.TokenLoader(packing='best_fit') rows, attention block-diagonal "
            "causal from seq_idx, position_ids from the loader, loss on its labels; padded: one "
            f"document a row, truncated at {TRAIN_SEQ}, padded to the batch's longest, causal "
            "attention masked on the padding. Both: the same model, initial weights and "
            "optimizer; a step's loss is the mean over the batch's real next-token predictions. "
            "real tokens/s counts the tokens that are not padding (a step costs about the same "
            "either way: the packed rows are full, the padded ones as long as the batch's "
            f"longest). The evaluation rows, the same for both models: {tr.get('eval_rows', 0)} "
            f"{tr.get('eval_kind', '')} rows of another seed's epoch (from the training "
            "documents: there is no held-out set), token-weighted mean loss, after training. "
            "A few steps of a throwaway model ran first (the process's first backward passes "
            "are several times slower).",
            "",
        ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved epochs in part c")
    parser.add_argument(
        "--steps", type=int, default=150, help="training steps in part d (~0.5 s each)"
    )
    parser.add_argument("--train-batch", type=int, default=4)
    parser.add_argument("--plan-docs", type=int, default=1_000_000)
    parser.add_argument("--trl-plan-docs", type=int, default=100_000)
    parser.add_argument("--grain-bins", default=f"{BATCH},64", help="num_packing_bins, comma list")
    parser.add_argument("--parts", default="abcd", help="which parts to run (letters)")
    parser.add_argument("--quick", action="store_true", help="1 round, 60 steps")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps = 1, 60
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    t_start = time.time()
    load_start = os.getloadavg()[0]
    machine = bench_data.machine()
    machine.pop("libjpeg-turbo", None)
    print(f"machine: {machine}", flush=True)
    corpus = make_corpus()
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine,
        "versions": versions(),
        "corpus": corpus.describe(),
        "command": "python benchmarks/packing.py" + "".join(f" {a}" for a in sys.argv[1:]),
        "rounds": args.rounds,
    }
    print(json.dumps(res["corpus"]), flush=True)
    pack: Path | None = None
    try:
        pack = make_pack(corpus)
    except Exception as e:  # noqa: BLE001
        print(f"stoker pack: {type(e).__name__}: {e}", flush=True)
        res["stoker_error"] = f"pack_tokens: {type(e).__name__}: {e}"

    def guarded(name: str, fn: Callable[[], dict[str, Any]], **fields: Any) -> dict[str, Any]:
        try:
            row = fn()
        except Exception as e:  # noqa: BLE001
            row = {**fields, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(
            f"  {name}: " + json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True
        )
        return row

    if "a" in args.parts:
        print("a. efficiency", flush=True)
        rows = []
        bins = [int(b) for b in args.grain_bins.split(",") if b]
        for L in SEQ_LENS:
            for packing in ("best_fit", "first_fit"):
                rows.append(
                    guarded(
                        f"stoker {packing} {L}",
                        lambda: stoker_efficiency(pack, corpus, L, packing),  # noqa: B023
                        packer=f"stoker {packing}",
                        seq_len=L,
                    )
                )
            for strategy, mb in (("bfd_split", 1000), ("bfd_split", None), ("bfd", 1000)):
                rows.append(
                    guarded(
                        f"TRL {strategy} {mb} {L}",
                        lambda: trl_efficiency(corpus, L, strategy, mb),  # noqa: B023
                        packer=f"TRL {strategy}",
                        seq_len=L,
                    )
                )
            for kind in ("first_fit", "best_fit"):
                for nb in bins:
                    rows.append(
                        guarded(
                            f"Grain {kind} {nb} {L}",
                            lambda: grain_efficiency(corpus, L, kind, nb),  # noqa: B023
                            packer=f"Grain {kind}, {nb} bins",
                            seq_len=L,
                        )
                    )
        res["efficiency"] = rows
        res["lower_bound_rows"] = {str(L): lower_bound_rows(corpus, L) for L in SEQ_LENS}

    if "b" in args.parts:
        print("b. planning", flush=True)
        L = 2048
        lengths = np.random.default_rng(1).choice(corpus.lengths, size=args.plan_docs)
        plan_rows_out = []
        for packing in ("best_fit", "first_fit"):

            def run_stoker(packing: str = packing) -> dict[str, Any]:
                s, plan = stoker_plan(lengths, L, packing)
                return {
                    "planner": f"stoker plan_epoch {packing}",
                    "documents": len(lengths),
                    "rows": plan_rows(plan),
                    "seconds": s,
                }

            plan_rows_out.append(
                guarded(
                    f"stoker plan {packing}",
                    run_stoker,
                    planner=f"stoker plan_epoch {packing}",
                    documents=len(lengths),
                )
            )
        n_trl = min(args.trl_plan_docs, len(lengths))
        for mb in (1000, None):

            def run_trl(mb: int | None = mb) -> dict[str, Any]:
                s, rows_ = trl_plan(lengths[:n_trl], L, mb)
                batch = "one batch" if mb is None else f"map batch {mb:,}"
                return {
                    "planner": f"TRL pack_dataset bfd_split, {batch}",
                    "documents": n_trl,
                    "rows": rows_,
                    "seconds": s,
                }

            plan_rows_out.append(
                guarded(
                    f"TRL plan {mb}",
                    run_trl,
                    planner=f"TRL pack_dataset bfd_split {mb}",
                    documents=n_trl,
                )
            )
        res["plan"] = {
            "documents": len(lengths),
            "tokens": int(lengths.sum()),
            "seq_len": L,
            "rows": plan_rows_out,
            "note": (
                f"TRL is timed on the first {n_trl:,} of those documents (--trl-plan-docs): "
                "pack_dataset plans (best fit decreasing, a Python loop over the pieces) and "
                "then builds the packed rows, a copy of every token (here one byte a token, all "
                "0: the least copy there can be); 1M documents would take minutes and gigabytes "
                "here. stoker plans from the lengths alone (the pack's document index), window "
                "after window of buffer=10,000 pieces, and reads tokens only for the rows a step "
                "takes."
            ),
        }

    if "c" in args.parts:
        print("c. tokens/s to the loop", flush=True)
        res["throughput"] = throughput(pack, corpus, args.rounds)

    if "d" in args.parts:
        print("d. tiny GPT", flush=True)
        tr: dict[str, Any] = {"steps": args.steps, "batch": args.train_batch}
        warm_up_allocator(args.train_batch)
        # The same rows for both models' evaluation: packed rows of another seed's epoch.
        evaluation: list = []
        if pack is not None:
            with contextlib.suppress(Exception):
                it = packed_batches(pack, args.train_batch, seed=1)
                evaluation = [next(it) for _ in range(8)]
                it.close()
        if not evaluation:
            it = padded_batches(corpus, args.train_batch, seed=1)
            evaluation = [next(it) for _ in range(8)]
        tr["eval_rows"] = sum(b[0].shape[0] for b in evaluation)
        tr["eval_kind"] = "packed" if pack is not None else "padded"
        if pack is not None:
            tr["packed"] = guarded(
                "packed",
                lambda: train(packed_batches(pack, args.train_batch), args.steps, evaluation),
            )
        tr["padded"] = guarded(
            "padded",
            lambda: train(padded_batches(corpus, args.train_batch), args.steps, evaluation),
        )
        res["training"] = tr

    res["load"] = (load_start, os.getloadavg()[0])
    res["seconds"] = time.time() - t_start
    text = report(res)
    print("\n" + text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
