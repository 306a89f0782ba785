"""The console's charts as inline SVG (pure functions, no I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

COLORS = {"completed": "#1a7f37", "retried": "#bf8700", "poisoned": "#cf222e"}


def svg_lines(
    title: str, labels: Sequence[str], series: Mapping[str, Sequence[int]], width: int = 560
) -> str:
    """A line chart of per-minute counts: one polyline per series, an axis with the peak."""
    height, pad = 160, 28
    peak = max([1, *(max(values, default=0) for values in series.values())])
    n = max(1, len(labels) - 1)
    parts = [
        f"<svg class=chart-svg data-chart='{escape(title)}' width={width} height={height} "
        f"viewBox='0 0 {width} {height}' role=img aria-label='{escape(title)}'>",
        f"<text x={pad} y=14 font-size=12>{escape(title)} (peak {peak}/min)</text>",
        f"<line x1={pad} y1={height - pad} x2={width - 6} y2={height - pad} stroke='#8c959f'/>",
        f"<line x1={pad} y1={20} x2={pad} y2={height - pad} stroke='#8c959f'/>",
    ]
    for name, values in series.items():
        points = " ".join(
            f"{pad + i * (width - pad - 6) / n:.1f},{height - pad - v * (height - pad - 24) / peak:.1f}"
            for i, v in enumerate(values)
        )
        parts.append(
            f"<polyline class='series' data-series='{escape(name)}' data-total='{sum(values)}' fill=none "
            f"stroke='{COLORS.get(name, '#0969da')}' stroke-width=2 points='{points}'/>"
        )
    if labels:
        parts.append(f"<text x={pad} y={height - 8} font-size=10>{escape(labels[0][-5:])}</text>")
        parts.append(f"<text x={width - 40} y={height - 8} font-size=10>{escape(labels[-1][-5:])}</text>")
    parts.append("</svg>")
    legend = "".join(
        f"<span class=s-{k if k in COLORS else 'other'}>■ {escape(k)} {sum(v)}</span>"
        for k, v in series.items()
    )
    return f"<div class=chart>{''.join(parts)}<div class=legend>{legend}</div></div>"


def svg_bars(title: str, labels: Sequence[str], values: Sequence[int], width: int = 420) -> str:
    """A bar chart (the latency histogram)."""
    height, pad = 160, 24
    peak = max([1, *values])
    step = (width - pad) / max(1, len(values))
    parts = [
        f"<svg class=chart-svg data-chart='{escape(title)}' width={width} height={height} "
        f"viewBox='0 0 {width} {height}' role=img aria-label='{escape(title)}'>",
        f"<text x=4 y=14 font-size=12>{escape(title)}</text>",
    ]
    for i, value in enumerate(values):
        h = value * (height - 2 * pad - 10) / peak
        x = pad + i * step
        parts.append(
            f"<rect class=bar data-value={value} x={x:.1f} y={height - pad - h:.1f} width={step * 0.8:.1f} "
            f"height={h:.1f} fill='#0969da'><title>{escape(labels[i])}: {value}</title></rect>"
        )
        if i % 3 == 0:
            parts.append(f"<text x={x:.1f} y={height - 8} font-size=9>{escape(labels[i])}</text>")
    parts.append("</svg>")
    return f"<div class=chart>{''.join(parts)}</div>"
