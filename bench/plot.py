"""Plots of the benchmark figures (matplotlib, Agg backend: no display needed).

python -m bench.plot [bench/out/bench.json] [--out bench/out/throughput_vs_hosts.png]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

DEFAULT_JSON = Path(__file__).resolve().parent / "out" / "bench.json"


def plot_throughput_vs_hosts(
    rows: Sequence[Mapping[str, Any]],
    path: Path,
    *,
    messages: int,
    machine: str = "",
) -> Path:
    """Bars of messages/s against the number of host processes, each labelled with its storage
    requests/s, and a dotted line for linear scaling from one host.

    `rows`: one mapping per host count with `hosts`, `messages_per_s`, `requests_per_s`.
    """
    hosts = [int(r["hosts"]) for r in rows]
    msgs = [float(r["messages_per_s"]) for r in rows]
    reqs = [float(r["requests_per_s"]) for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    bars = ax.bar(hosts, msgs, width=0.55, color="tab:blue", label="messages/s (drain time)")
    for bar, m, r in zip(bars, msgs, reqs, strict=True):
        ax.annotate(
            f"{m:.0f} msg/s\n{r:.0f} req/s",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            textcoords="offset points",
            xytext=(0, 4),
            ha="center",
            fontsize=8,
        )
    if hosts and hosts[0] == 1:
        more = [k for k in hosts if k > 1]
        ax.scatter(
            more, [msgs[0] * k for k in more], marker="_", s=900, color="tab:gray", label="linear from 1 host"
        )
    ax.set_xlabel("host processes competing for the queue")
    ax.set_ylabel("messages/s (noop jobs)")
    ax.set_xticks(hosts)
    ax.set_ylim(0, max([*msgs, msgs[0] * max(hosts)] if hosts[0] == 1 else msgs) * 1.25)
    ax.legend(loc="upper left", fontsize=8, markerscale=0.3)
    title = f"Drain of {messages:,} pre-filled jobs, one Azurite"
    ax.set_title(title + (f"\n{machine}" if machine else ""), fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_from_report(report: Mapping[str, Any], path: Path) -> Path | None:
    """The throughput-vs-hosts plot from a bench.json report (None when it has no scaling section)."""
    scaling = report.get("host", {}).get("scaling")
    if not scaling:
        return None
    machine = report.get("machine", {})
    label = f"{machine.get('cpus', '?')} CPUs, Python {machine.get('python', '?')}, Azurite {machine.get('azurite', '?')}"
    return plot_throughput_vs_hosts(
        scaling["rows"],
        path,
        messages=int(scaling["messages"]),
        machine=label,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("report", type=Path, nargs="?", default=DEFAULT_JSON)
    parser.add_argument("--out", type=Path, default=None, help="default: throughput_vs_hosts.png next to it")
    args = parser.parse_args(argv)
    report = json.loads(args.report.read_text(encoding="utf-8"))
    out = plot_from_report(report, args.out or args.report.parent / "throughput_vs_hosts.png")
    print(out or "no scaling section in the report")
    return 0 if out else 1


if __name__ == "__main__":
    raise SystemExit(main())
