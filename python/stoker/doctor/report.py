"""Diagnosis.to_html: one self-contained page, plots inline as SVG (matplotlib, Agg)."""

from __future__ import annotations

import html
import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .result import Diagnosis

_COLORS = {"wait": "#e8833a", "step": "#3a7ce8", "loader": "#e8833a", "transfer": "#9b59b6"}


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and doctype: inline in HTML


def _figure(width=9.0, height=3.2):
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height))
    ax.spines[["top", "right"]].set_visible(False)
    return plt, fig, ax


def timeline_svg(d: "Diagnosis") -> str | None:
    if not d.timeline:
        return None
    plt, fig, ax = _figure()
    steps = list(range(1, len(d.timeline) + 1))
    wait = [1e3 * w for w, _ in d.timeline]
    step = [1e3 * c for _, c in d.timeline]
    ax.bar(steps, step, color=_COLORS["step"], label="step (compute)", width=0.85)
    ax.bar(steps, wait, bottom=step, color=_COLORS["wait"], label="waiting for data", width=0.85)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step" + (" (with the loader running)" if d.source == "diagnose" else ""))
    ax.set_ylabel("ms")
    ax.set_title(f"Per step: waiting for data against compute (stall {100 * d.stall:.0f}%)")
    ax.legend(frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    svg = _svg(fig)
    plt.close(fig)
    return svg


def phases_svg(d: "Diagnosis") -> str | None:
    rows = [
        ("loader alone", d.loader_s, _COLORS["loader"]),
        ("step alone\n(cached batch)", d.step_s, _COLORS["step"]),
        ("host → device copy", d.transfer_s, _COLORS["transfer"]),
        ("both together", d.together_s, "#555555"),
    ]
    present = [(n, v, c) for n, v, c in rows if v is not None]
    if d.source != "diagnose" or not present:
        return None
    plt, fig, ax = _figure(height=2.2 + 0.3 * len(present))
    names = [n for n, _, _ in present][::-1]
    values = [1e3 * v for _, v, _ in present][::-1]
    colors = [c for _, _, c in present][::-1]
    bars = ax.barh(names, values, color=colors)
    for bar, value in zip(bars, values):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {value:.1f} ms",
                va="center")  # fmt: skip
    ax.set_xlabel("ms per batch")
    ax.set_title("The three phases: the slower of loader and step bounds the job")
    svg = _svg(fig)
    plt.close(fig)
    return svg


def cpu_svg(d: "Diagnosis") -> str | None:
    samples = d.cpu.get("samples") or []
    if not samples:
        return None
    plt, fig, ax = _figure()
    times = [t for t, _, _ in samples]
    cores = len(samples[0][2])
    for core in range(cores):
        ax.plot(times, [s[2][core] for s in samples], linewidth=1, label=f"core {core}")
    mean = [sum(s[2]) / cores for s in samples]
    ax.plot(times, mean, color="black", linewidth=2, label="mean")
    # Shade each phase and name it.
    start, phase = times[0], samples[0][1]
    spans = []
    for t, p, _ in samples[1:] + [(times[-1], None, None)]:
        if p != phase:
            spans.append((start, t, phase))
            start, phase = t, p
    for i, (a, b, name) in enumerate(spans):
        ax.axvspan(a, b, color="#000000", alpha=0.04 if i % 2 else 0.0)
        ax.text((a + b) / 2, 103, name, ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 115)
    ax.set_xlabel("seconds")
    ax.set_ylabel("CPU %")
    ax.set_title("CPU use per core")
    if cores <= 16:
        ax.legend(frameon=False, fontsize=7, ncol=min(cores + 1, 6), loc="lower right")
    svg = _svg(fig)
    plt.close(fig)
    return svg


_STYLE = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1000px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
.verdict { font-size: 1.3em; padding: 0.6em 1em; border-radius: 6px; background: #f3f0e8; }
.verdict b { text-transform: uppercase; }
table { border-collapse: collapse; } td, th { padding: 0.3em 0.8em; border-bottom: 1px solid #ddd;
  text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f7f7f7; padding: 1em; white-space: pre-wrap; }
figure { margin: 1em 0; } svg { max-width: 100%; height: auto; }
"""


def write_html(d: "Diagnosis", path: str) -> str:
    e = html.escape
    cause = f" ({e(d.data_cause)})" if d.data_cause else ""
    parts = [
        "<!DOCTYPE html>",
        "<html lang='en'><head><meta charset='utf-8'>",
        f"<title>stoker doctor: {e(d.verdict)}-bound</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>stoker doctor</h1>",
        f"<p class='verdict'><b>{e(d.verdict)}</b>-bound{cause}: waiting for data "
        f"{100 * d.stall:.0f}% of the step time.<br>{e(d.explanation)}</p>",
        "<h2>Recommendations</h2>",
    ]
    if d.recommendations:
        parts.append("<table><tr><th>#</th><th>change</th><th>measured gain</th><th>how</th></tr>")
        for i, r in enumerate(d.recommendations, 1):
            gain = f"{r.gain:.2f}x" if r.gain is not None else "not measured"
            parts.append(
                f"<tr><td>{i}</td><td>{e(r.text)}</td><td class='num'>{gain}</td>"
                f"<td>{e(r.measured)}</td></tr>"
            )
        parts.append("</table>")
    else:
        parts.append("<p>No change was measured to help.</p>")
    for title, svg in (
        ("Phases", phases_svg(d)),
        ("Timeline", timeline_svg(d)),
        ("CPU", cpu_svg(d)),
    ):
        if svg:
            parts.append(f"<h2>{title}</h2><figure class='plot'>{svg}</figure>")
    parts.append(f"<h2>Summary</h2><pre>{e(d.summary())}</pre>")
    parts.append("</body></html>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
    return path
