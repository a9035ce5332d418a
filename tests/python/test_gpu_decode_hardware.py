"""decode="gpu" through stoker's NvImageCodec decoder itself, against nvimgcodec_standin (what
nvImageCodec does unlike a CPU decoder) under cuda_standin (what CUDA does unlike the CPU):
issue 58's findings that live in the decoder. A file nvImageCodec's parser refuses where libjpeg
only warns fails alone and is decoded on the host; whole images decoded for refused regions are
held until the copies out of them have run on the stream."""

from __future__ import annotations

import pytest
import torch
from conftest import after_passes, shared_data, write_tar
from cuda_standin import StandInCuda

import nvimgcodec_standin
import stoker
from stoker.device import gpu_decode
from stoker.device.gpu_decode import backends

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it


@pytest.fixture
def cuda(monkeypatch):
    cuda = StandInCuda(devices=1).install(monkeypatch)
    monkeypatch.setattr(backends, "load_nvimgcodec", lambda: nvimgcodec_standin)
    monkeypatch.setattr(nvimgcodec_standin.Decoder, "cuda", cuda)
    yield cuda
    from stoker.load.loader import _open_loaders

    for loader in list(_open_loaders):  # while the stand-in is there to close them against
        loader.close()


def nvimagecodec(monkeypatch, **options) -> list[backends.NvImageCodec]:
    """decode="gpu" with NvImageCodec (on the stand-in), made with `options`; the decoders made."""
    made: list[backends.NvImageCodec] = []

    def build(on):
        made.append(backends.NvImageCodec(on, **options))
        return made[-1]

    factory = gpu_decode.DecoderFactory(build, backends.NvImageCodec.max_scale_denom)
    monkeypatch.setattr(gpu_decode, "decoder_for", lambda device, batch_size=0: factory)
    return made


def shard(tmp_path, files: list[tuple[str, bytes]]):
    """A WebDataset shard of these JPEGs, read as it is (stoker.pack would rewrite them)."""
    members = [(key, "jpg", data, k % 3) for k, (key, data) in enumerate(files)]
    return write_tar(tmp_path / "shard.tar", members)


def photos(count: int, subsampled: bool = False) -> list[tuple[str, bytes]]:
    """imagenet-sample's first photos (with chroma subsampled: those with 4:2:0 or 4:2:2)."""
    chosen: list[bytes] = []
    for path in sorted((shared_data() / "imagenet-sample").glob("*.JPEG")):
        data = path.read_bytes()
        if not subsampled or nvimgcodec_standin._subsampled(data):
            chosen.append(data)
        if len(chosen) == count:
            break
    return [(f"photo{k:02d}", d) for k, d in enumerate(chosen)]


def batches(path, **kw):
    kw = {"batch_size": 4, "size": 224, "train": False, "threads": 2, "dtype": torch.uint8,
          "return_index": True, **kw}  # fmt: skip
    loader = stoker.ImageLoader(path, **kw)
    return loader, [(x.clone(), i.clone()) for x, _, i in loader]


def test_a_file_the_parser_refuses_fails_alone_and_is_decoded_on_the_host(
    cuda, tmp_path, monkeypatch
):
    """Two bytes between a JPEG's APP0 segment and its next marker: libjpeg skips them with a
    warning, nvImageCodec's parser raises when the code stream is made. The batch is decoded,
    that file on the host: every batch is the host path's."""
    files = photos(8)
    data = files[5][1]
    after_app0 = 4 + int.from_bytes(data[4:6], "big")
    assert data[2:4] == b"\xff\xe0" and data[after_app0] == 0xFF
    files[5] = ("marked", data[:after_app0] + b"\x00\x00" + data[after_app0:])
    path = shard(tmp_path, files)
    with pytest.raises(RuntimeError, match="Invalid marker"):
        nvimgcodec_standin.CodeStream(files[5][1])
    made = nvimagecodec(monkeypatch)
    gpu, got = batches(path, device="cuda", decode="gpu")
    _, want = batches(path, device="cpu")
    for (x, i), (hx, hi) in zip(got, want, strict=True):
        assert torch.equal(i, hi) and torch.equal(x, hx), i
    assert made[0].refused_streams == 1
    assert gpu.stats()["decode"]["device_failed"] == 1


def test_whole_images_for_refused_regions_are_held_until_copied(cuda, tmp_path, monkeypatch):
    """Without fancy upsampling for regions, nvImageCodec refuses every region of a subsampled
    JPEG; each is decoded whole into a block nvImageCodec allocates on the stream and the region
    copied out of it on the stream. A block let go before that copy ran would be the next
    request's, written when the next call is made: the whole images are held until an event
    after their copies completes (the stand-in counts a block let go with a copy pending)."""
    path = shard(tmp_path, photos(12, subsampled=True))
    made = nvimagecodec(monkeypatch, options=":fancy_upsampling=1")
    gpu, got = batches(path, device="cuda", decode="gpu")
    nvimagecodec(monkeypatch)  # regions allowed: the same pixels, decoded as regions
    _, want = batches(path, device="cuda", decode="gpu")
    for (x, i), (rx, ri) in zip(got, want, strict=True):
        assert torch.equal(i, ri) and torch.equal(x, rx), i
    gpu.close()
    for stream in cuda.streams:
        stream.run(stream.queued, force=True)
    assert made[0].refused_regions == 12 and gpu.stats()["decode"]["device_failed"] == 0
    assert made[0].decoder.allocated < 12, "blocks handed back are reused"
    assert cuda.freed_early == 0


def test_between_passes_the_stage_holds_no_memory_of_its_batches(cuda, tmp_path, monkeypatch):
    """tests/gpu's memory test reads the device's memory after whole passes (after_passes), so
    that what it sees grow is a leak, not the stage at work: then the stage holds no ring
    buffer and no whole image kept for a copy (every region refused, as without fancy
    upsampling for regions), and every block nvImageCodec allocated is back in its pool. In
    the middle of a pass it holds both, sized by the pass's largest batch so far."""
    path = shard(tmp_path, photos(12, subsampled=True))
    made = nvimagecodec(monkeypatch, options=":fancy_upsampling=1")
    loader = stoker.ImageLoader(path, batch_size=4, size=224, threads=2, device="cuda",
                                decode="gpu", dtype=torch.uint8)  # fmt: skip

    def held():
        pool = made[0].decoder
        in_use = pool.allocated - sum(len(free) for free in pool._free.values())
        return loader.stats()["decode"]["ring_bytes"], len(made[0]._held), in_use

    at = after_passes(loader, (3, 9), held)
    assert at == {3: (0, 0, 0), 9: (0, 0, 0)}
    during, decode_into = [], made[0].decode_into

    def read_after(*args):  # on the stage thread, as each batch's decode call returns
        done = decode_into(*args)
        during.append(held())
        return done

    made[0].decode_into = read_after
    for _ in loader:
        pass
    assert len(during) == 3 and all(ring > 0 and whole > 0 and used > 0
                                    for ring, whole, used in during), during  # fmt: skip
    loader.close()
