"""Analyst views over the project's tables: small functions from DataFrames to DataFrames.

Every function takes and returns Spark DataFrames (plots are `plots.py`), so the same calls serve a
notebook locally and on Databricks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from fraudrules import tables
from fraudrules.config import EVALUATE_QUERY, JobConfig
from fraudrules.engine import keying
from fraudrules.engine.inputs import numeric
from fraudrules.engine.ruleset import RuleSet
from fraudrules.rules import store
from fraudrules.rules.model import NUMERIC_FIELDS, Rule, parse_rule

if TYPE_CHECKING:
    import pandas as pd

SIDES = ("only_a", "only_b", "both")


# ---------------------------------------------------------------- alerts


def alerts_per_rule(alerts: DataFrame, bucket: str = "1 minute", time_col: str = "eventTime") -> DataFrame:
    """Alerts per (time bucket, ruleId): columns bucket (timestamp), ruleId, alerts; in time order."""
    return (
        alerts.groupBy(F.window(time_col, bucket).start.alias("bucket"), "ruleId")
        .agg(F.count(F.lit(1)).alias("alerts"))
        .orderBy("bucket", "ruleId")
    )


def top_keys(alerts: DataFrame, n: int = 10, rule_id: int | None = None) -> DataFrame:
    """The `n` (ruleId, key) pairs with most alerts, with their largest aggregate and time span."""
    if rule_id is not None:
        alerts = alerts.where(F.col("ruleId") == rule_id)
    return (
        alerts.groupBy("ruleId", "key")
        .agg(
            F.count(F.lit(1)).alias("alerts"),
            F.max("aggregate").alias("maxAggregate"),
            F.min("eventTime").alias("firstAlert"),
            F.max("eventTime").alias("lastAlert"),
        )
        .orderBy(F.desc("alerts"), "ruleId", "key")
        .limit(n)
    )


def pick_alert(alerts: DataFrame, alert_id: str | None = None, rule_id: int | None = None) -> dict[str, Any]:
    """One alert as a dict: `alert_id` if given, else the latest alert of the most alerted (ruleId, key)
    (of rule `rule_id` if given)."""
    if alert_id:
        rows = alerts.where(F.col("alertId") == alert_id).limit(1).collect()
        if not rows:
            raise KeyError(f"no alert {alert_id!r}")
        return rows[0].asDict(recursive=True)
    top = top_keys(alerts, 1, rule_id).collect()
    if not top:
        raise LookupError("there are no alerts yet")
    row = (
        alerts.where((F.col("ruleId") == top[0].ruleId) & (F.col("key") == top[0].key))
        .orderBy(F.desc("eventTimeMs"), F.desc("transactionId"))
        .first()
    )
    return row.asDict(recursive=True)


def rule_version(rule_history: DataFrame, rule_id: int, version: int) -> Rule | None:
    """The rule as it was at `version` (from the rule_history table); None if that version is unknown."""
    row = (
        rule_history.where((F.col("ruleId") == int(rule_id)) & (F.col("version") == int(version)))
        .select("ruleJson")
        .first()
    )
    return None if row is None else parse_rule(json.loads(row.ruleJson))


def window_transactions(transactions: DataFrame, alert: Mapping[str, Any], rule: Rule | None = None) -> DataFrame:
    """Drill-down: the transactions of the alert's window.

    The bronze transactions with the alert's key (the same values of the rule's grouping fields)
    and eventTime in [T − W, T], T the alerting transaction's eventTime and W the rule's window;
    with `rule`, also only those passing its filter. Ordered by eventTime.
    """
    end = int(alert["eventTimeMs"])
    start = end - int(alert["windowMinutes"]) * 60_000
    cond = F.col("eventTime").between(start, end)
    for name, value in json.loads(alert["key"]).items():
        field = F.col("fields")[name]
        cond &= field.isNull() if value is None else (field == F.lit(str(value)))
    if rule is not None:
        for c in rule.filter:
            cond &= _condition(c.field, c.op, c.values)
    return transactions.where(cond).orderBy("eventTime", "srcName", "srcPos")


def _condition(field: str, op: str, values: Sequence[str]) -> Column:
    numeric = field in NUMERIC_FIELDS or op in ("GT", "GE", "LT", "LE")
    col = F.col("fields")[field]
    if numeric:
        col = col.try_cast("decimal(38,10)")
        lits = [F.lit(v).try_cast("decimal(38,10)") for v in values]
    else:
        lits = [F.lit(v) for v in values]
    ops = {
        "EQ": lambda: col == lits[0],
        "NE": lambda: col != lits[0],
        "GT": lambda: col > lits[0],
        "GE": lambda: col >= lits[0],
        "LT": lambda: col < lits[0],
        "LE": lambda: col <= lits[0],
        "IN": lambda: col.isin(*lits),
        "NOT_IN": lambda: ~col.isin(*lits),
    }
    return F.coalesce(ops[op](), F.lit(False))


def window_summary(window: DataFrame, alert: Mapping[str, Any]) -> dict[str, Any]:
    """The drill-down next to what the alert says (numbers as exact decimal strings)."""
    row = window.agg(F.count(F.lit(1)).alias("n"), F.sum("paymentAmount").alias("total")).first()
    tx_ids = {r.transactionId for r in window.select("transactionId").collect()}
    return {
        "alertId": alert["alertId"],
        "ruleId": int(alert["ruleId"]),
        "aggregatorFunctionType": alert["aggregatorFunctionType"],
        "aggregateFieldName": alert["aggregateFieldName"],
        "aggregate": _text(alert["aggregate"]),
        "transactions": int(row["n"]),
        "paymentAmountSum": _text(row["total"]),
        "containsAlertingTransaction": int(alert["transactionId"]) in tx_ids,
    }


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, Decimal):
        return format(value.normalize(), "f") if value != 0 else "0"
    return str(value)


def quarantine_reasons(quarantine: DataFrame) -> DataFrame:
    """Quarantined records per reason, most frequent first, with one example record each."""
    return (
        quarantine.groupBy("reason")
        .agg(F.count(F.lit(1)).alias("records"), F.min("raw").alias("example"))
        .orderBy(F.desc("records"), "reason")
    )


# ---------------------------------------------------------------- keying


PREVIEW_SCHEMA = "ruleId int, ruleVersion long, transactionId long, eventTime long, key string, shard int"


def key_preview(spark: SparkSession, cfg: JobConfig, bronze: DataFrame) -> DataFrame:
    """Batch preview: how the rules in force key these bronze transactions, and to which shards, by the very
    code the stateful stage runs (`engine.keying`)."""
    rules = RuleSet()
    rules.apply(store.current(spark, cfg).values())
    active = [(r, rules.sig(r.rule_id)) for r in rules.active("WINDOW")]
    shards = cfg.shards

    def fan_out(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            yield keying.fan_out(keying.Transactions.of(frame), active, shards)

    rows = numeric(bronze.withColumn("srcTime", F.unix_millis("ingestedAt")))
    return rows.mapInPandas(fan_out, PREVIEW_SCHEMA)


def fanout_per_rule(keyed: DataFrame) -> DataFrame:
    """Per rule of a keyed preview: keyed rows (= transactions passing it), distinct keys, shards used."""
    return (
        keyed.groupBy("ruleId")
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.countDistinct("key").alias("keys"),
            F.countDistinct("shard").alias("shards"),
        )
        .orderBy("ruleId")
    )


def hot_keys(keyed: DataFrame, n: int = 10) -> DataFrame:
    """The `n` busiest (ruleId, key) of a keyed preview with their shard and share of the rule's rows."""
    per_key = keyed.groupBy("ruleId", "key", "shard").agg(F.count(F.lit(1)).alias("rows"))
    per_rule = keyed.groupBy("ruleId").agg(F.count(F.lit(1)).alias("ruleRows"))
    return (
        per_key.join(per_rule, "ruleId")
        .withColumn("share", F.round(F.col("rows") / F.col("ruleRows"), 4))
        .drop("ruleRows")
        .orderBy(F.desc("rows"), "ruleId", "key")
        .limit(n)
    )


def shard_load(keyed: DataFrame) -> DataFrame:
    """Keyed rows per shard: how evenly the stateful stage's groups are loaded."""
    return keyed.groupBy("shard").agg(F.count(F.lit(1)).alias("rows")).orderBy("shard")


# ---------------------------------------------------------------- batches


def recent_batches(batches: DataFrame, n: int = 50, query: str = EVALUATE_QUERY) -> DataFrame:
    """The last `n` micro-batches of `query`, oldest first, with seconds since the previous commit
    and input rows per second (where the batch recorded its input rows)."""
    from pyspark.sql.window import Window

    last = batches.where(F.col("query") == query).orderBy(F.desc("batchId")).limit(n)
    w = Window.orderBy("batchId")
    seconds = F.unix_millis("committedAt") - F.lag(F.unix_millis("committedAt")).over(w)
    return (
        last.withColumn("seconds", seconds / 1000.0)
        .withColumn("inputRowsPerSecond", F.col("inputRows") / F.col("seconds"))
        .orderBy("batchId")
    )


def alert_latencies(alerts: DataFrame, batch_ids: Sequence[int] | None = None) -> DataFrame:
    """Per alert: latencyMs from the transaction's ingestionTimestamp to the alert's commit (producedAtMs)."""
    df = alerts.where(F.col("ingestionTimestamp") > 0)
    if batch_ids is not None:
        df = df.where(F.col("batchId").isin(*[int(b) for b in batch_ids]))
    return df.select(
        "batchId", "ruleId", "alertId", (F.col("producedAtMs") - F.col("ingestionTimestamp")).alias("latencyMs")
    )


def ingest_throughput(transactions: DataFrame, n: int = 50) -> DataFrame:
    """Bronze rows per ingest micro-batch (rows of one batch share ingestedAt) and rows per second."""
    from pyspark.sql.window import Window

    per_batch = transactions.groupBy("ingestedAt").agg(F.count(F.lit(1)).alias("rows"))
    last = per_batch.orderBy(F.desc("ingestedAt")).limit(n)
    w = Window.orderBy("ingestedAt")
    seconds = (F.unix_millis("ingestedAt") - F.lag(F.unix_millis("ingestedAt")).over(w)) / 1000.0
    return (
        last.withColumn("seconds", seconds).withColumn("rowsPerSecond", F.col("rows") / seconds).orderBy("ingestedAt")
    )


def progress_table(progress: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """A streaming query's progress reports (e.g. `notebook.run_query(...)["progress"]`) as a table:
    batchId, numInputRows, processedRowsPerSecond and the batch's duration in ms."""
    import pandas as pd

    rows = [
        {
            "batchId": int(pr["batchId"]),
            "numInputRows": int(pr.get("numInputRows", 0)),
            "processedRowsPerSecond": float(pr.get("processedRowsPerSecond") or 0.0),
            "durationMs": int((pr.get("durationMs") or {}).get("triggerExecution", 0)),
        }
        for pr in progress
    ]
    return pd.DataFrame(rows, columns=["batchId", "numInputRows", "processedRowsPerSecond", "durationMs"])


# ---------------------------------------------------------------- backtests and history


def with_rule_id(rule: Rule, rule_id: int) -> Rule:
    """The same rule under another id (to replay a candidate beside the live rule in one backtest)."""
    return replace(rule, rule_id=rule_id)


def compare_alerts(a: DataFrame, b: DataFrame, on: Sequence[str] = ("transactionId", "key")) -> DataFrame:
    """Alerts of two runs matched on `on`: one row per alert with side only_a, only_b or both."""
    cols = list(on)
    left = a.select(*cols, F.col("aggregate").alias("aggregateA")).withColumn("_a", F.lit(True))
    right = b.select(*cols, F.col("aggregate").alias("aggregateB")).withColumn("_b", F.lit(True))
    side = (
        F.when(F.col("_a") & F.col("_b"), F.lit("both")).when(F.col("_a"), F.lit("only_a")).otherwise(F.lit("only_b"))
    )
    return left.join(right, cols, "full_outer").withColumn("side", side).drop("_a", "_b").orderBy(*cols)


def comparison_counts(compared: DataFrame) -> dict[str, int]:
    """{only_a, only_b, both} counts of a `compare_alerts` result (zeros included)."""
    counts = {r["side"]: int(r["count"]) for r in compared.groupBy("side").count().collect()}
    return {s: counts.get(s, 0) for s in SIDES}


def history(spark: SparkSession, cfg: JobConfig, name: str = "transactions") -> DataFrame:
    """A table's Delta versions: version, timestamp, operation, rows written."""
    return (
        tables.delta(spark, cfg, name)
        .history()
        .select("version", "timestamp", "operation", F.col("operationMetrics")["numOutputRows"].alias("rows"))
        .orderBy("version")
    )


def bronze_as_of(
    spark: SparkSession, cfg: JobConfig, version: int | str | None = None, timestamp: str | None = None
) -> DataFrame:
    """Bronze transactions as they were at a Delta version or timestamp (Delta time travel); latest if neither."""
    if version not in (None, "") and timestamp:
        raise ValueError("give a version or a timestamp, not both")
    reader = spark.read.format("delta")
    if version not in (None, ""):
        reader = reader.option("versionAsOf", str(int(version)))
    elif timestamp:
        reader = reader.option("timestampAsOf", timestamp)
    if cfg.uses_catalog:
        return reader.table(cfg.table("transactions"))
    return reader.load(cfg.table("transactions"))


def export_raw(transactions: DataFrame, folder: str) -> int:
    """Write bronze rows' original records (`raw`) as one JSON-lines file in eventTime order, for replay."""
    ordered = transactions.orderBy("eventTime", "srcName", "srcPos").select("raw")
    ordered.coalesce(1).write.mode("overwrite").text(folder)
    return transactions.count()
