"""stoker.augment.mix: MixUp/CutMix against a per-sample reference of timm's Mixup written out
here with numpy and Python floats (timm is not installed on this machine), fed the same uniforms.

Tolerances: functional mixup and cutmix are exact (same float32 operations, a pasted box is a
copy); the Beta draw matches the textbook polar formula to 1e-7 and Beta(a, a)'s moments to
five standard errors; the whole class matches the reference to 1e-6 (its lam comes from a
differently written but equal formula, so the last float32 bit may differ)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from stoker.augment.mix import (
    BETA_TRIES,
    MixUp,
    box_lam,
    cutmix,
    mixup,
    one_hot,
    rand_bbox,
    rand_bbox_minmax,
    sample_beta,
)

N, C, H, W = 8, 3, 32, 48
CLASSES = 10


def batch(dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (N, C, H, W), generator=g, dtype=torch.uint8)
    return x if dtype == torch.uint8 else x.to(dtype) / 255


LABELS = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])


class Recorder:
    """A `uniform` that records what it handed out, by name; `fixed` overrides some names."""

    def __init__(self, seed: int, fixed: dict[str, list[float]] | None = None):
        self.gen = torch.Generator().manual_seed(seed)
        self.fixed = fixed or {}
        self.values: dict[str, list[float]] = {}

    def __call__(self, name: str, n: int) -> torch.Tensor:
        assert name not in self.values, f"{name} drawn twice"
        if name in self.fixed:
            v = torch.tensor(self.fixed[name], dtype=torch.float64)
        else:
            v = torch.rand(n, generator=self.gen, dtype=torch.float64)
        self.values[name] = v.tolist()
        return v


# --- the reference: timm's Mixup, per sample, from the recorded uniforms -------------------


def beta_ref(alpha: float, us: list[float]) -> float:
    """Bailey's polar t generator, then X = (1 + T / sqrt(nu + T^2)) / 2, as printed."""
    nu = 2 * alpha
    for k in range(len(us) // 2):
        u, v = 2 * us[2 * k] - 1, 2 * us[2 * k + 1] - 1
        w = u * u + v * v
        if 0 < w < 1:
            t = u * math.sqrt(nu * (w ** (-2 / nu) - 1) / w)
            return 0.5 * (1 + t / math.sqrt(nu + t * t))
    return 0.5


def bbox_ref(lam: float, uy: float, ux: float) -> tuple[int, int, int, int]:
    ratio = math.sqrt(1 - lam)
    cut_h, cut_w = int(H * ratio), int(W * ratio)
    cy, cx = int(uy * H), int(ux * W)
    clip = np.clip
    return (
        int(clip(cy - cut_h // 2, 0, H)),
        int(clip(cy + cut_h // 2, 0, H)),
        int(clip(cx - cut_w // 2, 0, W)),
        int(clip(cx + cut_w // 2, 0, W)),
    )


def bbox_minmax_ref(minmax, uh, uw, uy, ux) -> tuple[int, int, int, int]:
    lo_h, hi_h, lo_w, hi_w = (int(H * minmax[0]), int(H * minmax[1]),
                              int(W * minmax[0]), int(W * minmax[1]))  # fmt: skip
    cut_h, cut_w = lo_h + int(uh * (hi_h - lo_h)), lo_w + int(uw * (hi_w - lo_w))
    y0, x0 = int(uy * (H - cut_h)), int(ux * (W - cut_w))
    return y0, y0 + cut_h, x0, x0 + cut_w


def timm_ref(mix: MixUp, x: np.ndarray, labels: np.ndarray, drawn: dict[str, list[float]]):
    """timm's _mix_batch / _mix_pair / _mix_elem and mixup_target, one sample at a time."""
    n = len(x)
    rows = {"batch": 1, "pair": n // 2, "elem": n}[mix.mode]
    out, lams = x.copy(), np.ones(n)
    for r in range(rows):
        members = {
            "batch": [(i, n - 1 - i) for i in range(n)],
            "pair": [(r, n - 1 - r), (n - 1 - r, r)],
            "elem": [(r, n - 1 - r)],
        }[mix.mode]
        if not drawn["mix.apply"][r] < mix.mix_prob:
            continue
        if mix.mixup_alpha > 0 and mix.cutmix_alpha > 0:
            use_cut = drawn["mix.switch"][r] < mix.switch_prob
        else:
            use_cut = mix.cutmix_alpha > 0
        alpha = mix.cutmix_alpha if use_cut else mix.mixup_alpha
        lam = beta_ref(alpha, [drawn[f"mix.lam.{k}"][r] for k in range(2 * BETA_TRIES)])
        if use_cut:
            if mix.cutmix_minmax is None:
                y0, y1, x0, x1 = bbox_ref(lam, drawn["mix.cy"][r], drawn["mix.cx"][r])
            else:
                y0, y1, x0, x1 = bbox_minmax_ref(
                    mix.cutmix_minmax, *(drawn[k][r] for k in ("mix.cut_h", "mix.cut_w",
                                                               "mix.cy", "mix.cx"))
                )  # fmt: skip
            if mix.correct_lam or mix.cutmix_minmax is not None:
                lam = 1 - (y1 - y0) * (x1 - x0) / (H * W)
            for i, j in members:
                out[i][..., y0:y1, x0:x1] = x[j][..., y0:y1, x0:x1]
        else:
            lam32 = np.float32(lam)
            for i, j in members:
                out[i] = x[i] * lam32 + x[j] * (np.float32(1) - lam32)
        for i, _ in members:
            lams[i] = lam
    smooth = mix.label_smoothing
    off, on = smooth / mix.num_classes, 1 - smooth + smooth / mix.num_classes
    onehot = np.full((n, mix.num_classes), off)
    onehot[np.arange(n), labels] = on
    targets = onehot * lams[:, None] + onehot[::-1] * (1 - lams[:, None])
    return out, targets, lams


CONFIGS = [
    dict(mixup_alpha=0.8, cutmix_alpha=1.0, mode="batch"),
    dict(mixup_alpha=0.8, cutmix_alpha=1.0, mode="pair", label_smoothing=0.0),
    dict(mixup_alpha=0.8, cutmix_alpha=1.0, mode="elem", switch_prob=0.5, prob=0.7),
    dict(mixup_alpha=0.0, cutmix_alpha=2.0, mode="elem", correct_lam=False),
    dict(mixup_alpha=1.0, cutmix_alpha=0.0, mode="elem"),
    dict(mixup_alpha=0.5, cutmix_minmax=(0.2, 0.8), mode="elem"),
    dict(mixup_alpha=0.0, cutmix_minmax=(0.3, 0.9), mode="batch", correct_lam=False),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_matches_timm_reference(config, seed):
    mix = MixUp(num_classes=CLASSES, **config)
    x = batch()
    rec = Recorder(seed)
    out, targets = mix(x, LABELS, uniform=rec)
    want, want_targets, _ = timm_ref(mix, x.numpy(), LABELS.numpy(), rec.values)
    np.testing.assert_allclose(out.numpy(), want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(targets.numpy(), want_targets, rtol=0, atol=1e-6)
    assert targets.dtype == torch.float32
    torch.testing.assert_close(targets.sum(1), torch.ones(N), rtol=0, atol=1e-6)
    assert torch.equal(x, batch())  # the input is left as it was


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_one_hot_smoothing_as_timm(smoothing):
    t = one_hot(LABELS, CLASSES, smoothing)
    off = smoothing / CLASSES
    want = np.full((N, CLASSES), off, dtype=np.float32)
    want[np.arange(N), LABELS.numpy()] = 1 - smoothing + off
    np.testing.assert_array_equal(t.numpy(), want)
    torch.testing.assert_close(t.sum(1), torch.ones(N), rtol=0, atol=1e-6)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
def test_targets_sum_to_one(mode, smoothing):
    mix = MixUp(0.8, 1.0, mode=mode, label_smoothing=smoothing, num_classes=CLASSES, seed=5)
    for _ in range(3):
        _, targets = mix(batch(), LABELS)
        torch.testing.assert_close(targets.sum(1), torch.ones(N), rtol=0, atol=1e-6)
        assert (targets >= 0).all()


def test_mixup_is_exact_per_sample_lam():
    x = batch()
    lam = torch.linspace(0.05, 0.95, N)
    out, targets = mixup(x, one_hot(LABELS, CLASSES), lam)
    xs = x.numpy()
    for i in range(N):
        lam_i = np.float32(lam[i].item())
        want = xs[i] * lam_i + xs[N - 1 - i] * (np.float32(1) - lam_i)
        np.testing.assert_array_equal(out[i].numpy(), want)
        t = np.zeros(CLASSES, np.float32)
        t[LABELS[i]] += lam_i
        t[LABELS[N - 1 - i]] += np.float32(1) - lam_i
        np.testing.assert_allclose(targets[i].numpy(), t, rtol=0, atol=1e-7)
    scalar, _ = mixup(x, one_hot(LABELS, CLASSES), 0.3)  # one lam for all
    assert torch.equal(scalar, mixup(x, one_hot(LABELS, CLASSES), torch.full((N,), 0.3))[0])


def test_mixup_uint8_rounds_half_to_even_as_fast_collate():
    """uint8 in, uint8 out: mixed in float32, np.rint, as timm's FastCollateMixup."""
    x = batch(torch.uint8)
    lam = torch.tensor([0.5, 0.25, 0.7, 0.1, 0.9, 0.5, 0.33, 0.0])
    out, _ = mixup(x, one_hot(LABELS, CLASSES), lam)
    assert out.dtype == torch.uint8
    xs = x.numpy().astype(np.float32)
    for i in range(N):
        lam_i = np.float32(lam[i].item())
        want = np.rint(xs[i] * lam_i + xs[N - 1 - i] * (np.float32(1) - lam_i)).astype(np.uint8)
        np.testing.assert_array_equal(out[i].numpy(), want)
    # lam 0.5 on 1 and 2 gives 1.5: half to even is 2, on 2 and 3 it gives 2 (not 3)
    pair = torch.tensor([1, 2, 3, 2], dtype=torch.uint8).view(4, 1, 1, 1).expand(4, 1, 2, 2)
    got, _ = mixup(pair, one_hot(torch.arange(4), 4), 0.5)
    assert got[:, 0, 0, 0].tolist() == [2, 2, 2, 2]
    with pytest.raises(TypeError):
        mixup(x.to(torch.int32), one_hot(LABELS, CLASSES), 0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_cutmix_pastes_partner_box_and_corrects_lam(dtype):
    x = batch(dtype)
    g = torch.Generator().manual_seed(4)
    lam = torch.rand(N, generator=g)
    box = rand_bbox((H, W), lam, torch.rand(N, generator=g), torch.rand(N, generator=g))
    out, targets = cutmix(x, one_hot(LABELS, CLASSES), box)
    xs = x.numpy()
    areas = []
    for i in range(N):
        y0, y1, x0, x1 = (int(b[i]) for b in box)
        want = xs[i].copy()
        want[:, y0:y1, x0:x1] = xs[N - 1 - i][:, y0:y1, x0:x1]
        np.testing.assert_array_equal(out[i].numpy(), want)
        areas.append((y1 - y0) * (x1 - x0))
        lam_i = 1 - areas[-1] / (H * W)
        assert box_lam(box, (H, W))[i].item() == pytest.approx(lam_i, abs=1e-7)
        t = np.zeros(CLASSES)
        t[LABELS[i]] += lam_i
        t[LABELS[N - 1 - i]] += 1 - lam_i
        np.testing.assert_allclose(targets[i].numpy(), t, rtol=0, atol=1e-6)
    assert len(set(areas)) > 1  # the boxes really differ per sample
    # an uncorrected lam is used as given
    _, raw = cutmix(x, one_hot(LABELS, CLASSES), box, lam=lam)
    want = lam[:, None] * one_hot(LABELS, CLASSES) + (1 - lam[:, None]) * one_hot(
        LABELS.flip(0), CLASSES
    )
    torch.testing.assert_close(raw, want)


def test_rand_bbox_as_timm():
    g = torch.Generator().manual_seed(7)
    lam, uy, ux = (torch.rand(64, generator=g, dtype=torch.float64) for _ in range(3))
    box = rand_bbox((H, W), lam, uy, ux)
    for i in range(64):
        assert tuple(int(b[i]) for b in box) == bbox_ref(lam[i].item(), uy[i].item(), ux[i].item())
    mm = rand_bbox_minmax((H, W), (0.2, 0.8), lam, uy, ux, lam.flip(0))
    for i in range(64):
        args = (lam[i].item(), uy[i].item(), ux[i].item(), lam.flip(0)[i].item())
        assert tuple(int(b[i]) for b in mm) == bbox_minmax_ref((0.2, 0.8), *args)
    # uniforms just below 1 stay inside the image
    top = torch.full((4,), 1 - 2**-24)
    y0, y1, x0, x1 = rand_bbox_minmax((H, W), (0.0, 1.0), top, top, top, top)
    assert (y1 <= H).all() and (x1 <= W).all() and (y1 > y0).all()


@pytest.mark.parametrize("alpha", [0.2, 0.8, 1.0, 4.0])
def test_beta_moments(alpha):
    n = 100_000
    u = torch.rand(n, 2 * BETA_TRIES, generator=torch.Generator().manual_seed(11))
    lam = sample_beta(alpha, u)
    assert ((lam >= 0) & (lam <= 1)).all()
    var = 1 / (4 * (2 * alpha + 1))
    # standard errors of the mean and of the variance (via the fourth central moment)
    mu4 = 3 * (2 * alpha + 1) * var**2 / (2 * alpha + 3)  # symmetric Beta's kurtosis
    assert abs(lam.mean().item() - 0.5) < 5 * math.sqrt(var / n)
    assert abs(lam.var().item() - var) < 5 * math.sqrt((mu4 - var**2) / n)


def test_beta_uniform_at_alpha_one_and_matches_formula():
    u = torch.rand(20_000, 2 * BETA_TRIES, generator=torch.Generator().manual_seed(12))
    lam = sample_beta(1.0, u)
    deciles = torch.quantile(lam, torch.linspace(0.1, 0.9, 9, dtype=torch.float64))
    assert torch.allclose(deciles, torch.linspace(0.1, 0.9, 9, dtype=torch.float64), atol=0.015)
    for alpha in (0.4, 1.0, 2.5):
        got = sample_beta(alpha, u[:200])
        for i in range(200):
            # 1e-7: the printed W^(-2/nu) - 1 cancels for W near 1 (the module uses expm1)
            assert got[i].item() == pytest.approx(beta_ref(alpha, u[i].tolist()), abs=1e-7)
    # every pair rejected (outside the unit disc): the documented fallback
    assert sample_beta(0.8, torch.full((3, 2 * BETA_TRIES), 0.999)).tolist() == [0.5] * 3


def test_prob_zero_leaves_images_and_smooths_targets():
    mix = MixUp(0.8, 1.0, prob=0.0, mode="elem", num_classes=CLASSES, seed=1)
    x = batch()
    out, targets = mix(x, LABELS)
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()
    assert torch.equal(targets, one_hot(LABELS, CLASSES, 0.1))
    mix.mixup_enabled = False
    assert torch.equal(mix(x, LABELS)[1], one_hot(LABELS, CLASSES, 0.1))


def test_switch_prob_chooses_cutmix_or_mixup_per_draw():
    mix = MixUp(0.8, 1.0, switch_prob=0.5, mode="elem", num_classes=CLASSES)
    switch = [0.1, 0.9, 0.2, 0.8, 0.3, 0.7, 0.4, 0.6]  # < 0.5: CutMix
    rec = Recorder(3, {"mix.switch": switch, "mix.apply": [0.0] * N})
    x = batch()
    out, _ = mix(x, LABELS, uniform=rec)
    for i in range(N):
        j = N - 1 - i
        pasted = (out[i] == x[j]) & (out[i] != x[i])
        blended = (out[i] != x[i]) & (out[i] != x[j])
        if switch[i] < 0.5:  # pixels are either kept or the partner's
            assert ((out[i] == x[i]) | (out[i] == x[j])).all() and pasted.any()
        else:
            assert blended.float().mean() > 0.9


def test_same_draws_same_output_and_seeded_default():
    x = batch()
    a = MixUp(0.8, 1.0, mode="elem", num_classes=CLASSES)
    first = a(x, LABELS, uniform=Recorder(9))
    again = a(x, LABELS, uniform=Recorder(9))
    assert all(torch.equal(p, q) for p, q in zip(first, again, strict=True))
    s1, s2 = MixUp(0.8, 1.0, mode="elem", seed=4), MixUp(0.8, 1.0, mode="elem", seed=4)
    state = s1.state_dict()
    one = s1(x, LABELS)
    assert all(torch.equal(p, q) for p, q in zip(one, s2(x, LABELS), strict=True))
    s1.load_state_dict(state)  # resume replays the same batch
    assert torch.equal(s1(x, LABELS)[0], one[0])
    assert not torch.equal(s1(x, LABELS)[0], one[0])  # the next batch differs
    assert not torch.equal(MixUp(0.8, 1.0, mode="elem", seed=5)(x, LABELS)[0], one[0])


def test_elem_lams_differ_and_pair_mirrors():
    x = batch()
    rec = Recorder(5, {"mix.apply": [0.0] * N})
    _, targets = MixUp(1.0, mode="elem", label_smoothing=0.0, num_classes=CLASSES)(
        x, LABELS, uniform=rec
    )
    lam = targets[torch.arange(N), LABELS]  # own class weight: no partner shares a label
    assert len({round(v, 4) for v in lam.tolist()}) >= N - 1
    rec = Recorder(5, {"mix.apply": [0.0] * (N // 2)})
    pair = MixUp(1.0, mode="pair", label_smoothing=0.0, num_classes=CLASSES)
    out, _ = pair(x, LABELS, uniform=rec)
    assert len(rec.values["mix.apply"]) == N // 2
    lam = torch.tensor([beta_ref(1.0, [rec.values[f"mix.lam.{k}"][r] for k in range(32)])
                        for r in range(N // 2)], dtype=torch.float32)  # fmt: skip
    lam = torch.cat([lam, lam.flip(0)])
    torch.testing.assert_close(out, mixup(x, one_hot(LABELS, CLASSES), lam)[0])
    with pytest.raises(ValueError, match="even"):
        pair(x[:7], LABELS[:7])


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
@pytest.mark.parametrize("alphas", [(0.8, 1.0), (0.0, 1.0), (1.0, 0.0)])
@pytest.mark.parametrize("mode", ["batch", "elem"])
def test_channels_last_same_values(mode, alphas, dtype):
    mix = MixUp(*alphas, mode=mode, num_classes=CLASSES)
    x = batch(dtype)
    cl = x.contiguous(memory_format=torch.channels_last)
    out, t = mix(x, LABELS, uniform=Recorder(8))
    out_cl, t_cl = mix(cl, LABELS, uniform=Recorder(8))
    assert out_cl.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, out_cl) and torch.equal(t, t_cl)


def test_rejects_bad_arguments():
    with pytest.raises(ValueError):
        MixUp(0.0, 0.0)
    with pytest.raises(ValueError):
        MixUp(mode="row")
    with pytest.raises(ValueError):
        MixUp(cutmix_minmax=(0.8, 0.2))
    with pytest.raises(ValueError, match="shape"):  # a uniform that ignores n
        MixUp(mode="elem")(batch(), LABELS, uniform=lambda name, n: torch.rand(1))
