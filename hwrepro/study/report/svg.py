"""Inline SVG charts for the HTML reports: line charts and stacked share bars, as text.

The run report is written at the end of every run, so its figures must be cheap (milliseconds, no matplotlib
import in the training process) and self-contained (an <svg> element in the page: nothing to load, nothing to
fetch). The sweep report's figures stay matplotlib PNGs (hwrepro.study.report.figures).
"""

from __future__ import annotations

import html
import math
from typing import Mapping, NamedTuple, Sequence

# matplotlib's tab10, so runs look the same here as in the sweep's PNGs
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
WIDTH, HEIGHT = 460, 280
LEFT, RIGHT, TOP, BOTTOM = 62, 12, 26, 40


class Series(NamedTuple):
    """One curve: a label for the legend and its points (x, y), x increasing."""
    label: str
    x: Sequence[float]
    y: Sequence[float]


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About `count` round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi]."""
    if not hi > lo:
        return [lo]
    raw = (hi - lo) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    return [round(first + i * step, 12) for i in range(int(math.ceil((hi - first) / step - 1e-9)) + 1)]


def log_ticks(lo: float, hi: float) -> list[float]:
    """Powers of ten covering [lo, hi] (lo > 0), with 2 and 5 between them when that spans under 2 decades."""
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    mantissas = (1, 2, 5) if last - first < 2 else (1,)
    return [m * 10.0 ** e for e in range(first, last + 1) for m in mantissas if m * 10.0 ** e <= 10.0 ** last]


def _extent(ticks: list[float]) -> tuple[float, float]:
    """The axis range of its ticks; around a single one (a flat curve), +-10% of it, at least +-1 (at 1e17, +-1
    would round back to the tick itself)."""
    if len(ticks) > 1:
        return min(ticks), max(ticks)
    half = max(abs(ticks[0]) * 0.1, 1.0)
    return ticks[0] - half, ticks[0] + half


def _label(v: float) -> str:
    return f"{v:.4g}"


def line_chart(series: Sequence[Series], title: str, xlabel: str, ylabel: str) -> str:
    """An <svg> line chart of the series (markers where a series has a few points); the x axis is logarithmic
    when the positive x values span more than two decades (fast and slow runs on one time axis)."""
    points = [(x, y) for s in series for x, y in zip(s.x, s.y) if math.isfinite(x) and math.isfinite(y)]
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    log_x = bool(xs) and min(xs) > 0 and max(xs) / min(xs) > 100
    xticks = log_ticks(min(xs), max(xs)) if log_x else nice_ticks(min(xs), max(xs)) if xs else [0.0, 1.0]
    yticks = nice_ticks(min(ys), max(ys)) if ys else [0.0, 1.0]
    (x0, x1), (y0, y1) = _extent(xticks), _extent(yticks)
    fx = (lambda v: math.log10(v)) if log_x else (lambda v: v)
    px = lambda v: LEFT + (fx(v) - fx(x0)) / (fx(x1) - fx(x0)) * (WIDTH - LEFT - RIGHT)
    py = lambda v: HEIGHT - BOTTOM - (v - y0) / (y1 - y0) * (HEIGHT - TOP - BOTTOM)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{html.escape(title)}">',
           f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" font-size="13">{html.escape(title)}</text>']
    for t in xticks:
        out.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" stroke="#ddd"/>'
                   f'<text x="{px(t):.1f}" y="{HEIGHT - BOTTOM + 14}" text-anchor="middle" font-size="10">'
                   f'{_label(t)}</text>')
    for t in yticks:
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#ddd"/>'
                   f'<text x="{LEFT - 4}" y="{py(t) + 3:.1f}" text-anchor="end" font-size="10">{_label(t)}</text>')
    out.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 6}" text-anchor="middle" font-size="11">'
               f'{html.escape(xlabel + (" (log scale)" if log_x else ""))}</text>'
               f'<text transform="translate(13 {(TOP + HEIGHT - BOTTOM) / 2}) rotate(-90)" text-anchor="middle" '
               f'font-size="11">{html.escape(ylabel)}</text>')
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        pts = [(px(x), py(y)) for x, y in zip(s.x, s.y) if math.isfinite(x) and math.isfinite(y)]
        if pts:
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="'
                       + " ".join(f"{a:.1f},{b:.1f}" for a, b in pts) + '"/>')
        if len(pts) <= 30:
            out += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2.5" fill="{color}"/>' for a, b in pts]
        if len(series) > 1:
            y = TOP + 6 + 14 * i
            out.append(f'<rect x="{WIDTH - RIGHT - 150}" y="{y - 7}" width="10" height="3" fill="{color}"/>'
                       f'<text x="{WIDTH - RIGHT - 136}" y="{y - 2}" font-size="10">{html.escape(s.label)}</text>')
    return "\n".join(out + ["</svg>"])


def share_bars(rows: Sequence[tuple[str, Mapping[str, float]]], title: str) -> str:
    """An <svg> of one horizontal bar per (label, {part: seconds}) row, split into each part's share of the
    row's total, with a legend of the parts (the same color for a part in every row)."""
    parts = list(dict.fromkeys(p for _, seconds in rows for p, v in seconds.items() if v > 0))
    colors = {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(parts)}
    bar, label_w, width = 22, 150, WIDTH + 160
    height = TOP + len(rows) * (bar + 8) + 34
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
           f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">{html.escape(title)}</text>']
    span = width - label_w - RIGHT
    for i, (label, seconds) in enumerate(rows):
        y, x = TOP + i * (bar + 8), float(label_w)
        total = sum(v for v in seconds.values() if v > 0)
        out.append(f'<text x="{label_w - 6}" y="{y + bar / 2 + 4}" text-anchor="end" font-size="11">'
                   f'{html.escape(label)}</text>')
        for p, v in seconds.items():
            if v <= 0 or total <= 0:
                continue
            w = span * v / total
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar}" fill="{colors[p]}">'
                       f'<title>{html.escape(p)}: {v:.1f} s ({100 * v / total:.1f}%)</title></rect>')
            if w > 34:
                out.append(f'<text x="{x + w / 2:.1f}" y="{y + bar / 2 + 4}" text-anchor="middle" font-size="10" '
                           f'fill="#fff">{100 * v / total:.0f}%</text>')
            x += w
    x = float(label_w)
    for p in parts:
        out.append(f'<rect x="{x:.0f}" y="{height - 20}" width="10" height="10" fill="{colors[p]}"/>'
                   f'<text x="{x + 14:.0f}" y="{height - 11}" font-size="10">{html.escape(p)}</text>')
        x += 18 + 6.5 * len(p)
    return "\n".join(out + ["</svg>"])
