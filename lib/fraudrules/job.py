"""The continuous job: an ingest query (bronze + quarantine) and an evaluation query (alerts).

Both read the same source, each with its own checkpoint, so that an alert is one micro-batch away
from ingestion rather than two.
"""

from __future__ import annotations

import os

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from fraudrules import ingest, kafka_io, keying, rulebook, tables
from fraudrules.alerting import AlertSink, Printer
from fraudrules.config import JobConfig
from fraudrules.evaluation import OUTPUT_SCHEMA
from fraudrules.logins import LOGIN_OUTPUT_SCHEMA, LoginProcessor
from fraudrules.processor import RulesProcessor
from fraudrules.rules import parse_rules_text

INGEST_QUERY = "ingest"
EVALUATE_QUERY = "evaluate"
RULES_QUERY = "rules"
LOGINS_INGEST_QUERY = "ingest_logins"
LOGINS_QUERY = "detect_logins"


def raw_transactions(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    if cfg.source == "kafka":
        return kafka_io.source(spark, cfg, cfg.kafka_transactions_topic)
    return ingest.file_source(spark, cfg.landing, cfg.max_files_per_trigger)


def raw_logins(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    if cfg.source == "kafka":
        return kafka_io.source(spark, cfg, cfg.kafka_logins_topic)
    os.makedirs(cfg.logins_landing, exist_ok=True)
    return ingest.file_source(spark, cfg.logins_landing, cfg.max_files_per_trigger)


def evaluate(spark: SparkSession, cfg: JobConfig, raw: DataFrame) -> DataFrame:
    """Source records → keyed events → windowed evaluation: the processor's output rows."""
    tx = ingest.valid(ingest.parse(raw))
    # The watermark column is dropped right after it is declared: the stateful stage then still
    # receives the query's watermark, but Spark no longer discards late rows before we can report them.
    tx = (
        tx.withColumn("wm_ts", F.timestamp_millis("eventTime"))
        .withWatermark("wm_ts", f"{cfg.lateness_ms} milliseconds")
        .drop("wm_ts")
    )
    keyed = keying.key_transactions(tx, keying.active_rules(spark, cfg), cfg.shards)
    return keyed.groupBy("shard").transformWithStateInPandas(
        RulesProcessor(cfg.lateness_ms), OUTPUT_SCHEMA, "append", "EventTime"
    )


def _start(df: DataFrame, cfg: JobConfig, name: str, sink) -> StreamingQuery:
    writer = df.writeStream.queryName(name).foreachBatch(sink).option("checkpointLocation", cfg.checkpoint(name))
    if cfg.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{int(cfg.trigger_seconds * 1000)} milliseconds")
    return writer.start()


def rule_changes(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    """Rule change files (the rules topic's local stand-in): one change set per file, in arrival order."""
    if cfg.kafka_rules_topic:  # the rules topic itself: one change set per message
        return kafka_io.rule_changes(spark, cfg)
    os.makedirs(cfg.rules_landing, exist_ok=True)
    return spark.readStream.text(cfg.rules_landing, wholetext=True).select(
        "value", F.col("_metadata.file_path").alias("source"),
        F.col("_metadata.file_modification_time").alias("modified"),
    )  # fmt: skip


class RuleChangeSink:
    """Merges each change set into the rules table; invalid rules go to rule_errors, valid ones still apply."""

    def __init__(self, cfg: JobConfig, printer: Printer | None = print):
        self.cfg, self.printer = cfg, printer

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        spark = df.sparkSession
        errors = []
        for row in df.orderBy("modified", "source").collect():
            changes, problems = parse_rules_text(row.value)
            applied = rulebook.apply(spark, self.cfg, changes, author=f"stream:{os.path.basename(row.source)}",
                                     change_id=f"{RULES_QUERY}:{batch_id}:{row.source}")  # fmt: skip
            errors += [{"ruleId": None if e.rule_id is None else str(e.rule_id), "raw": row.value,
                        "reason": "; ".join(e.problems), "source": row.source} for e in problems]  # fmt: skip
            if self.printer:
                self.printer(f"[rules] {os.path.basename(row.source)}: {len(applied)} rules changed, "
                             f"{len(problems)} rejected")  # fmt: skip
        if errors:
            frame = spark.createDataFrame(errors, "ruleId string, raw string, reason string, source string")
            tables.append(frame.withColumn("receivedAt", F.current_timestamp()), self.cfg, "rule_errors",
                          f"{RULES_QUERY}-errors", batch_id)  # fmt: skip


class Job:
    """The running queries of the job, by name."""

    def __init__(self, queries: dict[str, StreamingQuery]):
        self.by_name = queries

    def __getattr__(self, name: str) -> StreamingQuery:
        try:
            return self.__dict__["by_name"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def queries(self) -> list[StreamingQuery]:
        return list(self.by_name.values())

    def wait(self) -> None:
        for q in self.queries:
            q.awaitTermination()

    def process_all_available(self) -> None:
        for q in self.queries:
            q.processAllAvailable()

    def stop(self) -> None:
        for q in self.queries:
            if q.isActive:
                q.stop()


def detect_logins(spark: SparkSession, cfg: JobConfig, raw: DataFrame) -> DataFrame:
    """Login records → detector rules fan-out → per-user sequences: the login processor's output rows."""
    events = ingest.valid(ingest.parse_logins(raw))
    events = (
        events.withColumn("wm_ts", F.timestamp_millis("eventTimestamp"))
        .withWatermark("wm_ts", f"{cfg.lateness_ms} milliseconds")
        .drop("wm_ts")
    )  # same trick as evaluate()
    keyed = keying.key_logins(events, keying.active_login_rules(spark, cfg), cfg.shards)
    return keyed.groupBy("shard").transformWithStateInPandas(LoginProcessor(), LOGIN_OUTPUT_SCHEMA, "append",
                                                             "EventTime")  # fmt: skip


def start(spark: SparkSession, cfg: JobConfig, raw: DataFrame | None = None, printer: Printer | None = print) -> Job:
    """Create missing tables and start the queries: rules, ingest + evaluate, and (cfg.logins) the login ones."""
    tables.ensure(spark, cfg)
    raw = raw if raw is not None else raw_transactions(spark, cfg)
    queries = {
        RULES_QUERY: _start(rule_changes(spark, cfg), cfg, RULES_QUERY, RuleChangeSink(cfg, printer)),
        INGEST_QUERY: _start(ingest.parse(raw), cfg, INGEST_QUERY,
                             lambda df, bid: ingest.write_batch(df, cfg, bid, INGEST_QUERY)),
        EVALUATE_QUERY: _start(evaluate(spark, cfg, raw), cfg, EVALUATE_QUERY, AlertSink(cfg, EVALUATE_QUERY, printer)),
    }  # fmt: skip
    if cfg.logins:
        logins = raw_logins(spark, cfg)
        queries[LOGINS_INGEST_QUERY] = _start(
            ingest.parse_logins(logins),
            cfg,
            LOGINS_INGEST_QUERY,
            lambda df, bid: ingest.write_batch(df, cfg, bid, LOGINS_INGEST_QUERY, kind="login"),
        )
        queries[LOGINS_QUERY] = _start(detect_logins(spark, cfg, logins), cfg, LOGINS_QUERY,
                                       AlertSink(cfg, LOGINS_QUERY, printer, logins=True))  # fmt: skip
    return Job(queries)
