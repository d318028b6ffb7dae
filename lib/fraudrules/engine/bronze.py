"""The ingest queries' foreachBatch sink: bronze (`transactions`, `logins`) and `quarantine` rows, each appended
exactly once per micro-batch with Delta's transaction (query, batch id)."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from fraudrules import maintenance, tables
from fraudrules.config import JobConfig
from fraudrules.engine.ingest import with_defaults
from fraudrules.session import background_thread

EXPIRE_EVERY_S = 3_600.0  # bronze rows past their retention are deleted this often


class IngestSink:
    """foreachBatch target of an ingest query: bronze and quarantine rows, each exactly once per batch (empty ones
    skipped). The micro-batch is one Spark job (the parse, collected as Arrow: a micro-batch is bounded by
    `max_records_per_trigger`), split and stamped here, and committed by the table writer."""

    def __init__(self, cfg: JobConfig, query: str, kind: str = "transaction"):
        self.cfg, self.query, self.kind = cfg, query, kind
        self.bronze = "transactions" if kind == "transaction" else "logins"
        self.expired_at: float | None = None  # when this run last deleted bronze rows past their retention

    def __call__(self, parsed: DataFrame, batch_id: int) -> None:
        """The stamps come from Python: a `current_timestamp()` is a constant that Spark compiles into new code
        at every micro-batch."""
        spark = parsed.sparkSession
        background_thread(spark)
        records = with_defaults(parsed).toArrow()
        writer, txn = tables.writer(spark, self.cfg), tables.Txn.of(self.cfg, self.query, batch_id)
        stamp = pa.scalar(datetime.now(timezone.utc), pa.timestamp("us", tz="UTC"))
        bad = pc.is_valid(records.column("error"))
        good = records.filter(pc.invert(bad))
        if good.num_rows:
            rows = good.append_column("raw", good.column("value"))
            writer.append(self.bronze, _stamped(rows, "ingestedAt", stamp), txn)
        quarantined = records.filter(bad)
        if quarantined.num_rows:
            rows = pa.table(
                {
                    "kind": pa.array([self.kind] * quarantined.num_rows, pa.string()),
                    "raw": quarantined.column("value"),
                    "reason": quarantined.column("error"),
                    "srcName": quarantined.column("srcName"),
                    "srcPos": quarantined.column("srcPos"),
                }
            )
            writer.append("quarantine", _stamped(rows, "quarantinedAt", stamp), txn)
        self.expire(spark)

    def expire(self, spark: SparkSession) -> None:
        """Bronze retention, at the first micro-batch of a run and then hourly: this query is the table's only
        writer in the job, so its delete never races the job's appends."""
        now = time.monotonic()
        if self.expired_at is None or now - self.expired_at >= EXPIRE_EVERY_S:
            try:
                maintenance.expire_bronze(spark, self.cfg, self.bronze)
            except maintenance.conflicts(self.cfg):
                return  # a concurrent compaction (the scheduled pass) came first: the next micro-batch tries again
            self.expired_at = now


def _stamped(rows: pa.Table, column: str, stamp: pa.Scalar) -> pa.Table:
    """`rows` plus `column` = `stamp` on every row."""
    micros = np.full(rows.num_rows, stamp.value, dtype=np.int64)
    return rows.append_column(column, pa.array(micros).cast(stamp.type))
