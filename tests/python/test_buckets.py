"""Aspect-ratio buckets and group_by on real photos of varied aspect (imagenet-sample and the
decodable photos of jpeg-variety): every batch has one shape, from the bucket set; each image
is in the bucket nearest its aspect; resume mid-epoch equals the uninterrupted run; 2 and 4
ranks get equal batch counts, and with same_shape_across_ranks the same shape at every step;
leftovers never mix shapes; replay, record and show work on bucketed batches; masks and boxes
follow each image's crop; group_by groups any field (token sequences by length)."""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image as PIL

import stoker
from conftest import shared_data

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

BUCKETS = stoker.AspectBuckets(area=128 * 128, step=16, max_ratio=2.5)


def photos(root: Path) -> Path:
    """60 of imagenet-sample and the decodable 8-bit photos of jpeg-variety (48 px to 1.5
    megapixels), one class folder: about 200 photos, a quarter of them portrait."""
    data = shared_data()
    src = root / "src" / "photos"
    src.mkdir(parents=True)
    for p in sorted((data / "imagenet-sample").iterdir())[:60]:
        shutil.copy(p, src / p.name)
    for line in (data / "MANIFEST.tsv").read_text().splitlines()[1:]:
        f = line.split("\t")
        if not f[0].startswith("jpeg-variety/") or f[2] not in ("baseline", "progressive-huff"):
            continue
        w, h = (int(v) for v in f[4].split("x"))
        if f[3] == "8" and f[11] == "0" and min(w, h) >= 48 and w * h <= 1_500_000:
            shutil.copy(data / f[0], src / f[0].replace("/", "_").replace(".jpeg", ".jpg"))
    pack = root / "pack"
    stoker.pack(root / "src", pack, shard_size="4MB", progress=False)
    return pack


@pytest.fixture(scope="module")
def pack(tmp_path_factory) -> Path:
    return photos(tmp_path_factory.mktemp("buckets"))


def nearest(height: int, width: int, sizes: list[tuple[int, int]]) -> set[tuple[int, int]]:
    """The buckets nearest an image's aspect in log ratio (all of them, if tied)."""
    d = [abs(math.log(width / height) - math.log(w / h)) for h, w in sizes]
    return {s for s, x in zip(sizes, d, strict=True) if x - min(d) < 1e-12}


def run(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images.clone(), index.clone()) for images, _, index in loader]


def loader(pack: Path, **kwargs) -> stoker.ImageLoader:
    options = dict(batch_size=6, buckets=BUCKETS, threads=2, seed=11, return_index=True)
    return stoker.ImageLoader(pack, **{**options, **kwargs})


def test_index_records_each_images_size_and_older_packs_read_theirs_once(pack, tmp_path):
    ds = stoker.load.loader.open_dataset(pack)
    sizes, source = ds.image_sizes(0, ["jpg"])
    assert source == "index"
    for i in range(0, len(sizes), 7):
        with PIL.open(__import__("io").BytesIO(ds.read(i))) as im:
            assert (sizes[i][1], sizes[i][0]) == im.size
    # The pack as an older stoker wrote it: version 2 indexes (no sizes table).
    old = tmp_path / "old"
    shutil.copytree(pack, old)
    for idx in old.glob("*.idx"):
        data = idx.read_bytes()
        members = struct.unpack_from("<Q", data, 24)[0]
        v2 = bytearray(data[: len(data) - 4 - 8 * members])
        v2[8:12] = struct.pack("<I", 2)
        idx.write_bytes(bytes(v2) + struct.pack("<I", stoker._core.crc32c(bytes(v2))))
    old_ds = stoker.load.loader.open_dataset(old)
    again, source = old_ds.image_sizes(0, ["jpg"])
    assert source == "headers" and (again == sizes).all()
    assert old_ds.image_sizes(0, ["jpg"])[1] == "sizes file"
    # Its loader buckets exactly as the new pack's does.
    assert [x.shape for x, _ in run(loader(old))] == [x.shape for x, _ in run(loader(pack))]


def test_every_batch_is_one_bucket_nearest_each_images_aspect(pack):
    ld = loader(pack)
    ds = ld.dataset
    batches = run(ld)
    seen: set[int] = set()
    shapes = set()
    for images, index in batches:
        b, c, h, w = images.shape
        assert c == 3 and (h, w) in BUCKETS.sizes
        shapes.add((h, w))
        assert b == 6  # training: full batches; leftovers carried
        for i in index.tolist():
            record = ds.record(i)
            member = next(m for m in record["members"] if m["name"] == "jpg")
            assert (h, w) in nearest(member["height"], member["width"], BUCKETS.sizes), record
            seen.add(i)
    assert len(shapes) >= 4, shapes  # real photos: portrait, square and landscape buckets
    carried = ld.stats()["leftovers"]["carried"]
    assert len(seen) + carried == len(ds) and carried < 6 * len(BUCKETS.sizes)


def test_resume_mid_epoch_equals_the_uninterrupted_run(pack):
    whole = loader(pack)
    whole.set_epoch(1)  # an epoch that starts with the samples epoch 0 carried
    expected = run(whole)
    first = loader(pack)
    first.set_epoch(1)
    it = iter(first)
    head = [(x.clone(), i.clone()) for x, _, i in (next(it) for _ in range(7))]
    state = first.state_dict()
    assert state["batches_done"] == 7 and "grouping" in state
    second = loader(pack, threads=1)
    second.load_state_dict(state)
    rest = run(second)
    got = head + rest
    assert len(got) == len(expected)
    for (x, i), (ex, ei) in zip(got, expected, strict=True):
        assert torch.equal(i, ei) and torch.equal(x, ex)
    # A state taken with other buckets is refused, not misread.
    other = loader(pack, buckets=stoker.AspectBuckets(area=96 * 96, step=32, max_ratio=2.5))
    with pytest.raises(stoker.InvalidArgumentError, match="grouping"):
        other.load_state_dict(state)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("same_shape", [False, True])
def test_ranks_get_equal_counts_and_same_shape_at_every_step(pack, world, same_shape):
    ranks = [run(loader(pack, rank=r, world_size=world, same_shape_across_ranks=same_shape))
             for r in range(world)]  # fmt: skip
    counts = {len(r) for r in ranks}
    assert len(counts) == 1 and counts.pop() > 0
    if same_shape:
        for step in zip(*ranks, strict=True):
            assert len({tuple(x.shape) for x, _ in step}) == 1
    indices = [int(i) for r in ranks for _, idx in r for i in idx]
    assert len(indices) == len(set(indices))  # no sample on two ranks


def test_leftovers_dropped_or_partial_never_mix_shapes(pack):
    n = len(stoker.load.loader.open_dataset(pack))
    drop = loader(pack, leftovers="drop")
    seen = sum(len(i) for _, i in run(drop))
    assert seen + drop.stats()["leftovers"]["dropped"] == n
    evaluation = loader(pack, train=False)  # evaluation's default: "partial", centred crops
    batches = run(evaluation)
    assert sorted(int(i) for _, idx in batches for i in idx) == list(range(n))
    assert any(len(i) < 6 for _, i in batches)  # the buckets' last, smaller batches
    for x, _ in batches:
        assert tuple(x.shape[2:]) in BUCKETS.sizes
    assert evaluation.stats()["leftovers"] == {"carried": 0, "dropped": 0, "padded": 0}
    # Centred: the same bytes every epoch.
    again = run(evaluation)
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(batches, again, strict=True))


def test_batch_size_from_a_pixel_budget(pack):
    budget = stoker.AspectBuckets(area=128 * 128, step=16, max_ratio=2.5, batch_pixels=8 * 128**2)
    ld = loader(pack, buckets=budget)
    assert [g["batch_size"] for g in ld.groups] == [8 * 128**2 // (h * w) for h, w in budget.sizes]
    for x, _ in run(ld):
        assert x.shape[0] == 8 * 128**2 // (x.shape[2] * x.shape[3])


def dct_scale(height: int, width: int, size: tuple[int, int]) -> int:
    """The DCT scale denominator a photo decodes at for its bucket: the largest of 1, 2, 4, 8
    at which the covering crop keeps at least the bucket's pixels (CoverCrop's box is the bucket
    scaled by the photo's side over its covering side, rounded)."""
    bh, bw = size
    scale = max(bw / width, bh / height)
    new_w, new_h = max(bw, round(width * scale)), max(bh, round(height * scale))
    denom = 1
    while denom < 8 and width >= 2 * denom * new_w and height >= 2 * denom * new_h:
        denom *= 2
    return denom


def test_decoding_uses_the_dct_scale_of_its_bucket(pack):
    """Photos of 2x a bucket or more decode at 1/2 (or less): other bytes than a full decode,
    within its 40-45 dB; stats()["dct_scales"] counts each image at the scale of its bucket."""
    ld = loader(pack, train=False)
    scaled = run(ld)
    ds = stoker.load.loader.open_dataset(pack)
    hw = np.concatenate([ds.image_sizes(s, ["jpg"])[0] for s in range(ds.num_shards)])
    expected = {1: 0, 2: 0, 4: 0, 8: 0}
    for images, index in scaled:
        for i in index.tolist():
            expected[dct_scale(int(hw[i][0]), int(hw[i][1]), tuple(images.shape[2:]))] += 1
    assert ld.stats()["dct_scales"] == expected and expected[2] + expected[4] > 0
    unscaled = loader(pack, train=False, dct_scaling=False)
    full = run(unscaled)
    assert unscaled.stats()["dct_scales"] == {1: sum(expected.values()), 2: 0, 4: 0, 8: 0}
    differ = sum(not torch.equal(a, b) for (a, _), (b, _) in zip(scaled, full, strict=True))
    assert differ > len(scaled) // 2
    a = torch.cat([x.flatten() for x, _ in scaled]).float()
    b = torch.cat([x.flatten() for x, _ in full]).float()
    assert 10 * math.log10(255**2 / float(((a - b) ** 2).mean())) > 30


def test_replay_record_and_show_work_on_bucketed_batches(pack, tmp_path):
    ld = loader(pack, record=tmp_path / "steps.jsonl")
    batches = run(ld)
    lines = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [line["index"] for line in lines] == [i.tolist() for _, i in batches]
    for step in (0, 5, len(batches) - 1):
        images, _, index = ld.batch_at(0, step)
        assert torch.equal(index, batches[step][1]) and torch.equal(images, batches[step][0])
        assert [s["index"] for s in ld.sample_ids(0, step, rank=0)] == batches[step][1].tolist()
    with pytest.raises(stoker.StepOutOfRangeError):
        ld.batch_at(0, len(batches))
    page = stoker.show(ld, 0, 3, tmp_path / "show.html")
    assert page.read_text().count("<img") == len(batches[3][1])


def test_masks_and_boxes_follow_each_images_bucket_crop(tmp_path):
    """A white rectangle on each image, the same rectangle as its mask and its box: after the
    crop into the bucket they still coincide."""
    rng = np.random.default_rng(4)
    rows = []
    for k in range(24):
        w, h = int(rng.integers(120, 400)), int(rng.integers(120, 400))
        x0, y0 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
        x1, y1 = x0 + w // 3, y0 + h // 3
        pixels = np.zeros((h, w, 3), np.uint8)
        pixels[y0:y1, x0:x1] = 255
        mask = np.zeros((h, w), np.uint8)
        mask[y0:y1, x0:x1] = 1
        PIL.fromarray(pixels).save(tmp_path / f"{k}.png")
        PIL.fromarray(mask).save(tmp_path / f"{k}.seg.png")
        boxes = [{"bbox": [x0, y0, x1 - x0, y1 - y0], "category_id": 1}]
        rows.append({"jpg": str(tmp_path / f"{k}.png"), "seg.png": str(tmp_path / f"{k}.seg.png"),
                     "json": boxes})  # fmt: skip
    table = tmp_path / "table.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stoker.pack(table, tmp_path / "pack", progress=False)
    ld = stoker.Loader(tmp_path / "pack", batch_size=3, buckets=BUCKETS, seed=2, threads=2,
                       leftovers="partial", fields={
        "image": stoker.Image("jpg", hflip=0.5),
        "mask": stoker.Mask("seg.png", follow="image"),
        "boxes": stoker.Boxes("json", follow="image"),
    })  # fmt: skip
    checked = 0
    for batch in ld:
        image, mask, boxes = batch["image"], batch["mask"], batch["boxes"]
        assert mask.shape == (image.shape[0], *image.shape[2:])
        for b in range(image.shape[0]):
            white = image[b, 0] > 127
            ys, xs = torch.nonzero(mask[b], as_tuple=True)
            if len(xs) == 0:
                continue
            assert (white == (mask[b] > 0)).float().mean() > 0.98
            x0, y0, x1, y1 = boxes["boxes"][b, 0].tolist()
            assert abs(x0 - int(xs.min())) <= 1.5 and abs(x1 - int(xs.max()) - 1) <= 1.5
            assert abs(y0 - int(ys.min())) <= 1.5 and abs(y1 - int(ys.max()) - 1) <= 1.5
            checked += 1
    assert checked >= 20


def test_group_by_groups_token_sequences_by_length(tmp_path):
    """Sequences of 5 to 120 tokens in .npy members, grouped in bands of 32 with a batch size
    per band (Energon's criterion): every batch's lengths in one band."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 121, size=90)
    rows = [{"tokens.npy": rng.integers(0, 50000, size=int(n)).astype(np.int32), "cls": 0}
            for n in lengths]  # fmt: skip
    stoker.pack(rows, tmp_path / "pack", progress=False)

    def band(entry):
        band = entry.length("tokens.npy") // 32
        return band, {0: 8, 1: 6, 2: 4, 3: 3}[band]

    ld = stoker.Loader(tmp_path / "pack", batch_size=4, group_by=band, threads=2, seed=1,
                       leftovers="partial", return_index=True, fields={
        "tokens": stoker.Array("tokens.npy", shape=(-1,), dtype="int64", max_length=128),
    })  # fmt: skip
    assert {g["key"]: g["batch_size"] for g in ld.groups} == {0: 8, 1: 6, 2: 4, 3: 3}
    seen = []
    for batch in ld:
        length = batch["tokens"]["length"]
        assert len(set((length // 32).tolist())) == 1
        assert len(length) <= {0: 8, 1: 6, 2: 4, 3: 3}[int(length[0]) // 32]
        seen += batch["index"].tolist()
    assert sorted(seen) == list(range(90))
    with pytest.raises(stoker.InvalidArgumentError, match="one batch size per key"):
        stoker.Loader(tmp_path / "pack", batch_size=4, fields={"t": stoker.Bytes("tokens.npy")},
                      group_by=lambda e: ("all", 2 + e.index % 2))  # fmt: skip
    with pytest.raises(stoker.InvalidArgumentError, match="hashable"):
        stoker.Loader(tmp_path / "pack", batch_size=4, fields={"t": stoker.Bytes("tokens.npy")},
                      group_by=lambda e: [e.index])  # fmt: skip


def test_bucket_options_are_checked_once_with_clear_errors(pack):
    with pytest.raises(stoker.InvalidArgumentError, match="area= .* or sizes="):
        stoker.AspectBuckets()
    with pytest.raises(stoker.InvalidArgumentError, match="max_ratio"):
        stoker.AspectBuckets(area=128 * 128, step=32, max_ratio=0.5)
    with pytest.raises(stoker.InvalidArgumentError, match="no bucket"):
        stoker.AspectBuckets(area=100 * 100, step=64, max_ratio=1.5)
    with pytest.raises(stoker.InvalidArgumentError, match="drop_last"):
        loader(pack, drop_last=True)
    with pytest.raises(stoker.InvalidArgumentError, match="go with buckets"):
        stoker.ImageLoader(pack, batch_size=4, same_shape_across_ranks=True)
    with pytest.raises(stoker.InvalidArgumentError, match="leave its geometry out"):
        stoker.Loader(pack, batch_size=4, buckets=BUCKETS,
                      fields={"image": stoker.Image(geometry=stoker.Letterbox())})  # fmt: skip
    assert BUCKETS.sizes == sorted(BUCKETS.sizes, key=lambda s: s[1] / s[0])
    assert all(h * w <= 128 * 128 and h % 16 == 0 and w % 16 == 0 for h, w in BUCKETS.sizes)
    # A mid-epoch state resumes at its own world size only.
    two = loader(pack, rank=0, world_size=2)
    it = iter(two)
    next(it)
    state = two.state_dict()
    with pytest.raises(stoker.InvalidArgumentError, match="world_size"):
        loader(pack, rank=0, world_size=4).load_state_dict(state)


def test_inspect_shows_the_aspect_distribution(pack, tmp_path, capsys):
    info = stoker.inspect(pack)
    aspects = info["aspects"]
    n = len(stoker.load.loader.open_dataset(pack))
    assert aspects["images"] == n and sum(aspects["counts"]) == n
    assert aspects["portrait"] + aspects["square"] + aspects["landscape"] == n
    from stoker.tools.cli import main

    assert main(["inspect", str(pack), "--html", str(tmp_path / "page.html")]) == 0
    out = capsys.readouterr().out
    assert "aspects" in out and "landscape" in out and "#" in out
    assert "data:image/png;base64," in (tmp_path / "page.html").read_text()


def test_the_device_feed_takes_every_buckets_shape_in_slots_pinned_once(pack, monkeypatch):
    """On a GPU (the CUDA stand-in of the feed's tests): every bucket's batch arrives in its
    shape from the same few page-locked slots (each locked once, the largest bucket's size),
    with no staging copy, equal to the host's batches."""
    from cuda_standin import StandInCuda

    cuda = StandInCuda(devices=2).install(monkeypatch)
    expected = run(loader(pack, leftovers="partial"))
    ld = loader(pack, leftovers="partial", device="cuda:1", dtype=torch.float32)
    got = []
    for images, _, index in ld:
        cuda.current_stream(1).enqueue("step")
        got.append((images, index))
    assert len(got) == len(expected) and len({tuple(x.shape[2:]) for x, _ in got}) >= 4
    for (images, index), (h_images, h_index) in zip(got, expected, strict=True):
        assert torch.equal(index, h_index) and torch.equal(images, h_images.float() / 255)
    stats = ld.stats()["device"]
    registered = len(cuda.calls("cudaHostRegister"))
    assert registered == stats["pinned_slots"] <= 8 < len(got)  # each slot locked once
    assert stats["staged_bytes"] == 0 and stats["staging_buffers"] == 0
    assert cuda.corrupted == 0
    ld.close()


def test_remote_workers_make_the_loaders_own_bucketed_batches(pack):
    """remote_workers= (as threads here): the workers make each step's bucketed batch, bit for
    bit the loader's own, over two epochs (the second opens with the first's leftovers)."""
    from stoker.load.workers.local import ThreadWorkers

    plain = loader(pack)
    spec = ThreadWorkers(2, threads=1, name="remote", batches_in_flight=4)
    with loader(pack, threads=0, remote_workers=spec) as rw:
        for epoch in (0, 1):
            plain.set_epoch(epoch)
            rw.set_epoch(epoch)
            want, got = run(plain), run(rw)
            assert len(got) == len(want)
            for (x, i), (wx, wi) in zip(got, want, strict=True):
                assert torch.equal(i, wi) and torch.equal(x, wx)
