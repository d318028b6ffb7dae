"""Analyst plots: matplotlib Figures from Spark or pandas frames (the `views.py` results), saved as PNGs.

Figures are built without pyplot, so nothing depends on a display or a global figure state.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fraudrules.analyst.views import SIDES

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


def _pandas(df: Any) -> pd.DataFrame:
    return df.toPandas() if hasattr(df, "toPandas") else df


def _figure(ncols: int = 1, width: float = 8.0) -> tuple[Figure, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, 3.6), layout="constrained")
    axes = fig.subplots(1, ncols)
    return fig, axes


def plot_alerts_per_rule(per_rule: Any) -> Figure:
    """Lines of alerts per time bucket, one per rule (input: `alerts_per_rule`)."""
    pdf = _pandas(per_rule)
    fig, ax = _figure()
    if len(pdf):
        wide = pdf.pivot_table(index="bucket", columns="ruleId", values="alerts", aggfunc="sum").fillna(0)
        for rule_id in wide.columns:
            ax.plot(wide.index, wide[rule_id], marker="o", label=f"rule {rule_id}")
        ax.legend(loc="upper left", fontsize="small")
    ax.set_title("Alerts per rule over event time")
    ax.set_xlabel("event time bucket")
    ax.set_ylabel("alerts")
    fig.autofmt_xdate()
    return fig


def plot_fanout(fanout: Any) -> Figure:
    """Bars of keyed rows and distinct keys per rule (input: `fanout_per_rule`)."""
    pdf = _pandas(fanout)
    fig, ax = _figure()
    x = list(range(len(pdf)))
    ax.bar([i - 0.2 for i in x], pdf["rows"], width=0.4, label="keyed rows")
    ax.bar([i + 0.2 for i in x], pdf["keys"], width=0.4, label="distinct keys")
    ax.set_xticks(x, [f"rule {r}" for r in pdf["ruleId"]])
    ax.set_title("Dynamic keying: fan-out per rule")
    ax.legend(fontsize="small")
    return fig


def plot_batches(latencies: Any, batches: Any, progress: Any = None) -> Figure:
    """Alert latency histogram; per-batch alerts with p50/p99 latency; and, given a `progress_table`,
    each micro-batch's processing time, with transactions per second where batches record inputRows."""
    lat, bat = _pandas(latencies), _pandas(batches)
    panels = 3 if progress is not None else 2
    fig, axes = _figure(panels, width=5.2 * panels)
    left, mid = axes[0], axes[1]
    if len(lat):
        left.hist(lat["latencyMs"], bins=30)
    left.set_title("Alert latency (ingestion → alert committed)")
    left.set_xlabel("ms")
    left.set_ylabel("alerts")
    if len(bat):
        mid.bar(bat["batchId"], bat["alerts"], color="lightgray", label="alerts")
        twin = mid.twinx()
        twin.plot(bat["batchId"], bat["latencyP50Ms"], marker="o", label="p50")
        twin.plot(bat["batchId"], bat["latencyP99Ms"], marker="^", label="p99")
        twin.set_ylabel("alert latency ms")
        twin.legend(loc="upper right", fontsize="small")
    mid.set_title("Recent micro-batches: alerts and latency")
    mid.set_xlabel("batch")
    mid.set_ylabel("alerts")
    if progress is not None:
        prog, right = _pandas(progress), axes[2]
        if len(prog):
            right.bar(prog["batchId"], prog["durationMs"] / 1000.0, color="tab:blue")
        right.set_title("Micro-batch processing time")
        right.set_xlabel("batch")
        right.set_ylabel("seconds")
        if len(bat) and bat["inputRowsPerSecond"].notna().any():
            rate = right.twinx()
            rate.plot(bat["batchId"], bat["inputRowsPerSecond"], marker="s", color="tab:green")
            rate.set_ylabel("transactions / s")
    for ax in axes:
        ax.xaxis.get_major_locator().set_params(integer=True)
    return fig


def plot_counts(df: Any, label: str, value: str, title: str) -> Figure:
    """Horizontal bars of `value` per `label` (e.g. `quarantine_reasons`: "reason", "records")."""
    pdf = _pandas(df)
    fig, ax = _figure()
    ax.barh([str(v) for v in pdf[label]], pdf[value])
    ax.invert_yaxis()
    ax.set_title(title)
    ax.set_xlabel(value)
    return fig


def plot_comparison(counts: Mapping[str, int], labels: tuple[str, str] = ("live", "candidate")) -> Figure:
    """Bars of alerts only in A, only in B and in both (input: `comparison_counts`)."""
    fig, ax = _figure(width=6.0)
    names = [f"only {labels[0]}", f"only {labels[1]}", "both"]
    ax.bar(names, [counts.get(s, 0) for s in SIDES], color=["tab:blue", "tab:orange", "tab:green"])
    ax.set_title("Backtest: candidate vs live rule")
    ax.set_ylabel("alerts")
    return fig


def plot_live_vs_shadow(per_bucket: Any, shadow_id: int | None = None) -> Figure:
    """Alerts over time of a live rule and its shadow rule (input: `shadow.live_vs_shadow`)."""
    pdf = _pandas(per_bucket)
    fig, ax = _figure()
    ax.plot(pdf["bucket"], pdf["live"], marker=".", label="live (alerts)")
    ax.plot(pdf["bucket"], pdf["shadow"], marker=".", linestyle="--", label="shadow (shadow_alerts)")
    ax.set_title("Live vs shadow rule" + (f" {shadow_id}" if shadow_id is not None else "") + ": alerts over time")
    ax.set_xlabel("event time")
    ax.set_ylabel("alerts")
    ax.legend()
    ax.tick_params(axis="x", labelrotation=30)
    return fig


def save_figure(fig: Any, figures_dir: str, name: str) -> Any:
    """Save a matplotlib Figure as `<figures_dir>/<name>.png`; returns the PNG as an IPython Image to show."""
    from IPython.display import Image

    Path(figures_dir).mkdir(parents=True, exist_ok=True)
    path = os.path.join(figures_dir, f"{name}.png")
    fig.savefig(path, dpi=90, bbox_inches="tight")
    return Image(filename=path)
