"""stoker.pack_text: text from JSON Lines, Parquet, text files and Hugging Face datasets,
tokenized with a BPE tokenizer trained here on Python's own sources; each pack's token stream
against tokenizer.encode() of every document (plus eos) in order, its document index, the dtype
chosen from the vocabulary, the tokenizer's hash in the manifest, and the errors that name
a bad line or a missing column."""

from __future__ import annotations

import ast
import gzip
import hashlib
import inspect
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import stoker  # noqa: E402
from stoker.packing.text import pack_text  # noqa: E402

EOS = "<|endoftext|>"


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    """Real text of varied lengths: the functions and classes of the ast module, and some
    prose with non-ASCII characters."""
    source = Path(ast.__file__).read_text(encoding="utf-8")
    pieces = [
        ast.get_source_segment(source, node) or ""
        for node in ast.parse(source).body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef))
    ]
    prose = textwrap.dedent(inspect.getdoc(textwrap) or "") + " Déjà vu: naïve café, 東京, ½ + ¼."
    return [p for p in pieces if p][:60] + [prose, "x", "line one\r\nline two\n"]


@pytest.fixture(scope="module")
def tokenizer(corpus):
    """A byte-level BPE of 500 ids with <|endoftext|>, trained on the corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    assert tok.get_vocab_size() == 500
    return tok


def read_pack(out: Path) -> tuple[dict, np.ndarray]:
    manifest = json.loads((out / "manifest.json").read_text())
    dtype = np.dtype(manifest["dtype"])
    stream = np.concatenate([np.fromfile(out / s["file"], dtype=dtype) for s in manifest["shards"]])
    assert len(stream) == manifest["num_tokens"]
    return manifest, stream


def expected(tokenizer, texts, eos: int | None) -> list[list[int]]:
    docs = [tokenizer.encode(t).ids for t in texts]
    return [d + ([] if eos is None else [eos]) for d in docs]


def check_pack(out: Path, tokenizer, texts, sources: list[str], eos: int | None = 0) -> dict:
    """The stream is each text's ids (and eos) in order; documents.npz says where each one is
    and what its source is; the manifest names the tokenizer."""
    manifest, stream = read_pack(out)
    docs = expected(tokenizer, texts, eos)
    assert stream.tolist() == [i for d in docs for i in d]
    index = np.load(out / manifest["documents"]["file"])
    assert index["length"].tolist() == [len(d) for d in docs]
    assert index["offset"].tolist() == np.cumsum([0] + [len(d) for d in docs])[:-1].tolist()
    names = manifest["documents"]["sources"]
    assert [names[i] for i in index["source"]] == sources
    assert manifest["eos_id"] == eos
    assert manifest["tokenizer"] == {
        "sha256": hashlib.sha256(tokenizer.to_str().encode()).hexdigest(),
        "vocab_size": 500,
    }
    return manifest


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return path


def test_jsonl(tmp_path, tokenizer, corpus):
    path = write_jsonl(
        tmp_path / "wiki.jsonl", [{"id": i, "text": t} for i, t in enumerate(corpus)]
    )
    out = tmp_path / "pack"
    result = pack_text(path, out, tokenizer=tokenizer, batch_size=7, progress=False)
    manifest = check_pack(out, tokenizer, corpus, ["wiki"] * len(corpus))
    assert manifest["dtype"] == "uint16"  # 500 ids
    assert result.num_samples == manifest["num_tokens"]


def test_parquet_file_from_tokenizer_json(tmp_path, tokenizer, corpus):
    """A tokenizer.json path; a Parquet file of several row groups read in batches across them,
    its null and empty texts left out."""
    texts = corpus + [None, ""]
    path = tmp_path / "web.parquet"
    pq.write_table(pa.table({"body": texts, "n": list(range(len(texts)))}), path, row_group_size=10)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    out = tmp_path / "pack"
    pack_text(path, out, tokenizer=tmp_path / "tokenizer.json", column="body", batch_size=4,
              progress=False)  # fmt: skip
    check_pack(out, tokenizer, corpus, ["web"] * len(corpus))


def test_text_folder_and_list(tmp_path, tokenizer, corpus):
    """A folder of .txt and .md files (subfolders too) in sorted order, bytes as they are
    (a \\r\\n kept); a list of sources, each named by its file, source_name naming all."""
    root = tmp_path / "books"
    (root / "b").mkdir(parents=True)
    files = {"a.txt": corpus[0], "b/c.md": corpus[1], "b/d.txt": corpus[-1], "e.txt": corpus[2]}
    for name, text in files.items():
        (root / name).write_bytes(text.encode())
    (root / "notes.csv").write_text("ignored,file\n")
    (root / ".hidden.txt").write_text("ignored")
    out = tmp_path / "pack"
    pack_text(root, out, tokenizer=tokenizer, eos_id=None, progress=False)
    check_pack(out, tokenizer, list(files.values()), ["books"] * 4, eos=None)

    lines = "".join(json.dumps({"text": t}) + "\n" for t in corpus[3:6])
    (tmp_path / "chat.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    sources = [root / "a.txt", tmp_path / "chat.jsonl.gz"]
    pack_text(sources, tmp_path / "two", tokenizer=tokenizer, progress=False)
    check_pack(tmp_path / "two", tokenizer, [corpus[0], *corpus[3:6]], ["a"] + ["chat"] * 3)
    pack_text(sources, tmp_path / "one", tokenizer=tokenizer, source_name="mix", progress=False)
    check_pack(tmp_path / "one", tokenizer, [corpus[0], *corpus[3:6]], ["mix"] * 4)


def test_hf_dataset_and_fast_tokenizer(tmp_path, tokenizer, corpus):
    """A datasets.Dataset, its rows shuffled (an indices mapping read through); a transformers
    fast tokenizer, its eos_token_id taken, with a post-processor that adds a BOS."""
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": corpus, "n": list(range(len(corpus)))})
    ds = ds.shuffle(seed=0)
    texts = list(ds["text"])
    out = tmp_path / "pack"
    pack_text(ds, out, tokenizer=tokenizer, batch_size=16, progress=False)
    check_pack(out, tokenizer, texts, ["dataset"] * len(texts))

    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.add_special_tokens(["<bos>", "<stop>"])
    bos = tok.token_to_id("<bos>")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", bos)]
    )
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<stop>")
    pack_text(ds, tmp_path / "fast", tokenizer=fast, source_name="s", progress=False)
    manifest, stream = read_pack(tmp_path / "fast")
    stop = tok.token_to_id("<stop>")
    assert manifest["eos_id"] == stop
    assert stream.tolist() == [i for d in expected(tok, texts, stop) for i in d]
    assert stream[0] == bos and np.sum(stream == bos) == len(texts)
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256(tok.to_str().encode()).hexdigest()
    assert manifest["tokenizer"]["vocab_size"] == 502


def test_eos_added_by_the_post_processor_not_doubled(tmp_path, tokenizer, corpus):
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_str(tokenizer.to_str())
    eos = tok.token_to_id(EOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", special_tokens=[(EOS, eos)]
    )
    out = tmp_path / "pack"
    pack_text(write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in corpus[:5]]), out,
              tokenizer=tok, progress=False)  # fmt: skip
    manifest, stream = read_pack(out)
    assert manifest["eos_id"] is None
    assert stream.tolist() == [i for t in corpus[:5] for i in tok.encode(t).ids]
    assert np.sum(stream == eos) == 5
    pack_text(tmp_path / "d.jsonl", tmp_path / "raw", tokenizer=tok, add_special_tokens=False,
              eos_id=eos, progress=False)  # fmt: skip
    _, raw = read_pack(tmp_path / "raw")
    assert raw.tolist() == stream.tolist()


def test_truncation_and_padding_not_applied(tmp_path, tokenizer, corpus):
    """A tokenizer.json saved with truncation and padding packs each document whole; the
    user's tokenizer keeps its settings; the hash is of the JSON as given."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.enable_truncation(8)
    tok.enable_padding(length=16)
    texts = corpus[:4]
    out = tmp_path / "pack"
    pack_text(write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in texts]), out,
              tokenizer=tok, progress=False)  # fmt: skip
    manifest, stream = read_pack(out)
    assert stream.tolist() == [i for d in expected(tokenizer, texts, 0) for i in d]
    assert tok.truncation["max_length"] == 8 and tok.padding["length"] == 16
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256(tok.to_str().encode()).hexdigest()


def test_dtype_from_the_vocabulary(tmp_path):
    """A vocabulary past 65,536 ids packs as uint32 (ids above 65,535 kept); uint16 asked of it
    is refused before anything is written."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70_000)}
    vocab["[UNK]"] = 70_000
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    texts = ["w1 w65535 w65536 w69999", "w0 nothing w42"]
    path = write_jsonl(tmp_path / "big.jsonl", [{"text": t} for t in texts])
    out = tmp_path / "pack"
    pack_text(path, out, tokenizer=tok, progress=False)
    manifest, stream = read_pack(out)
    assert manifest["dtype"] == "uint32" and manifest["eos_id"] is None
    assert stream.tolist() == [1, 65535, 65536, 69999, 0, 70_000, 42]
    assert manifest["tokenizer"]["vocab_size"] == 70_001
    with pytest.raises(stoker.InvalidArgumentError, match="uint16.*dtype='uint32'"):
        pack_text(path, tmp_path / "small", tokenizer=tok, dtype="uint16", progress=False)
    assert not (tmp_path / "small").exists()


def test_bad_jsonl_lines_named(tmp_path, tokenizer):
    lines = ['{"text": "fine"}', "", '{"text": "also fine"}', '{"text": "cut', '{"text": "x"}']
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(stoker.CorruptDataError, match=r"bad\.jsonl, line 4: not JSON") as e:
        pack_text(path, tmp_path / "pack", tokenizer=tokenizer, batch_size=1, progress=False)
    assert e.value.key == "line 4"
    assert not (tmp_path / "pack").exists() and not list(tmp_path.glob(".pack.partial-*"))

    path.write_text('{"text": "fine"}\n{"body": "no text", "id": 2}\n')
    fields = r"line 2: no field 'text' \(its fields: 'body', 'id'\)"
    with pytest.raises(stoker.InvalidArgumentError, match=fields):
        pack_text(path, tmp_path / "pack", tokenizer=tokenizer, progress=False)
    path.write_text('{"text": "fine"}\n{"text": ["a", "list"]}\n')
    with pytest.raises(stoker.InvalidArgumentError, match="line 2: 'text' holds a list, not text"):
        pack_text(path, tmp_path / "pack", tokenizer=tokenizer, progress=False)
    path.write_text("\n[1, 2]\n")
    with pytest.raises(stoker.CorruptDataError, match="line 2: a JSON list, not an object"):
        pack_text(path, tmp_path / "pack", tokenizer=tokenizer, progress=False)


def test_missing_column_and_bad_arguments(tmp_path, tokenizer):
    """Refused before a pack folder is made: a column Parquet or the Dataset does not have,
    a non-text column, a tokenizer that is not one, a source of another kind, no text at all."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"content": ["a b"], "n": [1]}), path)
    out = tmp_path / "pack"
    columns = r"t\.parquet: no column 'text' \(its columns: 'content', 'n'\)"
    with pytest.raises(stoker.InvalidArgumentError, match=columns):
        pack_text(path, out, tokenizer=tokenizer, progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="column 'n' holds int64, not text"):
        pack_text(path, out, tokenizer=tokenizer, column="n", progress=False)
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"content": ["a"]})
    with pytest.raises(stoker.InvalidArgumentError, match="no column 'text'.*'content'"):
        pack_text(ds, out, tokenizer=tokenizer, progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="holds several splits"):
        pack_text(datasets.DatasetDict({"train": ds}), out, tokenizer=tokenizer, progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="fast tokenizer"):
        pack_text(path, out, tokenizer=object(), column="content", progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="no such tokenizer.json"):
        pack_text(path, out, tokenizer=tmp_path, column="content", progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="not a dict"):
        pack_text({"text": "a"}, out, tokenizer=tokenizer, progress=False)
    (tmp_path / "notes.csv").write_text("a,b\n")
    with pytest.raises(stoker.InvalidArgumentError, match="reads .parquet"):
        pack_text(tmp_path / "notes.csv", out, tokenizer=tokenizer, progress=False)
    empty = write_jsonl(tmp_path / "empty.jsonl", [{"text": ""}, {"text": None}])
    with pytest.raises(stoker.InvalidArgumentError, match="no text in empty .2 documents read"):
        pack_text(empty, out, tokenizer=tokenizer, progress=False)
    assert not out.exists() and not list(tmp_path.glob(".pack.partial-*"))


@pytest.mark.sanitize  # the engine parses the manifest with its added key
def test_pack_reads_with_the_tokenizer_key(tmp_path, tokenizer, corpus):
    out = tmp_path / "pack"
    pack_text(list(map(str, [write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in corpus])])),
              out, tokenizer=tokenizer, shard_size="1KB", progress=False)  # fmt: skip
    info = stoker.inspect(out)
    manifest, stream = read_pack(out)
    assert info["format"] == "stoker-tokens" and info["num_tokens"] == len(stream)
    assert info["shards"] == len(manifest["shards"]) > 1
