"""decode="gpu" and decode="auto" on the CPU (issue 32). The device path runs whole: the workers
hand each sequential JPEG over with its plan, the stage decodes every handed-over region of a
batch in one call and renders them with the batched resampler, the failures go back to the
engine. Here the device decoder is stoker's own (HostDecoder, the host path's libjpeg-turbo) on
device="cpu": its pixels are the host path's, so every batch must equal the host path's byte for
byte, which checks the plans, the regions, the resampler, the placement, the flips and the fill.
nvImageCodec itself, on a GPU, is tests/gpu/test_gpu_decode.py's."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from PIL import Image

import stoker
from stoker import _core
from stoker.device import gpu_decode
from stoker.device.gpu_decode import resample, split
from stoker.load.stages.decode import DeviceDecode

from conftest import shared_data, write_tar

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it


class StandIn(gpu_decode.HostDecoder):
    """The device decoder's place: stoker's decoder, at the scales it is told it may use; it
    refuses the files `refuse` says (a coding the device would not take)."""

    def __init__(self, max_scale_denom: int = 8, refuse=lambda data: False) -> None:
        super().__init__()
        self.max_scale_denom = max_scale_denom
        self.refuse = refuse
        self.calls = 0
        self.sizes: list[int] = []  # each call's images
        self.threads: set[int] = set()  # the threads it decoded on

    def decode_into(self, blobs, regions, targets):
        self.calls += 1
        self.sizes.append(len(blobs))
        self.threads.add(threading.get_ident())
        refused = [self.refuse(b) for b in blobs]
        done = super().decode_into([b for b, r in zip(blobs, refused) if not r],
                                   regions[[not r for r in refused]],
                                   targets.select([not r for r in refused]))  # fmt: skip
        it = iter(done)
        return [False if r else next(it) for r in refused]


@pytest.fixture
def stand_in(monkeypatch):
    decoder = StandIn()
    monkeypatch.setattr(gpu_decode, "decoder_for",
                        lambda device, batch_size=0: gpu_decode.DecoderFactory.reusing(decoder))
    return decoder


def loader(pack, **kw):
    kw = {"batch_size": 6, "size": 64, "seed": 2, "threads": 2, "device": "cpu",
          "dtype": torch.uint8, "return_index": True, **kw}  # fmt: skip
    return stoker.ImageLoader(pack, **kw)


def kinds(pack) -> dict[int, dict]:
    ds = stoker.load.loader.open_dataset(pack)
    return {i: _core.image_info(ds.read(i)) for i in range(len(ds))}


@pytest.mark.parametrize("train", [True, False])
def test_the_same_batches_as_the_host_path_byte_for_byte(packed, stand_in, train):
    info = kinds(packed)
    host = list(loader(packed, train=train))
    gpu = loader(packed, train=train, decode="gpu")
    got = list(gpu)
    assert len(got) == len(host) == 6
    on_device = on_host = 0
    for (x, y, i), (hx, hy, hi) in zip(got, host, strict=True):
        assert torch.equal(i, hi) and torch.equal(y, hy) and torch.equal(x, hx)
        for index in i.tolist():
            meta = info[index]
            if meta["format"] == "jpg" and not meta["progressive"]:
                on_device += 1
            else:
                on_host += 1
    assert on_device > 20 and on_host >= 4  # the PNGs, the progressive
    assert stand_in.calls == 6  # one batched call a batch
    # The first call is full size (the engines' batch is set by it): the first batch's device
    # rows, and the smallest of them again up to the batch size, decoded and not used.
    first = sum(info[i]["format"] == "jpg" and not info[i]["progressive"]
                for i in got[0][2].tolist())  # fmt: skip
    assert first <= 6 and stand_in.sizes[0] == 6
    assert stand_in.decoded == on_device + 6 - first == sum(stand_in.sizes)
    assert threading.get_ident() not in stand_in.threads  # decoded off the caller's thread
    counts = gpu.stats()["decode"]
    assert (counts["device"], counts["host"], counts["device_failed"]) == (on_device, on_host, 0)


GEOMETRIES = {
    "random_resized_crop": dict(geometry=stoker.RandomResizedCrop(), hflip=0.5),
    "center_crop": dict(geometry=stoker.CenterCrop()),
    "resize": dict(geometry=stoker.Resize(), vflip=0.5),
    "letterbox": dict(geometry=stoker.Letterbox(fill=114), hflip=0.5, vflip=0.5),
    "random_crop_padded": dict(geometry=stoker.RandomCrop(padding=24, fill=77), hflip=0.5),
    "grey": dict(geometry=stoker.RandomResizedCrop(), channels=1),
}


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """80 imagenet-sample photos (4:2:0, 4:4:4, grey, sizes up to 500 px), as stoker packs
    them (a restart marker every MCU)."""
    from conftest import shared_data

    files = sorted((shared_data() / "imagenet-sample").glob("*.JPEG"))[:80]
    table = tmp_path_factory.mktemp("photos") / "photos.csv"
    table.write_text("".join(f"{f},{i % 10}\n" for i, f in enumerate(files)))
    out = tmp_path_factory.mktemp("photos_pack") / "pack"
    stoker.pack(table, out, progress=False)
    return out


@pytest.mark.parametrize("name", sorted(GEOMETRIES))
@pytest.mark.parametrize("scales", [8, 1])
def test_every_geometry_renders_as_the_host_path_on_photos(photos, monkeypatch, name, scales):
    """Each geometry (crop first or resize first, fill, both flips, grey output) over real photos
    at two sizes, with a device that decodes at DCT scales up to 1/8 (as the host does) or only
    at full size (as nvImageCodec does: then the host path with dct_scaling=False is the
    reference): byte for byte."""
    decoder = StandIn(max_scale_denom=scales)
    monkeypatch.setattr(gpu_decode, "decoder_for",
                        lambda device, batch_size=0: gpu_decode.DecoderFactory.reusing(decoder))
    size = (96, 128) if name == "letterbox" else 112
    fields = lambda decode: {  # noqa: E731
        "image": stoker.Image(size=size, decode=decode, dct_scaling=scales > 1,
                              **GEOMETRIES[name]),
        "label": stoker.Label(),
    }  # fmt: skip
    common = dict(batch_size=20, seed=7, threads=2, device="cpu", dtype=torch.uint8, train=True)
    host = list(stoker.Loader(photos, fields=fields("host"), **common))
    gpu = stoker.Loader(photos, fields=fields("gpu"), **common)
    got = list(gpu)
    for a, b in zip(got, host, strict=True):
        assert torch.equal(a["label"], b["label"])
        same = [torch.equal(a["image"][k], b["image"][k]) for k in range(len(b["image"]))]
        assert all(same), [k for k, s in enumerate(same) if not s]
    assert gpu.stats()["decode"]["device"] == decoder.decoded == 80


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("scales", [8, 1])
def test_aspect_buckets_render_as_the_host_path(photos, monkeypatch, train, scales):
    """buckets=: each batch at its own bucket's size, every image cropped to it (CoverCrop,
    random along the slack when training), decoded on the device at the DCT scale it allows:
    byte for byte the host path's bucketed batches, shapes, order and leftovers included."""
    decoder = StandIn(max_scale_denom=scales)
    monkeypatch.setattr(gpu_decode, "decoder_for",
                        lambda device, batch_size=0: gpu_decode.DecoderFactory.reusing(decoder))
    buckets = stoker.AspectBuckets(area=96 * 96, step=16, max_ratio=2.0)
    fields = lambda decode: {  # noqa: E731
        "image": stoker.Image(decode=decode, dct_scaling=scales > 1, hflip=0.5),
        "label": stoker.Label(),
    }  # fmt: skip
    common = dict(batch_size=8, seed=5, threads=2, device="cpu", dtype=torch.uint8, train=train,
                  buckets=buckets, return_index=True)  # fmt: skip
    host = list(stoker.Loader(photos, fields=fields("host"), **common))
    gpu = stoker.Loader(photos, fields=fields("gpu"), **common)
    got = list(gpu)
    assert len(got) == len(host) >= 8
    assert len({tuple(b["image"].shape[2:]) for b in got}) >= 2  # batches of several buckets
    for a, b in zip(got, host, strict=True):
        assert tuple(a["image"].shape[2:]) in buckets.sizes
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["image"], b["image"])
    decoded = sum(len(b["index"]) for b in got)
    assert gpu.stats()["decode"]["device"] == decoder.decoded - (8 - len(got[0]["index"])) > 0
    assert gpu.stats()["decode"]["device"] == decoded  # every photo a sequential JPEG
    # decode="auto": each batch split between the workers and the device, the same batches.
    auto = stoker.Loader(photos, fields=fields("auto"), **common)
    for a, b in zip(auto, host, strict=True):
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["image"], b["image"])
    counts = auto.stats()["decode"]
    assert counts["device"] > 0 and counts["host"] > 0
    assert counts["device"] + counts["host"] == decoded


def test_small_groups_and_both_pass_orders_render_as_the_host_path(photos, monkeypatch):
    """A batch's regions split into many groups (a small group_bytes) and into Pillow's two
    orders of passes, laid out group by group in one ring buffer: byte for byte the host's."""
    decoder = StandIn(max_scale_denom=1)
    monkeypatch.setattr(gpu_decode, "decoder_for",
                        lambda device, batch_size=0: gpu_decode.DecoderFactory.reusing(decoder))
    groups = []
    real_render = resample.render

    def spy(regions, plans, *args, **kwargs):
        groups.append(bool(resample.horizontal_first(plans)[0]))
        assert len(set(resample.horizontal_first(plans).tolist())) == 1  # one order a group
        return real_render(regions, plans, *args, **kwargs)

    monkeypatch.setattr(resample, "render", spy)
    fields = lambda decode: {  # noqa: E731
        "image": stoker.Image(size=(24, 200), decode=decode, dct_scaling=False,
                              geometry=stoker.RandomResizedCrop(scale=(0.05, 1.0))),
        "label": stoker.Label(),
    }  # fmt: skip
    common = dict(batch_size=40, seed=11, threads=2, device="cpu", dtype=torch.uint8)
    host = list(stoker.Loader(photos, fields=fields("host"), **common))
    gpu = stoker.Loader(photos, fields=fields("gpu"), **common)
    gpu._chain.find(DeviceDecode).decode.group_bytes = 300_000
    for a, b in zip(gpu, host, strict=True):
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])
    assert len(groups) > 2 * 2 and True in groups and False in groups


def test_the_resampler_is_the_host_resamplers_byte_for_byte():
    """Random boxes, output sizes from 3 to twice the image's (up- and downscaling, Pillow's two
    pass orders)
    of one decoded photo against transform::Resampler (_core.resize_box)."""
    from conftest import shared_data

    path = sorted((shared_data() / "imagenet-sample").glob("*.JPEG"))[3]
    image = _core.decode_image(path.read_bytes())
    h, w, _ = image.shape
    rng = np.random.default_rng(1)
    plans, expected = [], []
    for _ in range(60):
        x0, y0 = rng.uniform(0, w - 2), rng.uniform(0, h - 2)
        x1, y1 = rng.uniform(x0 + 1, w), rng.uniform(y0 + 1, h)
        ow, oh = (int(v) for v in rng.integers(3, 300, size=2))
        if len(plans) % 3 == 0:  # wider than the box: Pillow resamples down the image first
            ow = int(rng.integers(int(x1 - x0) + 1, 2 * w))
        plan = np.zeros(resample.PLAN_VALUES)
        plan[resample.DENOM] = 1
        plan[resample.DECODE] = plan[resample.VIEW] = [0, 0, w, h]
        plan[resample.BOX] = [x0, y0, x1, y1]
        plan[resample.RECT] = [0, 0, ow, oh]
        plans.append(plan)
        expected.append(_core.resize_box(image, x0, y0, x1, y1, ow, oh))
    both = np.array([resample.horizontal_first(p[None])[0] for p in plans])
    assert both.any() and not both.all()  # both pass orders are exercised
    for plan, want in zip(plans, expected, strict=True):
        oh, ow = want.shape[:2]
        got = resample.render(torch.from_numpy(image)[None], plan[None], oh, ow)[0]
        assert np.array_equal(got.numpy(), want)


def test_a_group_of_regions_of_different_sizes_renders_each_as_alone():
    """Regions padded into one buffer: each image reads only its own pixels (taps clamped to
    its region), whatever its neighbours' sizes."""
    rng = np.random.default_rng(3)
    sizes = [(40, 70), (90, 33), (17, 17)]
    regions = [rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for h, w in sizes]
    buffer = torch.full((3, 90, 70, 3), 255, dtype=torch.uint8)
    plans = np.zeros((3, resample.PLAN_VALUES))
    for k, ((h, w), region) in enumerate(zip(sizes, regions, strict=True)):
        buffer[k, :h, :w] = torch.from_numpy(region)
        plans[k, resample.DENOM] = 1
        plans[k, resample.DECODE] = plans[k, resample.VIEW] = [0, 0, w, h]
        plans[k, resample.BOX] = [0.5, 1.25, w - 0.75, h]
        plans[k, resample.RECT] = [0, 0, 24, 24]
    together = resample.render(buffer, plans, 24, 24)
    for k, region in enumerate(regions):
        alone = resample.render(torch.from_numpy(region)[None], plans[k : k + 1], 24, 24)
        assert torch.equal(together[k], alone[0])


def test_the_workers_hand_over_the_file_itself(packed, stand_in):
    """What the stage receives for a device sample is the member's bytes, untouched, and its
    pixels are left for the device (zeros before the stage)."""
    seen = []
    real = gpu_decode.DeviceDecodeStage.__call__

    def spy(self, images):
        queued = self.pending[0]
        seen.append((list(queued.blobs), set(queued.on_device.tolist()), images.clone()))
        return real(self, images)

    gpu_decode.DeviceDecodeStage.__call__ = spy
    try:
        got = list(loader(packed, train=False, decode="gpu"))
    finally:
        gpu_decode.DeviceDecodeStage.__call__ = real
    ds = stoker.load.loader.open_dataset(packed)
    handed = 0
    for (blobs, on_device, before), (_, _, index) in zip(seen, got, strict=True):
        for k, i in enumerate(index.tolist()):
            if k in on_device:
                handed += 1
                assert blobs[k] == ds.read(i) and not before[k].any()
            else:
                assert blobs[k] == b""
    assert handed == 30  # all but the PNGs and the progressive JPEGs


def test_a_file_the_device_refuses_is_decoded_on_the_host(packed, monkeypatch):
    """The device refusing a file sends it back to the engine, whose host decode is the host
    path's own: the batches equal, byte for byte, with the refusals counted."""
    decoder = StandIn(refuse=lambda data: len(data) % 3 == 0)
    monkeypatch.setattr(gpu_decode, "decoder_for",
                        lambda device, batch_size=0: gpu_decode.DecoderFactory.reusing(decoder))
    host = list(loader(packed, train=True))
    gpu = loader(packed, train=True, decode="gpu")
    for (x, y, i), (hx, hy, hi) in zip(gpu, host, strict=True):
        assert torch.equal(i, hi) and torch.equal(y, hy) and torch.equal(x, hx)
    counts = gpu.stats()["decode"]
    refused = sum(len(stoker.load.loader.open_dataset(packed).read(i)) % 3 == 0
                  for i, meta in kinds(packed).items()
                  if meta["format"] == "jpg" and not meta["progressive"])  # fmt: skip
    assert counts["device_failed"] == refused > 3
    assert counts["device"] + counts["device_failed"] == 30


@pytest.fixture(scope="module")
def corrupt_pack(tmp_path_factory):
    """A WebDataset shard (read as it is: stoker.pack would refuse them) of 22 good JPEGs and
    two whose headers parse but which libjpeg refuses to decode (a quantisation table never
    defined, a bogus Huffman table: before any pixel, `image_info`'s "starts" is false)."""
    root = shared_data()
    good = sorted((root / "imagenet-sample").glob("*.JPEG"))[:22]
    bad = [root / "jpeg-corrupt/go-fuzz-corpus-jpeg/39f8a0b04e00ad1a22a276138a7d0d2531547cc1-1",
           root / "jpeg-corrupt/jpeg-decoder-crashtest/imagetestsuite/"
                  "c52ffdd6a0346c4d09271f8ccbdfd5a3.jpg"]  # fmt: skip
    files = [(f"good{k:02d}", p) for k, p in enumerate(good)]
    files[5:5] = [("zbad0", bad[0])]
    files[17:17] = [("zbad1", bad[1])]
    members = [(key, "jpg", path.read_bytes(), k % 3) for k, (key, path) in enumerate(files)]
    return write_tar(tmp_path_factory.mktemp("corrupt") / "mixed.tar", members)


class Garbage(StandIn):
    """A batched decode that reports every image decoded, as nvImageCodec's hardware engines
    do: a file libjpeg refuses comes out grey."""

    def decode_into(self, blobs, regions, targets):
        done = super().decode_into(blobs, regions, targets)
        for i, ok in enumerate(done):
            if not ok:
                targets.view(i).fill_(128)
        return [True] * len(done)


@pytest.mark.parametrize("on_error", ["raise", "skip", "replace"])
def test_a_corrupt_file_meets_on_error_as_on_the_host_path(corrupt_pack, monkeypatch, on_error):
    """Named and raised, left out (the batch one shorter, the sample listed) or replaced by the
    same substitute, exactly as the host path does, with a device that calls every file
    decoded: the workers keep the files libjpeg refuses before any pixel (an undefined
    quantisation table, a bogus Huffman table) on the host, whose verdict meets on_error."""
    decoder = Garbage()
    monkeypatch.setattr(gpu_decode, "decoder_for",
                        lambda device, batch_size=0: gpu_decode.DecoderFactory.reusing(decoder))
    common = dict(train=False, on_error=on_error, batch_size=8)
    host, gpu = loader(corrupt_pack, **common), loader(corrupt_pack, decode="gpu", **common)
    if on_error == "raise":
        with pytest.raises(stoker.CorruptDataError) as theirs:
            list(host)
        with pytest.raises(stoker.CorruptDataError) as mine:
            list(gpu)
        assert str(mine.value) == str(theirs.value) and "zbad" in str(mine.value)
        return
    want, got = list(host), list(gpu)
    for (x, y, i), (hx, hy, hi) in zip(got, want, strict=True):
        assert torch.equal(i, hi) and torch.equal(y, hy) and torch.equal(x, hx)
    mine, theirs = gpu.stats(), host.stats()
    assert mine["skipped"] == theirs["skipped"] == 2
    assert mine["replaced"] == theirs["replaced"] == (2 if on_error == "replace" else 0)
    assert mine["skipped_samples"] == theirs["skipped_samples"]
    assert (mine["decode"]["device"], mine["decode"]["device_failed"]) == (22, 0)
    budget = loader(corrupt_pack, decode="gpu", max_errors=1, **common)
    with pytest.raises(stoker.ErrorBudgetExceededError, match="2 samples of this pass failed"):
        list(budget)


def test_resume_ranks_and_batch_at_are_the_host_paths(packed, stand_in):
    """Mid-epoch resume, two ranks and batch_at with decode="gpu": the host path's batches."""
    common = dict(train=True, batch_size=4, seed=9)
    whole = [tuple(t.clone() for t in b) for b in loader(packed, decode="gpu", **common)]
    first = loader(packed, decode="gpu", **common)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    resumed = loader(packed, decode="gpu", **common)
    resumed.load_state_dict(state)
    rest = [tuple(t.clone() for t in b) for b in resumed]
    assert len(rest) == len(whole) - 3
    for a, b in zip(rest, whole[3:], strict=True):
        assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    again = loader(packed, decode="gpu", **common).batch_at(0, 5)
    assert all(torch.equal(p, q) for p, q in zip(again, whole[5], strict=True))
    for rank in (0, 1):
        mine = list(loader(packed, decode="gpu", rank=rank, world_size=2, **common))
        theirs = list(loader(packed, rank=rank, world_size=2, **common))
        for a, b in zip(mine, theirs, strict=True):
            assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))


def test_decode_options_are_checked(packed, stand_in, monkeypatch):
    with pytest.raises(stoker.InvalidArgumentError, match="give device='cuda'"):
        stoker.ImageLoader(packed, batch_size=4, decode="gpu")
    with pytest.raises(stoker.InvalidArgumentError, match="'host', 'gpu' or 'auto'"):
        stoker.Image(decode="nvjpeg")
    with pytest.raises(stoker.InvalidArgumentError, match="follows no other field"):
        stoker.Image(decode="gpu", follow="image")
    with pytest.raises(stoker.InvalidArgumentError, match="resident"):
        stoker.ImageLoader(packed, batch_size=4, decode="gpu", device="cpu", resident=True)
    with pytest.raises(stoker.InvalidArgumentError, match="map="):
        loader(packed, decode="gpu", map=lambda s: {})
    monkeypatch.undo()  # the real decoder_for: a CUDA device only
    with pytest.raises(stoker.DeviceUnavailableError, match="CUDA device"):
        stoker.ImageLoader(packed, batch_size=4, decode="gpu", device="cpu")


def test_without_nvimgcodec_the_error_says_how_to_install_it(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_nvidia(name, *args, **kwargs):
        if name == "nvidia" or name.startswith("nvidia."):
            raise ImportError("No module named 'nvidia'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_nvidia)
    with pytest.raises(stoker.DeviceUnavailableError, match=r"pip install 'stoker\[gpu\]'"):
        gpu_decode.load_nvimgcodec()


def test_auto_without_a_device_decoder_decodes_on_the_host(packed):
    """decode="auto" where there is no device decoder (here: the CPU) is the host path, and
    says why in stats()."""
    host = list(loader(packed, train=True))
    auto = loader(packed, train=True, decode="auto")
    for a, b in zip(auto, host, strict=True):
        assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert "CUDA device" in auto.stats()["decode"]["note"]


def test_balanced_share_gives_both_sides_the_same_time():
    assert split.balanced_share(host_rate=3000, device_rate=1000) == 0.25
    assert split.balanced_share(host_rate=1000, device_rate=1000) == 0.5
    for host_rate, device_rate in [(2000, 15000), (8000, 3000)]:
        share = split.balanced_share(host_rate, device_rate)
        assert share * 256 / device_rate == pytest.approx((1 - share) * 256 / host_rate)


def test_the_split_follows_the_measured_rates():
    """Fed totals as a host at 2,000 images/s (4 threads) and a device at 6,000 would make them,
    the share settles at 0.75; with the device slowing to 1,000, at a third."""
    s = split.HostDeviceSplit()
    t = split._Totals()
    for _ in range(30):
        host_n, device_n = int(256 * (1 - s.share)), int(256 * s.share)
        t = split._Totals(
            t.host_seconds + host_n * 4 / 2000,
            t.host_images + host_n,
            t.device_seconds + device_n / 6000,
            t.device_images + device_n,
        )
        s.update(t, threads=4)
    assert s.share == pytest.approx(0.75, abs=0.01)
    for _ in range(30):
        host_n, device_n = int(256 * (1 - s.share)), int(256 * s.share)
        t = split._Totals(
            t.host_seconds + host_n * 4 / 2000,
            t.host_images + host_n,
            t.device_seconds + device_n / 1000,
            t.device_images + device_n,
        )
        s.update(t, threads=4)
    assert s.share == pytest.approx(1 / 3, abs=0.01)


def test_auto_splits_each_batch_and_keeps_the_batches(packed, monkeypatch):
    """decode="auto" with a device decoder: the engine hands the device its share of each batch
    (its first positions), the rest is decoded by the workers; the batches are the host path's
    (the stand-in's pixels are the host's) whatever the split."""
    decoder = StandIn()
    monkeypatch.setattr(gpu_decode, "decoder_for",
                        lambda device, batch_size=0: gpu_decode.DecoderFactory.reusing(decoder))
    host = list(loader(packed, train=True, batch_size=12))
    auto = loader(packed, train=True, batch_size=12, decode="auto")
    assert auto._engine.device_share == 0.5
    seen = []
    real = gpu_decode.DeviceDecodeStage.__call__

    def spy(self, images):
        seen.append(self.pending[0].on_device.tolist())
        return real(self, images)

    monkeypatch.setattr(gpu_decode.DeviceDecodeStage, "__call__", spy)
    for a, b in zip(auto, host, strict=True):
        assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert all(rows and max(rows) < 6 for rows in seen)  # the first half of each batch at most
    counts = auto.stats()["decode"]
    assert counts["device"] == sum(map(len, seen)) and counts["share"] == 0.5
    from stoker.load.stages.decode import DeviceDecodeQueue

    auto._chain.find(DeviceDecodeQueue).split = None  # the share held where set: 0 offers nothing
    auto._engine.device_share = 0.0
    list(auto)
    assert auto.stats()["decode"]["device"] == counts["device"]  # nothing more offered


class MarkerBlind(StandIn):
    """A device decoder whose parser takes every 3-component JPEG as YCbCr, as nvJPEG's does:
    the components of a JPEG coded as RGB (an Adobe marker with transform 0) come out converted
    as if they were Y, Cb and Cr (JFIF's matrix), where libjpeg honours the marker."""

    def decode_into(self, blobs, regions, targets):
        done = super().decode_into(blobs, regions, targets)
        for i, data in enumerate(blobs):
            info = _core.image_info(data)
            if done[i] and info["components"] == 3 and not info["ycbcr"]:
                y, cb, cr = (c.float() for c in targets.view(i).unbind(-1))
                rgb = torch.stack([y + 1.402 * (cr - 128),
                                   y - 0.344136 * (cb - 128) - 0.714136 * (cr - 128),
                                   y + 1.772 * (cb - 128)], dim=-1)  # fmt: skip
                targets.view(i).copy_(rgb.round().clamp(0, 255).to(torch.uint8))
        return done


def test_a_jpeg_coded_as_rgb_stays_on_the_host(tmp_path, monkeypatch):
    """An Adobe marker with transform 0 says a JPEG's components are R, G, B (Pillow's
    keep_rgb=True writes one); a device decoder would read them as YCbCr, colours shifted. Such
    files are decoded on the host: the batches equal the host path's, the YCbCr ones still go to
    the device."""
    photos = sorted((shared_data() / "imagenet-sample").glob("*.JPEG"))[:8]
    folder = tmp_path / "src" / "photos"
    folder.mkdir(parents=True)
    for k, path in enumerate(photos):
        with Image.open(path) as im:
            im.convert("RGB").reduce(4).save(folder / f"{k}.jpg", quality=90, keep_rgb=k % 2 == 0)
    stoker.pack(tmp_path / "src", tmp_path / "pack", progress=False)
    rgb = [i for i, meta in kinds(tmp_path / "pack").items() if not meta["ycbcr"]]
    assert len(rgb) == 4, "the pack keeps the Adobe marker"
    decoder = MarkerBlind()
    monkeypatch.setattr(gpu_decode, "decoder_for",
                        lambda device, batch_size=0: gpu_decode.DecoderFactory.reusing(decoder))
    host = list(loader(tmp_path / "pack", train=False, batch_size=4))
    gpu = loader(tmp_path / "pack", train=False, batch_size=4, decode="gpu")
    for (x, _, i), (hx, _, hi) in zip(gpu, host, strict=True):
        assert torch.equal(i, hi) and torch.equal(x, hx), i
    counts = gpu.stats()["decode"]
    assert (counts["device"], counts["host"]) == (4, 4)



def test_only_files_libjpeg_refuses_fail_to_start():
    """`starts` (what the workers ask before handing a JPEG to the device): every JPEG of
    jpeg-variety that decodes starts (CMYK, RGB-coded, grey, every subsampling among them); the
    corrupt-file test's two do not, and neither decodes."""
    root = shared_data()
    checked = 0
    for path in sorted((root / "jpeg-variety").rglob("*")):
        data = path.read_bytes() if path.is_file() else b""
        try:
            info = _core.image_info(data)
        except stoker.StokerError:
            continue
        if info["format"] != "jpg":
            continue
        try:
            _core.decode_image(data)
        except stoker.StokerError:
            continue
        assert info["starts"], path
        checked += 1
    assert checked > 20
    for name in ("go-fuzz-corpus-jpeg/39f8a0b04e00ad1a22a276138a7d0d2531547cc1-1",
                 "jpeg-decoder-crashtest/imagetestsuite/c52ffdd6a0346c4d09271f8ccbdfd5a3.jpg"):
        data = (root / "jpeg-corrupt" / name).read_bytes()
        assert not _core.image_info(data)["starts"], name
        with pytest.raises(stoker.CorruptDataError):
            _core.decode_image(data)
