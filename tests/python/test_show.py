"""What the model saw (issue 26, item 1): ``record=`` writes the samples of every step each rank
handed out, across a resume and with replaced samples; ``stoker.show`` and ``stoker show`` draw a
step's batch (the pixels of batch_at, with boxes and masks over them); ``stoker trace`` prints its
samples."""

from __future__ import annotations

import base64
import io
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image as PIL

import stoker
import stoker.augment as A
from stoker.tools.cli import main


def pictures(page: str) -> list[np.ndarray]:
    return [np.asarray(PIL.open(io.BytesIO(base64.b64decode(b))).convert("RGB"))
            for b in re.findall(r'base64,([^"]+)"', page)]  # fmt: skip


def captions(page: str) -> list[str]:
    return re.findall(r"<figcaption><b>([^<]*)</b>", page)


def test_record_lists_each_steps_samples_across_a_resume(packed, tmp_path):
    path = tmp_path / "steps.jsonl"
    make = lambda **kw: stoker.ImageLoader(packed, batch_size=5, size=24, seed=3,  # noqa: E731
                                           return_index=True, record=path, **kw)  # fmt: skip
    loader = make()
    loader.set_epoch(2)
    it = iter(loader)
    handed = [next(it)[2].tolist() for _ in range(3)]
    state = loader.state_dict()
    loader.close()
    resumed = make()
    resumed.load_state_dict(state)
    handed += [b[2].tolist() for b in resumed]
    resumed.close()
    lines = stoker.read_record(path)
    assert [(r["epoch"], r["step"]) for r in lines] == [(2, s) for s in range(len(handed))]
    assert [r["index"] for r in lines] == handed
    for r in lines:
        assert r["key"] == [s["key"] for s in resumed.sample_ids(2, r["step"], 0)]


def test_each_rank_records_its_own_file_and_replaced_samples_as_received(tmp_path):
    from conftest import corrupt

    from conftest import make_image_folder

    pack = tmp_path / "pack"
    stoker.pack(make_image_folder(tmp_path / "src", per_class=10, seed=5), pack, progress=False)
    corrupt(pack, [4, 11])
    for rank in range(2):
        loader = stoker.ImageLoader(pack, batch_size=4, size=24, rank=rank, world_size=2,
                                    on_error="replace", return_index=True,
                                    record=tmp_path / "steps.jsonl")  # fmt: skip
        got = [b[2].tolist() for b in loader]
        loader.close()
        assert sum(map(len, got)) == 15  # half of the 30 samples, each rank
        lines = stoker.read_record(tmp_path / f"steps.rank{rank}.jsonl")
        assert [r["index"] for r in lines] == got  # substitutes, as the batches had them
        assert {(r["rank"], r["world_size"]) for r in lines} == {(rank, 2)}
    assert not (tmp_path / "steps.jsonl").exists()


def test_show_draws_batch_at_with_keys_and_labels(packed, tmp_path):
    recipe = [A.ColorJitter(0.4, 0.4, 0.4), A.RandomErasing(0.5)]
    loader = stoker.ImageLoader(packed, batch_size=6, size=32, seed=4, augment=recipe,
                                return_index=True)  # fmt: skip
    page = stoker.show(loader, 1, 2, tmp_path / "batch.html").read_text()
    images, labels, index = loader.batch_at(1, 2)
    drawn = pictures(page)
    assert len(drawn) == 6
    for picture, image in zip(drawn, images, strict=True):  # the augmented pixels, exactly
        np.testing.assert_array_equal(picture, image.permute(1, 2, 0).numpy())
    assert captions(page) == [s["key"] for s in loader.sample_ids(1, 2, 0)]
    classes = loader.classes
    for label in labels.tolist():
        assert f"label {classes[label]}" in page


def test_augment_draws_lists_each_sample_s_policy_ops_and_show_prints_them(packed, tmp_path):
    from stoker.tools.replay import augment_draws

    recipe = [A.ColorJitter(0.2), A.TimmRandAugment.from_config("rand-m9-mstd0.5", prob=1.0),
              A.RandAugment(1, 9)]  # fmt: skip
    loader = stoker.ImageLoader(packed, batch_size=6, size=32, seed=4, augment=recipe,
                                return_index=True)  # fmt: skip
    drawn = augment_draws(loader, 1, 2)
    assert [d["index"] for d in drawn] == [s["index"] for s in loader.sample_ids(1, 2, 0)]
    # op k of augment= draws under "ops/k": timm's two layers, then RandAugment's one round
    keyed = A.KeyedDraws(4, 1, torch.tensor([d["index"] for d in drawn])).scoped("ops")
    timm = recipe[1].drawn(keyed.scoped("1"), 32, 32)
    rand = recipe[2].drawn(keyed.scoped("2"), 32, 32)
    for d, t, r in zip(drawn, timm, rand, strict=True):
        assert d["ops"] == t + r and len(d["ops"]) == 3
    # the images are those ops' (the workers applied them): the loader without its policies
    # gives the jittered crops, and the drawn ops applied one by one give the batch
    images, _, index = loader.batch_at(1, 2)
    plain = stoker.ImageLoader(packed, batch_size=6, size=32, seed=4, augment=recipe[:1],
                               return_index=True)  # fmt: skip
    base, _, _ = plain.batch_at(1, 2)
    from test_augment_policies import replay_drawn

    for i, d in enumerate(drawn):
        timm_ops, rand_ops = d["ops"][:2], d["ops"][2:]
        want = replay_drawn(recipe[2], replay_drawn(recipe[1], base[i : i + 1], timm_ops),
                            rand_ops)  # fmt: skip
        assert (want[0] != images[i]).any(0).float().mean() <= 2e-3
    page = stoker.show(loader, 1, 2, tmp_path / "batch.html").read_text()
    for d in drawn:
        assert " · ".join(str(op) for op in d["ops"]) in page


def test_show_overlays_masks_and_boxes(tmp_path):
    from test_fields import _sample, _write_pack

    pack = _write_pack(tmp_path / "pack", [_sample(i) for i in range(12)])
    fields = {
        "image": stoker.Image("png", size=(40, 56), geometry=stoker.Letterbox(), hflip=0.5),
        "mask": stoker.Mask("seg.png", follow="image"),
        "boxes": stoker.Boxes("json", follow="image", max_boxes=8),
        "label": stoker.Label("cls"),
    }
    loader = stoker.Loader(pack, batch_size=4, fields=fields, seed=2)
    page = stoker.show(loader, 0, 1, tmp_path / "b.html").read_text()
    batch = loader.batch_at(0, 1)
    drawn = pictures(page)
    assert len(drawn) == len(batch["image"]) == 4
    boxed = 0
    for i, picture in enumerate(drawn):
        image = batch["image"][i].permute(1, 2, 0).numpy()
        mask = batch["mask"][i].numpy()
        box_pixels = np.zeros(mask.shape, bool)
        for b in range(int(batch["boxes"]["count"][i])):
            x0, y0, x1, y1 = batch["boxes"]["boxes"][i, b].tolist()
            box_pixels[max(int(y0) - 3, 0) : int(y1) + 4, max(int(x0) - 3, 0) : int(x1) + 4] = True
        clear = (mask == 0) & ~box_pixels
        np.testing.assert_array_equal(picture[clear], image[clear])  # untouched outside
        painted = (mask > 0) & ~box_pixels
        assert painted.any() and (picture[painted] != image[painted]).any(axis=-1).mean() > 0.9
        if int(batch["boxes"]["count"][i]):
            assert (picture[box_pixels] != image[box_pixels]).any()
            boxed += 1
    assert boxed > 0  # some box outline was checked
    assert "label " in page


def test_show_of_a_mix_draws_the_loader_the_step_drew(packed, tmp_path):
    a = stoker.ImageLoader(packed, batch_size=4, size=24, seed=1)
    b = stoker.ImageLoader(packed, batch_size=4, size=24, seed=2, train=False)
    mixed = stoker.mix([a, b], [0.5, 0.5], seed=7)
    source, epoch, step = mixed.source_at(0, 3)
    page = stoker.show(mixed, 0, 3, tmp_path / "m.html").read_text()
    assert f"source {source}" in page
    expected = mixed.sources[source].batch_at(epoch, step)[0]
    for picture, image in zip(pictures(page), expected, strict=True):
        np.testing.assert_array_equal(picture, image.permute(1, 2, 0).numpy())


def test_trace_and_show_on_the_command_line(packed, tmp_path, capsys):
    environment = dict(os.environ)
    assert main(["trace", str(packed), "--step", "2", "--batch-size", "4", "--seed", "5",
                 "--world-size", "2", "--all-ranks"]) == 0  # fmt: skip
    out = capsys.readouterr().out.splitlines()[2:]
    assert dict(os.environ) == environment  # --world-size given to the loader, then taken back
    loader = stoker.ImageLoader(packed, batch_size=4, seed=5, rank=0, world_size=2)
    ids = loader.sample_ids(0, 2)
    assert [line.split()[-1] for line in out] == [s["key"] for r in (0, 1) for s in ids[r]]
    assert [int(line.split()[0]) for line in out] == [0] * 4 + [1] * 4

    # --loader: the user's own loader, as training builds it, at the rank asked for
    (tmp_path / "train.py").write_text(textwrap.dedent(f"""
        import stoker, stoker.augment as A
        def make_loader():
            return stoker.ImageLoader({str(packed)!r}, batch_size=3, size=20, seed=8,
                                      augment=[A.RandomErasing(1.0)])
    """))  # fmt: skip
    cmd = [sys.executable, "-m", "stoker", "show", "--loader", f"{tmp_path}/train.py:make_loader",
           "--epoch", "1", "--step", "4", "--world-size", "2", "--rank", "1",
           "--html", str(tmp_path / "s.html")]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    page = (tmp_path / "s.html").read_text()
    theirs = stoker.ImageLoader(packed, batch_size=3, size=20, seed=8, rank=1, world_size=2,
                                augment=[A.RandomErasing(1.0)])  # fmt: skip
    assert captions(page) == [s["key"] for s in theirs.sample_ids(1, 4, 1)]
    for picture, image in zip(pictures(page), theirs.batch_at(1, 4)[0], strict=True):
        np.testing.assert_array_equal(picture, image.permute(1, 2, 0).numpy())
    assert "rank 1 of 2" in page

    bad = subprocess.run([sys.executable, "-m", "stoker", "trace", "--loader", "nope", "--step",
                          "0"], capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 1 and "FILE.py:FUNCTION" in bad.stderr


@pytest.mark.parametrize("device", ["cpu"])
def test_show_brings_normalised_device_batches_back_to_pixels(packed, tmp_path, device):
    host = stoker.ImageLoader(packed, batch_size=4, size=24, seed=1)
    fed = stoker.ImageLoader(packed, batch_size=4, size=24, seed=1, device=device,
                             mean=stoker.IMAGENET_MEAN, std=stoker.IMAGENET_STD)  # fmt: skip
    page = stoker.show(fed, 0, 1, tmp_path / "d.html").read_text()
    for picture, image in zip(pictures(page), host.batch_at(0, 1)[0], strict=True):
        diff = np.abs(picture.astype(int) - image.permute(1, 2, 0).numpy().astype(int))
        assert diff.max() <= 1  # float32 round trip
    assert torch.is_floating_point(fed.batch_at(0, 1)[0])


def test_a_mix_records_the_loader_each_step_drew_whose_record_has_the_samples(packed, tmp_path):
    from conftest import make_image_folder

    other = tmp_path / "other"
    stoker.pack(make_image_folder(tmp_path / "src", per_class=4, seed=8), other, progress=False)
    a = stoker.ImageLoader(packed, batch_size=4, size=24, seed=1, return_index=True,
                           record=tmp_path / "a.jsonl")  # fmt: skip
    b = stoker.ImageLoader(other, batch_size=4, size=24, seed=2, return_index=True,
                           record=tmp_path / "b.jsonl")  # fmt: skip
    mixed = stoker.mix([a, b], [0.5, 0.5], seed=7, stop="all_exhausted",
                       record=tmp_path / "mix.jsonl")  # fmt: skip
    mixed.set_epoch(1)
    got = [batch[2].tolist() for batch in mixed]
    mixed.close()
    steps = stoker.read_record(tmp_path / "mix.jsonl")
    assert [r["step"] for r in steps] == list(range(len(got)))
    records = {0: stoker.read_record(tmp_path / "a.jsonl"),
               1: stoker.read_record(tmp_path / "b.jsonl")}  # fmt: skip
    for r, indices in zip(steps, got, strict=True):
        assert (r["source"], r["source_epoch"], r["source_step"]) == mixed.source_at(1, r["step"])
        line = [x for x in records[r["source"]]
                if (x["epoch"], x["step"]) == (r["source_epoch"], r["source_step"])]  # fmt: skip
        assert len(line) == 1 and line[0]["index"] == indices


def test_records_name_the_rank_of_loaders_given_ranks_and_trials_never_write_them(packed, tmp_path):
    from stoker.doctor.experiments import _sibling

    path = str(tmp_path / "{exp}" / "steps-{rank}.jsonl").replace("{exp}", "run{1}")
    loaders = [stoker.ImageLoader(packed, batch_size=4, size=16, rank=1, world_size=2,
                                  record=path) for _ in range(2)]  # fmt: skip
    mixed = stoker.mix(loaders, [1, 1], record=tmp_path / "mix.jsonl")
    for _ in mixed:
        pass
    mixed.close()
    assert {(r["rank"], r["world_size"]) for r in
            stoker.read_record(tmp_path / "mix.rank1.jsonl")} == {(1, 2)}  # fmt: skip
    assert not (tmp_path / "mix.jsonl").exists()
    written = stoker.read_record(path.replace("{rank}", "1"))  # a brace of its own in the path
    trial = _sibling(loaders[0], threads=1)  # the doctor's trial loader
    for _ in trial:
        pass
    trial.close()
    assert stoker.read_record(path.replace("{rank}", "1")) == written
    assert written


def test_show_refuses_what_it_cannot_draw(tmp_path):
    documents = [np.arange(1, 40, dtype=np.uint16)] * 8
    stoker.pack_tokens(documents, tmp_path / "tokens", eos_id=0, progress=False)
    loader = stoker.TokenLoader(tmp_path / "tokens", seq_len=8, batch_size=2)
    with pytest.raises(stoker.InvalidArgumentError, match="images"):
        stoker.show(loader, 0, 0, tmp_path / "t.html")
    with pytest.raises(stoker.InvalidArgumentError, match="columns"):
        stoker.show(loader, 0, 0, tmp_path / "t.html", columns=0)
