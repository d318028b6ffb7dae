"""The continuous job: an ingest query (bronze + quarantine) and an evaluation query (alerts).

Both read the same source, each with its own checkpoint, so that an alert is one micro-batch away
from ingestion rather than two.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from fraudrules import tables
from fraudrules.config import (
    EVALUATE_QUERY,
    INGEST_QUERY,
    LOGINS_INGEST_QUERY,
    LOGINS_QUERY,
    QUERIES,
    RULES_QUERY,
    TRANSACTION_QUERIES,
    JobConfig,
)
from fraudrules.engine import ingest, keying
from fraudrules.engine.evaluation import OUTPUT_SCHEMA
from fraudrules.engine.logins import LOGIN_OUTPUT_SCHEMA
from fraudrules.engine.processors import LoginProcessor, RulesProcessor
from fraudrules.engine.sinks import AlertSink, Printer, RuleChangeSink, write_bronze
from fraudrules.engine.sources import raw_logins, raw_transactions, rule_changes


def watermarked(df: DataFrame, time_ms_column: str, lateness_ms: int) -> DataFrame:
    """The event-time watermark on an epoch-ms column, declared on a helper column that is dropped at
    once: the stateful stage still receives the query's watermark, but Spark no longer discards late
    rows before the processor can report them."""
    return (
        df.withColumn("wm_ts", F.timestamp_millis(time_ms_column))
        .withWatermark("wm_ts", f"{lateness_ms} milliseconds")
        .drop("wm_ts")
    )


def evaluate(spark: SparkSession, cfg: JobConfig, raw: DataFrame) -> DataFrame:
    """Source records → keyed events → windowed evaluation: the processor's output rows."""
    tx = watermarked(ingest.valid(ingest.parse(raw)), "eventTime", cfg.lateness_ms)
    keyed = keying.key_transactions(tx, keying.active_rules(spark, cfg), cfg.shards)
    return keyed.groupBy("shard").transformWithStateInPandas(
        RulesProcessor(cfg.lateness_ms), OUTPUT_SCHEMA, "append", "EventTime"
    )


def start_query(df: DataFrame, sink: Callable[[DataFrame, int], None], cfg: JobConfig, name: str) -> StreamingQuery:
    """Start one query with its foreachBatch sink, checkpoint and the configured trigger."""
    writer = df.writeStream.queryName(name).foreachBatch(sink).option("checkpointLocation", cfg.checkpoint(name))
    if cfg.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{int(cfg.trigger_seconds * 1000)} milliseconds")
    return writer.start()


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

    def stop(self, drain_s: float = 30.0) -> None:
        """Stop every query; with `drain_s`, each first gets that long to finish the micro-batch it is in
        (stopping interrupts a running batch: it is redone on restart, but the JVM reports the interruption)."""
        deadline = time.monotonic() + drain_s
        for q in self.queries:
            while q.isActive and q.status["isTriggerActive"] and time.monotonic() < deadline:
                time.sleep(0.2)
            if q.isActive:
                q.stop()


def detect_logins(spark: SparkSession, cfg: JobConfig, raw: DataFrame) -> DataFrame:
    """Login records → detector rules fan-out → per-user sequences: the login processor's output rows."""
    events = watermarked(ingest.valid(ingest.parse_logins(raw)), "eventTimestamp", cfg.lateness_ms)
    keyed = keying.key_logins(events, keying.active_login_rules(spark, cfg), cfg.shards)
    return keyed.groupBy("shard").transformWithStateInPandas(
        LoginProcessor(), LOGIN_OUTPUT_SCHEMA, "append", "EventTime"
    )


def query(
    spark: SparkSession, cfg: JobConfig, name: str, printer: Printer | None = print, raw: DataFrame | None = None
) -> tuple[DataFrame, Callable[[DataFrame, int], None]]:
    """The named query's streaming DataFrame and its foreachBatch sink (`raw`: the transactions source)."""
    if name == RULES_QUERY:
        return rule_changes(spark, cfg), RuleChangeSink(cfg, printer)
    if name in (INGEST_QUERY, EVALUATE_QUERY):
        raw = raw if raw is not None else raw_transactions(spark, cfg)
        if name == INGEST_QUERY:
            return ingest.parse(raw), lambda df, bid: write_bronze(df, cfg, bid, INGEST_QUERY)
        return evaluate(spark, cfg, raw), AlertSink(cfg, EVALUATE_QUERY, printer)
    if name == LOGINS_INGEST_QUERY:
        return ingest.parse_logins(raw_logins(spark, cfg)), lambda df, bid: write_bronze(
            df, cfg, bid, LOGINS_INGEST_QUERY, kind="login"
        )
    if name == LOGINS_QUERY:
        return detect_logins(spark, cfg, raw_logins(spark, cfg)), AlertSink(cfg, LOGINS_QUERY, printer, logins=True)
    raise ValueError(f"unknown query {name!r}; queries: {', '.join(QUERIES)}")


def start(spark: SparkSession, cfg: JobConfig, raw: DataFrame | None = None, printer: Printer | None = print) -> Job:
    """Create missing tables and start the queries: rules, ingest + evaluate, and (cfg.logins) the login ones."""
    tables.ensure(spark, cfg)
    raw = raw if raw is not None else raw_transactions(spark, cfg)
    names = QUERIES if cfg.logins else TRANSACTION_QUERIES
    return Job({name: start_query(*query(spark, cfg, name, printer, raw), cfg, name) for name in names})
