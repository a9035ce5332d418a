"""stoker.Loader's typed fields against references written here: each sample's geometry drawn
here by torchvision's rules (RandomResizedCrop.get_params, RandomCrop's padded window, Resize +
CenterCrop, a letterbox) from the engine's keyed generator, KeyedRandom(seed, epoch, sample), and
checked against what the loader reports; images and masks against PIL applying that geometry,
boxes against numpy arithmetic on it; every geometry, 1 and N threads; resume, ranks, missing and
bad members, format-1 packs."""

from __future__ import annotations

import io
import json
import struct

import numpy as np
import pytest
import torch
from PIL import Image as PILImage

from test_reference_random_resized_crop import get_params, keyed

import stoker
from stoker import _core

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

N = 24
OUT_H, OUT_W = 40, 56  # not square


def _png(array: np.ndarray, mode: str | None = None) -> bytes:
    buf = io.BytesIO()
    im = PILImage.fromarray(array, mode) if mode else PILImage.fromarray(array)
    if mode == "P":
        im.putpalette([v for i in range(256) for v in (i, 255 - i, (7 * i) % 256)])
    im.save(buf, format="PNG")
    return buf.getvalue()


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _sample(i: int) -> dict:
    rng = np.random.default_rng(i)
    h, w = int(rng.integers(30, 90)), int(rng.integers(30, 90))
    yy, xx = np.mgrid[0:h, 0:w]
    rgb = np.stack([(xx * 5 + i) % 256, (yy * 7) % 256, (xx * yy) % 256], -1).astype(np.uint8)
    rgb = (rgb.astype(int) + rng.integers(0, 40, rgb.shape)).clip(0, 255).astype(np.uint8)
    mask = ((xx // 7 + yy // 5 + i) % 6).astype(np.uint8)  # class ids 0-5, a palette PNG
    n = int(rng.integers(0, 6))
    x0 = rng.uniform(-5, w - 2, n)
    y0 = rng.uniform(-5, h - 2, n)
    bw, bh = rng.uniform(1, w / 2, n), rng.uniform(1, h / 2, n)
    classes = rng.integers(0, 9, n)
    coco = [
        {"bbox": [float(a), float(b), float(c), float(d)], "category_id": int(k)}
        for a, b, c, d, k in zip(x0, y0, bw, bh, classes, strict=True)
    ]
    xyxy = np.stack([x0, y0, x0 + bw, y0 + bh, classes], -1).astype(np.float32).reshape(-1, 5)
    return {
        "png": _png(rgb),
        "seg.png": _png(mask, "P"),
        "json": json.dumps(coco).encode(),
        "boxes.npy": _npy(xyxy),
        "arr.npy": _npy(rng.normal(size=3).astype(np.float32)),
        "var.npy": _npy(rng.normal(size=(int(rng.integers(0, 5)), 2)).astype(np.float64)),
        "txt": f"caption {i} é".encode(),
        "cls": str(i % 4).encode(),
    }


def _write_pack(path, samples, version=2, drop=()):
    """A one-shard pack written with the engine's writer; `drop` = (index, member) to leave out."""
    path.mkdir()
    writer = _core.ShardWriter(str(path / "shard-000000.tar"), str(path / "shard-000000.idx"))
    for i, s in enumerate(samples):
        members = [(k, v) for k, v in s.items() if (i, k) not in drop]
        writer.add_sample(f"{i:08d}", members)
    writer.finish()
    fields = [
        {
            "name": "arr.npy",
            "kind": "array",
            "dtype": "float32",
            "min_shape": [3],
            "max_shape": [3],
            "count": len(samples),
        },
        {
            "name": "var.npy",
            "kind": "array",
            "dtype": "float64",
            "min_shape": [0, 2],
            "max_shape": [4, 2],
            "count": len(samples),
        },
    ]
    manifest = {
        "format": "stoker-pack",
        "version": version,
        "num_samples": len(samples),
        "classes": ["a", "b", "c", "d"],
        "shards": [
            {"tar": "shard-000000.tar", "index": "shard-000000.idx", "num_samples": len(samples)}
        ],
        "fields": fields,
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


@pytest.fixture(scope="module")
def samples():
    return [_sample(i) for i in range(N)]


@pytest.fixture(scope="module")
def pack(tmp_path_factory, samples):
    return _write_pack(tmp_path_factory.mktemp("fields") / "pack", samples)


def _fields(geometry, *, hflip=0.5, vflip=0.5, channels=3, fmt="xyxy", normalized=False):
    return {
        "image": stoker.Image(
            "png",
            size=(OUT_H, OUT_W),
            geometry=geometry,
            hflip=hflip,
            vflip=vflip,
            channels=channels,
            return_params=True,
            dct_scaling=False,
        ),
        "mask": stoker.Mask("seg.png", follow="image", fill=255),
        "boxes": stoker.Boxes(
            "json", follow="image", max_boxes=8, format=fmt, normalized=normalized, min_visible=0.3
        ),
        "npboxes": stoker.Boxes("boxes.npy", follow="image", max_boxes=8),
        "label": stoker.Label("cls"),
    }


def _collect(loader):
    out = []
    for batch in loader:
        out.append(batch)
    return out


# --- references ---------------------------------------------------------------------------------


def _reference_boxes(coco, params, min_visible, W, H, fmt="xyxy", normalized=False):
    box, rect = np.asarray(params["box"], np.float64), np.asarray(params["rect"], np.float64)
    sx = (rect[2] - rect[0]) / (box[2] - box[0])
    sy = (rect[3] - rect[1]) / (box[3] - box[1])
    out = []
    for a in coco:
        x, y, w, h = a["bbox"]
        m = np.array(
            [
                rect[0] + (x - box[0]) * sx,
                rect[1] + (y - box[1]) * sy,
                rect[0] + (x + w - box[0]) * sx,
                rect[1] + (y + h - box[1]) * sy,
            ]
        )
        area = (m[2] - m[0]) * (m[3] - m[1])
        c = np.array(
            [
                np.clip(m[0], rect[0], rect[2]),
                np.clip(m[1], rect[1], rect[3]),
                np.clip(m[2], rect[0], rect[2]),
                np.clip(m[3], rect[1], rect[3]),
            ]
        )
        visible = (c[2] - c[0]) * (c[3] - c[1])
        if not (c[2] > c[0] and c[3] > c[1] and area > 0) or visible < min_visible * area:
            continue
        if params["hflip"]:
            c = np.array([W - c[2], c[1], W - c[0], c[3]])
        if params["vflip"]:
            c = np.array([c[0], H - c[3], c[2], H - c[1]])
        if fmt == "xywh":
            c = np.array([c[0], c[1], c[2] - c[0], c[3] - c[1]])
        elif fmt == "cxcywh":
            c = np.array([(c[0] + c[2]) / 2, (c[1] + c[3]) / 2, c[2] - c[0], c[3] - c[1]])
        if normalized:
            c = c / np.array([W, H, W, H])
        out.append((c, a["category_id"]))
    return out


def _place(img: PILImage.Image, params, W, H, fill, resample, crop_first) -> np.ndarray:
    """PIL: the box resized onto the rect of a fill canvas, then the flips. `crop_first`: the
    box is cut out first (torchvision's crop-then-resize: the filter sees only its pixels)."""
    box = tuple(float(v) for v in params["box"])
    r = [int(v) for v in params["rect"]]
    canvas = PILImage.new(img.mode, (W, H), fill if img.mode in ("L", "P") else (fill,) * 3)
    if r[2] > r[0] and r[3] > r[1]:
        size = (r[2] - r[0], r[3] - r[1])
        if crop_first:
            part = img.crop(tuple(int(v) for v in box)).resize(size, resample)
        else:
            part = img.resize(size, resample, box=box)
        canvas.paste(part, (r[0], r[1]))
    if params["hflip"]:
        canvas = canvas.transpose(PILImage.Transpose.FLIP_LEFT_RIGHT)
    if params["vflip"]:
        canvas = canvas.transpose(PILImage.Transpose.FLIP_TOP_BOTTOM)
    return np.asarray(canvas)


def _drawn(geometry, width, height, index, *, seed, epoch=0, hflip=0.5, vflip=0.5) -> dict:
    """The sample's geometry drawn here, from KeyedRandom(seed, epoch, sample) (an image field's
    stream 0): the geometry's draws by torchvision's rules, then the horizontal flip's, then the
    vertical flip's. `box`: the source region; `rect`: where it lands in the output."""
    rng = _core.KeyedRandom(seed, epoch, index)
    box, rect, window = (0.0, 0.0, float(width), float(height)), (0, 0, OUT_W, OUT_H), None
    if isinstance(geometry, stoker.RandomResizedCrop):
        box = get_params(width, height, geometry.scale, geometry.ratio, *keyed(rng))
    elif isinstance(geometry, stoker.CenterCrop):
        # Resize(resize_size): the shorter side to it, the longer int(size * long / short);
        # CenterCrop: int(round((side - crop) / 2.0)); the crop's edges mapped back to the source.
        resize = geometry.resize_size or round(min(OUT_W, OUT_H) * 256 / 224)
        short, long = min(width, height), max(width, height)
        new_w, new_h = (resize, int(resize * long / short)) if width <= height else (
            int(resize * long / short), resize)  # fmt: skip
        top, left = int(round((new_h - OUT_H) / 2.0)), int(round((new_w - OUT_W) / 2.0))
        sx, sy = width / new_w, height / new_h
        box = (left * sx, top * sy, (left + OUT_W) * sx, (top + OUT_H) * sy)
    elif isinstance(geometry, stoker.Letterbox):
        s = min(OUT_W / width, OUT_H / height)
        w = min(max(int(np.floor(width * s + 0.5)), 1), OUT_W)
        h = min(max(int(np.floor(height * s + 0.5)), 1), OUT_H)
        x0, y0 = (OUT_W - w) // 2, (OUT_H - h) // 2
        rect = (x0, y0, x0 + w, y0 + h)
    elif isinstance(geometry, stoker.RandomCrop):
        # RandomCrop.get_params on the padded image: the top first, then the left; where the
        # padded image is narrower than the window, the window starts at its edge.
        pad = geometry.padding
        top = rng.below(max(0, height + 2 * pad - OUT_H) + 1)
        left = rng.below(max(0, width + 2 * pad - OUT_W) + 1)
        window = (top, left)
        x0, y0 = max(left - pad, 0), max(top - pad, 0)
        x1, y1 = min(left - pad + OUT_W, width), min(top - pad + OUT_H, height)
        box = (float(x0), float(y0), float(x1), float(y1))
        rect = (x0 - (left - pad), y0 - (top - pad), x1 - (left - pad), y1 - (top - pad))
    else:
        assert isinstance(geometry, stoker.Resize), geometry
    return {
        "box": np.array(box, np.float64),
        "rect": np.array(rect, np.int64),
        "hflip": rng.uniform(0.0, 1.0) < hflip,
        "vflip": rng.uniform(0.0, 1.0) < vflip,
        "window": window,
    }


def _assert_reported(reported, drawn):
    """The loader's own report of the geometry (return_params) is the one drawn here."""
    np.testing.assert_allclose(reported["box"].numpy(), drawn["box"], rtol=0, atol=1e-9)
    assert reported["rect"].tolist() == drawn["rect"].tolist()
    assert (bool(reported["hflip"]), bool(reported["vflip"])) == (drawn["hflip"], drawn["vflip"])


def _pad_crop(img: PILImage.Image, drawn, pad, fill) -> np.ndarray:
    """torchvision's RandomCrop(padding) on PIL: the image pasted on a canvas of `fill` grown by
    `pad` on every side (and to the window, where that is larger), the window cut out, then the
    flips."""
    top, left = drawn["window"]
    w, h = img.size
    size = (max(w + 2 * pad, left + OUT_W), max(h + 2 * pad, top + OUT_H))
    canvas = PILImage.new(img.mode, size, fill if img.mode in ("L", "P") else (fill,) * 3)
    canvas.paste(img, (pad, pad))
    out = canvas.crop((left, top, left + OUT_W, top + OUT_H))
    if drawn["hflip"]:
        out = out.transpose(PILImage.Transpose.FLIP_LEFT_RIGHT)
    if drawn["vflip"]:
        out = out.transpose(PILImage.Transpose.FLIP_TOP_BOTTOM)
    return np.asarray(out)


GEOMETRIES = [
    stoker.RandomResizedCrop(),
    stoker.CenterCrop(resize_size=64),
    stoker.Resize(),
    stoker.Letterbox(fill=114),
    stoker.RandomCrop(padding=12, fill=7),
]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: type(g).__name__)
@pytest.mark.parametrize("threads", [1, 3])
def test_every_field_follows_the_geometry(pack, samples, geometry, threads):
    if isinstance(geometry, stoker.CenterCrop):
        pytest.importorskip("PIL")
    loader = stoker.Loader(
        pack, batch_size=5, fields=_fields(geometry), threads=threads, return_index=True, seed=3
    )
    seen = 0
    for batch in loader:
        for j, i in enumerate(batch["index"].tolist()):
            s = samples[i]
            reported = {k: v[j] for k, v in batch["image_params"].items()}
            src = PILImage.open(io.BytesIO(s["png"])).convert("RGB")
            assert reported["source_size"].tolist() == list(src.size)
            p = _drawn(geometry, *src.size, i, seed=3)
            _assert_reported(reported, p)
            fill = getattr(geometry, "fill", 0)
            mask = PILImage.open(io.BytesIO(s["seg.png"]))
            if isinstance(geometry, stoker.RandomCrop):
                # Pixels and masks: torchvision's pad-and-cut on PIL, exactly.
                want = _pad_crop(src, p, geometry.padding, fill)
                want_mask = _pad_crop(mask, p, geometry.padding, 255)
            else:
                # Pixels: PIL's resize of the box (bilinear, antialiased; RandomResizedCrop cut
                # out first) placed and flipped, exactly. Masks: NEAREST of the same box.
                crop_first = isinstance(geometry, stoker.RandomResizedCrop)
                bilinear, nearest = PILImage.Resampling.BILINEAR, PILImage.Resampling.NEAREST
                want = _place(src, p, OUT_W, OUT_H, fill, bilinear, crop_first)
                want_mask = _place(mask, p, OUT_W, OUT_H, 255, nearest, False)
            got = batch["image"][j].permute(1, 2, 0).numpy()
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(batch["mask"][j].numpy(), want_mask)
            # Boxes: numpy on the same geometry, to 1e-4 px.
            coco = json.loads(s["json"])
            ref = _reference_boxes(coco, p, 0.3, OUT_W, OUT_H)
            b = batch["boxes"]
            assert b["count"][j].item() == len(ref)
            for k, (c, cls) in enumerate(ref):
                np.testing.assert_allclose(b["boxes"][j, k].numpy(), c, atol=1e-4)
                assert b["classes"][j, k].item() == cls
            assert (b["classes"][j, len(ref) :] == -1).all()
            # .npy boxes (xyxy, class column, min_visible 0).
            arr = np.load(io.BytesIO(s["boxes.npy"]))
            as_coco = [
                {"bbox": [r[0], r[1], r[2] - r[0], r[3] - r[1]], "category_id": int(r[4])}
                for r in arr.astype(np.float64)
            ]
            ref = _reference_boxes(as_coco, p, 0.0, OUT_W, OUT_H)
            nb = batch["npboxes"]
            assert nb["count"][j].item() == len(ref)
            for k, (c, cls) in enumerate(ref):
                np.testing.assert_allclose(nb["boxes"][j, k].numpy(), c, atol=1e-4)
                assert nb["classes"][j, k].item() == cls
            assert batch["label"][j].item() == i % 4
            seen += 1
    assert seen == N


@pytest.mark.parametrize("fmt", ["xywh", "cxcywh"])
def test_box_formats_and_normalised_output(pack, samples, fmt):
    loader = stoker.Loader(
        pack,
        batch_size=8,
        threads=2,
        return_index=True,
        fields=_fields(stoker.Letterbox(), fmt=fmt, normalized=True),
    )
    seen = boxes = 0
    for batch in loader:
        for j, i in enumerate(batch["index"].tolist()):
            size = PILImage.open(io.BytesIO(samples[i]["png"])).size
            p = _drawn(stoker.Letterbox(), *size, i, seed=0)
            _assert_reported({k: v[j] for k, v in batch["image_params"].items()}, p)
            ref = _reference_boxes(json.loads(samples[i]["json"]), p, 0.3, OUT_W, OUT_H, fmt, True)
            assert batch["boxes"]["count"][j].item() == len(ref)
            for k, (c, _) in enumerate(ref):
                np.testing.assert_allclose(batch["boxes"]["boxes"][j, k].numpy(), c, atol=1e-6)
            seen += 1
            boxes += len(ref)
    assert seen == N and boxes > N  # every sample, and boxes to compare


def test_grey_images_are_pils_luma_of_the_rgb_output(pack, samples):
    fields = _fields(stoker.Resize(), hflip=0.0, vflip=0.0, channels=1)
    loader = stoker.Loader(pack, batch_size=6, fields=fields, threads=2, return_index=True)
    seen = 0
    for batch in loader:
        assert batch["image"].shape[1:] == (1, OUT_H, OUT_W)
        for j, i in enumerate(batch["index"].tolist()):
            src = PILImage.open(io.BytesIO(samples[i]["png"])).convert("RGB")
            rgb = src.resize((OUT_W, OUT_H), PILImage.Resampling.BILINEAR)
            np.testing.assert_array_equal(
                batch["image"][j, 0].numpy(), np.asarray(rgb.convert("L"))
            )
            seen += 1
    assert seen == N


def test_labels_arrays_text_json_round_trip(pack, samples):
    loader = stoker.Loader(
        pack,
        batch_size=7,
        threads=2,
        return_index=True,
        shuffle=True,
        fields={
            "label": stoker.Label("cls"),
            "arr": stoker.Array("arr.npy"),  # shape and dtype from the manifest
            "var": stoker.Array("var.npy", dtype="float32"),  # variable first dimension
            "raw": stoker.Bytes("json"),
            "caption": stoker.Text("txt"),
            "ann": stoker.Json("json"),
        },
    )
    seen = set()
    for batch in loader:
        assert batch["arr"].dtype == torch.float32 and batch["arr"].shape[1:] == (3,)
        assert batch["var"]["values"].shape[1:] == (4, 2)
        for j, i in enumerate(batch["index"].tolist()):
            s = samples[i]
            seen.add(i)
            assert batch["label"][j].item() == i % 4
            np.testing.assert_array_equal(
                batch["arr"][j].numpy(), np.load(io.BytesIO(s["arr.npy"]))
            )
            var = np.load(io.BytesIO(s["var.npy"])).astype(np.float32)
            n = batch["var"]["length"][j].item()
            assert n == len(var)
            np.testing.assert_array_equal(batch["var"]["values"][j, :n].numpy(), var)
            assert (batch["var"]["values"][j, n:] == 0).all()
            assert batch["raw"][j] == s["json"]
            assert batch["caption"][j] == s["txt"].decode()
            assert batch["ann"][j] == json.loads(s["json"])
    assert seen == set(range(N))


def _flat(batches):
    """Every tensor of every batch, in order, for equality checks."""
    out = []
    for b in batches:
        for k in sorted(b):
            v = b[k]
            for t in v.values() if isinstance(v, dict) else [v]:
                out.append(t.clone() if isinstance(t, torch.Tensor) else t)
    return out


def _equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y)
        else:
            assert x == y


def test_same_batches_with_1_and_n_threads_and_exact_resume(pack):
    def make(threads):
        return stoker.Loader(
            pack, batch_size=5, fields=_fields(stoker.RandomResizedCrop()), threads=threads, seed=9
        )

    one = _flat(_collect(make(1)))
    _equal(one, _flat(_collect(make(3))))
    # Resume after two batches, in a fresh loader: exactly the remaining ones.
    a = make(2)
    it = iter(a)
    head = [next(it), next(it)]
    state = a.state_dict()
    b = make(2)
    b.load_state_dict(state)
    _equal(one, _flat(head) + _flat(_collect(b)))


def test_ranks_are_disjoint_and_complete(pack):
    seen = []
    for rank in range(3):
        loader = stoker.Loader(
            pack,
            batch_size=4,
            rank=rank,
            world_size=3,
            return_index=True,
            fields={"label": stoker.Label("cls")},
        )
        seen.append([i for b in loader for i in b["index"].tolist()])
    assert all(len(s) == N // 3 for s in seen)
    assert sorted(sum(seen, [])) == list(range(N))


def test_missing_members_follow_the_policy(tmp_path, samples):
    pack = _write_pack(tmp_path / "p", samples, drop={(3, "seg.png"), (10, "seg.png")})
    fields = _fields(stoker.Resize())
    with pytest.raises(stoker.CorruptDataError) as e:
        _collect(stoker.Loader(pack, batch_size=4, fields=fields, threads=2, shuffle=False))
    assert e.value.key == "00000003" and e.value.member == "seg.png"
    assert "no member 'seg.png'" in str(e.value)

    loader = stoker.Loader(
        pack, batch_size=4, fields=fields, threads=2, missing="skip", return_index=True
    )
    got = sorted(i for b in loader for i in b["index"].tolist())
    assert got == [i for i in range(N) if i not in (3, 10)]
    assert loader.stats()["missing"] == 2 and loader.stats()["skipped"] == 0

    optional = dict(fields, mask=stoker.Mask("seg.png", follow="image", fill=9, optional=True))
    loader = stoker.Loader(pack, batch_size=N, fields=optional, threads=2, shuffle=False)
    (batch,) = _collect(loader)
    assert (batch["mask"][3] == 9).all() and (batch["mask"][10] == 9).all()
    assert not (batch["mask"][4] == 9).all()


def test_a_bad_member_drops_its_whole_sample_or_is_named(tmp_path, samples):
    bad = [dict(s) for s in samples]
    bad[5]["json"] = b'[{"bbox": [1, 2, "x", 4]}]'
    bad[8]["arr.npy"] = bad[8]["arr.npy"][:-4]  # truncated
    pack = _write_pack(tmp_path / "p", bad)
    fields = {
        "image": stoker.Image("png", size=16),
        "boxes": stoker.Boxes("json", follow="image"),
        "arr": stoker.Array("arr.npy"),
    }
    with pytest.raises(stoker.CorruptDataError) as e:
        _collect(stoker.Loader(pack, batch_size=4, fields=fields, threads=2, shuffle=False))
    assert (e.value.shard, e.value.key, e.value.member) == ("shard-000000.tar", "00000005", "json")
    loader = stoker.Loader(
        pack, batch_size=4, fields=fields, threads=2, on_error="skip", return_index=True
    )
    got = sorted(i for b in loader for i in b["index"].tolist())
    assert got == [i for i in range(N) if i not in (5, 8)]
    skipped = {s["key"]: s for s in loader.stats()["skipped_samples"]}
    assert skipped["00000008"]["member"] == "arr.npy"
    assert skipped["00000005"]["error"] == "CorruptDataError"


def test_invalid_field_sets_are_refused(pack):
    with pytest.raises(stoker.InvalidArgumentError, match="not a field"):
        stoker.Loader(pack, batch_size=2, fields={"m": stoker.Mask(follow="image")})
    with pytest.raises(stoker.InvalidArgumentError, match="Image"):
        stoker.Loader(
            pack, batch_size=2, fields={"l": stoker.Label(), "m": stoker.Mask(follow="l")}
        )
    with pytest.raises(stoker.InvalidArgumentError, match="stoker field"):
        stoker.Loader(pack, batch_size=2, fields={"x": "jpg"})


def _v1_index(records, keys) -> bytes:
    """A version-1 index as docs/FORMAT.md specifies it (40-byte records)."""
    key_table = b"".join(keys)
    out = b"STKRIDX\0" + struct.pack("<IIQQ", 1, 1, len(records), len(key_table))
    at = 0
    for (offset, size, label, crc, fmt), key in zip(records, keys, strict=True):
        out += struct.pack("<QQqQIHBB", offset, size, label, at, crc, len(key), fmt, 0)
        at += len(key)
    out += key_table
    return out + struct.pack("<I", _core.crc32c(out))


def test_a_format_1_pack_still_loads(tmp_path, samples):
    v2 = _write_pack(tmp_path / "v2", samples)
    ds = _core.Dataset.open(str(v2))
    records, keys = [], []
    for i in range(len(ds)):
        r = ds.record(i)
        png = next(m for m in r["members"] if m["name"] == "png")
        records.append((png["offset"], png["size"], r["label"], png["crc32c"], 2))
        keys.append(r["key"].encode())
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "shard-000000.tar").write_bytes((v2 / "shard-000000.tar").read_bytes())
    (v1 / "shard-000000.idx").write_bytes(_v1_index(records, keys))
    manifest = json.loads((v2 / "manifest.json").read_text())
    manifest["version"] = 1
    del manifest["fields"]
    (v1 / "manifest.json").write_text(json.dumps(manifest))

    def run(path):
        loader = stoker.ImageLoader(path, batch_size=6, size=24, threads=2, verify_crc=True)
        return _flat({"i": i, "l": lab} for i, lab in loader)

    _equal(run(v2), run(v1))
    assert [r["name"] for r in _core.Dataset.open(str(v1)).record(0)["members"]] == ["png"]
