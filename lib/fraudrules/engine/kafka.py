"""Kafka I/O of the job: the topics it reads (transactions, logins, rule changes) and the alerts it publishes.

Plain Structured Streaming connector usage, so it runs the same against a local broker and a managed cluster from
Databricks. Connection and security settings come from JobConfig:

* `kafka_bootstrap` → `kafka.bootstrap.servers`;
* `kafka_options`: keys starting with `kafka.` (e.g. `kafka.security.protocol`, `kafka.sasl.mechanism`,
  `kafka.sasl.jaas.config`, `kafka.ssl.truststore.location`) go to every reader and writer as they are;
  other keys (e.g. `failOnDataLoss`, `minPartitions`) go to the readers only.
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamReader

from fraudrules.config import JobConfig
from fraudrules.engine.ingest import RAW_COLUMNS
from fraudrules.engine.outbox import EXACT_INTS

# Rule change sources are "topic-partition:offset" with the offset zero-padded: text order = offset order.
OFFSET_DIGITS = 20


def client_options(cfg: JobConfig) -> dict[str, str]:
    """Options every Kafka reader and writer gets: bootstrap servers and the `kafka.*` pass-through ones."""
    if not cfg.kafka_bootstrap:
        raise ValueError("kafka_bootstrap is not configured")
    options = {k: str(v) for k, v in cfg.kafka_options.items() if k.startswith("kafka.")}
    return {"kafka.bootstrap.servers": cfg.kafka_bootstrap, **options}


def reader(spark: SparkSession, cfg: JobConfig, topic: str, max_offsets: int | None = None) -> DataStreamReader:
    """A streaming reader of `topic` with the connection options, at most `max_offsets` records per micro-batch."""
    r = spark.readStream.format("kafka").option("subscribe", topic)
    r = r.option("startingOffsets", cfg.kafka_starting_offsets)
    if max_offsets:
        r = r.option("maxOffsetsPerTrigger", str(max_offsets))
    for key, value in {**cfg.kafka_options, **client_options(cfg)}.items():
        r = r.option(key, str(value))
    return r


def raw_records(spark: SparkSession, cfg: JobConfig, topic: str) -> DataFrame:
    """A topic as raw records (RAW_COLUMNS), at most `max_records_per_trigger` per micro-batch."""
    df = reader(spark, cfg, topic, cfg.max_records_per_trigger).load()
    return df.select(
        F.col("value").cast("string").alias("value"),
        F.unix_millis("timestamp").alias("srcTime"),
        F.concat_ws("-", "topic", F.col("partition").cast("string")).alias("srcName"),
        F.col("offset").cast("long").alias("srcPos"),
    ).select(*RAW_COLUMNS)


def rule_changes(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    """The rules topic in the shape of `sources.rule_changes`: one change set (a rule or a JSON list) per message.

    `source` is "topic-partition:offset" (offset zero-padded) so that change ids are unique per message and
    messages with equal timestamps apply in offset order.
    """
    df = reader(spark, cfg, str(cfg.kafka_rules_topic)).load()
    offset = F.lpad(F.col("offset").cast("string"), OFFSET_DIGITS, "0")
    return df.select(
        F.coalesce(F.col("value").cast("string"), F.lit("")).alias("value"),
        F.concat(F.col("topic"), F.lit("-"), F.col("partition").cast("string"), F.lit(":"), offset).alias("source"),
        F.col("timestamp").alias("modified"),
    )


def publish_alerts(spark: SparkSession, alerts: pa.Table, cfg: JobConfig) -> None:
    """Write one micro-batch's alerts (rows of the alerts table, outbox form) to the alerts topic: key = alertId,
    value = the row as JSON."""
    frame = alerts.to_pandas(types_mapper=EXACT_INTS.get)  # ids stay exact integers
    messages = pd.DataFrame(
        {"key": frame["alertId"].astype(str), "value": frame.to_json(orient="records", lines=True).splitlines()}
    )
    writer = spark.createDataFrame(messages, "key string, value string").write.format("kafka")
    writer = writer.option("topic", str(cfg.kafka_alerts_topic))
    for key, value in client_options(cfg).items():
        writer = writer.option(key, value)
    writer.save()
