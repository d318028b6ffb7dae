"""Window state of the evaluation query, read from its checkpoint with Spark's state data source."""

from __future__ import annotations

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from fraudrules.config import JobConfig
from fraudrules.job import EVALUATE_QUERY, LOGINS_QUERY
from fraudrules.logins import decode as login_decode
from fraudrules.processor import decode

STATE_COLUMNS = ("shard", "ruleId", "key", "eventTime", "seq", "value")


def raw(spark: SparkSession, cfg: JobConfig, var: str = "events", batch_id: int | None = None,
        query: str = EVALUATE_QUERY) -> DataFrame:  # fmt: skip
    spark.streams.active  # noqa: B018 - starts the state store coordinator the RocksDB reader reports to
    reader = spark.read.format("statestore").option("path", cfg.checkpoint(query)).option("stateVarName", var)
    if batch_id is not None:
        reader = reader.option("batchId", str(batch_id))
    return reader.load()


def entries(spark: SparkSession, cfg: JobConfig, batch_id: int | None = None) -> pd.DataFrame:
    """One row per retained event: (shard, ruleId, key, eventTime, seq, value scaled)."""
    frames = []
    for row in raw(spark, cfg, "events", batch_id).collect():
        events = decode(bytes(row.value.blob)).to_frame()
        events.insert(0, "shard", int(row.key.shard))
        frames.append(events)
    if not frames:
        return pd.DataFrame(columns=list(STATE_COLUMNS))
    out = pd.concat(frames, ignore_index=True).rename(columns={"rule": "ruleId", "t": "eventTime", "val": "value"})
    return out[list(STATE_COLUMNS)]


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
        for (rule, user), seq in login_decode(bytes(row.value.blob)).items():
            rows.append({"shard": int(row.key.shard), "ruleId": rule, "userId": user, "start": seq.start,
                         "failedIps": seq.ips})  # fmt: skip
    return pd.DataFrame(rows, columns=["shard", "ruleId", "userId", "start", "failedIps"])
