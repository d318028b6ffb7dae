"""Backtest: the continuous job's own queries, run to completion over files with an available-now trigger."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from fraudrules import job, rulebook, tables
from fraudrules.config import JobConfig
from fraudrules.rules import Rule
from fraudrules.tables import to_json_line

ALERT_FIELDS = (
    "alertId",
    "ruleId",
    "ruleVersion",
    "transactionId",
    "key",
    "aggregate",
    "aggregatorFunctionType",
    "aggregateFieldName",
    "limitOperatorType",
    "limit",
    "windowMinutes",
    "eventTimeMs",
    "producedAtMs",
)


@dataclass
class BacktestResult:
    transactions: int
    quarantined: int
    late: int
    alerts: int
    seconds: float
    per_rule: dict[int, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.transactions / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        lines = [
            f"transactions: {self.transactions} valid, {self.quarantined} quarantined, {self.late} late",
            f"alerts: {self.alerts} in {self.seconds:.1f} s ({self.rate:,.0f} transactions/s)",
        ]
        lines += [f"  rule {rid}: {n} alerts" for rid, n in sorted(self.per_rule.items())]
        return "\n".join(lines)


def run(spark: SparkSession, cfg: JobConfig, transactions: str, rules: list[Rule]) -> BacktestResult:
    """Evaluate `rules` over a JSON-lines file or folder into the tables under `cfg.data_dir`."""
    cfg = cfg.with_(transactions_source=os.path.abspath(transactions), available_now=True)
    tables.ensure(spark, cfg)
    rulebook.upsert(spark, cfg, rules, author="backtest")
    started = time.time()
    running = job.start(spark, cfg, printer=None)
    running.wait()
    seconds = time.time() - started
    alerts = tables.read(spark, cfg, "alerts")
    per_rule = Counter({r.ruleId: r["count"] for r in alerts.groupBy("ruleId").count().collect()})
    late = tables.read(spark, cfg, "late_events").select("transactionId").distinct().count()
    return BacktestResult(
        transactions=tables.read(spark, cfg, "transactions").count(),
        quarantined=tables.read(spark, cfg, "quarantine").count(),
        late=late,
        alerts=sum(per_rule.values()),
        seconds=seconds,
        per_rule=dict(per_rule),
    )


def write_alerts(spark: SparkSession, cfg: JobConfig, out: str) -> int:
    """Alerts as JSON lines, ordered by (ruleId, transactionId); `key` as an object of name → value."""
    rows = tables.read(spark, cfg, "alerts").orderBy("ruleId", "transactionId").select(*ALERT_FIELDS)
    n = 0
    with open(out, "w", encoding="utf-8") as fh:
        for row in rows.toLocalIterator():
            record = row.asDict()
            record["key"] = json.loads(record["key"])
            fh.write(to_json_line(record) + "\n")
            n += 1
    return n
