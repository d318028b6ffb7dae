"""The queries' foreachBatch sinks: bronze and quarantine, alerts and late events, rule changes.

Every Delta append carries (txnAppId, batchId), so a micro-batch replayed after a crash is skipped by
Delta: exactly once per batch. The alerts topic is at-least-once (Spark's Kafka sink contract: a replayed
batch publishes again); its message key is the alertId, so consumers de-duplicate on it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from fraudrules import tables
from fraudrules.config import RULES_QUERY, JobConfig
from fraudrules.engine.ingest import valid
from fraudrules.engine.sources import client_options
from fraudrules.rules import store
from fraudrules.rules.model import parse_rules_text

Printer = Callable[[str], None]


def write_bronze(parsed: DataFrame, cfg: JobConfig, batch_id: int, app_id: str, kind: str = "transaction") -> None:
    """Bronze and quarantine rows of one micro-batch, each idempotent per batch (empty ones skipped)."""
    bronze = "transactions" if kind == "transaction" else "logins"
    parsed.persist()
    try:
        counts = {
            r["bad"]: r["count"] for r in parsed.groupBy(F.col("error").isNotNull().alias("bad")).count().collect()
        }
        now = F.current_timestamp()
        if counts.get(False):
            tables.append(
                valid(parsed).withColumn("raw", F.col("value")).withColumn("ingestedAt", now),
                cfg,
                bronze,
                f"{app_id}-bronze",
                batch_id,
            )
        if counts.get(True):
            bad = parsed.where(F.col("error").isNotNull()).select(
                F.lit(kind).alias("kind"),
                F.col("value").alias("raw"),
                F.col("error").alias("reason"),
                "srcName",
                "srcPos",
                now.alias("quarantinedAt"),
            )
            tables.append(bad, cfg, "quarantine", f"{app_id}-quarantine", batch_id)
    finally:
        parsed.unpersist()


def _with_rule(out: DataFrame, history: DataFrame) -> DataFrame:
    """Alert rows joined to the exact rule version they were evaluated under (its JSON as `rule`)."""
    versions = history.select("ruleId", F.col("version").alias("ruleVersion"), F.col("ruleJson").alias("rule"))
    alerts = out.where("kind = 'alert'").withColumn("ruleId", F.col("ruleId").cast("int"))
    return alerts.join(
        F.broadcast(versions.dropDuplicates(["ruleId", "ruleVersion"])), ["ruleId", "ruleVersion"], "left"
    )


def _rule(name: str) -> Column:
    return F.get_json_object("rule", f"$.{name}")


def _common(batch_id: int) -> list[Column]:
    return [
        F.timestamp_millis("eventTime").alias("eventTime"),
        F.col("eventTime").alias("eventTimeMs"),
        F.col("ingestionTimestamp"),
        F.timestamp_millis("producedAt").alias("producedAt"),
        F.col("producedAt").alias("producedAtMs"),
        F.col("watermark").alias("watermarkMs"),
        F.lit(batch_id).cast("long").alias("batchId"),
        F.col("shard"),
    ]


def alert_rows(out: DataFrame, batch_id: int, history: DataFrame) -> DataFrame:
    """Window-rule alerts from the processor's output, as rows of the alerts table."""
    alerts = _with_rule(out, history)
    aggregate = F.col("aggregate").cast("decimal(38,18)")
    message = F.format_string(
        "%s(%s) of %s over %s min = %s, %s %s",
        _rule("aggregatorFunctionType"),
        _rule("aggregateFieldName"),
        F.col("key"),
        _rule("windowMinutes"),
        F.col("aggregate"),
        _rule("limitOperatorType"),
        _rule("limit"),
    )
    return alerts.select(
        F.concat_ws(":", "ruleId", "transactionId").alias("alertId"),
        F.lit("WINDOW").alias("kind"),
        "ruleId",
        "ruleVersion",
        "transactionId",
        F.lit(None).cast("long").alias("userId"),
        "key",
        F.from_json(_rule("groupingKeyNames"), "array<string>").alias("groupingKeyNames"),
        aggregate.alias("aggregate"),
        _rule("aggregateFieldName").alias("aggregateFieldName"),
        _rule("aggregatorFunctionType").alias("aggregatorFunctionType"),
        _rule("limitOperatorType").alias("limitOperatorType"),
        _rule("limit").cast("decimal(38,18)").alias("limit"),
        _rule("windowMinutes").cast("int").alias("windowMinutes"),
        *_common(batch_id),
        message.alias("message"),
        F.lit(None).cast("string").alias("details"),
    )


def login_alert_rows(out: DataFrame, batch_id: int, history: DataFrame) -> DataFrame:
    """Login-anomaly alerts: the user, failed IPs, counts and the sequence's span in `details`."""
    alerts = _with_rule(out, history)
    return alerts.select(
        F.concat(F.col("ruleId"), F.lit(":u"), F.col("userId"), F.lit(":"), F.col("eventTime")).alias("alertId"),
        F.lit("LOGIN_ANOMALY").alias("kind"),
        "ruleId",
        "ruleVersion",
        F.lit(None).cast("long").alias("transactionId"),
        "userId",
        "key",
        F.array(F.lit("userId")).alias("groupingKeyNames"),
        F.col("aggregate").cast("decimal(38,18)").alias("aggregate"),
        F.lit("failedLogins").alias("aggregateFieldName"),
        F.lit("COUNT").alias("aggregatorFunctionType"),
        F.lit("GREATER_EQUAL").alias("limitOperatorType"),
        _rule("minFailures").cast("decimal(38,18)").alias("limit"),
        _rule("windowMinutes").cast("int").alias("windowMinutes"),
        *_common(batch_id),
        "message",
        "details",
    )


def late_rows(out: DataFrame, batch_id: int, kind: str = "transaction") -> DataFrame:
    ids = (
        [F.col("transactionId"), F.lit(None).cast("long").alias("userId")]
        if kind == "transaction"
        else [F.lit(None).cast("long").alias("transactionId"), F.col("userId")]
    )
    return out.where("kind = 'late'").select(
        F.lit(kind).alias("kind"),
        *ids,
        F.col("ruleId").cast("int").alias("ruleId"),
        "ruleVersion",
        "key",
        F.col("eventTime").alias("eventTimeMs"),
        F.col("watermark").alias("watermarkMs"),
        "reason",
        F.current_timestamp().alias("detectedAt"),
        F.lit(batch_id).cast("long").alias("batchId"),
    )


def _num(v: object) -> float | None:
    return None if v is None else float(v)


class AlertSink:
    """foreachBatch target of the evaluation query.

    Each Delta append carries (txnAppId, batchId): when a crashed batch is replayed from the
    checkpoint, Delta recognises the version it already committed and skips it. With
    `cfg.kafka_alerts_topic` the alerts are then also published to Kafka: at-least-once there (a replayed
    batch publishes again), keyed by alertId for consumers to de-duplicate.
    """

    def __init__(
        self, cfg: JobConfig, query: str, printer: Printer | None = print, show: int = 5, logins: bool = False
    ):
        self.cfg, self.query, self.printer, self.show = cfg, query, printer, show
        self.to_alerts = login_alert_rows if logins else alert_rows
        self.late_kind = "login" if logins else "transaction"
        self.reported: set[tuple[int, int]] | None = None  # rule versions whose apply delay is recorded

    def _reported_versions(self, spark: SparkSession) -> set[tuple[int, int]]:
        """Rule versions whose apply delay is recorded (read from the table once, then kept up to date)."""
        if self.reported is None:
            applied = tables.read(spark, self.cfg, "rule_applied").select("ruleId", "version").collect()
            self.reported = {(r.ruleId, r.version) for r in applied}
        return self.reported

    def _rule_applies(self, out: DataFrame, batch_id: int) -> None:
        """Record, once per rule version, the delay from its change to the first event evaluated under it."""
        spark = out.sparkSession
        reported = self._reported_versions(spark)
        history = tables.read(spark, self.cfg, "rule_history").where("ruleState != 'CONTROL'")
        seen = (
            out.where("kind = 'rule'")
            .groupBy("ruleId", "ruleVersion")
            .agg(F.min("producedAt").alias("first"))
            .join(
                history.select("ruleId", F.col("version").alias("ruleVersion"), "updatedAt"),
                ["ruleId", "ruleVersion"],
                "left",
            )
            .select(
                F.col("ruleId").cast("int").alias("ruleId"),
                F.col("ruleVersion").alias("version"),
                F.col("updatedAt").alias("changedAt"),
                F.timestamp_millis("first").alias("firstEvaluatedAt"),
                (F.col("first") - F.unix_millis("updatedAt")).alias("delayMs"),
                F.lit(batch_id).cast("long").alias("batchId"),
            )
        )
        records = [r.asDict() for r in seen.collect() if (r.ruleId, r.version) not in reported]
        if not records:
            return
        for r in records:
            reported.add((r["ruleId"], r["version"]))
            if self.printer and r["delayMs"] is not None:
                self.printer(
                    f"[rules] rule {r['ruleId']} v{r['version']} in force: first event evaluated "
                    f"{r['delayMs'] / 1000:.1f} s after the change"
                )
        tables.append(
            spark.createDataFrame(records, tables.SCHEMAS["rule_applied"]),
            self.cfg,
            "rule_applied",
            f"{self.query}-applied",
            batch_id,
        )

    def __call__(self, out: DataFrame, batch_id: int) -> None:
        out.persist()
        try:
            stats = (
                out.groupBy("kind")
                .agg(
                    F.count("*").alias("n"),
                    F.max("watermark").alias("wm"),
                    F.sum(F.when(F.col("kind") == "rule", F.col("aggregate")).cast("long")).alias("s"),
                    F.collect_set(F.when(F.col("kind") == "rule", F.struct("ruleId", "ruleVersion"))).alias("v"),
                )
                .collect()
            )
            counts = {r["kind"]: r["n"] for r in stats}
            evaluated = next((r["s"] for r in stats if r["kind"] == "rule"), 0)  # keyed events evaluated
            versions = {(v["ruleId"], v["ruleVersion"]) for r in stats for v in r["v"]}
            wm = max((r["wm"] for r in stats), default=None)
            sample, p50, p99, pmax = [], None, None, None
            if counts.get("alert"):  # empty appends would still cost a Delta commit each
                history = tables.read(out.sparkSession, self.cfg, "rule_history")
                alerts = self.to_alerts(out, batch_id, history).persist()
                tables.append(alerts, self.cfg, "alerts", f"{self.query}-alerts", batch_id)
                if self.cfg.kafka_alerts_topic:  # after the Delta commit; replayed batches publish again
                    publish_alerts(alerts, self.cfg)
                committed_ms = int(time.time() * 1000)
                sample = alerts.select("alertId", "ruleId", "key", "aggregate", "message").limit(self.show).collect()
                latency = F.lit(committed_ms) - F.col("ingestionTimestamp")
                p50, p99, pmax = (
                    alerts.where("ingestionTimestamp > 0")
                    .agg(
                        F.percentile_approx(latency, 0.5, 10_000),
                        F.percentile_approx(latency, 0.99, 10_000),
                        F.max(latency),
                    )
                    .first()
                )
                alerts.unpersist()
            if counts.get("late"):
                late = late_rows(out, batch_id, self.late_kind)
                tables.append(late, self.cfg, "late_events", f"{self.query}-late", batch_id)
            if versions - self._reported_versions(out.sparkSession):  # a rule version evaluated for the first time
                self._rule_applies(out, batch_id)
            record = {
                "query": self.query,
                "batchId": batch_id,
                "committedAt": None,
                "inputRows": int(evaluated or 0),
                "alerts": counts.get("alert", 0),
                "lateEvents": counts.get("late", 0),
                "watermarkMs": wm,
                "latencyP50Ms": _num(p50),
                "latencyP99Ms": _num(p99),
                "latencyMaxMs": _num(pmax),
            }
            spark = out.sparkSession
            tables.append(
                spark.createDataFrame([record], tables.SCHEMAS["batches"]).withColumn(
                    "committedAt", F.current_timestamp()
                ),
                self.cfg,
                "batches",
                f"{self.query}-batches",
                batch_id,
            )
            if self.printer and (record["alerts"] or record["lateEvents"]):
                lat_text = f" latency p50={p50:.0f}ms p99={p99:.0f}ms" if p50 is not None else ""
                self.printer(
                    f"[alerts] batch {batch_id}: {record['alerts']} alerts, {record['lateEvents']} late{lat_text}"
                )
                for r in sample:
                    self.printer(f"  ALERT {r.alertId}: {r.message}")
        finally:
            out.unpersist()


class RuleChangeSink:
    """Merges each change set into the rules table; invalid rules go to rule_errors, valid ones still apply."""

    def __init__(self, cfg: JobConfig, printer: Printer | None = print):
        self.cfg, self.printer = cfg, printer

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        spark = df.sparkSession
        errors = []
        for row in df.orderBy("modified", "source").collect():
            changes, problems = parse_rules_text(row.value)
            applied = store.apply(
                spark,
                self.cfg,
                changes,
                author=f"stream:{os.path.basename(row.source)}",
                change_id=f"{RULES_QUERY}:{batch_id}:{row.source}",
            )
            errors += [
                {
                    "ruleId": None if e.rule_id is None else str(e.rule_id),
                    "raw": row.value,
                    "reason": "; ".join(e.problems),
                    "source": row.source,
                }
                for e in problems
            ]
            if self.printer:
                self.printer(
                    f"[rules] {os.path.basename(row.source)}: {len(applied)} rules changed, {len(problems)} rejected"
                )
        if errors:
            frame = spark.createDataFrame(errors, "ruleId string, raw string, reason string, source string")
            tables.append(
                frame.withColumn("receivedAt", F.current_timestamp()),
                self.cfg,
                "rule_errors",
                f"{RULES_QUERY}-errors",
                batch_id,
            )


def alert_messages(alerts: DataFrame) -> DataFrame:
    """Alert rows as Kafka messages: key = alertId, value = the whole row as JSON."""
    return alerts.select(
        F.col("alertId").cast("string").alias("key"),
        F.to_json(F.struct(*[F.col(c) for c in alerts.columns])).alias("value"),
    )


def publish_alerts(alerts: DataFrame, cfg: JobConfig) -> None:
    """Write one micro-batch's alerts to the alerts topic (a batch write from inside foreachBatch)."""
    writer = alert_messages(alerts).write.format("kafka").option("topic", str(cfg.kafka_alerts_topic))
    for key, value in client_options(cfg).items():
        writer = writer.option(key, value)
    writer.save()
