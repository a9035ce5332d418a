"""stoker.attach (issue 56, part 4): a column added to a pack without rewriting its shards, read
by a loader as if it were in them. Values from a mapping, a callable, a folder of KEY.npy and
KEY.pt files and a Parquet file read back exactly, by key, in any order and on any thread; the
shards are untouched; misuse (attaching twice, a key missing on either side, a sidecar made for
another pack, a name the samples have) is an error naming it; a pack at a URL has its sidecar
fetched through the same cache (a real nginx on loopback)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import stoker

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it


@pytest.fixture
def pack(packed, tmp_path) -> Path:
    """A copy of the session's pack of 36 images in several shards."""
    shutil.copytree(packed, tmp_path / "pack")
    return tmp_path / "pack"


def keys_of(pack: Path) -> list[str]:
    dataset = stoker.load.loader.open_dataset(pack)
    return [dataset.record(i)["key"] for i in range(len(dataset))]


def latent(key: str, shape=(4, 6, 5), dtype=np.float16) -> np.ndarray:
    """A value that only this key has."""
    seed = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16)
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def read_back(pack: Path, fields: dict, **kw) -> dict[str, dict[str, np.ndarray]]:
    """Every sample's fields by key, from a shuffled, threaded loader."""
    keys = keys_of(pack)
    ld = stoker.Loader(pack, batch_size=5, shuffle=True, seed=4, threads=2, return_index=True,
                       fields=fields, **kw)  # fmt: skip
    out: dict[str, dict[str, np.ndarray]] = {}
    for batch in ld:
        for row, i in enumerate(batch["index"].tolist()):
            got = {}
            for name in fields:
                value = batch[name]
                if isinstance(value, dict):  # a variable first dimension: values and length
                    value = value["values"][row, : int(value["length"][row])]
                else:
                    value = value[row]
                got[name] = value.numpy()
            out[keys[i]] = got
    assert len(out) == len(keys)
    return out


def test_a_mapping_reads_back_exactly_and_the_shards_are_untouched(pack):
    keys = keys_of(pack)
    before = {p.name: p.read_bytes() for p in pack.iterdir() if p.is_file()}
    result = stoker.attach(pack, "latents", {k: latent(k) for k in keys}, progress=False)
    assert result.samples == len(keys) and result.path == pack / "attached" / "latents"
    after = {p.name: p.read_bytes() for p in pack.iterdir() if p.is_file() and p.name in before}
    assert after == before  # the manifest, shards and indexes as they were
    # The shape and dtype come from the sidecar's schema, as a packed member's from the manifest.
    got = read_back(pack, {"latents": stoker.Array("latents"), "label": stoker.Label()})
    for k in keys:
        assert got[k]["latents"].dtype == np.float16
        np.testing.assert_array_equal(got[k]["latents"], latent(k))
    # A second column, of another dtype and a variable first dimension, beside the first.
    lengths = {k: 3 + len(k) % 5 for k in keys}
    text = {k: torch.from_numpy(latent(k, (lengths[k], 8), np.float32)) for k in keys}
    again = stoker.attach(pack, "text", text, progress=False)
    assert again.fingerprint != result.fingerprint
    assert stoker.load.loader.open_dataset(pack).attached == ["latents", "text"]
    got = read_back(pack, {"latents": stoker.Array("latents"),
                           "text": stoker.Array("text", max_length=8)})  # fmt: skip
    for k in keys:
        np.testing.assert_array_equal(got[k]["latents"], latent(k))
        np.testing.assert_array_equal(got[k]["text"], text[k].numpy())
    # The dataset lists them with the sample's members; read() reads one.
    dataset = stoker.load.loader.open_dataset(pack)
    assert dataset.attached == ["latents", "text"]
    names = [m["name"] for m in dataset.record(3)["members"]]
    assert names[-2:] == ["latents", "text"]
    data = dataset.read(3, "latents")
    np.testing.assert_array_equal(np.load(__import__("io").BytesIO(data)), latent(keys[3]))


def test_a_callable_a_folder_and_parquet(pack, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    keys = keys_of(pack)
    stoker.attach(pack, "a", lambda k: latent(k, (3,), np.int32), progress=False)
    folder = tmp_path / "values"
    for n, k in enumerate(keys):
        (folder / k).parent.mkdir(parents=True, exist_ok=True)
        if n % 2:
            np.save(folder / f"{k}.npy", latent(k, (2, 2), np.float32))
        else:
            torch.save(torch.from_numpy(latent(k, (2, 2), np.float32)), folder / f"{k}.pt")
    stoker.attach(pack, "b", folder, progress=False)
    table = pa.table({"id": keys, "emb": [latent(k, (6,), np.float64).tolist() for k in keys],
                      "note": ["x"] * len(keys)})  # fmt: skip
    pq.write_table(table, tmp_path / "emb.parquet")
    stoker.attach(pack, "c", tmp_path / "emb.parquet", key_column="id", value_column="emb",
                  progress=False)  # fmt: skip
    # Big-endian values are written little-endian, as the engine reads them.
    stoker.attach(pack, "d", {k: latent(k, (4,), np.float32).astype(">f4") for k in keys},
                  progress=False)  # fmt: skip
    got = read_back(pack, {n: stoker.Array(n) for n in "abcd"})
    for k in keys:
        np.testing.assert_array_equal(got[k]["d"], latent(k, (4,), np.float32))
    for k in keys:
        np.testing.assert_array_equal(got[k]["a"], latent(k, (3,), np.int32))
        np.testing.assert_array_equal(got[k]["b"], latent(k, (2, 2), np.float32))
        np.testing.assert_array_equal(got[k]["c"], latent(k, (6,), np.float64))


def test_misuse_is_an_error_naming_it(pack, tmp_path, packed):
    keys = keys_of(pack)
    values = {k: latent(k) for k in keys}
    stoker.attach(pack, "latents", values, progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="'latents' is attached already"):
        stoker.attach(pack, "latents", values, progress=False)
    replaced = stoker.attach(pack, "latents", {k: v * 2 for k, v in values.items()},
                             overwrite=True, progress=False)  # fmt: skip
    got = read_back(pack, {"latents": stoker.Array("latents")})
    np.testing.assert_array_equal(got[keys[0]]["latents"], values[keys[0]] * 2)
    assert replaced.samples == len(keys)
    short = dict(values)
    del short[keys[7]]
    with pytest.raises(stoker.InvalidArgumentError, match=f"1 of the pack's samples.*{keys[7]}"):
        stoker.attach(pack, "short", short, progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="'no-such-key'"):
        stoker.attach(pack, "extra", {**values, "no-such-key": values[keys[0]]}, progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="no value for the sample"):
        stoker.attach(pack, "partial", lambda k: values[k] if k != keys[2] else {}[k],
                      progress=False)  # fmt: skip
    with pytest.raises(stoker.InvalidArgumentError, match="member 'jpg' already"):
        stoker.attach(pack, "jpg", values, progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="name '../up' must be"):
        stoker.attach(pack, "../up", values, progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="local copy"):
        stoker.attach("http://127.0.0.1:9/pack", "x", values, progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="not a dtype stoker reads"):
        stoker.attach(pack, "words", {k: "text" for k in keys}, progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="complex64, not a dtype"):
        stoker.attach(pack, "waves", {k: np.ones(3, np.complex64) for k in keys}, progress=False)
    # A member some samples have (the PNGs, none a shard's first): the shard's index knows it.
    pngs = [i for i in range(len(keys)) if any(
        m["name"] == "png" for m in stoker.load.loader.open_dataset(pack).record(i)["members"])]
    assert pngs
    with pytest.raises(stoker.InvalidArgumentError, match="member 'png' already"):
        stoker.attach(pack, "png", values, progress=False)
    # An overwrite whose source fails leaves the column attached before as it was.
    with pytest.raises(stoker.InvalidArgumentError, match="no value"):
        stoker.attach(pack, "latents", lambda k: {}[k], overwrite=True, progress=False)
    got = read_back(pack, {"latents": stoker.Array("latents")})
    np.testing.assert_array_equal(got[keys[0]]["latents"], values[keys[0]] * 2)
    assert stoker.load.loader.open_dataset(pack).attached == ["latents"]
    assert not any(p.name.startswith(".") for p in (pack / "attached").iterdir())  # no leftovers

    # A sidecar made for another pack: the other pack's manifest differs; its loader says so.
    other = tmp_path / "other"
    shutil.copytree(packed, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["note"] = "another pack"
    (other / "manifest.json").write_text(json.dumps(manifest))
    shutil.copytree(pack / "attached", other / "attached")
    shutil.copy(pack / "attached.json", other / "attached.json")
    with pytest.raises(stoker.InvalidArgumentError, match="sidecar 'latents' was made for another"):
        stoker.Loader(other, batch_size=4, fields={"latents": stoker.Array("latents")})
    # A sidecar whose samples are not the pack's (its index for another shard): named.
    listed = json.loads((pack / "attached.json").read_text())
    shards = listed["sidecars"][0]["shards"]
    shards[0], shards[1] = shards[1], shards[0]
    (pack / "attached.json").write_text(json.dumps(listed))
    with pytest.raises(stoker.StokerError,
                       match="shard-000001.idx: corrupt data: 8 samples, its pack shard 4"):
        stoker.Loader(pack, batch_size=4, fields={"latents": stoker.Array("latents")})


@pytest.mark.skipif(sys.platform != "linux", reason="nginx on loopback")
def test_a_pack_at_a_url_has_its_sidecar_fetched_through_the_cache(pack, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from servers.nginx import NGINX, Nginx

    if not os.path.exists(NGINX):
        pytest.skip("nginx is not installed")
    keys = keys_of(pack)
    stoker.attach(pack, "latents", {k: latent(k) for k in keys}, progress=False)
    www = tmp_path / "www"
    shutil.copytree(pack, www / "pack")
    with Nginx(www, tmp_path / "nginx") as server:

        def check(scale: float) -> None:
            ld = stoker.Loader(f"{server.url}/pack", batch_size=6, shuffle=True, seed=1,
                               cache_dir=tmp_path / "cache", return_index=True,
                               fields={"latents": stoker.Array("latents")})  # fmt: skip
            seen = 0
            for batch in ld:
                for row, i in enumerate(batch["index"].tolist()):
                    want = (latent(keys[i]) * scale).astype(np.float16)
                    np.testing.assert_array_equal(batch["latents"][row].numpy(), want)
                    seen += 1
            ld.close()  # before the server stops: its fetcher would go on to the next epoch's
            assert seen == len(keys)

        check(1)
        cached = sorted(p.name for p in (tmp_path / "cache").rglob("attached~*"))
        assert cached and all(p.endswith(".tar") for p in cached)
        # Attached anew at the source: the same cache folder reads the new values.
        stoker.attach(www / "pack", "latents", {k: latent(k) * 3 for k in keys}, overwrite=True,
                      progress=False)  # fmt: skip
        check(3)
        # A loader that reads only the images fetches none of the sidecar's data.
        ld = stoker.Loader(f"{server.url}/pack", batch_size=6, cache_dir=tmp_path / "jpg",
                           fields={"image": stoker.Image(size=32)})  # fmt: skip
        assert sum(len(b["image"]) for b in ld) == len(keys)
        ld.close()
        assert not list((tmp_path / "jpg").rglob("attached~*"))
