"""A pack's aspect distribution as `stoker inspect` shows it: a text histogram, and an HTML page
with its picture (``stoker inspect PACK --html page.html``)."""

from __future__ import annotations

import base64
import html
import io
import os
from pathlib import Path
from typing import Any


def _labels(edges: list[float]) -> list[str]:
    def ratio(r: float) -> str:
        return f"{r:.2f}" if r >= 1 else f"1/{1 / r:.2f}"

    return ([f"< {ratio(edges[0])}"]
            + [f"{ratio(a)}-{ratio(b)}" for a, b in zip(edges, edges[1:], strict=False)]
            + [f"> {ratio(edges[-1])}"])  # fmt: skip


def text(aspects: dict[str, Any], width: int = 40) -> list[str]:
    """The distribution's lines: totals, then one bar per bin that holds images."""
    n = aspects["images"]
    lines = [
        f"aspects     {n} images (width / height): {aspects['portrait']} portrait, "
        f"{aspects['square']} square, {aspects['landscape']} landscape; median "
        f"{aspects['median']:.2f}"
        + (f"; {aspects['unknown']} without a readable size" if aspects["unknown"] else "")
    ]
    top = max(aspects["counts"]) or 1
    for label, count in zip(_labels(aspects["edges"]), aspects["counts"], strict=True):
        if count:
            bar = "#" * max(1, round(width * count / top))
            lines.append(f"  {label:>13} {count:>8} {bar}")
    return lines


def picture(aspects: dict[str, Any]) -> bytes:
    """The histogram as a PNG (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = _labels(aspects["edges"])
    fig, ax = plt.subplots(figsize=(9, 3.2))
    ax.bar(range(len(labels)), aspects["counts"], color="#3b7dd8")
    ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_xlabel("aspect (width / height), bins even in log ratio")
    ax.set_ylabel("images")
    ax.axvline((len(labels) - 1) / 2, color="0.6", lw=0.8, ls="--")  # square
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def write_html(info: dict[str, Any], path: str | os.PathLike) -> Path:
    """A page with what inspect found and, where the pack holds images, their aspect
    histogram's picture. Returns its path."""
    aspects = info.get("aspects")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
        for k, v in info.items()
        if k not in ("aspects", "fields", "shard_bytes", "classes", "class_counts")
    )
    body = f"<table>{rows}</table>"
    if aspects is not None:
        png = base64.b64encode(picture(aspects)).decode()
        body += (f"<h3>Aspect ratios</h3><img src='data:image/png;base64,{png}'>"
                 f"<pre>{html.escape(chr(10).join(text(aspects)))}</pre>")  # fmt: skip
    else:
        body += "<p>No images with a size to show.</p>"
    out.write_text(
        "<!doctype html><meta charset='utf-8'><title>stoker inspect</title>"
        "<style>body{font:13px sans-serif;margin:16px}th{text-align:left;padding-right:12px}"
        "</style>" + body
    )
    return out
