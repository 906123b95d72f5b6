"""Line charts as inline SVG, drawn on the server (no JavaScript, nothing vendored).

Every text that lands in the SVG (series names, x labels, tooltips) is escaped
here, so a metric or version name can never inject markup; the result is a
``markupsafe.Markup`` a template may insert as is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from markupsafe import Markup, escape

#: colours of successive series (the Okabe-Ito palette: distinguishable for
#: colour-blind readers)
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
WIDTH, HEIGHT = 720, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 16, 64


@dataclass(slots=True)
class Series:
    """One line: ``points`` are ``(x index, y)`` with x an index into the
    chart's ``x_labels``; ``y`` None leaves a gap. ``dashed`` draws a threshold."""

    name: str
    points: list[tuple[int, float | None]]
    dashed: bool = False
    colour: str = ""


@dataclass(slots=True)
class Chart:
    """A chart: a title, categorical x labels, and series over them."""

    title: str
    x_labels: list[str]
    series: list[Series] = field(default_factory=list)
    y_label: str = ""


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _y_range(values: Sequence[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if lo == hi:
        pad = abs(lo) * 0.1 or 1.0
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.08
    return lo - pad, hi + pad


def render_svg(chart: Chart) -> Markup:
    """The chart as an ``<svg>`` element (``role="img"``, a ``<title>`` per
    point for hover), or a short note when there is nothing to draw."""
    values = [y for s in chart.series for _, y in s.points
              if y is not None and math.isfinite(y)]
    if not values or not chart.x_labels:
        return Markup('<p class="muted">{}: no values to chart.</p>').format(chart.title)
    lo, hi = _y_range(values)
    n = len(chart.x_labels)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return LEFT + (plot_w / 2 if n == 1 else plot_w * i / (n - 1))

    def y(v: float) -> float:
        return TOP + plot_h * (1 - (v - lo) / (hi - lo))

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}">',
             f"<title>{escape(chart.title)}</title>",
             f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="#fff" '
             'stroke="#ccc"/>']
    for k in range(5):  # y grid and tick labels
        tick = lo + (hi - lo) * k / 4
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(tick):.1f}" '
                     f'y2="{y(tick):.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end" '
                     f'font-size="11">{_fmt(tick)}</text>')
    step = max(1, math.ceil(n / 12))  # at most ~12 x labels
    for i in range(0, n, step):
        label = chart.x_labels[i]
        short = label if len(label) <= 14 else label[:13] + "\u2026"
        parts.append(f'<text x="{x(i):.1f}" y="{TOP + plot_h + 14}" font-size="11" '
                     f'text-anchor="end" transform="rotate(-35 {x(i):.1f} {TOP + plot_h + 14})">'
                     f"{escape(short)}</text>")
    if chart.y_label:
        parts.append(f'<text x="14" y="{TOP + plot_h / 2:.1f}" font-size="11" '
                     f'transform="rotate(-90 14 {TOP + plot_h / 2:.1f})" text-anchor="middle">'
                     f"{escape(chart.y_label)}</text>")
    legend_y = HEIGHT - 8
    legend_x = float(LEFT)
    for k, s in enumerate(chart.series):
        colour = s.colour or PALETTE[k % len(PALETTE)]
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        runs: list[list[tuple[int, float]]] = [[]]
        for i, value in s.points:
            if value is None or not math.isfinite(value):
                runs.append([])
            else:
                runs[-1].append((i, value))
        for run in runs:
            if len(run) > 1:
                pts = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in run)
                parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} '
                             f'points="{pts}"/>')
        if not s.dashed:
            for i, value in s.points:
                if value is not None and math.isfinite(value):
                    parts.append(f'<circle cx="{x(i):.1f}" cy="{y(value):.1f}" r="3" '
                                 f'fill="{colour}"><title>{escape(s.name)} @ '
                                 f"{escape(chart.x_labels[i])}: {_fmt(value)}</title></circle>")
        parts.append(f'<line x1="{legend_x:.0f}" x2="{legend_x + 18:.0f}" y1="{legend_y - 4}" '
                     f'y2="{legend_y - 4}" stroke="{colour}" stroke-width="2"{dash}/>')
        parts.append(f'<text x="{legend_x + 22:.0f}" y="{legend_y}" font-size="11">'
                     f"{escape(s.name)}</text>")
        legend_x += 30 + 6.5 * len(s.name)
    parts.append("</svg>")
    return Markup("".join(parts))
