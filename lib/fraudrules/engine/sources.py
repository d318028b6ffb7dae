"""Where the job's records come from: JSON-lines files or Kafka topics, and the rule changes.

Every source yields `ingest.RAW_COLUMNS`: `value` (the record as text), `srcTime` (file modification time or
Kafka record timestamp, ms), `srcName` (file path or "topic-partition") and `srcPos` (line or offset), so
quarantine and bronze rows point at the exact record, and equal event times have a source order.
Topics are read by `kafka`.
"""

from __future__ import annotations

import os

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from fraudrules.config import JobConfig
from fraudrules.engine import kafka, lines
from fraudrules.paths import is_glob, is_remote
from fraudrules.rules.table import is_path

VERSION_DIGITS = 20  # a Delta version in a rule change's `source`, zero-padded: text order is version order


def raw_transactions(spark: SparkSession, cfg: JobConfig, query: str) -> DataFrame:
    """Transaction records for one query (each query keeps its own position in the source, in its checkpoint)."""
    if cfg.source == "kafka":
        return kafka.raw_records(spark, cfg, cfg.kafka_transactions_topic)
    return file_source(spark, cfg.landing, cfg.checkpoint(query), cfg.max_records_per_trigger)


def raw_logins(spark: SparkSession, cfg: JobConfig, query: str, ledger: str = "lines") -> DataFrame:
    """Login records for one query; `ledger` names the file source's ledger in the query's checkpoint (the
    evaluation query reads transactions as well)."""
    if cfg.source == "kafka":
        return kafka.raw_records(spark, cfg, cfg.kafka_logins_topic)
    return file_source(spark, cfg.logins_landing, cfg.checkpoint(query), cfg.max_records_per_trigger, ledger)


def file_source(
    spark: SparkSession, path: str, checkpoint: str, max_records: int | None = None, ledger: str = "lines"
) -> DataFrame:
    """JSON-lines files, one record per line, with (file, line) positions: the files of a folder (created when
    missing: a landing folder may not have received its first file yet), one file, or a glob's matches; at most
    `max_records` lines per micro-batch, whatever the files' sizes (`lines`). `checkpoint`: the reading query's,
    where the source keeps the files it has seen."""
    if not (is_remote(path) or is_glob(path) or os.path.isfile(path)):
        os.makedirs(path, exist_ok=True)
    lines.register(spark)
    reader = spark.readStream.format(lines.NAME).schema(lines.SCHEMA).option("path", path)
    reader = reader.option("ledger", lines.ledger_of(checkpoint, ledger))
    if max_records:
        reader = reader.option("maxRecordsPerTrigger", str(max_records))
    records = reader.load().select(F.col("value").cast("string").alias("value"), "srcTime", "srcName", "srcPos")
    return records.where(F.trim("value") != "")


def rule_changes(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    """Rule change sets, one per file of the rules folder (the rules topic's local stand-in) or per message of
    the rules topic: `value` (a rule or a JSON list), `source` (unique per change set) and `modified`; with a
    rules table, one per row change of its change feed (`table_changes`)."""
    if cfg.rules_table:
        return table_changes(spark, cfg.rules_table)
    if cfg.kafka_rules_topic:
        return kafka.rule_changes(spark, cfg)
    os.makedirs(cfg.rules_landing, exist_ok=True)
    return spark.readStream.text(cfg.rules_landing, wholetext=True).select(
        "value",
        F.col("_metadata.file_path").alias("source"),
        F.col("_metadata.file_modification_time").alias("modified"),
    )


def table_changes(spark: SparkSession, table: str) -> DataFrame:
    """A Delta table's Change Data Feed (a table name, or a path: it has a '/') in the shape of `rule_changes`
    (`change_rows`). A fresh checkpoint starts with the table's rows as inserts (Delta's snapshot of a change feed
    without a starting version), then its changes."""
    reader = spark.readStream.format("delta").option("readChangeFeed", "true")
    return change_rows(reader.load(table) if is_path(table) else reader.table(table), table)


def change_rows(feed: DataFrame, table: str) -> DataFrame:
    """Change feed rows as rule changes: `value` the changed row with its change columns as JSON
    (`cdc.table_change`), `source` "<table>@<version>" (zero-padded: versions apply in order), `modified` the
    commit's time. An update's old image is left out: the new one says it all."""
    feed = feed.where(F.col("_change_type") != "update_preimage")
    version = F.lpad(F.col("_commit_version").cast("string"), VERSION_DIGITS, "0")
    return feed.select(
        F.to_json(F.struct(*[F.col(f"`{c}`") for c in feed.columns])).alias("value"),
        F.concat(F.lit(f"{table}@"), version).alias("source"),
        F.col("_commit_timestamp").alias("modified"),
    )
