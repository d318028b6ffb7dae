"""Kafka I/O of the job: the topics it reads (transactions, logins, rule changes) and the alerts it publishes.

Plain Structured Streaming connector usage, so it runs the same against a local broker and a managed cluster from
Databricks. Connection and security settings come from JobConfig:

* `kafka_bootstrap` → `kafka.bootstrap.servers`;
* `kafka_options`: keys starting with `kafka.` (e.g. `kafka.security.protocol`, `kafka.sasl.mechanism`,
  `kafka.sasl.jaas.config`, `kafka.ssl.truststore.location`) go to every reader as they are, and to the alerts
  producer as librdkafka names them (`producer_config`); other keys (e.g. `failOnDataLoss`, `minPartitions`) go to
  the readers only.

The alerts go out through librdkafka in the driver (`AlertsProducer`), not a Spark write: no Spark job per
micro-batch.
"""

from __future__ import annotations

import re
from functools import partial

import pyarrow as pa
from confluent_kafka import KafkaException, Producer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamReader

from fraudrules.config import JobConfig
from fraudrules.engine.ingest import RAW_COLUMNS
from fraudrules.engine.outbox import EXACT_INTS
from fraudrules.kafka_client import send

# Rule change sources are "topic-partition:offset" with the offset zero-padded: text order = offset order.
OFFSET_DIGITS = 20
# The rules topic's broker-side fetch wait. The topic is idle between changes, and the read task of a change waited
# out the cached consumer's last fetch, parked at the broker for the Kafka default of 500 ms: a micro-batch of
# one Debezium event took 550 ms to collect, 70-100 ms with 20 (make rules-db). A user's setting stands.
RULES_FETCH_WAIT_MS = 20


def client_options(cfg: JobConfig) -> dict[str, str]:
    """Options every Kafka reader and writer gets: bootstrap servers and the `kafka.*` pass-through ones."""
    if not cfg.kafka_bootstrap:
        raise ValueError("kafka_bootstrap is not configured")
    options = {k: str(v) for k, v in cfg.kafka_options.items() if k.startswith("kafka.")}
    return {"kafka.bootstrap.servers": cfg.kafka_bootstrap, **options}


def reader(
    spark: SparkSession,
    cfg: JobConfig,
    topic: str,
    max_offsets: int | None = None,
    defaults: dict[str, str] | None = None,
) -> DataStreamReader:
    """A streaming reader of `topic` with the connection options, at most `max_offsets` records per micro-batch;
    `defaults`: options of this reader that the user's `kafka_options` override."""
    r = spark.readStream.format("kafka").option("subscribe", topic)
    r = r.option("startingOffsets", cfg.kafka_starting_offsets)
    if max_offsets:
        r = r.option("maxOffsetsPerTrigger", str(max_offsets))
    for key, value in {**(defaults or {}), **cfg.kafka_options, **client_options(cfg)}.items():
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
    wait = {"kafka.fetch.max.wait.ms": str(RULES_FETCH_WAIT_MS)}
    df = reader(spark, cfg, str(cfg.kafka_rules_topic), defaults=wait).load()
    offset = F.lpad(F.col("offset").cast("string"), OFFSET_DIGITS, "0")
    return df.select(
        F.coalesce(F.col("value").cast("string"), F.lit("")).alias("value"),
        F.concat(F.col("topic"), F.lit("-"), F.col("partition").cast("string"), F.lit(":"), offset).alias("source"),
        F.col("timestamp").alias("modified"),
    )


# The Java consumer's settings that a producer does not have: readers' options (`kafka.*` go to every reader and
# writer), which the alerts producer skips as Spark's Java writer does (it warns of them and goes on).
CONSUMER_ONLY = frozenset(
    [
        "allow.auto.create.topics",
        "auto.commit.interval.ms",
        "auto.offset.reset",
        "check.crcs",
        "client.rack",
        "default.api.timeout.ms",
        "enable.auto.commit",
        "exclude.internal.topics",
        "fetch.max.bytes",
        "fetch.max.wait.ms",
        "fetch.min.bytes",
        "group.id",
        "group.instance.id",
        "group.protocol",
        "group.remote.assignor",
        "heartbeat.interval.ms",
        "isolation.level",
        "key.deserializer",
        "max.partition.fetch.bytes",
        "max.poll.interval.ms",
        "max.poll.records",
        "partition.assignment.strategy",
        "session.timeout.ms",
        "value.deserializer",
    ]
)
JAAS_LOGIN = re.compile(r"\.(PlainLoginModule|ScramLoginModule)\s+required\b(?P<options>.*)", re.DOTALL)
JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')
PRODUCER_DEFAULTS = {  # the Java producer's defaults where librdkafka's differ (delivery.timeout.ms: 2 minutes)
    "enable.idempotence": "true",
    "acks": "all",
    "delivery.timeout.ms": "120000",
}


def producer_config(cfg: JobConfig) -> dict[str, str]:
    """The alerts producer's librdkafka settings from the job's Java client options (`client_options`).

    Most Java producer settings have the same name in librdkafka and pass as they are (librdkafka rejects those it
    does not know). Translated: `sasl.jaas.config` of the PLAIN and SCRAM login modules (to `sasl.username` and
    `sasl.password`), a PEM trust store (`ssl.truststore.type=PEM`: to `ssl.ca.location`, or `ssl.ca.pem` for
    `ssl.truststore.certificates`), an empty `ssl.endpoint.identification.algorithm` (to `none`). Consumer-only
    settings are skipped. A JKS or PKCS12 trust store, or another JAAS login module, has no librdkafka equivalent:
    a ValueError says which option."""
    java = {k.removeprefix("kafka."): v for k, v in client_options(cfg).items()}
    config = dict(PRODUCER_DEFAULTS)
    truststore = java.pop("ssl.truststore.type", "JKS").upper()
    for key, value in java.items():
        if key in CONSUMER_ONLY:
            continue
        if key == "sasl.jaas.config":
            config.update(_jaas_credentials(value))
        elif key in ("ssl.truststore.location", "ssl.truststore.certificates"):
            if truststore != "PEM":
                raise ValueError(
                    f"kafka.{key}: the alerts producer (librdkafka) reads PEM trust stores only; set "
                    f"kafka.ssl.truststore.type=PEM with a PEM file (this one is {truststore})"
                )
            config["ssl.ca.location" if key.endswith("location") else "ssl.ca.pem"] = value
        elif key == "ssl.endpoint.identification.algorithm":
            config[key] = value or "none"
        else:
            config[key] = value
    return config


def _jaas_credentials(jaas: str) -> dict[str, str]:
    """`sasl.username` and `sasl.password` of a PLAIN or SCRAM JAAS login (any package: `kafkashaded.` too)."""
    login = JAAS_LOGIN.search(jaas)
    options = dict(JAAS_OPTION.findall(login.group("options"))) if login else {}
    if "username" not in options or "password" not in options:
        raise ValueError(
            "kafka.sasl.jaas.config: the alerts producer (librdkafka) takes a PlainLoginModule or ScramLoginModule "
            'login with username="..." password="..." only'
        )
    unescape = partial(re.sub, r"\\(.)", r"\1")
    return {"sasl.username": unescape(options["username"]), "sasl.password": unescape(options["password"])}


class AlertsProducer:
    """The alerts topic's producer in the driver (librdkafka): a micro-batch's alerts sent and acknowledged in one
    call, without a Spark job (whose tasks would take the cores the next micro-batch needs)."""

    def __init__(self, cfg: JobConfig):
        self.topic = str(cfg.kafka_alerts_topic)
        self.client_error: object = None  # the last error of librdkafka's own (connection, authentication)
        # librdkafka's own log: critical only. Its errors are retries it makes itself, one line every few hundred ms
        # while a broker is down; a message it cannot deliver fails its delivery, raised here with the last of them.
        try:
            self.producer = Producer({**producer_config(cfg), "log_level": 2, "error_cb": self._client_error})
        except KafkaException as err:
            raise ValueError(f"the alerts producer (librdkafka) cannot take the job's Kafka options: {err}") from err

    def __call__(self, alerts: pa.Table) -> None:
        """Every row to the topic, key = alertId, value = the row as JSON; returns once the broker has each one,
        raises the first delivery error."""
        if not alerts.num_rows:
            return
        frame = alerts.to_pandas(types_mapper=EXACT_INTS.get)  # ids stay exact integers
        values = frame.to_json(orient="records", lines=True).splitlines()
        errors: list[object] = []

        def delivered(err: object, _msg: object) -> None:
            if err is not None:
                errors.append(err)

        for key, value in zip(frame["alertId"].astype(str), values, strict=True):
            send(self.producer, self.topic, value.encode(), key.encode(), delivered)
        self.producer.flush()
        if errors:
            last = f" (the client's last error: {self.client_error})" if self.client_error else ""
            raise RuntimeError(
                f"{len(errors)} of {len(values)} alerts not delivered to {self.topic}: {errors[0]}{last}"
            )

    def _client_error(self, err: object) -> None:
        self.client_error = err

    def cancel(self) -> None:
        """Drop the messages not delivered yet: a send waiting for them returns with their delivery errors at once
        instead of after the delivery timeout (a broker that is down)."""
        self.producer.purge()

    def close(self) -> None:
        """Deliver what is left and end the producer's connections (else it retries them while its process lives)."""
        self.producer.close()
