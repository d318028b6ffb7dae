"""Backtest: the continuous job's own queries, run to completion over files with an available-now trigger."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field

import pyarrow.compute as pc
from pyspark.sql import SparkSession

from fraudrules import tables
from fraudrules.config import EVALUATE_QUERY, RULES_QUERY, JobConfig
from fraudrules.engine import job, state
from fraudrules.engine.messages import iso_time, plural
from fraudrules.rules import store
from fraudrules.rules.model import Rule
from fraudrules.tables import exact_number, json_text

ALERT_FIELDS = (
    "alertId",
    "kind",
    "ruleId",
    "ruleVersion",
    "transactionId",
    "userId",
    "key",
    "aggregate",
    "aggregatorFunctionType",
    "aggregateFieldName",
    "limitOperatorType",
    "limit",
    "windowMinutes",
    "eventTimeMs",
    "producedAtMs",
    "message",
    "details",
)


DECIMAL_FIELDS = ("aggregate", "limit")
WRITE_ROWS = 10_000  # alerts as Python objects at a time while they are written
ORDER = ("ruleId", "transactionId", "userId", "eventTimeMs")


@dataclass
class BacktestResult:
    transactions: int
    logins: int
    quarantined: int
    late: int
    alerts: int
    seconds: float
    per_rule: dict[int, int] = field(default_factory=dict)
    shadow_per_rule: dict[int, int] = field(default_factory=dict)  # SHADOW rules' hits (shadow_alerts)

    @property
    def rate(self) -> float:
        return (self.transactions + self.logins) / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        lines = [
            f"transactions: {self.transactions:,} valid, logins: {self.logins:,} valid, "
            f"{self.quarantined:,} quarantined, {self.late:,} late",
            f"alerts: {self.alerts:,}; {self.seconds:.1f} s wall clock incl. query start-up "
            f"({self.rate:,.0f} events/s)",
        ]
        lines += [f"  rule {rid}: {plural(n, 'alert')}" for rid, n in sorted(self.per_rule.items())]
        shadow = sorted(self.shadow_per_rule.items())
        lines += [f"  shadow rule {rid}: {plural(n, 'hit')} (shadow_alerts)" for rid, n in shadow]
        return "\n".join(lines)


def run(
    spark: SparkSession, cfg: JobConfig, transactions: str | None, rules: list[Rule], logins: str | None = None
) -> BacktestResult:
    """Evaluate `rules` over JSON-lines files of transactions and/or logins into the tables under `cfg.data_dir`."""
    empty = os.path.join(cfg.data_dir, "landing", "none")
    os.makedirs(empty, exist_ok=True)
    cfg = cfg.with_(
        transactions_source=os.path.abspath(transactions or empty),
        available_now=True,
        logins=logins is not None,
        logins_source=logins and os.path.abspath(logins),
    )
    tables.ensure(spark, cfg)
    store.upsert(spark, cfg, rules, author="backtest")
    started = time.time()
    # the rules are the given ones: no rules query (it would watch a rules folder or topic)
    names = tuple(q for q in job.query_names(cfg) if q != RULES_QUERY)
    running = job.start(spark, cfg, printer=None, names=names)
    running.wait()
    seconds = time.time() - started
    writer = tables.writer(spark, cfg)
    late = writer.arrow("late_events", ["kind", "transactionId", "userId", "eventTimeMs"])
    per_rule, shadow = _per_rule(writer, "alerts"), _per_rule(writer, "shadow_alerts")
    n_transactions, n_logins, quarantined = (writer.count(t) for t in ("transactions", "logins", "quarantine"))
    return BacktestResult(
        transactions=n_transactions,
        logins=n_logins,
        quarantined=quarantined,
        # a late event is recorded once per rule it would have been keyed for: count events
        late=len(late.group_by(late.column_names).aggregate([])),
        alerts=sum(per_rule.values()),
        seconds=seconds,
        per_rule=per_rule,
        shadow_per_rule=shadow,
    )


def discard(cfg: JobConfig) -> None:
    """Remove a backtest's tables and checkpoints (its temporary data dir) and its local chunk cache."""
    shutil.rmtree(cfg.data_dir, ignore_errors=True)
    state.drop_cache(job.namespace(cfg, EVALUATE_QUERY))


def _per_rule(writer: tables.TableWriter, table: str) -> dict[int, int]:
    counts = writer.arrow(table, ["ruleId"]).group_by("ruleId").aggregate([([], "count_all")])
    return dict(zip(counts.column("ruleId").to_pylist(), counts.column("count_all").to_pylist(), strict=True))


def write_alerts(spark: SparkSession, cfg: JobConfig, out: str) -> int:
    """Alerts as JSON lines, ordered by (ruleId, transactionId); `key` as an object of name → value, and
    `eventTime` as an ISO timestamp beside the exact `eventTimeMs`.

    One rule's alerts at a time (a scan each), sorted there: the driver holds a rule's alerts, not all of them."""
    writer = tables.writer(spark, cfg)
    order = [(c, "ascending", "at_start") for c in ORDER]  # nulls first, as Spark sorts
    n = 0
    with open(out, "w", encoding="utf-8") as fh:
        for rule_id in sorted(_per_rule(writer, "alerts")):
            rows = writer.arrow("alerts", ALERT_FIELDS, where=("ruleId", rule_id))
            ordered = pc.sort_indices(rows.select(list(ORDER)), sort_keys=order)
            for start in range(0, len(ordered), WRITE_ROWS):  # Python objects for a slice at a time
                for record in rows.take(ordered[start : start + WRITE_ROWS]).to_pylist():
                    record["key"] = json.loads(record["key"])
                    record["details"] = json.loads(record["details"]) if record["details"] else None
                    for name in DECIMAL_FIELDS:  # the only non-JSON values: one conversion each, not a walk
                        if record[name] is not None:
                            record[name] = exact_number(record[name])
                    record["eventTime"] = iso_time(record["eventTimeMs"])
                    fh.write(json_text(record) + "\n")
                    n += 1
    return n
