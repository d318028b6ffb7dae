"""The stateful queries' state, read from their checkpoints with Spark's state data source.

The window state is what the evaluate query retains per shard for the window rules, decoded with the engine's own
codec (`engine.state`). Chunks may still physically hold events no window can reach any more (they go when their
chunk is dropped or merged); `events` shows, by default, what the engine would use. The login state is the login
detector's open sequences, kept by the same query.
"""

from __future__ import annotations

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

STATE_COLUMNS = ("shard", "ruleId", "sig", "key", "eventTime", "transactionId", "seq", "value")


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


def events(
    spark: SparkSession,
    cfg: JobConfig,
    batch_id: int | None = None,
    live: bool = True,
    marks: dict[int, int] | None = None,
) -> pd.DataFrame:
    """Retained events of the window rules, one row each: shard number and the engine's event columns; with
    `live`, only those a future window can still reach (by the engine's own rules and watermark: `marks` when the
    caller has read them, see `watermarks`)."""
    batch = _batch(cfg, batch_id)
    if batch is None:
        return pd.DataFrame(columns=["shard", *FIELDS])
    schema = event_schema.for_job(cfg)
    rules = {s: RuleSet.from_json(t, schema) for s, t in _values(spark, cfg, "rules", batch.batch_id).items()}
    resets = {s: Resets.decode(bytes(b)) for s, b in _values(spark, cfg, "resets", batch.batch_id).items()}
    frames, index = [], _index(cfg)
    if live and marks is None:
        marks = watermarks(spark, cfg, batch.batch_id)
    for row in raw(spark, cfg, "chunks", batch.batch_id).collect():
        shard = index[int(row.key.shard)]
        ev = decode(bytes(row.user_map_value.blob))
        if live:
            keep = Bounds.of(rules[shard].windows(), marks[shard]).mask(ev)
            ev = ev.take(np.flatnonzero(keep & ~resets.get(shard, Resets.empty()).hidden(ev)))
        frames.append(pd.DataFrame({"shard": shard, **ev.columns()}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["shard", *FIELDS])


def entries(
    spark: SparkSession, cfg: JobConfig, batch_id: int | None = None, marks: dict[int, int] | None = None
) -> pd.DataFrame:
    """One row per retained event the engine can still use (`events`, live), with its key (the transaction's
    grouping fields, read back from bronze) and its transaction."""
    ev = events(spark, cfg, batch_id, marks=marks)
    if ev.empty:
        return pd.DataFrame(columns=list(STATE_COLUMNS))
    batch = _batch(cfg, batch_id)
    schema = event_schema.for_job(cfg)
    rules = RuleSet.from_json(next(iter(_values(spark, cfg, "rules", batch.batch_id).values())), schema)
    # A semi join with the ids (sent through Arrow), not `isin`: an hour of state retains millions of transactions,
    # and an IN list is sent over py4j and planned one literal at a time.
    ids = spark.createDataFrame(pa.table({"transactionId": np.unique(ev["tx"].to_numpy(np.int64))}))
    wanted = tables.read(spark, cfg, "transactions").join(ids, "transactionId", "left_semi")
    # the transactions as the engine read them (its own columns), so that keys read as the engine writes them; only
    # the id and the rules' grouping fields (Parquet reads no other column: an hour of bronze is gigabytes)
    used = {n for r in ev["rule"].unique() for n in rules.rule(int(r)).grouping_key_names}
    columns = [schema.input_column(n) for n in ("transactionId", *sorted(used))]
    typed = numeric(wanted.withColumn("srcTime", F.lit(0)), schema).select(*columns)
    frame = typed.toPandas().drop_duplicates("transactionId")
    tx = keying.Transactions(frame.reset_index(drop=True), schema)  # in the frame's order
    rows = pd.Index(tx.column("transactionId")).get_indexer(ev["tx"].to_numpy(np.int64))  # -1: not in bronze
    keys = np.full(len(ev), None, dtype=object)
    for rule_id, at in ev.groupby("rule").indices.items():  # one keying call per rule, not per event
        found = at[rows[at] >= 0]
        keys[found] = keying.key_texts(tx, rules.rule(int(rule_id)), rows[found])
    out = ev.rename(columns={"rule": "ruleId", "t": "eventTime", "tx": "transactionId", "val": "value"})
    return out.assign(key=keys)[list(STATE_COLUMNS)].astype({c: "int64" for c in STATE_COLUMNS if c != "key"})


def keys(spark: SparkSession, cfg: JobConfig, batch_id: int | None = None) -> pd.DataFrame:
    """Per (ruleId, key): retained events and their event-time span."""
    df = entries(spark, cfg, batch_id)
    return (
        df.groupby(["ruleId", "key"])
        .agg(events=("eventTime", "size"), oldest=("eventTime", "min"), newest=("eventTime", "max"))
        .reset_index()
    )


def login_sequences(spark: SparkSession, cfg: JobConfig, batch_id: int | None = None) -> pd.DataFrame:
    """Open login sequences of the login detector (as of a committed batch, default the newest): (shard, ruleId,
    userId, start, failedIps)."""
    rows = []
    for label, blob in _labelled(spark, cfg, "login_sequences", batch_id):
        for (rule, user), seq in decode_sequences(bytes(blob)).items():
            rows.append({"shard": label, "ruleId": rule, "userId": user, "start": seq.start, "failedIps": seq.ips})
    return pd.DataFrame(rows, columns=["shard", "ruleId", "userId", "start", "failedIps"])
