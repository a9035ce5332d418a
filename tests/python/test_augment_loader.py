"""Loader(..., augment=...): batch augmentations applied to each batch with its samples' keyed
draws: the same batches as applying the pipeline by hand, whatever the thread count, after a
resume, and through the device feed (device="cpu", the feed's own path with a CPU backend)
before it normalises."""

from __future__ import annotations

import pickle

import pytest
import torch

import stoker
import stoker.augment as A
from stoker.augment.keyed import KeyedDraws
from stoker.augment.pipeline import Pipeline
from stoker.device import Normalize

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it


class Solarized(A.BatchOp):
    """A user's own batch op: it has no worker form."""

    name = "solarized"

    def apply(self, images, draws):
        return A.functional.solarize(images, draws.uniform("threshold", 100, 255) * 1.0)


RECIPE = [A.RandAugment(2, 9), A.ColorJitter(0.3, 0.3, 0.3), A.RandomErasing(0.5)]
TIMM_RECIPE = [
    A.TimmRandAugment.from_config("rand-m9-mstd0.5", prob=0.9),
    A.RandomErasing(0.5, value=(9, 99, 199)),
    A.RandomGrayscale(0.2),
]
# Its first two ops run in the workers, the user's op and the ColorJitter after it on the batch.
SPLIT_RECIPE = [A.TrivialAugmentWide(), A.RandomGrayscale(0.3), Solarized(), A.ColorJitter(0.3)]
# On the host, each recipe's ops run in the C++ threads as each image is decoded, up to the
# first op without a worker form; by_hand runs them all as batch ops.
IN_WORKERS = {"torchvision": 3, "timm": 3, "split": 2}
RECIPES = pytest.mark.parametrize(
    "recipe", [RECIPE, TIMM_RECIPE, SPLIT_RECIPE], ids=list(IN_WORKERS)
)
MIX = A.MixUp(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=3, label_smoothing=0.1)


def loader(pack, **kw):
    kw.setdefault("threads", 2)
    return stoker.ImageLoader(pack, batch_size=8, size=48, seed=3, **kw)


def by_hand(pack, augment, epoch=0, **kw):
    """The loader's batches without augment, then the pipeline applied here."""
    pipeline = Pipeline(augment)
    plain = loader(pack, return_index=True, **kw)
    plain.set_epoch(epoch)
    out = []
    for images, labels, indices in plain:
        # NCHW-contiguous: the ops' torch path (a channels_last uint8 batch takes their C++ one)
        out.append(pipeline(images.contiguous(), labels, KeyedDraws(3, epoch, indices)))
    return out


def batches(ld, epoch=0):
    ld.set_epoch(epoch)
    return [tuple(b) for b in ld]


@RECIPES
def test_augment_is_the_pipeline_applied_to_each_batch(packed, recipe, request):
    want = by_hand(packed, recipe, epoch=1)
    ld = loader(packed, augment=recipe)
    assert ld._augment.in_workers == IN_WORKERS[request.node.callspec.id]
    got = batches(ld, epoch=1)
    assert len(got) == len(want) == 5
    for (images, labels), (w_images, w_labels) in zip(got, want, strict=True):
        assert images.dtype == torch.uint8 and torch.equal(images, w_images)
        assert torch.equal(labels, w_labels)
    plain = batches(loader(packed), epoch=1)
    assert not torch.equal(got[0][0], plain[0][0])  # it did augment


@RECIPES
def test_the_same_whatever_the_threads_and_after_a_resume(packed, recipe):
    full = batches(loader(packed, augment=recipe + [MIX], threads=2), epoch=2)
    one = batches(loader(packed, augment=recipe + [MIX], threads=1), epoch=2)
    for a, b in zip(full, one, strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    first = loader(packed, augment=recipe + [MIX])
    first.set_epoch(2)
    it = iter(first)
    for _ in range(2):
        next(it)
    state = first.state_dict()
    resumed = loader(packed, augment=recipe + [MIX])
    resumed.load_state_dict(state)
    rest = [tuple(b) for b in resumed]
    assert len(rest) == len(full) - 2
    for a, b in zip(rest, full[2:], strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_mixup_gives_soft_targets(packed):
    got = batches(loader(packed, augment=RECIPE + [MIX]))
    for images, targets in got:
        assert images.dtype == torch.uint8
        assert targets.dtype == torch.float32 and targets.shape == (len(images), 3)
        torch.testing.assert_close(targets.sum(dim=1), torch.ones(len(images)))
    assert any((t.max(dim=1).values < 0.9).any() for _, t in got)  # mixed, not just smoothed


@RECIPES
def test_through_the_device_feed_before_normalising(packed, recipe):
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    want = by_hand(packed, recipe + [MIX])
    normalize = Normalize(mean, std, torch.float32)
    fed = loader(packed, augment=recipe + [MIX], device="cpu", mean=mean, std=std)
    got = batches(fed)
    assert len(got) == len(want)
    for (images, targets), (w_images, w_targets) in zip(got, want, strict=True):
        torch.testing.assert_close(images, normalize(w_images), atol=0, rtol=0)
        torch.testing.assert_close(targets, w_targets, atol=0, rtol=0)


def test_return_index_and_the_loaders_dict_batches(packed):
    got = batches(loader(packed, augment=RECIPE, return_index=True))
    assert all(len(b) == 3 and b[2].dtype == torch.int64 for b in got)
    ld = stoker.Loader(
        packed, batch_size=8, seed=3, threads=2, augment=[A.RandomGrayscale(1.0)],
        fields={"image": stoker.Image(size=40), "label": stoker.Label()},
    )  # fmt: skip
    for batch in ld:
        assert set(batch) == {"image", "label"}  # the indices it needed are not handed out
        img = batch["image"]
        assert torch.equal(img[:, 0], img[:, 1]) and torch.equal(img[:, 1], img[:, 2])


def test_a_loader_with_augment_pickles(packed):
    ld = loader(packed, augment=RECIPE + [MIX])
    again = pickle.loads(pickle.dumps(ld))
    a, b = batches(ld), batches(again)
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


def test_augment_arguments_are_checked(packed):
    with pytest.raises(stoker.InvalidArgumentError, match="goes last"):
        loader(packed, augment=[MIX, A.ColorJitter(0.1)])
    with pytest.raises(stoker.InvalidArgumentError, match=r"augment\[0\]"):
        loader(packed, augment=[lambda x: x])
    with pytest.raises(stoker.InvalidArgumentError, match="follow"):
        stoker.Loader(
            packed, batch_size=8, augment=[A.RandomGrayscale(0.5)],
            fields={"image": stoker.Image(size=40),
                    "mask": stoker.Mask("png", follow="image", optional=True)},
        )  # fmt: skip
    with pytest.raises(stoker.InvalidArgumentError, match="Label field"):
        stoker.Loader(packed, batch_size=8, augment=[MIX],
                      fields={"image": stoker.Image(size=40)})  # fmt: skip
