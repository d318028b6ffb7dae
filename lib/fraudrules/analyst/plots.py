"""Analyst plots: matplotlib Figures from Spark or pandas frames (the `views.py` results), saved as PNGs.

Every plot has a title, axes labelled with their units, integer ticks where it counts, readable tick labels
(dates as times of day, no crowding) and bars labelled with their values. Rules are labelled by what they check
(`labels`: ruleId -> `views.rule_labels`), not by their number alone. Figures are built without pyplot, so nothing
depends on a display or a global figure state.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.container import BarContainer
    from matplotlib.figure import Figure

DPI = 110
MAX_LABELLED_BARS = 20  # bars per axis that still have room for their value on top
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray")


def _pandas(df: Any) -> pd.DataFrame:
    return df.toPandas() if hasattr(df, "toPandas") else df


def _figure(nrows: int = 1, ncols: int = 1, width: float = 8.0, height: float = 4.0) -> tuple[Figure, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _counts_axis(ax: Axes, axis: str = "y") -> None:
    """Integer ticks with thousands separators on a count axis."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(MaxNLocator(integer=True, nbins="auto"))
    target.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))


def _label_bars(ax: Axes, bars: BarContainer, fmt: str = "{:,.0f}") -> None:
    ax.bar_label(bars, labels=[fmt.format(b.get_height()) for b in bars], padding=2, fontsize="small")
    ax.margins(y=0.15)


def _time_axis(ax: Axes) -> None:
    """Dates on the x axis as times of day (UTC), as few as fit."""
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

    locator = AutoDateLocator(minticks=3, maxticks=8)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))


def _empty(ax: Axes, text: str = "nothing to show yet") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def _rule(rule_id: int, labels: Mapping[int, str] | None, width: int = 60) -> str:
    """A rule by what it checks (wrapped to `width` characters), or by its number when it is not known."""
    return textwrap.fill((labels or {}).get(int(rule_id), f"rule {rule_id}"), width)


# ---------------------------------------------------------------- 01 ingest


def plot_ingested(bronze: Any) -> Figure:
    """What was ingested (input: bronze rows with eventTime (ms), paymentAmount, paymentType): transactions per
    minute of event time by payment type, and the distribution of payment amounts."""
    import pandas as pd

    pdf = _pandas(bronze)
    fig, axes = _figure(1, 2, width=12.0)
    per_minute, amounts = axes[0][0], axes[0][1]
    if len(pdf):
        t = pd.to_datetime(pdf["eventTime"], unit="ms").dt.floor("min")
        counts = pd.crosstab(t, pdf["paymentType"])
        bottom = np.zeros(len(counts))
        width = 0.8 / (24 * 60)  # days, as matplotlib dates are
        for i, kind in enumerate(counts.columns):
            per_minute.bar(counts.index, counts[kind], width=width, bottom=bottom, label=kind, color=COLORS[i])
            bottom += counts[kind].to_numpy()
        per_minute.legend(title="payment type", fontsize="small")
        _time_axis(per_minute)
        values = pdf["paymentAmount"].astype(float)
        bins = np.logspace(np.log10(max(values.min(), 0.01)), np.log10(values.max() * 1.01), 40)
        amounts.hist(values, bins=bins, color="tab:blue")
        amounts.set_xscale("log")
        amounts.xaxis.set_major_formatter(_money_formatter())
    else:
        _empty(per_minute)
        _empty(amounts)
    per_minute.set_title("Transactions per minute of event time")
    per_minute.set_xlabel("event time (UTC)")
    per_minute.set_ylabel("transactions")
    _counts_axis(per_minute)
    amounts.set_title("Payment amounts (log scale)")
    amounts.set_xlabel("payment amount")
    amounts.set_ylabel("transactions")
    _counts_axis(amounts)
    return fig


def _money_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 else f"{v:,.2f}")


# ---------------------------------------------------------------- 02 keying


def plot_fanout(fanout: Any, labels: Mapping[int, str] | None = None) -> Figure:
    """Keyed rows and distinct keys per rule, the rules named by what they check, on a log scale so that small
    counts stay visible, every bar labelled (input: `views.fanout_per_rule`)."""
    pdf = _pandas(fanout)
    fig, axes = _figure(width=11.0, height=1.2 + 0.9 * max(len(pdf), 1))
    ax = axes[0][0]
    if len(pdf):
        y = np.arange(len(pdf))[::-1]  # the first rule on top
        rows = ax.barh(y + 0.2, pdf["rows"], height=0.4, label="keyed rows (transactions passing the filter)")
        keys = ax.barh(y - 0.2, pdf["keys"], height=0.4, label="distinct keys")
        for bars in (rows, keys):
            ax.bar_label(bars, labels=[f"{b.get_width():,.0f}" for b in bars], padding=2, fontsize="small")
        ax.set_yticks(y, [_rule(r, labels, 50) for r in pdf["ruleId"]], fontsize="small")
        ax.set_xscale("log")
        ax.set_xlim(0.5, max(float(pdf["rows"].max()), 1.0) * 6)
        ax.xaxis.set_major_formatter(_money_formatter())
        ax.legend(fontsize="small", loc="lower right")
    else:
        _empty(ax)
    ax.set_title("Dynamic keying: rows and keys per rule")
    ax.set_xlabel("count (log scale)")
    return fig


def plot_shard_load(load: Any, shards: int | None = None) -> Figure:
    """Keyed rows per shard of the stateful stage (input: `views.shard_load`), with each shard's share."""
    pdf = _pandas(load)
    fig, axes = _figure(width=7.0, height=3.6)
    ax = axes[0][0]
    if len(pdf):
        total = float(pdf["rows"].sum()) or 1.0
        bars = ax.bar([f"shard {s}" for s in pdf["shard"]], pdf["rows"], color="tab:blue")
        ax.bar_label(bars, labels=[f"{v:,} ({v / total:.0%})" for v in pdf["rows"]], padding=2, fontsize="small")
        ax.margins(y=0.15)
    else:
        _empty(ax)
    ax.set_title("Load of the stateful stage: keyed rows per shard" + (f" ({shards} shards)" if shards else ""))
    ax.set_xlabel("shard")
    ax.set_ylabel("keyed rows")
    _counts_axis(ax)
    return fig


# ---------------------------------------------------------------- 03 evaluation


def plot_batches(batches: Any, replay: bool) -> Figure:
    """The evaluation query's micro-batches (input: `views.stateful_batches`): transactions and alerts per batch,
    batch durations, throughput and, for the continuous job only, the alert latency its heartbeat measured.

    A `replay` (available-now, over files written earlier) measures no latency: an alert comes when the replay
    reaches its transaction, however long ago that was written. It gets no latency panel, and says so."""
    bat = _pandas(batches)
    fig, axes = _figure(1, 3, width=15.0, height=4.2) if replay else _figure(2, 2, width=12.0, height=7.0)
    size, duration, rate = axes[0] if replay else (axes[0][0], axes[0][1], axes[1][0])
    if len(bat):
        x = bat["batch"].astype(int).to_numpy()
        labelled = len(x) <= MAX_LABELLED_BARS  # more bars than this: labels would overlap
        for offset, column, color in ((-0.2, "transactions", "tab:blue"), (0.2, "alerts", "tab:red")):
            bars = size.bar(x + offset, bat[column], width=0.4, color=color, label=column)
            if labelled:
                _label_bars(size, bars)
        size.legend(fontsize="small")
        for ax, column, fmt, color in (
            (duration, "seconds", "{:,.1f}", "tab:gray"),
            (rate, "transactions per s", "{:,.0f}", "tab:green"),
        ):
            bars = ax.bar(x, bat[column].fillna(0), color=color)
            if labelled:
                _label_bars(ax, bars, fmt)
        for ax in (size, duration, rate):
            _counts_axis(ax, "x")
    else:
        for ax in (size, duration, rate):
            _empty(ax)
    size.set_title("Transactions and alerts per micro-batch")
    size.set_ylabel("count")
    _counts_axis(size)
    duration.set_title("Micro-batch duration")
    duration.set_ylabel("seconds")
    rate.set_title("Throughput per micro-batch")
    rate.set_ylabel("transactions / s")
    for ax in (size, duration, rate):
        ax.set_xlabel("micro-batch")
    if replay:
        fig.suptitle(
            "An available-now replay of files written earlier: its micro-batches. A replay measures no alert "
            "latency\n(an alert comes when the replay reaches its transaction); the continuous job's heartbeat does.",
            fontsize="medium",
        )
    else:
        _heartbeat_latency(axes[1][1], bat)
    return fig


def _heartbeat_latency(ax: Axes, bat: pd.DataFrame) -> None:
    """Alert latency p50 and p99 per micro-batch, as the continuous job's heartbeat (`batches`) recorded them."""
    measured = bat.dropna(subset=["latency p99 (s)"]) if len(bat) else bat
    if len(measured):
        x = measured["batch"].astype(int)
        ax.plot(x, measured["latency p50 (s)"], marker="o", color="tab:purple", label="p50")
        ax.plot(x, measured["latency p99 (s)"], marker="s", linestyle="--", color="black", label="p99")
        ax.legend(fontsize="small", loc="upper left")
        ax.set_ylim(bottom=0)
        _counts_axis(ax, "x")
    else:
        _empty(ax, "no alerts")
    ax.set_title("Alert latency per micro-batch (the job's heartbeat)")
    ax.set_xlabel("micro-batch")
    ax.set_ylabel("seconds from ingestion to alert")


# ---------------------------------------------------------------- 04 alerting


def plot_alerts_per_rule(per_rule: Any, bucket: str = "1 minute", labels: Mapping[int, str] | None = None) -> Figure:
    """Alerts per time bucket of event time, one line per rule named by what it checks (input:
    `views.alerts_per_rule`)."""
    pdf = _pandas(per_rule)
    fig, axes = _figure(width=10.0, height=5.5)
    ax = axes[0][0]
    if len(pdf):
        import pandas as pd

        wide = pdf.pivot_table(index="bucket", columns="ruleId", values="alerts", aggfunc="sum")
        # every bucket of the span, those without alerts at 0 (a line would otherwise skip them)
        span = pd.date_range(wide.index.min(), wide.index.max(), freq=pd.Timedelta(bucket))
        wide = wide.reindex(span).fillna(0)
        for i, rule_id in enumerate(wide.columns):
            label = _rule(rule_id, labels, 55)
            ax.plot(wide.index, wide[rule_id], marker="o", label=label, color=COLORS[i % len(COLORS)])
        fig.legend(loc="outside lower center", fontsize="small", ncols=2)  # below the axes, not over the lines
        ax.set_ylim(bottom=0)
        _time_axis(ax)
    else:
        _empty(ax, "no alerts")
    ax.set_title(f"Alerts per rule per {bucket} of event time")
    ax.set_xlabel("event time (UTC)")
    ax.set_ylabel(f"alerts per {bucket}")
    _counts_axis(ax)
    return fig


# ---------------------------------------------------------------- 05 backtest


def plot_comparison(counts: Mapping[str, int], live: str | None, candidate: str) -> Figure:
    """Alerts of the live rule only, of the candidate only, and of both, in the order of `counts`
    (`views.comparison_counts`); `live` and `candidate` say what each checks (no live rule: None)."""
    fig, axes = _figure(width=8.0, height=4.4)
    ax = axes[0][0]
    bars = ax.bar(list(counts), [int(v) for v in counts.values()], color=COLORS[: len(counts)])
    _label_bars(ax, bars)
    ax.set_title(
        "Backtest: alerts of the live rule and of the candidate\n"
        + textwrap.fill(f"live: {live or 'none'}", 90)
        + "\n"
        + textwrap.fill(f"candidate: {candidate}", 90),
        fontsize="medium",
    )
    ax.set_xlabel("alerted by")
    ax.set_ylabel("alerts")
    _counts_axis(ax)
    return fig


def plot_live_vs_shadow(per_bucket: Any, live: str, shadow: str, bucket_minutes: int = 1) -> Figure:
    """Alerts per event-time bucket of a live rule and its shadow rule, side by side (input:
    `shadow.live_vs_shadow`, buckets of `bucket_minutes`); `live` and `shadow` name each by what it checks."""
    import pandas as pd

    pdf = _pandas(per_bucket)
    fig, axes = _figure(width=9.0, height=4.8)
    ax = axes[0][0]
    if len(pdf):
        step = pd.Timedelta(minutes=bucket_minutes)
        wide = pdf.set_index("bucket")[["live", "shadow"]]
        wide = wide.reindex(pd.date_range(wide.index.min(), wide.index.max(), freq=step), fill_value=0)
        days = bucket_minutes / (24 * 60)  # bar widths in days, as matplotlib dates are
        for offset, side, text in ((-0.2, "live", live), (0.2, "shadow", shadow)):
            color = COLORS[0] if side == "live" else COLORS[1]
            label = textwrap.fill(f"{side}: {text}", 70)
            bars = ax.bar(wide.index + step * offset, wide[side], width=0.4 * days, color=color, label=label)
            if len(wide) <= MAX_LABELLED_BARS:
                _label_bars(ax, bars)
        fig.legend(loc="outside lower center", fontsize="small")
        _time_axis(ax)
    else:
        _empty(ax, "no alerts of either rule in the batches both were evaluated in")
    ax.set_title("Live vs shadow rule: alerts over the micro-batches both were evaluated in")
    ax.set_xlabel("event time (UTC)")
    ax.set_ylabel(f"alerts per {bucket_minutes} min of event time")
    _counts_axis(ax)
    return fig


def save_figure(fig: Any, figures_dir: str, name: str) -> Any:
    """Save a matplotlib Figure as `<figures_dir>/<name>.png`; returns the PNG as an IPython Image to show."""
    from IPython.display import Image

    Path(figures_dir).mkdir(parents=True, exist_ok=True)
    path = os.path.join(figures_dir, f"{name}.png")
    fig.savefig(path, dpi=DPI)
    return Image(filename=path)
