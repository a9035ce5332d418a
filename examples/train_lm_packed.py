"""Fine-tuning a language model on packed documents: SFT pairs with loss masks, whole documents
packed into rows by best fit, attention kept inside each document.

    .venv/bin/python examples/train_lm_packed.py                      # 80 steps
    .venv/bin/python examples/train_lm_packed.py --steps 100 --resume # 20 steps more

(About 20 s on 2 CPU cores with OMP_NUM_THREADS=1: torch's threads otherwise contend with the
loader's for so few cores.)

1. Makes SFT documents from Python's own library, offline: for every function with a docstring,
   the docstring as the prompt and the function's code as the response, byte-level tokens
   (the 256 bytes, then eos). The loss mask is 0 on the prompt: the model learns to write the
   code, not the docstring. The modules' own docstrings join them as plain text, loss on every
   token. All go into a token pack under --out with ``stoker.pack_tokens``, once.
2. Reads them with ``stoker.TokenLoader(pack, packing="best_fit")``: rows of whole documents
   (one longer than --seq-len left out here; ``long_documents="split"`` would cut it), each
   batch a dict of input_ids, labels (-100 on each document's first token, on prompts and on
   padding), position_ids restarting at 0 in each document, and cu_seqlens, the documents'
   bounds.
3. Trains a small causal transformer whose attention is block-diagonal by cu_seqlens (a token
   sees only the earlier tokens of its own document) and whose positions come from
   position_ids, with the loss summed and divided by the batch's num_items_in_batch (its
   loss-bearing tokens), as Hugging Face's Trainer does. On a GPU the same batch goes to
   ``flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
   causal=True)``, or ``TokenLoader(..., flatten=True)`` to a Hugging Face model loaded with
   ``attn_implementation="flash_attention_2"``, instead of the dense mask built here.
4. Prints the loss and tokens/s, then the loader's token counts per source (real, padding,
   loss-bearing, split, dropped) and the rows' efficiency. Saves model, optimizer and loader
   state to --out/checkpoint.pt; --resume continues from it, exactly where the loader was.

Exits with status 1 unless the loss fell.
"""

from __future__ import annotations

import argparse
import ast
import math
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import stoker

EOS = 256  # the byte-level vocabulary: the 256 bytes, then eos
VOCAB = 257
MODULES = (  # pure-Python modules of the standard library, read from its source
    "textwrap", "json/__init__", "json/decoder", "json/encoder", "string", "shlex", "fnmatch",
    "glob", "difflib", "statistics", "fractions", "calendar", "heapq", "bisect", "colorsys",
    "csv", "argparse", "functools", "dataclasses", "pathlib", "shutil", "tempfile", "inspect",
    "ast", "pprint", "reprlib", "copy", "random",
)  # fmt: skip


def byte_tokens(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), dtype=np.uint8).astype(np.uint16)


def sft_documents() -> list[dict]:
    """(docstring -> code) pairs of the standard library's functions, prompt without loss, and
    the modules' docstrings as plain text."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    documents = []
    for name in MODULES:
        path = stdlib / f"{name}.py"
        if not path.exists():
            continue
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines(keepends=True)
        tree = ast.parse(source)
        about = ast.get_docstring(tree)
        if about:
            documents.append({"input_ids": byte_tokens(about), "source": "docs"})
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(node.body) < 2:
                continue
            # The code: its def line(s) and its body after the docstring.
            head = lines[node.lineno - 1 : node.body[0].lineno - 1]
            body = lines[node.body[0].end_lineno : node.end_lineno]
            code = textwrap.dedent("".join(head + body))
            prompt = byte_tokens(f"### Docstring\n{doc}\n### Code\n")
            response = byte_tokens(code)
            documents.append({
                "input_ids": np.concatenate((prompt, response)),
                "loss_mask": np.concatenate((np.zeros(len(prompt), np.uint8),
                                             np.ones(len(response), np.uint8))),
                "source": "sft",
            })  # fmt: skip
    return documents


def make_pack(out: Path) -> Path:
    pack = out / "pack"
    if not (pack / "manifest.json").exists():
        documents = sft_documents()
        stoker.pack_tokens(documents, pack, eos_id=EOS, progress=False)
        tokens = sum(len(d["input_ids"]) + 1 for d in documents)
        print(f"packed {len(documents):,} documents, {tokens:,} tokens, at {pack}")
    return pack


class CausalLM(nn.Module):
    """A small pre-norm transformer: learned position embeddings looked up by position_ids (so
    that each packed document starts at position 0), attention under any boolean mask."""

    def __init__(self, max_positions: int, d: int = 128, heads: int = 4, layers: int = 3):
        super().__init__()
        self.heads = heads
        self.tokens = nn.Embedding(VOCAB, d)
        self.positions = nn.Embedding(max_positions, d)
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"norm1": nn.LayerNorm(d), "qkv": nn.Linear(d, 3 * d),
                           "out": nn.Linear(d, d), "norm2": nn.LayerNorm(d),
                           "up": nn.Linear(d, 4 * d), "down": nn.Linear(4 * d, d)})
            for _ in range(layers)
        )  # fmt: skip
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB)

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


def document_mask(cu_seqlens: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """[rows, width, width] booleans: token i sees token j when both are of one segment of
    cu_seqlens (the rows' documents and padding, row after row) and j <= i."""
    cu = cu_seqlens.to(torch.int64)
    segment = torch.searchsorted(cu, torch.arange(rows * width), right=True).view(rows, width)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    return (segment[:, :, None] == segment[:, None, :]) & causal


def loss_of(model: nn.Module, batch: dict) -> torch.Tensor:
    """Cross-entropy over the loss-bearing labels, summed and divided by num_items_in_batch: the
    model shifts (logits at t predict the label at t + 1), as Hugging Face's models do."""
    ids = batch["input_ids"]
    logits = model(ids, batch["position_ids"], document_mask(batch["cu_seqlens"], *ids.shape))
    total = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), batch["labels"][:, 1:].reshape(-1),
                            ignore_index=-100, reduction="sum")  # fmt: skip
    return total / batch["num_items_in_batch"].clamp(min=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/train-lm-packed"))
    parser.add_argument("--steps", type=int, default=80, help="steps in all (with --resume too)")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", default="auto", help="the loader's threads")
    parser.add_argument("--resume", action="store_true", help="continue from --out/checkpoint.pt")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    pack = make_pack(args.out)
    loader = stoker.TokenLoader(
        pack,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        packing="best_fit",  # whole documents, each row filled by the tightest fit
        long_documents="drop",  # a pair longer than a row is left out (counted), not cut
        num_items_in_batch=True,
        seed=0,
        threads=args.threads if args.threads == "auto" else int(args.threads),
    )
    model = CausalLM(max_positions=args.seq_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    checkpoint = args.out / "checkpoint.pt"
    step = 0
    if args.resume and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        step = state["step"]
        print(f"resumed at step {step}, epoch {loader.epoch}")
    print(f"{loader.num_documents:,} documents, {len(loader)} steps an epoch of {args.batch_size} "
          f"rows x {args.seq_len} tokens")  # fmt: skip

    losses, tokens, t0 = [], 0, time.perf_counter()
    log_every = max(1, args.steps // 10)
    while step < args.steps:
        for batch in loader:
            loss = loss_of(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            losses.append(loss.item())
            tokens += batch["input_ids"].numel()  # the rows' slots, padding too
            if step % log_every == 0 or step == args.steps:
                rate = tokens / (time.perf_counter() - t0)
                print(f"step {step:>4}  loss {losses[-1]:.6f}  {rate:,.0f} row tokens/s  "
                      f"epoch {loader.epoch}")  # fmt: skip
            if step == args.steps:
                break

    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "loader": loader.state_dict(), "step": step}, checkpoint)  # fmt: skip
    stats = loader.stats()
    loader.close()
    kinds = ("real", "padding", "loss", "split", "dropped")
    print(f"tokens {'source':>8}" + "".join(f"  {k:>9}" for k in kinds))
    for source, c in stats["tokens"].items():
        print(f"       {source:>8}" + "".join(f"  {c[k]:>9,}" for k in kinds))
    print(f"efficiency {stats['efficiency']:.1%} (real tokens of the rows' slots); "
          f"checkpoint {checkpoint}")  # fmt: skip
    if len(losses) < 2:
        return 0
    quarter = max(1, len(losses) // 4)
    first, last = sum(losses[:quarter]) / quarter, sum(losses[-quarter:]) / quarter
    fell = last < first and all(math.isfinite(v) for v in losses)
    print(f"loss {first:.4f} -> {last:.4f}")
    return 0 if fell else 1


if __name__ == "__main__":
    sys.exit(main())
