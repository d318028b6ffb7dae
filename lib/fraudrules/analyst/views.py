"""Analyst views over the project's tables: small functions from DataFrames to DataFrames.

Functions take Spark DataFrames and return Spark DataFrames (or pandas, for the few that join Spark's progress
reports), so the same calls serve a notebook locally and on Databricks; `display.py` shows them readably and
`plots.py` plots them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from fraudrules import event_schema, tables
from fraudrules.config import EVALUATE_QUERY, INGEST_QUERY, JobConfig
from fraudrules.engine import ingest, keying
from fraudrules.engine.inputs import numeric
from fraudrules.engine.ruleset import RuleSet
from fraudrules.generator import RichWorkload, sample_rules_path
from fraudrules.rules import store
from fraudrules.rules.model import NULL_OPS, AnyOf, Condition, Not, Rule, Term, load_rules_file, stored_rule
from fraudrules.rules.text import rule_text

if TYPE_CHECKING:
    import pandas as pd

LABELS = ("live", "candidate")  # the two runs a backtest compares


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
    return None if row is None else stored_rule(json.loads(row.ruleJson))


def window_transactions(transactions: DataFrame, alert: Mapping[str, Any], rule: Rule | None = None) -> DataFrame:
    """Drill-down: the transactions of the alert's window.

    The bronze transactions with the alert's key (the same values of the rule's grouping fields, nested ones by
    their dotted path) and eventTime in [T − W, T], T the alerting transaction's eventTime and W the rule's window;
    with `rule`, also only those passing its filter (SQL's own three-valued logic: the engine's). Ordered by
    eventTime; the rule's fields are also columns named by their path.
    """
    end = int(alert["eventTimeMs"])
    start = end - int(alert["windowMinutes"]) * 60_000
    cond = F.col("eventTime").between(start, end)
    for name, value in json.loads(alert["key"]).items():
        field = _text(F.col(name))
        cond &= field.isNull() if value is None else (field == F.lit(str(value)))
    paths: list[str] = []
    if rule is not None:
        for term in rule.filter:
            cond &= term_column(term)
        paths = sorted(rule.fields() - set(transactions.columns))
    window = transactions.where(cond).orderBy("eventTime", "srcName", "srcPos")
    return window.select("*", *(F.col(p).alias(p) for p in paths))


def _text(col: Column) -> Column:
    """A typed bronze value as keys show it (decimals at their scale, booleans as true/false)."""
    return col.cast("string")


def term_column(term: Term) -> Column:
    """A filter term over bronze's typed columns: SQL's comparisons, NOT and OR are the three-valued logic the
    engine evaluates (a filter passes where it is TRUE)."""
    if isinstance(term, Not):
        return ~term_column(term.term)
    if isinstance(term, AnyOf):
        out = term_column(term.terms[0])
        for t in term.terms[1:]:
            out = out | term_column(t)
        return out
    return _comparison(term)


def _comparison(c: Condition) -> Column:
    col = F.col(c.field)
    if c.op in NULL_OPS:
        return col.isNull() if c.op == "IS_NULL" else col.isNotNull()
    if c.scale is not None:  # numbers compare as exact decimals
        col = col.cast("decimal(38,18)")
        lits = [F.lit(v).try_cast("decimal(38,18)") for v in c.values]
    else:  # text (booleans as true/false)
        col, lits = _text(col), [F.lit(v) for v in c.values]
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
    return ops[c.op]()


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
    schema = event_schema.for_job(cfg)
    rules = RuleSet(schema=schema)
    rules.apply(store.current(spark, cfg).values())
    active = [(r, rules.sig(r.rule_id)) for r in rules.active("WINDOW")]
    return _fan_out(
        numeric(bronze.withColumn("srcTime", F.unix_millis("ingestedAt")), schema), schema, active, cfg.shards
    )


def nested_key_example(spark: SparkSession, count: int, shards: int) -> DataFrame:
    """How a rule on a nested field keys: the rich schema's sample rule keyed by (merchant.country, channel)
    over `count` generated transactions of that schema, parsed and keyed by the job's own code."""
    schema = event_schema.builtin("rich")
    rules = load_rules_file(sample_rules_path(schema), schema)
    nested = [(r, 0) for r in rules if any("." in name for name in r.grouping_key_names)]
    records = [(json.dumps(tx), 0, "generated", i) for i, tx in enumerate(RichWorkload(count=count).transactions())]
    raw = spark.createDataFrame(records, "value string, srcTime long, srcName string, srcPos long")
    return _fan_out(numeric(ingest.valid(ingest.parse(raw, schema)), schema), schema, nested, shards)


def _fan_out(
    rows: DataFrame, schema: event_schema.EventSchema, rules: list[tuple[Rule, int]], shards: int
) -> DataFrame:
    """Rows of the engine's input keyed by `rules` (with their signatures): PREVIEW_SCHEMA rows."""

    def fan_out(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            yield keying.fan_out(keying.Transactions.of(frame, schema), rules, shards)

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


def stateful_batches(
    batches: DataFrame, progress: Sequence[Mapping[str, Any]] = (), query: str = EVALUATE_QUERY, replay: bool = False
) -> pd.DataFrame:
    """A stateful query's micro-batches from its heartbeat rows (`batches` table) and, when given, its progress
    reports (`notebook.run_queries(...)[query]["progress"]`): batch, committed at, transactions, alerts, late
    events, latency p50/p99 (s), duration (s) and transactions per second of that duration. A `replay`
    (available-now, over files written earlier) has no latency columns: what its heartbeat records is how long
    ago each transaction was written, not how fast the job alerts."""
    import pandas as pd

    latency = [
        (F.col("latencyP50Ms") / 1000.0).alias("latency p50 (s)"),
        (F.col("latencyP99Ms") / 1000.0).alias("latency p99 (s)"),
    ]
    beats = (
        batches.where(F.col("query") == query)
        .select(
            F.col("batchId").alias("batch"),
            F.col("committedAt").alias("committed at"),
            "transactions",
            "alerts",
            F.col("lateEvents").alias("late"),
            *([] if replay else latency),
        )
        .orderBy("batch")
        .toPandas()
    )
    durations = pd.DataFrame(
        [(int(p["batchId"]), int((p.get("durationMs") or {}).get("triggerExecution", 0)) / 1000.0) for p in progress],
        columns=["batch", "seconds"],
    )
    out = beats.merge(durations, on="batch", how="left") if len(durations) else beats.assign(seconds=float("nan"))
    out["transactions per s"] = out["transactions"] / out["seconds"].where(out["seconds"] > 0)
    return out


def ingest_batches(spark: SparkSession, cfg: JobConfig, progress: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The ingest query's micro-batches: records read (file lines or Kafka records) and duration (its progress
    reports), transactions appended to bronze and records quarantined (the tables' commits, each marked with its
    batch)."""
    import pandas as pd

    frame = pd.DataFrame(
        [
            (
                int(p["batchId"]),
                int(p.get("numInputRows", 0)),
                int((p.get("durationMs") or {}).get("triggerExecution", 0)),
            )
            for p in progress
        ],
        columns=["batch", "records", "ms"],
    )
    for table, column in (("transactions", "transactions"), ("quarantine", "quarantined")):
        rows = batch_rows(spark, cfg, table, INGEST_QUERY)
        frame = frame.merge(rows.rename(columns={"rows": column}), on="batch", how="left")
        frame[column] = frame[column].fillna(0).astype("int64")
    frame["seconds"] = frame.pop("ms") / 1000.0
    frame["transactions per s"] = frame["transactions"] / frame["seconds"].where(frame["seconds"] > 0)
    return frame


# A commit's rows written, in its operationMetrics: Spark's writer says numOutputRows, delta-rs num_added_rows
ROWS_WRITTEN = ("numOutputRows", "num_added_rows")


def _rows_written(metrics: Mapping[str, str]) -> str:
    return next((metrics[k] for k in ROWS_WRITTEN if metrics.get(k) is not None), "0")


def batch_rows(spark: SparkSession, cfg: JobConfig, table: str, query: str) -> pd.DataFrame:
    """Rows a query appended to a table, per micro-batch (from the commits' notes, see tables.Txn)."""
    import pandas as pd

    history = tables.delta(spark, cfg, table).history().select("userMetadata", "operationMetrics").collect()
    rows = {}
    for commit in history:
        marker = json.loads(commit.userMetadata) if (commit.userMetadata or "").startswith("{") else {}
        if str(marker.get("app", "")).startswith(f"{query}:"):
            rows[int(marker["batch"])] = int(_rows_written(commit.operationMetrics or {}))
    return pd.DataFrame(sorted(rows.items()), columns=["batch", "rows"])


# ---------------------------------------------------------------- backtests and history


def rule_labels(spark: SparkSession, cfg: JobConfig) -> dict[int, str]:
    """Each rule of the rules table by what it checks, for plots: `rule 5: SUM(paymentAmount) ... > 40,000.00`."""
    schema = event_schema.for_job(cfg)
    return {
        rule_id: f"rule {rule_id}: {rule_text(stored_rule(json.loads(row['ruleJson']), schema))}"
        for rule_id, row in sorted(store.current(spark, cfg).items())
    }


def with_rule_id(rule: Rule, rule_id: int) -> Rule:
    """The same rule under another id (to replay a candidate beside the live rule in one backtest)."""
    return replace(rule, rule_id=rule_id)


def compare_alerts(
    live: DataFrame,
    candidate: DataFrame,
    labels: tuple[str, str] = LABELS,
    on: Sequence[str] = ("transactionId", "key"),
) -> DataFrame:
    """Alerts of two runs matched on `on`, one row per alert: its aggregate in each run (`<label> aggregate`)
    and `alerted by`: "<label> only" or "both"."""
    cols = list(on)
    first, second = (f"{label} aggregate" for label in labels)
    left = live.select(*cols, F.col("aggregate").alias(first)).withColumn("_a", F.lit(True))
    right = candidate.select(*cols, F.col("aggregate").alias(second)).withColumn("_b", F.lit(True))
    sides = comparison_sides(labels)
    side = F.when(F.col("_a") & F.col("_b"), F.lit(sides[2])).when(F.col("_a"), F.lit(sides[0])).otherwise(sides[1])
    return left.join(right, cols, "full_outer").withColumn("alerted by", side).drop("_a", "_b").orderBy(*cols)


def comparison_sides(labels: tuple[str, str] = LABELS) -> tuple[str, str, str]:
    """The values of `alerted by`: "<first> only", "<second> only", "both"."""
    return f"{labels[0]} only", f"{labels[1]} only", "both"


def comparison_counts(compared: DataFrame, labels: tuple[str, str] = LABELS) -> dict[str, int]:
    """Alerts per `alerted by` value of a `compare_alerts` result, in that order, zeros included."""
    counts = {r["alerted by"]: int(r["count"]) for r in compared.groupBy("alerted by").count().collect()}
    return {side: counts.get(side, 0) for side in comparison_sides(labels)}


def history(spark: SparkSession, cfg: JobConfig, name: str = "transactions") -> DataFrame:
    """A table's Delta versions: version, timestamp, operation, rows written."""
    return (
        tables.delta(spark, cfg, name)
        .history()
        .select(
            "version",
            "timestamp",
            "operation",
            F.coalesce(*[F.col("operationMetrics")[k] for k in ROWS_WRITTEN]).cast("long").alias("rows"),
        )
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
