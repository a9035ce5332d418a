"""A loader's pass is a chain of stages with one contract (stoker.load.stages): every stage that
runs on the CPU is put in a chain by the option that asks for it, and passes the shared test
every stage passes: a pass read part way, its state taken, a new loader given that state reads
exactly the rest; stats() carries the stage's figures; close() ends it. Then each stage's own
piece: the layouts, a pass's close reaching the engine, the rows of a batch the device decode
rewrites."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import stoker
from stoker.device import gpu_decode
from stoker.load import layout as layouts
from stoker.load.stages import Mapped, Stage
from stoker.load.stages.augment import AugmentBatch
from stoker.load.stages.decode import DeviceDecodeQueue, HostDecodeNote
from stoker.load.stages.engine import EnginePass
from stoker.load.stages.feed import DeviceFeedStage
from stoker.load.stages.format import FormatBatch
from stoker.load.stages.map import MapSamples
from stoker.load.stages.record import RecordSteps
from stoker.load.stages.resident import ResidentGather
from stoker.load.stages.rows import keep_rows, replace_row, rows

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it


@pytest.fixture(scope="module")
def arrays(tmp_path_factory):
    rng = np.random.default_rng(2)
    out = tmp_path_factory.mktemp("stages") / "arrays"
    stoker.pack_arrays({"image": rng.integers(0, 256, (40, 16, 16, 3), dtype=np.uint8),
                        "label": np.arange(40) % 4}, out, progress=False)  # fmt: skip
    return out


def _map(sample):
    return {"image": 255 - sample["image"]}


# option -> (the stage it adds, the figure only it adds to stats(), how to build the loader)
CHAINS = {
    "engine": (EnginePass, "seconds.read", {}),
    "record": (RecordSteps, "record.steps", {"record": "{tmp}/steps.jsonl"}),
    "resident": (ResidentGather, "resident.bytes", {"resident": True, "device": "cpu"}),
    "decode": (DeviceDecodeQueue, "decode.device", {"decode": "gpu", "device": "cpu"}),
    "auto-without-gpu": (HostDecodeNote, "decode.note", {"decode": "auto"}),
    "map": (MapSamples, "seconds.map", {"map": _map, "map_threads": 2}),
    "augment": (AugmentBatch, "seconds.augment", {"augment": "flip"}),
    "feed": (DeviceFeedStage, "device.batches", {"device": "cpu", "dtype": torch.float32}),
}


def _loader(kind, source, tmp_path, **extra):
    import stoker.augment as A

    options = dict(CHAINS[kind][2])
    if "record" in options:
        options["record"] = options["record"].format(tmp=tmp_path)
    if options.get("augment") == "flip":
        options["augment"] = [A.RandomErasing(1.0)]
    decode = options.pop("decode", "host")
    member = "image" if kind == "resident" else "jpg;png"
    label = "label" if kind == "resident" else "cls"
    geometry = stoker.RandomCrop(16, padding=2) if kind == "resident" else None
    image = stoker.Image(member, size=16, decode=decode, geometry=geometry)
    fields = {"image": image, "label": stoker.Label(label)}
    return stoker.Loader(source, batch_size=4, fields=fields, seed=5, threads=2, **options,
                         **extra)  # fmt: skip


def _same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return torch.equal(a, b) if torch.is_tensor(a) else a == b


def _copy(batch):
    if isinstance(batch, dict):
        return {k: _copy(v) for k, v in batch.items()}
    return batch.clone() if torch.is_tensor(batch) else batch


@pytest.mark.parametrize("kind", sorted(CHAINS))
def test_every_stage_keeps_the_contract(kind, arrays, packed, tmp_path, monkeypatch):
    host_decoder = gpu_decode.DecoderFactory.reusing(gpu_decode.HostDecoder())
    monkeypatch.setattr(gpu_decode, "decoder_for", lambda device, batch_size=0: host_decoder)
    if kind == "resident":
        monkeypatch.setattr(stoker.Loader, "_resident_torch_on_cpu", True)
    source = arrays if kind == "resident" else packed
    stage_kind, figure, _ = CHAINS[kind]
    first = _loader(kind, source, tmp_path)
    assert isinstance(first._chain.find(stage_kind), stage_kind)  # the option's stage is there
    whole = [_copy(b) for b in _loader(kind, source, tmp_path)]
    it = iter(first)
    head = [_copy(next(it)) for _ in range(3)]
    assert all(_same(a, b) for a, b in zip(head, whole[:3], strict=True))
    state = first.state_dict()
    resumed = _loader(kind, source, tmp_path)
    resumed.load_state_dict(state)
    rest = [_copy(b) for b in resumed]
    assert len(rest) == len(whole) - 3 and all(
        _same(a, b) for a, b in zip(rest, whole[3:], strict=True)
    )
    # The stage's own figure: there with the stage, absent from a chain without it.
    key, sub = figure.split(".")
    assert sub in first.stats().get(key, {}), first.stats().get(key)
    if kind != "engine":
        plain = _loader("engine", source, tmp_path)
        assert sub not in plain.stats().get(key, {}), (figure, plain.stats().get(key))
        plain.close()
    first.close()
    with pytest.raises(stoker.InvalidArgumentError, match="closed"):
        iter(first)


def test_a_preset_is_options_and_a_layout_not_hooks(packed):
    """ImageLoader's chain is the Loader's with its layout: no stage of its own."""
    image = stoker.ImageLoader(packed, batch_size=4, size=16, seed=3, threads=2, return_index=True)
    fields = {"image": stoker.Image(size=16), "label": stoker.Label(optional=True)}
    loader = stoker.Loader(packed, batch_size=4, seed=3, threads=2, return_index=True,
                           fields=fields)  # fmt: skip
    assert type(image._chain.find(FormatBatch).layout) is layouts.ImageLabelLayout
    assert type(loader._chain.find(FormatBatch).layout) is layouts.DictLayout
    for (x, y, i), d in zip(image, loader, strict=True):
        assert torch.equal(x, d["image"]) and torch.equal(y, d["label"])
        assert torch.equal(i, d["index"])


def test_layouts_format_and_reach_the_images_for_augment():
    fields = {"image": torch.zeros(2, 3, 4, 4), "label": torch.tensor([1, 2])}
    idx = torch.tensor([7, 9])
    d = layouts.DictLayout(("image",), ("image", "label"))
    batch = d.format(dict(fields), idx, with_index=True)
    assert torch.equal(batch["index"], idx)
    seen = []

    def fn(images, labels, indices):
        seen.append(indices.tolist())
        return images + 1, labels * 10

    out = d.augment(batch, fn, keep_index=False)
    assert "index" not in out and out["image"].max() == 1 and out["label"].tolist() == [10, 20]
    il = layouts.ImageLabelLayout()
    assert len(il.format(dict(fields), idx, with_index=False)) == 2
    images, labels = il.augment(il.format(dict(fields), idx, True), fn, keep_index=False)
    assert labels.tolist() == [10, 20] and seen == [[7, 9], [7, 9]]
    assert (d.key("image"), il.key("image"), il.key("label")) == ("image", 0, 1)


def test_closing_a_pass_closes_its_source():
    closed = []

    class Source(Stage):
        def __iter__(self):
            def gen():
                try:
                    yield from range(10)
                finally:
                    closed.append(True)

            return gen()

    class Double(Stage):
        def apply(self, batch):
            return 2 * batch

    it = iter(Double(Double(Source())))
    assert [next(it), next(it)] == [0, 4]
    assert isinstance(it, Mapped)
    it.close()
    assert closed == [True]


def test_rows_of_a_batch_are_replaced_and_kept_in_every_field():
    batch = {"image": torch.arange(4 * 2).view(4, 2), "boxes": {"count": torch.arange(4)},
             "text": ["a", "b", "c", "d"]}  # fmt: skip
    one = {"image": torch.tensor([[50, 51]]), "boxes": {"count": torch.tensor([9])},
           "text": ["z"]}  # fmt: skip
    assert rows(batch) == 4
    replace_row(batch, one, 2)
    assert batch["image"][2].tolist() == [50, 51] and batch["boxes"]["count"][2] == 9
    kept = keep_rows(batch, [0, 2])
    assert kept["text"] == ["a", "z"] and kept["boxes"]["count"].tolist() == [0, 9]
    images = torch.zeros(3, 3, 2, 2).contiguous(memory_format=torch.channels_last)
    kept = keep_rows((images, torch.arange(3)), [1])
    assert kept[0].is_contiguous(memory_format=torch.channels_last) and kept[1].tolist() == [1]
