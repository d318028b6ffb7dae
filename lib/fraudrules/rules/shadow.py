"""A shadow rule beside its live rule: what each flagged over the same period (`fraudrules rules compare`).

The period is a range of the query's micro-batches in which both rules were evaluated: from the first batch
that evaluated the shadow rule's current SHADOW run (its versions in a row, `rule_applied`) up to the batch
at which it stopped (promoted, paused, deleted; or now). A batch's alerts of both rules come from the same
transactions, so comparing by batch is exact: each side is filtered by the same batch ids. `--since`/`until`
narrow it to the batches committed in between (the `batches` heartbeat).

Alerts are matched on their subject (the transaction, or a login's user and time): `both`, `only_live`,
`only_shadow`; per key, the keys where the two differ most; per event-time hour, the alerts of each. Alert rates
are per hour of the period the compared micro-batches ran (`batch_period`), whose length is printed with them.
The pure part (`compare_frames`, `batch_range`, `batch_period`) takes pandas frames and plain rows; `compare` reads
the tables.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from fraudrules import event_schema, tables
from fraudrules.config import EVALUATE_QUERY, JobConfig
from fraudrules.rules.codec import from_row
from fraudrules.rules.model import LOGIN_RULE, RuleError
from fraudrules.rules.text import duration_text, iso_time, key_label, rule_text

HOUR_MS = 3_600_000
COLUMNS = ("alertId", "key", "eventTimeMs", "batchId")
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_time(text: str, now: datetime | None = None) -> datetime:
    """`--since`/`--until`: an ISO time (UTC unless it says otherwise) or an age such as 30m, 2h, 1d."""
    now = now or datetime.now(timezone.utc)
    match = _RELATIVE.match(text.strip().lower())
    if match:
        return now - timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is neither an ISO time nor an age like 30m, 2h, 1d") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


# ------------------------------------------------------------------------------------------ the period


@dataclass(frozen=True)
class Run:
    """A shadow rule's current SHADOW run: its versions, when it began and ended (ms), what it shadowed."""

    shadow_id: int
    live_id: int | None
    versions: tuple[int, ...]
    started_ms: int
    ended_ms: int | None  # the change that ended it (promote, pause, delete), None while it runs
    ended_by: str | None
    rule_type: str


def _ms(t: Any) -> int:
    return int(t.timestamp() * 1000)


def shadow_run(history: list[dict], shadow_id: int) -> Run:
    """The latest run of consecutive SHADOW versions of rule `shadow_id` in its rule_history rows."""
    rows = sorted((r for r in history if r["ruleId"] == shadow_id and r["ruleState"] != "CONTROL"), key=_version)
    if not rows:
        raise RuleError(shadow_id, ["no such rule"])  # as the other rule commands say it
    last = max((i for i, r in enumerate(rows) if r["ruleState"] == "SHADOW"), default=None)
    if last is None:
        raise RuleError(shadow_id, ["has never been a SHADOW rule"])
    first = last
    while first > 0 and rows[first - 1]["ruleState"] == "SHADOW":
        first -= 1
    spec = json.loads(rows[last]["ruleJson"])
    after = rows[last + 1] if last + 1 < len(rows) else None
    return Run(
        shadow_id=shadow_id,
        live_id=spec.get("shadowOf"),
        versions=tuple(int(r["version"]) for r in rows[first : last + 1]),
        started_ms=_ms(rows[first]["updatedAt"]),
        ended_ms=_ms(after["updatedAt"]) if after else None,
        ended_by=(after["change"] if after else None),
        rule_type=str(spec.get("ruleType", "WINDOW")),
    )


def _version(row: dict) -> int:
    return int(row["version"])


def period_start(run: Run, first_evaluated_ms: int | None, since_ms: int | None = None) -> int:
    """When the comparison starts (ms): the shadow's first evaluation (else its change), or `--since`."""
    return max(first_evaluated_ms if first_evaluated_ms is not None else run.started_ms, since_ms or 0)


def batch_range(
    run: Run,
    first_evaluated_ms: int | None,
    committed: list[tuple[int, int]],
    since_ms: int | None = None,
    until_ms: int | None = None,
) -> tuple[int, int | None]:
    """[first, end) micro-batch ids of the query in which both rules were evaluated.

    `committed`: (batchId, committedAtMs) of the query's heartbeat. A batch is committed before the next
    one starts, so the first batch committed at or after the shadow's first evaluation is the one that
    evaluated it first, and every batch committed before the run ended (or before `until`) still had it.
    """
    start = period_start(run, first_evaluated_ms, since_ms)
    stops = [t for t in (run.ended_ms, until_ms) if t is not None]
    first = min((b for b, t in committed if t >= start), default=None)
    if first is None:  # nothing committed since: an empty range after the last batch
        first = max((b for b, _ in committed), default=-1) + 1
    if not stops:
        return first, None
    stop = min(stops)
    end = min((b for b, t in committed if t >= stop), default=None)
    return first, max(first, end) if end is not None else None


def batch_period(
    committed: list[tuple[int, int]], batches: tuple[int, int | None], start_ms: int
) -> tuple[int, int] | None:
    """When the input of the micro-batches [first, end) arrived and they ran (ms): from the commit of the batch
    before the first (its input is what came after), else `start_ms` (`period_start`, within the first), to the
    commit of the last; None when none of them is committed yet."""
    first, end = batches
    last = max((t for b, t in committed if b >= first and (end is None or b < end)), default=None)
    before = max((t for b, t in committed if b < first), default=start_ms)
    return None if last is None else (min(before, last), last)


# ------------------------------------------------------------------------------------------ the comparison


@dataclass
class Comparison:
    shadow_id: int
    live_id: int | None
    batches: tuple[int, int | None]
    counts: dict[str, int]
    per_key: pd.DataFrame  # key, live, shadow, difference (shadow − live), the largest |difference| first
    per_hour: pd.DataFrame  # hour (epoch ms, event time), live, shadow
    period: tuple[int | None, int | None] = (None, None)  # event time of the first and last alert, ms
    notes: list[str] = field(default_factory=list)
    alerts: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)  # "live", "shadow": what was compared
    window: tuple[int, int] | None = None  # when the compared micro-batches ran, ms (`batch_period`)
    rules: dict[str, str] = field(default_factory=dict)  # "live", "shadow": what each checks
    evaluated: tuple[int, str] | None = None  # what the compared batches evaluated: (count, "transactions")

    def rates(self) -> dict[str, float] | None:
        """Alerts per hour of the period the compared micro-batches ran; None before one is committed."""
        if self.window is None or self.window[1] <= self.window[0]:
            return None
        hours = (self.window[1] - self.window[0]) / HOUR_MS
        return {side: self.counts[side] / hours for side in ("live", "shadow")}

    def lines(self, top: int = 10) -> list[str]:
        live = f"live rule {self.live_id}" if self.live_id is not None else "no live rule"
        first, end = self.batches
        batches = f"batches {first}…{end - 1}" if end is not None else f"batches from {first}"
        c = self.counts
        rates = self.rates()
        rate = (
            f"alert rate per hour: live {rates['live']:,.1f}, shadow {rates['shadow']:,.1f} (over the "
            f"{duration_text(self.window[1] - self.window[0])} the compared micro-batches ran, "
            f"{iso_time(self.window[0])} … {iso_time(self.window[1])})"
            if rates is not None and self.window is not None
            else "alert rate: no compared micro-batch has run yet"
        )
        if self.evaluated:  # a rate that a backlog taken in one batch does not distort
            n, unit = self.evaluated
            per = {side: self.counts[side] * 1000 / n if n else 0.0 for side in ("live", "shadow")}
            rate += f"; per 1,000 of the {n:,} {unit} evaluated: live {per['live']:,.1f}, shadow {per['shadow']:,.1f}"
        out = [
            f"shadow rule {self.shadow_id} vs {live}, {batches} "
            f"(event time {iso_time(self.period[0])} … {iso_time(self.period[1])})",
            *(f"  {side}: {text}" for side, text in self.rules.items()),
            f"alerts: live {c['live']:,}, shadow {c['shadow']:,}; overlap (both) {c['both']:,}, "
            f"only live {c['only_live']:,}, only shadow {c['only_shadow']:,}",
            rate,
            *self.notes,
        ]
        diff = self.per_key[self.per_key["difference"] != 0].head(top)
        if len(diff):
            out.append(f"keys that differ most (top {len(diff)}): live, shadow, shadow − live")
            out += [
                f"  {key_label(r.key):<40} {r.live:>6,} {r.shadow:>6,} {r.difference:>+7,}" for r in diff.itertuples()
            ]
        else:
            out.append("no key differs")
        if len(self.per_hour):
            out.append("alerts by hour of event time: live, shadow")
            out += [
                f"  {iso_time(int(r.hour))[:13]}h {int(r.live):>6,} {int(r.shadow):>6,}"
                for r in self.per_hour.itertuples()
            ]
        return out


def subject(alert_ids: pd.Series) -> pd.Series:
    """What an alert is about, without its rule: `ruleId:transactionId` → transactionId (logins: u<user>:<t>)."""
    return alert_ids.astype(str).str.split(":", n=1).str[1]


def compare_frames(live: pd.DataFrame, shadow: pd.DataFrame) -> dict[str, Any]:
    """Counts, per-key differences and per-hour alerts of two alert frames (columns alertId, key, eventTimeMs)."""
    a, b = set(subject(live["alertId"])), set(subject(shadow["alertId"]))
    counts = {
        "live": len(live),
        "shadow": len(shadow),
        "both": len(a & b),
        "only_live": len(a - b),
        "only_shadow": len(b - a),
    }
    sides = _sides(live, shadow)
    per_key = _per_side(sides, "key")
    per_key["difference"] = per_key["shadow"] - per_key["live"]
    per_key = (
        per_key.assign(_abs=per_key["difference"].abs())
        .sort_values(["_abs", "key"], ascending=[False, True], kind="stable")
        .drop(columns="_abs")
        .reset_index(drop=True)
    )
    per_hour = _per_side(sides.assign(hour=sides["eventTimeMs"].astype("int64") // HOUR_MS * HOUR_MS), "hour")
    per_hour = per_hour.sort_values("hour").reset_index(drop=True)
    times = pd.concat([live["eventTimeMs"], shadow["eventTimeMs"]])
    period = (int(times.min()), int(times.max())) if len(times) else (None, None)
    return {"counts": counts, "per_key": per_key, "per_hour": per_hour, "period": period}


def _sides(live: pd.DataFrame, shadow: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([live.assign(side="live"), shadow.assign(side="shadow")], ignore_index=True)


def _per_side(sides: pd.DataFrame, by: str) -> pd.DataFrame:
    """Alerts per `by` value and side: columns by, live, shadow."""
    counts = sides.groupby([by, "side"]).size().unstack(fill_value=0)
    return counts.reindex(columns=["live", "shadow"], fill_value=0).reset_index()


def compare(
    spark: SparkSession,
    cfg: JobConfig,
    shadow_id: int,
    since: datetime | None = None,
    until: datetime | None = None,
) -> Comparison:
    """Shadow rule `shadow_id` against the live rule it shadows, over the batches both were evaluated in."""
    history = [
        r.asDict() for r in tables.read(spark, cfg, "rule_history").where(F.col("ruleId") == shadow_id).collect()
    ]
    run = shadow_run(history, shadow_id)
    first_ms = _first_evaluated(spark, cfg, shadow_id, run.versions)
    live_history = (
        [r.asDict() for r in tables.read(spark, cfg, "rule_history").where(F.col("ruleId") == run.live_id).collect()]
        if run.live_id is not None
        else []
    )
    schema = event_schema.for_job(cfg)
    rules = {"shadow": _definition(history, run.versions[-1], schema)}
    if live_history:  # the live rule as it was compared: not the version its promotion wrote
        rules["live"] = _definition(
            live_history, max(int(r["version"]) for r in live_history if r["change"] != run.ended_by), schema
        )
    if run.ended_by == f"promote:{shadow_id}" and run.live_id is not None:
        # the exact switch: the first batch that evaluated the promoted version (a batch planned before the
        # promotion, replayed after a restart, still ran the shadow rule)
        promoted = [r["version"] for r in live_history if r["change"] == run.ended_by]
        switch_ms = _first_evaluated(spark, cfg, run.live_id, tuple(promoted)) if promoted else None
        if switch_ms is not None:
            run = replace(run, ended_ms=switch_ms)
    unit, counted = ("login events", "logins") if run.rule_type == LOGIN_RULE else ("transactions", "transactions")
    beats = (
        tables.read(spark, cfg, "batches")
        .where(F.col("query") == EVALUATE_QUERY)
        .select("batchId", (F.unix_millis("committedAt")).alias("t"), F.coalesce(F.col(counted), F.lit(0)).alias("n"))
        .collect()
    )
    committed = [(int(r.batchId), int(r.t)) for r in beats]
    since_ms = _ms(since) if since else None
    until_ms = _ms(until) if until else None
    first, end = batch_range(run, first_ms, committed, since_ms, until_ms)
    live = alerts_in(spark, cfg, "alerts", run.live_id, first, end) if run.live_id is not None else _empty()
    shadow = alerts_in(spark, cfg, "shadow_alerts", shadow_id, first, end)
    result = compare_frames(live, shadow)
    result["alerts"] = {"live": live, "shadow": shadow}
    notes = []
    if first_ms is None:
        notes.append("(the shadow rule has not been evaluated yet: no rule_applied record)")
    if run.ended_by:
        notes.append(f"(the shadow run ended with change {run.ended_by!r}, in force at {iso_time(run.ended_ms)})")
    window = batch_period(committed, (first, end), period_start(run, first_ms, since_ms))
    n = sum(int(r.n or 0) for r in beats if r.batchId >= first and (end is None or r.batchId < end))
    return Comparison(
        shadow_id, run.live_id, (first, end), notes=notes, window=window, rules=rules, evaluated=(n, unit), **result
    )


def _definition(history: list[dict], version: int, schema: event_schema.EventSchema) -> str:
    """What a rule checks at `version` of its rule_history rows, in one line."""
    return rule_text(from_row(next(r for r in history if int(r["version"]) == version), schema))


def _first_evaluated(spark: SparkSession, cfg: JobConfig, rule_id: int, versions: tuple[int, ...]) -> int | None:
    """When the first of these versions of a rule was first evaluated (`rule_applied`), ms; None if never."""
    row = (
        tables.read(spark, cfg, "rule_applied")
        .where((F.col("ruleId") == int(rule_id)) & F.col("version").isin(*versions))
        .agg(F.min("firstEvaluatedAt").alias("t"))
        .first()
    )
    return _ms(row.t) if row is not None and row.t is not None else None


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="int64" if c != "alertId" and c != "key" else object) for c in COLUMNS})


def alerts_in(
    spark: SparkSession, cfg: JobConfig, table: str, rule_id: int, first: int, end: int | None
) -> pd.DataFrame:
    """A rule's alerts of `table` in micro-batches [first, end) as pandas (alertId, key, eventTimeMs, batchId)."""
    cond = (F.col("ruleId") == int(rule_id)) & (F.col("batchId") >= first)
    if end is not None:
        cond &= F.col("batchId") < end
    rows = tables.read(spark, cfg, table).where(cond).select(*COLUMNS).toPandas()
    return rows if len(rows) else _empty()


def live_vs_shadow(c: Comparison, bucket_ms: int = 60_000) -> pd.DataFrame:
    """Alerts per event-time bucket of a comparison's shadow rule and live rule over their common batches:
    columns bucket (timestamp), live, shadow (what the notebooks' `plots.plot_live_vs_shadow` draws)."""
    both = _sides(c.alerts["live"], c.alerts["shadow"])
    both["bucket"] = pd.to_datetime(both["eventTimeMs"].astype("int64") // bucket_ms * bucket_ms, unit="ms", utc=True)
    return _per_side(both, "bucket")
