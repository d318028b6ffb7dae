"""The continuous job: an ingest query (bronze + quarantine) and an evaluation query (alerts).

Both read the same source, each with its own checkpoint, so that an alert is one micro-batch away
from ingestion rather than two.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from fraudrules import ingest, keying, tables
from fraudrules.alerting import AlertSink, Printer
from fraudrules.config import JobConfig
from fraudrules.evaluation import OUTPUT_SCHEMA
from fraudrules.processor import RulesProcessor

INGEST_QUERY = "ingest"
EVALUATE_QUERY = "evaluate"


def raw_transactions(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    return ingest.file_source(spark, cfg.landing, cfg.max_files_per_trigger)


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


@dataclass
class Job:
    ingest: StreamingQuery
    evaluate: StreamingQuery

    @property
    def queries(self) -> list[StreamingQuery]:
        return [self.ingest, self.evaluate]

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


def start(spark: SparkSession, cfg: JobConfig, raw: DataFrame | None = None, printer: Printer | None = print) -> Job:
    """Create missing tables and start both queries on `raw` (the configured source by default)."""
    tables.ensure(spark, cfg)
    raw = raw if raw is not None else raw_transactions(spark, cfg)
    ingest_q = _start(
        ingest.parse(raw), cfg, INGEST_QUERY, lambda df, bid: ingest.write_batch(df, cfg, bid, INGEST_QUERY)
    )
    eval_q = _start(evaluate(spark, cfg, raw), cfg, EVALUATE_QUERY, AlertSink(cfg, EVALUATE_QUERY, printer))
    return Job(ingest_q, eval_q)
