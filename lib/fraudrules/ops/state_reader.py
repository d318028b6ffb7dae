"""The stateful queries' state, read from their checkpoints with Spark's state data source.

The window state is what the evaluate query retains per shard for the window rules, decoded with the engine's own
codec (`engine.state`). Chunks may still physically hold events no window can reach any more (they go when their
chunk is dropped or merged); `events` shows, by default, what the engine would use. The login state is the login
detector's open sequences, kept by the same query.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from fraudrules import event_schema, tables
from fraudrules.compat import spark_checkpoint
from fraudrules.config import EVALUATE_QUERY, JobConfig
from fraudrules.engine import keying
from fraudrules.engine.inputs import numeric, shard_labels
from fraudrules.engine.lines import open_fs
from fraudrules.engine.logins import decode_sequences
from fraudrules.engine.processors import watermark_of
from fraudrules.engine.ruleset import RuleSet
from fraudrules.engine.shard_values import VALUE, read_state
from fraudrules.engine.state import Bounds, Meta, Resets, decode
from fraudrules.engine.windowing import FIELDS

STATE_SCHEMA = "shard long, ruleId long, sig long, key string, eventTime long, transactionId long, seq long, value long"
STATE_COLUMNS = tuple(column.split()[0] for column in STATE_SCHEMA.split(", "))


@dataclass(frozen=True)
class CommittedBatch:
    """A query's newest committed micro-batch, from its checkpoint's commit and offset logs."""

    batch_id: int
    timestamp_ms: int


def last_committed(cfg: JobConfig, query: str = EVALUATE_QUERY) -> CommittedBatch | None:
    """The query's newest committed batch; None when its checkpoint has none (or does not exist)."""
    fs, root = open_fs(cfg.checkpoint(query))
    batch = spark_checkpoint.newest_committed(fs, root)
    return None if batch is None else committed(cfg, query, batch)


def committed(cfg: JobConfig, query: str, batch_id: int) -> CommittedBatch:
    """A committed batch of the query, with the time it ran at (from its offset log)."""
    metadata, _ = spark_checkpoint.planned(*open_fs(cfg.checkpoint(query)), batch_id)
    return CommittedBatch(batch_id, int(metadata.get("batchTimestampMs", 0)))


def raw(
    spark: SparkSession, cfg: JobConfig, var: str = "chunks", batch_id: int | None = None, query: str = EVALUATE_QUERY
) -> DataFrame:
    return read_state(spark, cfg.checkpoint(query), var, batch_id)


def _index(cfg: JobConfig) -> dict[int, int]:
    """Shard number of each grouping label (see inputs.shard_labels)."""
    return {label: i for i, label in enumerate(shard_labels(cfg.shards, cfg.shuffle_partitions))}


def _labelled(spark: SparkSession, cfg: JobConfig, field: str, batch_id: int | None) -> list[tuple[int, object]]:
    """A field of the shards' value (`shard_values`) in the evaluate query's state: (grouping label, value) where
    set."""
    rows = raw(spark, cfg, VALUE, batch_id).select("key.shard", f"value.{field}").collect()
    return [(int(label), value) for label, value in rows if value is not None]


def _values(spark: SparkSession, cfg: JobConfig, field: str, batch_id: int) -> dict[int, object]:
    """A field of the shards' value, per shard number where set."""
    index = _index(cfg)
    return {index[label]: value for label, value in _labelled(spark, cfg, field, batch_id)}


def watermarks(spark: SparkSession, cfg: JobConfig, batch_id: int, detector: str = "window") -> dict[int, int]:
    """Per shard number, a detector's own watermark (window or login) after a committed batch: the one the next
    batch runs with (`processors.watermark_of` the newest event time it has seen)."""
    if detector == "window":
        clocks = {s: Meta.from_json(t).clock for s, t in _values(spark, cfg, "meta", batch_id).items()}
    else:
        clocks = _values(spark, cfg, "login_clock", batch_id)
    return {s: watermark_of(int(c), cfg.lateness_ms) for s, c in clocks.items()}


def _batch(cfg: JobConfig, batch_id: int | None) -> CommittedBatch | None:
    return last_committed(cfg) if batch_id is None else committed(cfg, EVALUATE_QUERY, batch_id)


EVENTS_ARROW = pa.schema([("shard", pa.int64()), *[(f, pa.int64()) for f in FIELDS]])
EVENTS_SCHEMA = ", ".join(f"{f.name} long" for f in EVENTS_ARROW)


def events_frame(
    spark: SparkSession,
    cfg: JobConfig,
    batch_id: int | None = None,
    live: bool = True,
    marks: dict[int, int] | None = None,
) -> DataFrame:
    """Retained events of the window rules, one row each: shard number and the engine's event columns; with
    `live`, only those a future window can still reach (by the engine's own rules and watermark: `marks` when the
    caller has read them, see `watermarks`). Decoded by Spark's tasks, chunk by chunk: an hour of state is
    millions of events, which the driver need not hold."""
    batch = _batch(cfg, batch_id)
    if batch is None:
        return spark.createDataFrame([], EVENTS_SCHEMA)
    if live and marks is None:
        marks = watermarks(spark, cfg, batch.batch_id)
    chunks = raw(spark, cfg, "chunks", batch.batch_id)
    decoder = _Decoder(
        _index(cfg),
        _values(spark, cfg, "rules", batch.batch_id),
        {s: bytes(b) for s, b in _values(spark, cfg, "resets", batch.batch_id).items()},
        marks if live else None,
        event_schema.for_job(cfg),
    )
    blobs = chunks.select(F.col("key.shard").alias("label"), F.col("user_map_value.blob").alias("blob"))
    return blobs.mapInArrow(decoder.events, EVENTS_SCHEMA)


@dataclass(frozen=True)
class _Decoder:
    """A task's decoding of chunks (grouping label, blob) into events: per shard number its rules in force (JSON),
    reset rules and, for live events only, its watermark."""

    index: dict[int, int]
    rules: dict[int, str]
    resets: dict[int, bytes]
    marks: dict[int, int] | None
    schema: event_schema.EventSchema

    def events(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        live: dict[int, tuple[Bounds, Resets]] = {}
        for batch in batches:
            for label, blob in zip(batch.column("label").to_pylist(), batch.column("blob").to_pylist(), strict=True):
                shard = self.index[int(label)]
                ev = decode(blob)
                if self.marks is not None:
                    if shard not in live:
                        windows = RuleSet.from_json(self.rules[shard], self.schema).windows()
                        reset = Resets.decode(self.resets[shard]) if shard in self.resets else Resets.empty()
                        live[shard] = (Bounds.of(windows, self.marks[shard]), reset)
                    bounds, reset = live[shard]
                    ev = ev.take(np.flatnonzero(bounds.mask(ev) & ~reset.hidden(ev)))
                columns = {"shard": np.full(len(ev), shard, dtype=np.int64), **ev.columns()}
                yield pa.RecordBatch.from_pydict(columns, schema=EVENTS_ARROW)


def events(
    spark: SparkSession,
    cfg: JobConfig,
    batch_id: int | None = None,
    live: bool = True,
    marks: dict[int, int] | None = None,
) -> pd.DataFrame:
    """`events_frame` in the driver."""
    return events_frame(spark, cfg, batch_id, live, marks).toPandas()


def entries(
    spark: SparkSession, cfg: JobConfig, batch_id: int | None = None, marks: dict[int, int] | None = None
) -> DataFrame:
    """One row per retained event the engine can still use (`events_frame`, live), with its key (the transaction's
    grouping fields, read back from bronze; null where bronze lacks the transaction) and its transaction
    (STATE_SCHEMA). Joined and keyed by Spark's tasks, with the engine's own keying."""
    batch = _batch(cfg, batch_id)
    if batch is None:
        return spark.createDataFrame([], STATE_SCHEMA)
    schema = event_schema.for_job(cfg)
    rules = RuleSet.from_json(next(iter(_values(spark, cfg, "rules", batch.batch_id).values()), None), schema)
    # the transactions as the engine read them (its own columns), so that keys read as the engine writes them; only
    # the id and the window rules' grouping fields (Parquet reads no other column: an hour of bronze is gigabytes)
    window_rules = {rid: r for rid in rules.rules if (r := rules.usable(rid)) is not None and r.rule_type == "WINDOW"}
    used = sorted({n for r in window_rules.values() for n in r.grouping_key_names})
    columns = [schema.input_column(n) for n in used]
    inputs = {f"_in{i}": column for i, column in enumerate(columns)}  # apart from the events' own column names
    bronze = numeric(tables.read(spark, cfg, "transactions").withColumn("srcTime", F.lit(0)), schema)
    typed = bronze.select(
        F.col(schema.input_column("transactionId")).alias("_tx"), *[F.col(c).alias(a) for a, c in inputs.items()]
    ).dropDuplicates(["_tx"])
    # a left join with the numbers of a transaction bronze lacks as 0 (an int64 column stays one in pandas) and
    # `_found` false: its key is null
    joined = events_frame(spark, cfg, batch.batch_id, marks=marks).join(typed, F.col("tx") == F.col("_tx"), "left")
    numbers = {a for a, kind in typed.dtypes if kind == "bigint"}
    kept = [F.coalesce(F.col(a), F.lit(0)).alias(a) if a in numbers else F.col(a) for a in inputs]
    rows = joined.select(*EVENTS_ARROW.names, F.col("_tx").isNotNull().alias("_found"), *kept)

    def keyed(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            found = frame["_found"].to_numpy(bool)
            tx = keying.Transactions(frame[list(inputs)].rename(columns=inputs).reset_index(drop=True), schema)
            keys = np.full(len(frame), None, dtype=object)
            for rule_id, at in frame.groupby("rule").indices.items():  # one keying call per rule, not per event
                rule = window_rules.get(int(rule_id))  # None: the job's event schema no longer declares its fields
                if rule is not None:
                    keys[at[found[at]]] = keying.key_texts(tx, rule, at[found[at]])
            out = frame.rename(columns={"rule": "ruleId", "t": "eventTime", "tx": "transactionId", "val": "value"})
            yield out.assign(key=keys)[list(STATE_COLUMNS)]

    return rows.mapInPandas(keyed, STATE_SCHEMA)


def keys(spark: SparkSession, cfg: JobConfig, batch_id: int | None = None) -> pd.DataFrame:
    """Per (ruleId, key): retained events and their event-time span."""
    per_key = entries(spark, cfg, batch_id).groupBy("ruleId", "key")
    spans = per_key.agg(
        F.count("*").alias("events"), F.min("eventTime").alias("oldest"), F.max("eventTime").alias("newest")
    )
    return spans.orderBy("ruleId", "key").toPandas()


def login_sequences(spark: SparkSession, cfg: JobConfig, batch_id: int | None = None) -> pd.DataFrame:
    """Open login sequences of the login detector (as of a committed batch, default the newest): (shard, ruleId,
    userId, start, failedIps)."""
    rows = []
    for label, blob in _labelled(spark, cfg, "login_sequences", batch_id):
        for (rule, user), seq in decode_sequences(bytes(blob)).items():
            rows.append({"shard": label, "ruleId": rule, "userId": user, "start": seq.start, "failedIps": seq.ips})
    return pd.DataFrame(rows, columns=["shard", "ruleId", "userId", "start", "failedIps"])
