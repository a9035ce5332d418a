"""decode="gpu" on a CUDA device (issue 22): nvJPEG decoding against the host path over
imagenet-sample (the same samples and geometry; PSNR >= 30 dB mean), the host fallback for
the files nvJPEG does not take, and the feed's contracts with the stage in it. The figures are
printed (-s) for docs/GPU.md. Not yet run on a device."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

import stoker


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.double() - b.double()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


@pytest.mark.parametrize("train", [True, False])
def test_nvjpeg_batches_match_the_host_path(gpu_pack, train):
    common = dict(batch_size=128, size=224, seed=1, threads=4, device="cuda", dtype=torch.uint8,
                  train=train, return_index=True)  # fmt: skip
    host = list(stoker.ImageLoader(gpu_pack, **common))
    gpu_loader = stoker.ImageLoader(gpu_pack, decode="gpu", **common)
    gpu = list(gpu_loader)
    values = []
    for (x, _, i), (h, _, j) in zip(gpu, host, strict=True):
        assert torch.equal(i, j) and x.device.type == "cuda"
        values += [psnr(x[k], h[k]) for k in range(len(x))]
    finite = [v for v in values if v != math.inf]
    mean = statistics.mean(finite) if finite else math.inf
    print(f"\ndecode='gpu' against the host path ({'train' if train else 'eval'}): PSNR mean "
          f"{mean:.1f} dB, min {min(values):.1f}; {gpu_loader.stats()['decode']}")  # fmt: skip
    assert mean >= 30
    assert gpu_loader.stats()["decode"]["device"] > 0


def test_fallback_files_are_decoded_on_the_host(tmp_path):
    from conftest import make_image_folder  # PNG, progressive and grey files among JPEGs

    pack = tmp_path / "pack"
    stoker.pack(make_image_folder(tmp_path / "src"), pack, progress=False)
    common = dict(batch_size=6, size=64, seed=3, device="cuda", dtype=torch.uint8, train=False)
    host = list(stoker.ImageLoader(pack, **common))
    gpu_loader = stoker.ImageLoader(pack, decode="gpu", **common)
    gpu = list(gpu_loader)
    for (x, _), (h, _) in zip(gpu, host, strict=True):
        for k in range(len(x)):
            assert psnr(x[k], h[k]) > 30
    counts = gpu_loader.stats()["decode"]
    assert counts["host"] >= 6 and counts["device"] >= 24, counts


def test_normalised_and_augmented_after_decoding(gpu_pack):
    import stoker.augment as A

    loader = stoker.ImageLoader(gpu_pack, batch_size=64, decode="gpu", device="cuda",
                                augment=[A.RandomGrayscale(1.0)])  # fmt: skip
    x, _ = next(iter(loader))
    assert x.dtype == torch.float32 and x.is_cuda
    assert torch.allclose(x[:, 0] * 0.229 + 0.485, x[:, 1] * 0.224 + 0.456, atol=1e-2)
