"""Where the job's records come from: JSON-lines files or Kafka topics, and the rule changes.

Every source yields `ingest.RAW_COLUMNS`: `value` (the record as text), `srcTime` (file modification time or
Kafka record timestamp, ms), `srcName` (file path or "topic-partition") and `srcPos` (line or offset), so
quarantine and bronze rows point at the exact record, and equal event times have a source order.

Kafka is plain Structured Streaming connector usage, so it runs the same against a local broker and a managed
cluster from Databricks. Connection and security settings come from JobConfig:

* `kafka_bootstrap` → `kafka.bootstrap.servers`;
* `kafka_options`: keys starting with `kafka.` (e.g. `kafka.security.protocol`, `kafka.sasl.mechanism`,
  `kafka.sasl.jaas.config`, `kafka.ssl.truststore.location`) go to every reader and writer as they are;
  other keys (e.g. `failOnDataLoss`, `minPartitions`) go to the readers only.
"""

from __future__ import annotations

import os

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamReader

from fraudrules.config import JobConfig
from fraudrules.engine import lines
from fraudrules.engine.ingest import RAW_COLUMNS
from fraudrules.paths import is_glob, is_remote

# Rule change sources are "topic-partition:offset" with the offset zero-padded: text order = offset order.
OFFSET_DIGITS = 20


def raw_transactions(spark: SparkSession, cfg: JobConfig, query: str) -> DataFrame:
    """Transaction records for one query (each query keeps its own position in the source, in its checkpoint)."""
    if cfg.source == "kafka":
        return kafka_source(spark, cfg, cfg.kafka_transactions_topic)
    return file_source(spark, cfg.landing, cfg.checkpoint(query), cfg.max_records_per_trigger)


def raw_logins(spark: SparkSession, cfg: JobConfig, query: str) -> DataFrame:
    if cfg.source == "kafka":
        return kafka_source(spark, cfg, cfg.kafka_logins_topic)
    return file_source(spark, cfg.logins_landing, cfg.checkpoint(query), cfg.max_records_per_trigger)


def file_source(spark: SparkSession, path: str, checkpoint: str, max_records: int | None = None) -> DataFrame:
    """JSON-lines files, one record per line, with (file, line) positions: the files of a folder (created when
    missing: a landing folder may not have received its first file yet), one file, or a glob's matches; at most
    `max_records` lines per micro-batch, whatever the files' sizes (`lines`). `checkpoint`: the reading query's,
    where the source keeps the files it has seen."""
    if not (is_remote(path) or is_glob(path) or os.path.isfile(path)):
        os.makedirs(path, exist_ok=True)
    lines.register(spark)
    reader = spark.readStream.format(lines.NAME).option("path", path).option("ledger", lines.ledger_of(checkpoint))
    if max_records:
        reader = reader.option("maxRecordsPerTrigger", str(max_records))
    records = reader.load().select(F.col("value").cast("string").alias("value"), "srcTime", "srcName", "srcPos")
    return records.where(F.trim("value") != "")


def rule_changes(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    """Rule change sets, one per file of the rules folder (the rules topic's local stand-in) or per message of
    the rules topic: `value` (a rule or a JSON list), `source` (unique per change set) and `modified`."""
    if cfg.kafka_rules_topic:
        return kafka_rule_changes(spark, cfg)
    os.makedirs(cfg.rules_landing, exist_ok=True)
    return spark.readStream.text(cfg.rules_landing, wholetext=True).select(
        "value",
        F.col("_metadata.file_path").alias("source"),
        F.col("_metadata.file_modification_time").alias("modified"),
    )


def client_options(cfg: JobConfig) -> dict[str, str]:
    """Options every Kafka reader and writer gets: bootstrap servers and the `kafka.*` pass-through ones."""
    if not cfg.kafka_bootstrap:
        raise ValueError("kafka_bootstrap is not configured")
    options = {k: str(v) for k, v in cfg.kafka_options.items() if k.startswith("kafka.")}
    return {"kafka.bootstrap.servers": cfg.kafka_bootstrap, **options}


def kafka_reader(spark: SparkSession, cfg: JobConfig, topic: str, max_offsets: int | None = None) -> DataStreamReader:
    r = spark.readStream.format("kafka").option("subscribe", topic)
    r = r.option("startingOffsets", cfg.kafka_starting_offsets)
    if max_offsets:
        r = r.option("maxOffsetsPerTrigger", str(max_offsets))
    for key, value in {**cfg.kafka_options, **client_options(cfg)}.items():
        r = r.option(key, str(value))
    return r


def kafka_source(spark: SparkSession, cfg: JobConfig, topic: str) -> DataFrame:
    """A topic as raw records (RAW_COLUMNS), at most `max_records_per_trigger` per micro-batch."""
    df = kafka_reader(spark, cfg, topic, cfg.max_records_per_trigger).load()
    return df.select(
        F.col("value").cast("string").alias("value"),
        F.unix_millis("timestamp").alias("srcTime"),
        F.concat_ws("-", "topic", F.col("partition").cast("string")).alias("srcName"),
        F.col("offset").cast("long").alias("srcPos"),
    ).select(*RAW_COLUMNS)


def kafka_rule_changes(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    """The rules topic in the shape of `rule_changes`: one change set (a rule or a JSON list) per message.

    `source` is "topic-partition:offset" (offset zero-padded) so that change ids are unique per message and
    messages with equal timestamps apply in offset order.
    """
    df = kafka_reader(spark, cfg, str(cfg.kafka_rules_topic)).load()
    offset = F.lpad(F.col("offset").cast("string"), OFFSET_DIGITS, "0")
    return df.select(
        F.coalesce(F.col("value").cast("string"), F.lit("")).alias("value"),
        F.concat(F.col("topic"), F.lit("-"), F.col("partition").cast("string"), F.lit(":"), offset).alias("source"),
        F.col("timestamp").alias("modified"),
    )
