"""What the model saw: a step's batch drawn as a contact sheet (``stoker.show``, ``stoker
show``).

A loader's batches depend only on (seed, epoch, sample index), so a step's batch is computed
again rather than logged (``Loader.sample_ids``, ``Loader.batch_at``); stoker.load.record's
``record=`` is for what a computation cannot know afterwards: which steps a job actually ran.
"""

from __future__ import annotations

import base64
import functools
import html
import io
import os
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError
from ..load.fields import Audio, Boxes, Image, Label, Mask, Video

_PALETTE = [
    (230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
    (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128),
    (220, 190, 255), (170, 110, 40), (255, 250, 200), (128, 0, 0),
]  # fmt: skip


def augment_draws(loader: Any, epoch: int, step: int) -> list[dict[str, Any]]:
    """What each sample of batch `step` of `epoch` (on the loader's rank) drew in its
    ``augment=`` policies (RandAugment, TrivialAugmentWide, TimmRandAugment), computed, not
    read: ``[{"index", "shard", "key", "ops": [DrawnOp, ...]}]`` in the batch's order, each
    DrawnOp an op with its signed magnitude (and timm's probability, level and filter), in
    the order they run. The loader's workers and its batch ops apply exactly these (every
    draw is keyed by (seed, epoch, sample)); ``stoker show`` prints them under each image."""
    from ..load.loader import Loader

    if not isinstance(loader, Loader):
        raise InvalidArgumentError(
            f"augment_draws reads a stoker Loader's or ImageLoader's draws, not "
            f"{type(loader).__name__}'s"
        )
    samples = loader.sample_ids(epoch, step, rank=loader._engine.options.rank)
    assert isinstance(samples, list)
    drawn = _drawn(loader, epoch, [int(s["index"]) for s in samples])
    return [dict(s, ops=ops) for s, ops in zip(samples, drawn, strict=True)]


def _drawn(loader: Any, epoch: int, indices: list[int]) -> list[list[Any]]:
    """Each sample's drawn policy ops in the loader's augment= ([] without one)."""
    import torch

    from ..augment.keyed import KeyedDraws

    pipeline = loader._augment
    images = [f for n, f in loader.fields.items() if isinstance(f, Image)]
    named = [f for n, f in loader.fields.items() if isinstance(f, Image) and n == "image"]
    if pipeline is None or pipeline.kind != "image" or not images:
        return [[] for _ in indices]
    height, width = (named or images)[0].size
    draws = KeyedDraws(loader.seed, epoch, torch.tensor(indices, dtype=torch.int64))
    return pipeline.drawn(draws, height, width)


def show(loader: Any, epoch: int, step: int, path: str | os.PathLike, *, columns: int = 8) -> Path:
    """Write batch `step` of `epoch` on the loader's rank, as the model saw it, to `path` (an
    HTML page): each image after its crop, flips and augmentation (normalised ones brought back
    to pixels), with its key, pack index and label, the ops and magnitudes its augment=
    policies drew (augment_draws), boxes and masks drawn over it; a loader
    without images shows its Video field's clips as strips of frames (with their times) or its
    Audio field's sounds as a waveform and a log-mel spectrogram, one per row. `loader`: a
    Loader, ImageLoader or stoker.mix (the loader that step drew from is shown). Returns the
    path."""
    from ..load.loader import Loader
    from ..load.mix import Mix

    if isinstance(columns, bool) or not isinstance(columns, int) or columns < 1:
        raise InvalidArgumentError(f"columns must be a positive int, not {columns!r}")
    title = f"epoch {epoch}, step {step}"
    if isinstance(loader, Mix):
        source, source_epoch, source_step = loader.source_at(epoch, step)
        title += f" (source {source}: its epoch {source_epoch}, step {source_step})"
        loader, epoch, step = loader.sources[source], source_epoch, source_step
    kinds = (Image, Video, Audio)
    if not isinstance(loader, Loader) or not any(
        isinstance(f, kinds) for f in loader.fields.values()
    ):
        raise InvalidArgumentError(
            f"show draws a stoker loader's images, clips or sounds: {type(loader).__name__} has "
            "none (loader.sample_ids and batch_at replay any stoker loader)"
        )
    batch = loader._replay(epoch, step, return_index=True)
    rank, world_size = loader._engine.options.rank, loader._engine.options.world_size
    title += f", rank {rank} of {world_size}"
    classes = list(getattr(loader.dataset, "classes", []) or [])
    drawn = _drawn(loader, epoch, [int(v) for v in batch["index"]] if isinstance(batch, dict)
                   else [int(v) for v in batch[-1]])  # fmt: skip

    def caption(i: int, index: Any, label: Any) -> str:
        record = loader.dataset.record(int(index[i]))
        lines = [f"<b>{html.escape(str(record.get('key', '')))}</b>",
                 f"#{int(index[i])} · {html.escape(str(record.get('shard', '')))}"]  # fmt: skip
        if label is not None:
            lines.append(html.escape(_label_text(label[i], classes)))
        if drawn[i]:
            lines.append(html.escape(" · ".join(str(op) for op in drawn[i])))
        return "<br>".join(lines)

    cells = []
    if any(isinstance(f, Image) for f in loader.fields.values()):
        images, labels, boxes, masks, index = _parts(loader, batch)
        images = _pixels(images, _image_scale(loader))
        for i in range(images.shape[0]):
            picture = _picture(images[i])
            if masks is not None:
                picture = _with_mask(picture, masks[i])
            if boxes is not None:
                picture = _with_boxes(picture, boxes, i, classes)
            cells.append(_figure(picture, caption(i, index, labels)))
    else:  # a clip as a strip of its frames; a sound as its waveform and spectrogram
        columns = 1
        name, field = next(
            (n, f) for n, f in loader.fields.items() if isinstance(f, (Video, Audio))
        )
        labels = next((batch[n] for n, f in loader.fields.items() if isinstance(f, Label)), None)
        data, index = batch[name], batch["index"]
        for i in range(data.shape[0]):
            if isinstance(field, Video):
                picture = _clip_strip(data[i], field.layout, batch[name + "_timestamps"][i])
            elif isinstance(field, Audio):
                picture = _sound(data[i], int(batch[name + "_length"][i]), field.sample_rate)
            cells.append(_figure(picture, caption(i, index, labels)))
    count = len(cells)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        "<!doctype html><meta charset='utf-8'>"
        f"<title>stoker: {html.escape(title)}</title>"
        "<style>body{font:13px sans-serif;margin:16px}"
        f"main{{display:grid;grid-template-columns:repeat({columns},auto);gap:8px}}"
        "figure{margin:0}img{image-rendering:pixelated;max-width:100%}"
        "figcaption{word-break:break-all}</style>"
        f"<h3>{html.escape(str(loader.dataset.path))}: {html.escape(title)}, "
        f"{count} samples</h3><main>{''.join(cells)}</main>"
    )
    return out


def _parts(loader: Any, batch: Any) -> tuple[Any, Any, Any, Any, Any]:
    """The batch's images [B, C, H, W], labels, boxes (the dict), masks and indices."""
    if isinstance(batch, tuple):  # ImageLoader: (images, labels, index)
        return batch[0], batch[1], None, None, batch[-1]
    if not isinstance(batch, dict):
        raise InvalidArgumentError(f"cannot show a batch of {type(batch).__name__}")
    fields = loader.fields
    names: dict[type, list[str]] = {kind: [n for n, f in fields.items() if isinstance(f, kind)]
                                     for kind in (Image, Label, Boxes, Mask)}  # fmt: skip
    # The image the masks and boxes follow, else "image", else the first that follows none.
    followed = [getattr(fields[n], "follow", None) for n in names[Mask] + names[Boxes]]
    bases = [n for n in names[Image] if getattr(fields[n], "follow", None) is None]
    image = next((n for n in followed if n in names[Image]), None) or (
        "image" if "image" in names[Image] else (bases or names[Image])[0]
    )
    if image not in batch:
        raise InvalidArgumentError(f"show: the batch has no {image!r} (did map= rename it?)")

    def first(kind: type) -> Any:
        followers = [n for n in names[kind] if getattr(fields[n], "follow", image) == image]
        return batch[followers[0]] if followers else None

    labels = batch[names[Label][0]] if names[Label] else None
    boxes = first(Boxes)
    if boxes is not None:
        box_field = fields[[n for n in names[Boxes] if batch[n] is boxes][0]]
        boxes = dict(boxes, format=box_field.format, normalized=box_field.normalized)
    return batch[image], labels, boxes, first(Mask), batch["index"]


def _image_scale(loader: Any) -> tuple[Any, Any] | None:
    """(mean, std) where the batch's images are normalised floats, to bring back to pixels."""
    normalize = loader._normalize
    if normalize is None:
        return None
    return getattr(normalize, "mean", None), getattr(normalize, "std", None)


def _pixels(images: Any, scale: tuple[Any, Any] | None) -> Any:
    """The batch's images [B, C, H, W] as uint8 on the host: a device feed's normalised floats
    brought back (``x * std + mean``, in [0, 1]); floats without normalising are [0, 1] when the
    whole batch is, else 0-255."""
    import torch

    x = images.detach().to("cpu")
    if x.dtype == torch.uint8:
        return x
    x = x.float()
    if scale is not None and scale[0] is not None:
        x = x * torch.tensor(scale[1]).view(1, -1, 1, 1) + torch.tensor(scale[0]).view(1, -1, 1, 1)
        unit = True
    else:
        unit = bool(x.max() <= 1.0)
    return (x * 255 if unit else x).round().clamp(0, 255).to(torch.uint8)


def _picture(image: Any) -> Any:
    """A PIL image of one uint8 [C, H, W] tensor."""
    import numpy as np
    from PIL import Image as PIL

    pixels = np.ascontiguousarray(image.permute(1, 2, 0).numpy())
    return PIL.fromarray(pixels[..., 0] if pixels.shape[2] == 1 else pixels)


@functools.cache
def _mask_colours() -> Any:
    """The colour of each class id: 0 (background) and 255 (ignore) stay clear."""
    import numpy as np

    colours = np.zeros((256, 3), np.uint8)
    for c in range(1, 255):
        colours[c] = _PALETTE[(c - 1) % len(_PALETTE)]
    return colours


def _with_mask(picture: Any, mask: Any) -> Any:
    import numpy as np
    from PIL import Image as PIL

    m = mask.detach().to("cpu").numpy()
    colours = _mask_colours()
    rgb = np.asarray(picture.convert("RGB")).astype(np.float32)
    painted = (m > 0) & (m < 255)
    rgb[painted] = 0.55 * rgb[painted] + 0.45 * colours[m[painted]]
    return PIL.fromarray(rgb.round().astype(np.uint8))


def _with_boxes(picture: Any, boxes: dict[str, Any], i: int, classes: list[str]) -> Any:
    from PIL import ImageDraw

    picture = picture.convert("RGB")
    draw = ImageDraw.Draw(picture)
    w, h = picture.size
    for b in range(int(boxes["count"][i])):
        x0, y0, x1, y1 = (float(v) for v in boxes["boxes"][i, b].tolist())
        if boxes["format"] == "xywh":
            x1, y1 = x0 + x1, y0 + y1
        elif boxes["format"] == "cxcywh":
            x0, y0, x1, y1 = x0 - x1 / 2, y0 - y1 / 2, x0 + x1 / 2, y0 + y1 / 2
        if boxes["normalized"]:
            x0, x1, y0, y1 = x0 * w, x1 * w, y0 * h, y1 * h
        c = int(boxes["classes"][i, b])
        colour = _PALETTE[c % len(_PALETTE)] if c >= 0 else (255, 255, 255)
        draw.rectangle([x0, y0, x1, y1], outline=colour, width=max(1, w // 160))
        draw.text((x0 + 2, y0 + 1), classes[c] if 0 <= c < len(classes) else str(c), fill=colour)
    return picture


def _label_text(label: Any, classes: list[str]) -> str:
    def name(c: int) -> str:
        return classes[c] if 0 <= c < len(classes) else str(c)

    if getattr(label, "ndim", 0) == 0:
        return f"label {name(int(label))}"
    weights = label.detach().to("cpu").float()  # soft targets (MixUp, CutMix)
    top = weights.topk(min(2, weights.numel()))
    return " + ".join(f"{name(int(c))} {float(w):.2f}" for w, c in zip(*top, strict=True)
                      if float(w) > 0)  # fmt: skip


def _figure(picture: Any, caption: str) -> str:
    return (f'<figure><img src="data:image/png;base64,{_png(picture)}">'
            f"<figcaption>{caption}</figcaption></figure>")  # fmt: skip


def _clip_strip(clip: Any, layout: str, timestamps: Any, height: int = 112) -> Any:
    """A clip's frames side by side (each `height` pixels high), with their times."""
    from PIL import Image as PIL
    from PIL import ImageDraw

    frames = clip.detach().to("cpu")
    if layout == "CTHW":
        frames = frames.permute(1, 0, 2, 3)
    frames = _pixels(frames, None)  # [T, 3, H, W]
    t, _, h, w = frames.shape
    width = max(1, round(w * height / h))
    strip = PIL.new("RGB", (width * t, height + 14), "white")
    draw = ImageDraw.Draw(strip)
    for k in range(t):
        strip.paste(_picture(frames[k]).resize((width, height)), (k * width, 0))
        when = float(timestamps[k])
        draw.text((k * width + 2, height + 1), f"{when:.2f}s" if when >= 0 else "pad",
                  fill="black")  # fmt: skip
    return strip


def _sound(data: Any, length: int, sample_rate: int) -> Any:
    """A sound's waveform and log-mel spectrogram (or the spectrogram an augment= made of it),
    drawn with matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image as PIL

    from ..augment.audio import MelSpectrogram

    x = data.detach().to("cpu").float()
    if x.dim() == 3:  # [C, n_mels, frames]: already a spectrogram
        wave, spectrogram = None, x[0]
    else:
        wave = x.mean(dim=0)
        spectrogram = MelSpectrogram(sample_rate, n_mels=64, log=True)(x.mean(dim=0)[None, None])
        spectrogram = spectrogram[0, 0]
    rows = 1 if wave is None else 2
    fig, axes = plt.subplots(rows, 1, figsize=(8, 1.6 * rows), squeeze=False)
    if wave is not None:
        seconds = (wave.numel() - 1) / sample_rate
        axes[0][0].plot([i / sample_rate for i in range(wave.numel())], wave.numpy(), lw=0.4)
        axes[0][0].axvspan(length / sample_rate, max(seconds, length / sample_rate), color="0.9")
        axes[0][0].set_xlim(0, seconds)
        axes[0][0].set_ylabel("wave")
    axes[rows - 1][0].imshow(spectrogram.numpy(), origin="lower", aspect="auto", cmap="magma")
    axes[rows - 1][0].set_ylabel("mel band")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    plt.close(fig)
    buffer.seek(0)
    return PIL.open(buffer).convert("RGB")


def _png(picture: Any) -> str:
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()
