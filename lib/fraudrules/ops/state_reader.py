"""The stateful queries' state, read from their checkpoints with Spark's state data source.

The window state is what the evaluate query retains per shard (decoded with the processors' own codec,
`engine.state`); the login state is the detector's open sequences.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from fraudrules.config import EVALUATE_QUERY, LOGINS_QUERY, JobConfig
from fraudrules.engine.state import decode_events, decode_sequences

STATE_COLUMNS = ("shard", "ruleId", "sig", "key", "eventTime", "seq", "value")


@dataclass(frozen=True)
class CommittedBatch:
    """A query's newest committed micro-batch, from its checkpoint's commit and offset logs."""

    batch_id: int
    watermark_ms: int
    timestamp_ms: int


def last_committed(cfg: JobConfig, query: str = EVALUATE_QUERY) -> CommittedBatch | None:
    """The query's newest committed batch; None when its checkpoint has none (or does not exist)."""
    root = Path(cfg.checkpoint(query))
    commits = [int(p.name) for p in (root / "commits").glob("*") if p.name.isdigit()]
    if not commits:
        return None
    batch = max(commits)
    meta = json.loads((root / "offsets" / str(batch)).read_text().splitlines()[1])
    return CommittedBatch(batch, int(meta.get("batchWatermarkMs", 0)), int(meta.get("batchTimestampMs", 0)))


def raw(
    spark: SparkSession, cfg: JobConfig, var: str = "events", batch_id: int | None = None, query: str = EVALUATE_QUERY
) -> DataFrame:
    spark.streams.active  # noqa: B018 - starts the state store coordinator the RocksDB reader reports to
    reader = spark.read.format("statestore").option("path", cfg.checkpoint(query)).option("stateVarName", var)
    if batch_id is not None:
        reader = reader.option("batchId", str(batch_id))
    return reader.load()


def entries(spark: SparkSession, cfg: JobConfig, batch_id: int | None = None) -> pd.DataFrame:
    """One row per retained event: (shard, ruleId, sig, key, eventTime, seq, value scaled)."""
    frames = []
    for row in raw(spark, cfg, "events", batch_id).collect():
        events = decode_events(bytes(row.value.blob)).to_frame()
        events.insert(0, "shard", int(row.key.shard))
        frames.append(events)
    if not frames:
        out = pd.DataFrame(columns=list(STATE_COLUMNS))
    else:
        out = pd.concat(frames, ignore_index=True).rename(columns={"rule": "ruleId", "t": "eventTime", "val": "value"})
    return out[list(STATE_COLUMNS)].astype({c: "int64" for c in STATE_COLUMNS if c != "key"})


def shard_meta(spark: SparkSession, cfg: JobConfig, batch_id: int | None = None) -> pd.DataFrame:
    """Per shard: the ACTIVE window rules it last saw (`active`, in the rules codec's format)."""
    rows = raw(spark, cfg, "meta", batch_id).collect()
    return pd.DataFrame([(int(r.key.shard), r.value.active) for r in rows], columns=["shard", "active"])


def keys(spark: SparkSession, cfg: JobConfig, batch_id: int | None = None) -> pd.DataFrame:
    """Per (ruleId, key): retained events and their event-time span."""
    df = entries(spark, cfg, batch_id)
    return (
        df.groupby(["ruleId", "key"])
        .agg(events=("eventTime", "size"), oldest=("eventTime", "min"), newest=("eventTime", "max"))
        .reset_index()
    )


def login_sequences(spark: SparkSession, cfg: JobConfig) -> pd.DataFrame:
    """Open login sequences of the login detector: (shard, ruleId, userId, start, failedIps)."""
    rows = []
    for row in raw(spark, cfg, "sequences", query=LOGINS_QUERY).collect():
        for (rule, user), seq in decode_sequences(bytes(row.value.blob)).items():
            rows.append(
                {"shard": int(row.key.shard), "ruleId": rule, "userId": user, "start": seq.start, "failedIps": seq.ips}
            )
    return pd.DataFrame(rows, columns=["shard", "ruleId", "userId", "start", "failedIps"])
