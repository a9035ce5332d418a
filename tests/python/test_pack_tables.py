"""stoker.pack from tables (CSV, JSON Lines) and COCO instances: every member round-trips byte for
byte, the manifest's schema says what was packed, COCO masks and boxes equal ones computed here
by other means."""

import csv
import io
import json
import shutil

import numpy as np
import pytest
from conftest import shared_data
from PIL import Image, ImageDraw

import stoker
from stoker import _core
from stoker.packing.coco import rle_counts_from_string

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it


def save_image(path, w, h, seed=0, mode="RGB", **kw):
    rng = np.random.default_rng(seed)
    shape = (h, w, 3) if mode == "RGB" else (h, w)
    Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8)).save(path, **kw)
    return path


def save_mask(path, w, h, seed=0, classes=4):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, classes, size=(h, w), dtype=np.uint8)).save(path)
    return path


def manifest(out):
    return json.loads((out / "manifest.json").read_text())


def fields(out):
    return {f["name"]: f for f in manifest(out)["fields"]}


def test_csv_table_members_round_trip(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    photo = sorted((shared_data() / "imagenet-sample").glob("*.JPEG"))[0]
    shutil.copy(photo, data / "real.jpg")
    rows = []
    sizes = [(40, 30), (64, 48), (33, 57)]
    for i, (w, h) in enumerate(sizes):
        mode = "L" if i == 1 else "RGB"
        save_image(data / f"{i}.jpg", w, h, seed=i, mode=mode, quality=85)
        save_mask(data / f"{i}.seg.png", w, h, seed=i)
        np.save(data / f"{i}.boxes.npy", np.arange(4 * (i + 1), dtype=np.float32).reshape(-1, 4))
        rows.append(
            {
                "key": f"src-{i}",
                "jpg": f"{i}.jpg",
                "seg.png": f"{i}.seg.png",
                "boxes.npy": f"{i}.boxes.npy",
                "cls": str(i % 2),
                "json": json.dumps({"id": i, "tags": ["a", "b"][: i + 1]}),
                "txt": f"caption, number {i} \u00e9" if i != 2 else "",
            }
        )
    rows.append({**rows[0], "key": "src-3", "jpg": "real.jpg", "cls": "5"})
    with open(data / "table.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)

    out = tmp_path / "out"
    result = stoker.pack(data / "table.csv", out, restart_interval=None, progress=False)
    assert result.num_samples == 4 and not result.failed
    m = manifest(out)
    assert m["version"] == 2 and m["source_format"] == "table"
    assert m["classes"] == [str(i) for i in range(6)]
    assert m["class_counts"] == [2, 1, 0, 0, 0, 1]
    ds = _core.Dataset.open(str(out))
    for i, row in enumerate(rows):
        rec = ds.record(i)
        assert rec["label"] == int(row["cls"])
        for name in ("jpg", "seg.png", "boxes.npy"):
            assert ds.read(i, name) == (data / row[name]).read_bytes()
        assert ds.read(i, "json") == row["json"].encode()
        assert ds.read(i, "cls") == row["cls"].encode()
        assert ds.read(i) == ds.read(i, "jpg")  # the image, by default
        names = [mem["name"] for mem in rec["members"]]
        if row["txt"]:
            assert ds.read(i, "txt") == row["txt"].encode()
            assert names == ["jpg", "seg.png", "boxes.npy", "json", "txt", "cls"]
        else:  # an empty cell: a member the sample does not have
            assert names == ["jpg", "seg.png", "boxes.npy", "json", "cls"]
            with pytest.raises(stoker.InvalidArgumentError, match="no member 'txt'"):
                ds.read(i, "txt")
    sources = [line.split("\t") for line in (out / "sources.tsv").read_text().splitlines()]
    assert [s[3] for s in sources] == ["src-0", "src-1", "src-2", "src-3"]
    assert sources[1][2] == str(data / "1.jpg")

    real = Image.open(photo)
    f = fields(out)
    assert list(f) == ["jpg", "seg.png", "boxes.npy", "json", "txt", "cls"]
    assert f["jpg"] == {
        "name": "jpg",
        "kind": "image",
        "dtype": "uint8",
        "min_shape": [30, 33, 1],
        "max_shape": [max(57, real.height), max(64, real.width), 3],
        "count": 4,
    }
    assert f["seg.png"]["kind"] == "mask" and f["seg.png"]["dtype"] == "uint8"
    assert f["seg.png"]["min_shape"] == [30, 33] and f["seg.png"]["max_shape"] == [57, 64]
    assert f["boxes.npy"]["kind"] == "boxes" and f["boxes.npy"]["dtype"] == "float32"
    assert f["boxes.npy"]["min_shape"] == [1, 4] and f["boxes.npy"]["max_shape"] == [3, 4]
    assert f["json"] == {
        "name": "json",
        "kind": "json",
        "dtype": None,
        "min_shape": None,
        "max_shape": None,
        "count": 4,
    }
    assert f["txt"]["kind"] == "text" and f["txt"]["count"] == 3
    assert f["cls"] == {
        "name": "cls",
        "kind": "label",
        "dtype": "int64",
        "min_shape": [],
        "max_shape": [],
        "count": 4,
    }
    assert stoker.inspect(out)["fields"] == m["fields"]


def test_jsonl_table_values_and_class_names(tmp_path):
    (tmp_path / "img").mkdir()
    rows = []
    for i in range(5):
        save_image(tmp_path / "img" / f"{i}.png", 20 + i, 10 + 2 * i, seed=i)
        arr = np.full((i + 1,) * (1 + i % 2), i, dtype=np.int16)  # rank 1 or 2
        np.save(tmp_path / "img" / f"{i}.npy", arr)
        rows.append(
            {
                "__key__": i * 10,
                "png": f"img/{i}.png",
                "emb.npy": f"img/{i}.npy",
                "json": [{"bbox": [i, 2, 3.5, 4], "category_id": i}] if i != 3 else None,
                "txt": f"line {i}\nsecond \u2603",
                "meta.bin": {"n": i} if i % 2 else f"plain {i}",
                "label": ["cat", "dog", "ant"][i % 3],
            }
        )
    table = tmp_path / "rows.jsonl"
    table.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    out = tmp_path / "out"
    result = stoker.pack(table, out, progress=False, threads=2)
    assert result.num_samples == 5 and not result.failed
    assert result.classes == ["ant", "cat", "dog"]
    ds = _core.Dataset.open(str(out))
    for i, row in enumerate(rows):
        assert ds.record(i)["label"] == result.classes.index(row["label"])
        # PNGs are stored as they are (restart markers are for JPEGs).
        assert ds.read(i, "png") == (tmp_path / row["png"]).read_bytes()
        assert ds.read(i, "emb.npy") == (tmp_path / row["emb.npy"]).read_bytes()
        assert ds.read(i, "txt").decode() == row["txt"]
        meta = row["meta.bin"]
        assert (
            ds.read(i, "meta.bin") == (meta if isinstance(meta, str) else json.dumps(meta)).encode()
        )
        if row["json"] is None:
            assert "json" not in [mem["name"] for mem in ds.record(i)["members"]]
        else:
            assert json.loads(ds.read(i, "json")) == row["json"]
    f = fields(out)
    assert f["png"]["min_shape"] == [10, 20, 3] and f["png"]["max_shape"] == [18, 24, 3]
    assert f["emb.npy"]["kind"] == "array" and f["emb.npy"]["dtype"] == "int16"
    assert f["emb.npy"]["min_shape"] is None  # ranks 1 and 2: no shape bounds
    assert f["json"]["count"] == 4 and f["meta.bin"]["kind"] == "bytes"
    assert [line.split("\t")[3] for line in (out / "sources.tsv").read_text().splitlines()] == [
        "0",
        "10",
        "20",
        "30",
        "40",
    ]


def test_table_samples_that_cannot_be_packed_are_listed(tmp_path):
    save_image(tmp_path / "ok.jpg", 16, 16)
    save_image(tmp_path / "rgb.png", 16, 16)  # RGB: not a mask
    save_mask(tmp_path / "m.png", 16, 16)
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "ok.npy", np.zeros(3, np.float64))
    (tmp_path / "short.npy").write_bytes((tmp_path / "ok.npy").read_bytes()[:-8])
    rows = [
        ("ok.jpg", "m.png", "ok.npy", '{"a": 1}'),
        ("missing.jpg", "m.png", "ok.npy", "{}"),
        ("ok.jpg", "rgb.png", "ok.npy", "{}"),
        ("ok.jpg", "m.png", "obj.npy", "{}"),
        ("ok.jpg", "m.png", "short.npy", "{}"),
        ("ok.jpg", "m.png", "ok.npy", "{not json"),
        ("ok.jpg", "", "", ""),
    ]
    table = tmp_path / "t.csv"
    with open(table, "w", newline="") as f:
        csv.writer(f).writerows([("jpg", "mask.png", "x.npy", "json"), *rows])
    result = stoker.pack(table, tmp_path / "out", progress=False)
    assert result.num_samples == 2
    failed = dict(result.failed)
    assert "No such file" in failed[str(tmp_path / "missing.jpg")]
    assert "grey or palette PNG" in failed[str(tmp_path / "rgb.png")]
    assert "object array" in failed[str(tmp_path / "obj.npy")]
    assert "its header says 24" in failed[str(tmp_path / "short.npy")]
    assert failed[f"{table}:7"].startswith("json: ")
    assert len(failed) == 5 and len(manifest(tmp_path / "out")["failed"]) == 5
    f = fields(tmp_path / "out")
    assert f["jpg"]["count"] == 2 and f["mask.png"]["count"] == 1


def test_path_label_csv_without_a_header_is_still_the_list_form(tmp_path):
    save_image(tmp_path / "a.jpg", 16, 16)
    save_image(tmp_path / "b.jpg", 16, 16, seed=1)
    (tmp_path / "list.csv").write_text("a.jpg,3\nb.jpg,1\n")
    result = stoker.pack(tmp_path / "list.csv", tmp_path / "out", progress=False)
    assert result.num_samples == 2 and result.classes == ["0", "1", "2", "3"]
    m = manifest(tmp_path / "out")
    assert m["source_format"] == "csv"
    assert [(f["name"], f["kind"], f["count"]) for f in m["fields"]] == [
        ("jpg", "image", 2),
        ("cls", "label", 2),
    ]


def test_table_errors_are_clear(tmp_path):
    (tmp_path / "two.csv").write_text("cls,label,jpg\n1,2,a.jpg\n")
    with pytest.raises(stoker.InvalidArgumentError, match="at most one label column"):
        stoker.pack(tmp_path / "two.csv", tmp_path / "o1", progress=False)
    (tmp_path / "bad.jsonl").write_text('{"jpg": "a.jpg"}\n[1, 2]\n')
    with pytest.raises(stoker.InvalidArgumentError, match="bad.jsonl:2"):
        stoker.pack(tmp_path / "bad.jsonl", tmp_path / "o2", progress=False)
    (tmp_path / "neg.csv").write_text("jpg,cls\na.jpg,-1\n")
    with pytest.raises(stoker.InvalidArgumentError, match=">= 0"):
        stoker.pack(tmp_path / "neg.csv", tmp_path / "o3", progress=False)
    with pytest.raises(stoker.InvalidArgumentError, match="COCO"):
        stoker.pack(tmp_path / "neg.csv", tmp_path / "o4", images=tmp_path, progress=False)


# --- COCO ----------------------------------------------------------------------------------------


def rle_to_string(counts):
    """pycocotools maskApi.c rleToString, written out: the encoder of what the packer decodes."""
    out = []
    for i, count in enumerate(counts):
        x = count - (counts[i - 2] if i > 2 else 0)
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = x != -1 if c & 0x10 else x != 0
            out.append(chr((c | (0x20 if more else 0)) + 48))
    return "".join(out)


def rle_of(mask):
    """COCO's uncompressed RLE of a boolean [h, w] mask: column-major runs, from 0s."""
    flat = mask.T.reshape(-1).astype(np.int8)
    edges = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], edges, [flat.size]])
    counts = np.diff(bounds).tolist()
    return counts if flat[0] == 0 else [0, *counts]


def rle_mask(counts, h, w):
    """Decoded by repeating run values (the packer slices runs out of a cumulative sum)."""
    values = np.arange(len(counts)) % 2
    return np.repeat(values, counts).astype(bool).reshape(w, h).T


def test_compressed_rle_strings_decode_to_their_counts():
    rng = np.random.default_rng(1)
    for _ in range(50):
        counts = rng.integers(0, 3000, size=int(rng.integers(1, 40))).tolist()
        counts += [int(rng.integers(0, 1 << 30))]
        assert rle_counts_from_string(rle_to_string(counts)) == counts
    with pytest.raises(ValueError, match="ends inside"):
        rle_counts_from_string("0o")  # 'o' = 63: a continuation with nothing after it


def polygon_mask(polys, h, w):
    image = Image.new("L", (w, h), 0)
    for poly in polys:
        ImageDraw.Draw(image).polygon(poly, fill=1)
    return np.asarray(image).astype(bool)


@pytest.fixture
def coco(tmp_path):
    """Three images (one without annotations), one listed but missing; polygons, uncompressed
    RLE, a compressed RLE string, a crowd; categories listed out of id order."""
    images = tmp_path / "images"
    images.mkdir()
    sizes = {1: (48, 32), 2: (30, 40), 3: (24, 24)}
    for image_id, (w, h) in sizes.items():
        save_image(images / f"{image_id:012d}.jpg", w, h, seed=image_id, quality=90)
    rng = np.random.default_rng(0)
    blob = rng.random((32, 48)) > 0.6
    blob[:, :10] = False
    crowd = np.zeros((32, 48), bool)
    crowd[20:30, 5:40] = True
    square = np.zeros((40, 30), bool)
    square[3:19, 2:25] = True
    anns = [
        {"id": 1, "image_id": 1, "category_id": 7, "iscrowd": 0, "bbox": [4.5, 3.0, 30.25, 20.0],
         "segmentation": [[4.5, 3, 34.75, 3, 34.75, 23, 20, 12.5], [40, 25, 47, 25, 44, 31]]},
        {"id": 2, "image_id": 1, "category_id": 3, "iscrowd": 0, "bbox": [10, 0, 38, 32],
         "segmentation": {"size": [32, 48], "counts": rle_to_string(rle_of(blob))}},
        {"id": 3, "image_id": 1, "category_id": 12, "iscrowd": 1, "bbox": [5, 20, 35, 10],
         "segmentation": {"size": [32, 48], "counts": rle_of(crowd)}},
        {"id": 4, "image_id": 2, "category_id": 12, "iscrowd": 0, "bbox": [2, 3, 23, 16],
         "segmentation": {"size": [40, 30], "counts": rle_of(square)}},
        {"id": 5, "image_id": 2, "category_id": 3, "iscrowd": 0, "bbox": [0, 0, 10, 10],
         "segmentation": [[0, 0, 10, 0, 10, 10, 0, 10]]},
    ]  # fmt: skip
    doc = {
        "images": [
            *(
                {"id": i, "file_name": f"{i:012d}.jpg", "width": w, "height": h}
                for i, (w, h) in sizes.items()
            ),
            {"id": 9, "file_name": "gone.jpg", "width": 8, "height": 8},
        ],
        "annotations": anns,
        "categories": [
            {"id": 12, "name": "zebra"},
            {"id": 3, "name": "car"},
            {"id": 7, "name": "bird"},
        ],
    }
    ann_path = tmp_path / "instances.json"
    ann_path.write_text(json.dumps(doc))
    expected = {}
    index = {3: 0, 7: 1, 12: 2}  # class index by COCO id, in id order
    for image_id, (w, h) in sizes.items():
        seg = np.zeros((h, w), np.uint8)
        boxes = []
        for a in (a for a in anns if a["image_id"] == image_id):
            s = a["segmentation"]
            if isinstance(s, list):
                covered = polygon_mask(s, h, w)
            elif isinstance(s["counts"], list):
                covered = rle_mask(s["counts"], h, w)
            else:
                covered = {2: blob}[a["id"]]
            seg[covered] = index[a["category_id"]] + 1
            if not a["iscrowd"]:
                boxes.append({"bbox": a["bbox"], "category_id": index[a["category_id"]]})
        expected[image_id] = (seg, boxes)
    return ann_path, images, expected


def test_coco_masks_boxes_and_manifest(tmp_path, coco):
    ann_path, images, expected = coco
    out = tmp_path / "out"
    result = stoker.pack(ann_path, out, images=images, restart_interval=None, progress=False)
    assert result.num_samples == 3
    assert result.failed == [(str(images / "gone.jpg"), result.failed[0][1])]
    assert "No such file" in result.failed[0][1]
    m = manifest(out)
    assert m["source_format"] == "coco"
    assert m["classes"] == ["car", "bird", "zebra"] and m["category_ids"] == [3, 7, 12]
    assert m["crowd_annotations"] == 1
    assert m["class_counts"] == [2, 1, 1]  # boxes per class, crowds left out
    ds = _core.Dataset.open(str(out))
    for i, image_id in enumerate(sorted(expected)):
        seg, boxes = expected[image_id]
        rec = ds.record(i)
        assert rec["label"] == -1
        assert [mem["name"] for mem in rec["members"]] == ["jpg", "json", "seg.png"]
        assert ds.read(i, "jpg") == (images / f"{image_id:012d}.jpg").read_bytes()
        png = Image.open(io.BytesIO(ds.read(i, "seg.png")))
        assert png.mode == "L" and png.size == (seg.shape[1], seg.shape[0])
        np.testing.assert_array_equal(np.asarray(png), seg)
        assert json.loads(ds.read(i, "json")) == boxes
    assert not expected[3][0].any() and expected[3][1] == []  # kept, with nothing in it
    assert expected[1][0].max() == 3  # the crowd, painted last, is in the mask
    sources = [line.split("\t") for line in (out / "sources.tsv").read_text().splitlines()]
    assert [s[3] for s in sources] == ["1", "2", "3"]
    f = fields(out)
    assert f["jpg"]["min_shape"] == [24, 24, 3] and f["jpg"]["max_shape"] == [40, 48, 3]
    assert f["json"]["kind"] == "boxes"
    assert f["json"]["min_shape"] == [0, 4] and f["json"]["max_shape"] == [2, 4]
    assert f["seg.png"]["kind"] == "mask"
    assert f["seg.png"]["min_shape"] == [24, 24] and f["seg.png"]["max_shape"] == [40, 48]
    assert "cls" not in f


def test_coco_max_side_scales_boxes_and_masks(tmp_path, coco):
    ann_path, images, expected = coco
    out = tmp_path / "out"
    stoker.pack(ann_path, out, images=images, max_side=24, progress=False)
    ds = _core.Dataset.open(str(out))
    info = _core.image_info(ds.read(0, "jpg"))
    assert (info["width"], info["height"]) == (24, 16)
    mask = np.asarray(Image.open(io.BytesIO(ds.read(0, "seg.png"))))
    np.testing.assert_array_equal(mask, expected[1][0][1::2, 1::2])  # nearest, centres
    boxes = json.loads(ds.read(0, "json"))
    assert boxes[0]["bbox"] == [2.25, 1.5, 15.125, 10.0]


def test_coco_from_the_command_line(tmp_path, coco, capsys):
    from stoker.tools.cli import main

    ann_path, images, _ = coco
    out = tmp_path / "cli"
    argv = ["pack", "--coco", str(ann_path), "--images", str(images), "--quiet", str(out)]
    assert main(argv) == 0
    assert "packed 3 samples" in capsys.readouterr().out
    assert len(_core.Dataset.open(str(out))) == 3
    assert main(["pack", "--coco", str(ann_path), str(tmp_path / "x")]) == 1
    assert "--coco needs --images" in capsys.readouterr().err


# --- through stoker.Loader -----------------------------------------------------------------------


def typed_loader():
    pytest.importorskip("torch")
    if not hasattr(stoker, "Loader"):
        pytest.skip("stoker.Loader is not there")
    return stoker.Loader


def test_table_pack_through_the_loader(tmp_path):
    Loader = typed_loader()
    rows, masks = [], []
    for i in range(5):
        save_image(tmp_path / f"{i}.jpg", 64, 48, seed=i, quality=95)
        masks.append(np.asarray(Image.open(save_mask(tmp_path / f"{i}.seg.png", 64, 48, seed=i))))
        boxes = [{"bbox": [i, 2.5, 20, 10 + i], "category_id": i}] * (i % 3)
        rows.append({"jpg": f"{i}.jpg", "seg.png": f"{i}.seg.png", "cls": i % 2,
                     "txt": f"caption {i}", "json": boxes})  # fmt: skip
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "out"
    stoker.pack(tmp_path / "t.jsonl", out, progress=False)
    fields = {
        "image": stoker.Image("jpg", size=(48, 64), geometry=stoker.Resize()),  # the identity
        "mask": stoker.Mask("seg.png", follow="image"),
        "boxes": stoker.Boxes("json", follow="image", max_boxes=10),
        "label": stoker.Label("cls"),
        "caption": stoker.Text("txt"),
    }
    ds = _core.Dataset.open(str(out))
    seen = 0
    for batch in Loader(out, batch_size=2, train=False, threads=2, fields=fields):
        for j in range(len(batch["label"])):
            i, row = seen, rows[seen]
            seen += 1
            pixels = _core.decode_image(ds.read(i, "jpg"))
            np.testing.assert_array_equal(batch["image"][j].permute(1, 2, 0).numpy(), pixels)
            np.testing.assert_array_equal(batch["mask"][j].numpy(), masks[i])
            assert batch["label"][j].item() == row["cls"]
            assert batch["caption"][j] == row["txt"]
            n = int(batch["boxes"]["count"][j])
            assert n == len(row["json"])
            for (x, y, w, h), got in zip(
                [b["bbox"] for b in row["json"]], batch["boxes"]["boxes"][j][:n].tolist()
            ):
                assert got == pytest.approx([x, y, x + w, y + h])
            assert batch["boxes"]["classes"][j][:n].tolist() == [i] * n
    assert seen == 5


def test_coco_pack_through_the_loader(tmp_path, coco):
    Loader = typed_loader()
    ann_path, images, expected = coco
    out = tmp_path / "out"
    stoker.pack(ann_path, out, images=images, progress=False)
    fields = {
        "image": stoker.Image("jpg", size=(32, 48), geometry=stoker.Resize()),
        "mask": stoker.Mask("seg.png", follow="image"),
        "boxes": stoker.Boxes("json", follow="image", max_boxes=4),
    }
    (batch,) = list(Loader(out, batch_size=3, train=False, fields=fields))
    assert batch["image"].shape == (3, 3, 32, 48) and batch["mask"].shape == (3, 32, 48)
    seg, boxes = expected[1]  # image 1 is 48x32: the identity
    np.testing.assert_array_equal(batch["mask"][0].numpy(), seg)
    assert batch["boxes"]["count"].tolist() == [2, 2, 0]
    got = batch["boxes"]["boxes"][0][:2].tolist()
    for b, g in zip(boxes, got):
        x, y, w, h = b["bbox"]
        assert g == pytest.approx([x, y, min(x + w, 48), min(y + h, 32)])
    assert batch["boxes"]["classes"][0][:2].tolist() == [b["category_id"] for b in boxes]
