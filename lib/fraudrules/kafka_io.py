"""Kafka in and out: transactions, logins and rule changes from topics; alerts to a topic.

Everything here is plain Structured Streaming Kafka connector usage, so it runs the same against the
local broker (`kafka_local.LocalKafka`) and against a managed cluster from Databricks. Connection and
security settings come from JobConfig:

* `kafka_bootstrap` → `kafka.bootstrap.servers`;
* `kafka_options`: keys starting with `kafka.` (e.g. `kafka.security.protocol`, `kafka.sasl.mechanism`,
  `kafka.sasl.jaas.config`, `kafka.ssl.truststore.location`) go to every reader and writer as they are;
  other keys (e.g. `failOnDataLoss`, `minPartitions`) go to the readers only.

Sources yield `ingest.RAW_COLUMNS`: `value` (the message value as text), `srcTime` (the Kafka record
timestamp, ms), `srcName` ("topic-partition") and `srcPos` (the offset), so quarantine rows and bronze
rows point at the exact record, like (file, line) for files.

The alerts topic is at-least-once (Spark's Kafka sink contract: a micro-batch replayed after a crash
publishes its alerts again); the message key is the alertId, so consumers de-duplicate on it. The
Delta `alerts` table stays exactly-once.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamReader

from fraudrules.config import JobConfig
from fraudrules.generator import PacedWriter
from fraudrules.ingest import RAW_COLUMNS

# Rule change sources are "topic-partition:offset" with the offset zero-padded: text order = offset order.
OFFSET_DIGITS = 20


def parse_options(pairs: list[str] | None) -> dict[str, str]:
    """`KEY=VALUE` strings (e.g. from `--kafka-option`) as a dict; raises ValueError on a pair without `=`."""
    options = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"Kafka option {pair!r} is not KEY=VALUE")
        options[key.strip()] = value
    return options


def client_options(cfg: JobConfig) -> dict[str, str]:
    """Options every Kafka reader and writer gets: bootstrap servers and the `kafka.*` pass-through ones."""
    if not cfg.kafka_bootstrap:
        raise ValueError("kafka_bootstrap is not configured")
    options = {k: str(v) for k, v in cfg.kafka_options.items() if k.startswith("kafka.")}
    return {"kafka.bootstrap.servers": cfg.kafka_bootstrap, **options}


def reader(spark: SparkSession, cfg: JobConfig, topic: str, max_offsets: int | None = None) -> DataStreamReader:
    r = spark.readStream.format("kafka").option("subscribe", topic)
    r = r.option("startingOffsets", cfg.kafka_starting_offsets)
    if max_offsets:
        r = r.option("maxOffsetsPerTrigger", str(max_offsets))
    for key, value in {**cfg.kafka_options, **client_options(cfg)}.items():
        r = r.option(key, str(value))
    return r


def source(spark: SparkSession, cfg: JobConfig, topic: str) -> DataFrame:
    """A topic as raw records (RAW_COLUMNS), at most `max_offsets_per_trigger` per micro-batch."""
    df = reader(spark, cfg, topic, cfg.max_offsets_per_trigger).load()
    return df.select(
        F.col("value").cast("string").alias("value"),
        F.unix_millis("timestamp").alias("srcTime"),
        F.concat_ws("-", "topic", F.col("partition").cast("string")).alias("srcName"),
        F.col("offset").cast("long").alias("srcPos"),
    ).select(*RAW_COLUMNS)


def rule_changes(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    """The rules topic in the shape of `job.rule_changes`: one change set (a rule or a JSON list) per message.

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


# --- producing (generator, tests, demos): confluent-kafka, imported lazily -------------------------------------


def producer(bootstrap: str, **extra: object):
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                     "linger.ms": 5, **extra})  # fmt: skip


def produce(bootstrap: str, topic: str, values: list, key: str | None = None, timeout_s: float = 60) -> int:
    """Produce values (dicts as JSON, strings as they are) in order and wait for every delivery."""
    errors: list[str] = []
    p = producer(bootstrap)
    for value in values:
        text = value if isinstance(value, str) else json.dumps(value)
        p.produce(topic, value=text.encode(), key=key.encode() if key else None,
                  on_delivery=lambda err, _msg: errors.append(str(err)) if err else None)  # fmt: skip
        p.poll(0)
    left = p.flush(timeout_s)
    if left or errors:
        raise RuntimeError(f"{left} messages undelivered to {topic}; errors: {errors[:3]}")
    return len(values)


class KafkaRateWriter(PacedWriter):
    """A paced writer into a topic: one message per event, polled per tick, flushed at the end."""

    def __init__(self, bootstrap: str, topic: str, events: Iterator[dict], rate: float, **kwargs):
        super().__init__(events, rate, name=f"kafka-writer-{topic}", **kwargs)
        self.topic, self._producer = topic, producer(bootstrap)

    def emit(self, rows: list[dict], now_ms: int, tick: int) -> None:
        for event in rows:
            self._producer.produce(self.topic, value=json.dumps(event).encode())
        self._producer.poll(0)

    def close(self) -> None:
        self._producer.flush(10)


# --- local broker and topics (dev, tests, demos) ----------------------------------------------------------------


def start_local_broker(work_dir: str, port: int | None = None, timeout_s: float = 120):
    """A `kafka_local.LocalKafka` broker under work_dir (jars resolved first), started; stop() it when done."""
    from pathlib import Path

    from fraudrules.kafka_local import DEFAULT_JARS, DEFAULT_POM, LocalKafka, resolve_jars

    jars = resolve_jars(Path(os.environ.get("FRAUDRULES_KAFKA_JARS", DEFAULT_JARS)), DEFAULT_POM)
    return LocalKafka(jars, Path(work_dir), port).start(timeout_s=timeout_s)


def create_topics(bootstrap: str, topics: list[str], partitions: int = 1, timeout_s: float = 60) -> None:
    """Create topics that do not exist yet (replication factor 1: the local broker)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    wanted = [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in dict.fromkeys(topics)
              if t and t not in existing]  # fmt: skip
    for topic, future in (admin.create_topics(wanted, operation_timeout=timeout_s) if wanted else {}).items():
        try:
            future.result(timeout_s)
        except Exception as err:  # a concurrent creator is fine
            if "TOPIC_ALREADY_EXISTS" not in str(err):
                raise RuntimeError(f"cannot create topic {topic}: {err}") from err


def consume_all(bootstrap: str, topic: str, timeout_s: float = 120) -> list:
    """Every message of a topic, all partitions, from the start up to the end offsets at the time of the call."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"fraudrules-read-{time.time_ns()}",
                         "enable.auto.commit": False})  # fmt: skip
    messages = []
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1]
                for p in meta.partitions}  # fmt: skip
        todo = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                raise RuntimeError(f"consuming {topic}: {msg.error()}")
            messages.append(msg)
            if msg.offset() + 1 >= ends[msg.partition()]:
                todo.discard(msg.partition())
        if todo:
            raise TimeoutError(f"{topic}: partitions {sorted(todo)} not read to the end in {timeout_s}s")
    finally:
        consumer.close()
    return messages
