"""Maintenance of the job's Delta tables (docs/operations.md#table-maintenance).

Three parts, each where it belongs:
- compaction as the job writes: the writers merge a table's small files once it holds `compact_min_files` of them
  (`tables.due_for_compaction`: delta-rs after its append, Delta's own auto compaction on Spark's writer);
- bronze retention in the job: the ingest queries, the only writers of `transactions` and `logins`, delete the rows
  past `bronze_retention_days` once an hour (`expire_bronze`), between their own appends, so that the delete never
  races them (open-source Delta checks a DELETE against concurrent appends at Serializable isolation);
- the scheduled pass (`maintain`: `fraudrules maintain`, the `fraud_maintenance` DAG, the bundle's maintenance job):
  compaction of whatever the writers left, VACUUM of the files no version within `retention_hours` needs, the log's
  retention set on the table and applied (a checkpoint, then the expired entries removed).

Every commit of the scheduled pass is one the job's appends do not conflict with, or retry after (a retention set
on a table, once: a metadata change); compaction commits no data change, which streams of the table skip. Local path
tables go through delta-rs (no JVM), catalog and remote tables through Spark's Delta.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, TypeVar

from fraudrules import tables
from fraudrules.config import JOB_TABLES, JobConfig

if TYPE_CHECKING:
    from deltalake import DeltaTable as RustTable
    from pyspark.sql import SparkSession

BRONZE_TIME = "ingestedAt"  # what a bronze row's retention counts from
RETRIES = 8  # attempts of a step whose commit a concurrent commit conflicted with
HOURS_CHECKED = 168.0  # Delta refuses a shorter VACUUM retention unless told that it is meant


@dataclass
class Shape:
    """What a table holds at one moment: live data files and their bytes, Delta log entries (None: not listed)."""

    files: int
    bytes: int
    log_entries: int | None


@dataclass
class Report:
    """One table's maintenance: its shape before and after, the files VACUUM deleted, how long it took."""

    table: str
    before: Shape
    after: Shape
    files_vacuumed: int
    seconds: float

    def line(self) -> str:
        log = (
            f"log {self.before.log_entries:,} → {self.after.log_entries:,} entries"
            if self.before.log_entries is not None and self.after.log_entries is not None
            else "log: kept by Delta's checkpoints"
        )
        return (
            f"{self.table:<14} files {self.before.files:>6,} → {self.after.files:<6,} "
            f"{_mib(self.before.bytes):>9} → {_mib(self.after.bytes):<9} "
            f"vacuumed {self.files_vacuumed:>6,} files  {log}  "
            f"{self.seconds:.1f} s"
        )


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def maintain(spark: SparkSession | None, cfg: JobConfig, names: tuple[str, ...] = JOB_TABLES) -> list[Report]:
    """Maintain the named tables in turn (`spark` may be None for local path tables: delta-rs needs no JVM)."""
    if tables.uses_delta_rs(cfg):
        return [_maintain_rs(cfg, name) for name in names]
    if spark is None:
        raise ValueError("catalog and remote tables are maintained through Spark: pass a session")
    return [_maintain_spark(spark, cfg, name) for name in names]


def cutoff(cfg: JobConfig, now: datetime | None = None) -> datetime | None:
    """The ingestion time before which bronze rows are deleted (None: bronze is kept)."""
    if not cfg.bronze_retention_days:
        return None
    return (now or datetime.now(timezone.utc)) - timedelta(days=cfg.bronze_retention_days)


def expire_bronze(spark: SparkSession, cfg: JobConfig, name: str, now: datetime | None = None) -> int:
    """Delete the bronze rows ingested before `cutoff` (no commit when there are none): the rows deleted. Called by
    the table's own ingest query between its appends; a concurrent compaction makes it raise one of `conflicts`."""
    until = cutoff(cfg, now)
    if until is None:
        return 0
    if tables.uses_delta_rs(cfg):
        from deltalake import DeltaTable as RustTable

        predicate = f"{BRONZE_TIME} < '{until.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}'"
        return int(RustTable(cfg.table(name)).delete(predicate).get("num_deleted_rows", 0))
    delete = f"DELETE FROM {_sql_name(cfg, name)} WHERE {BRONZE_TIME} < TIMESTAMP '{until.isoformat()}'"
    return int(spark.sql(delete).first()[0] or 0)


def conflicts(cfg: JobConfig) -> tuple[type[Exception], ...]:
    """What the table writer of `cfg` raises when a concurrent commit conflicts with one of its commits."""
    return tables.rs_conflicts() if tables.uses_delta_rs(cfg) else tables.delta_conflicts()


def log_properties(cfg: JobConfig) -> dict[str, str]:
    """The table properties that carry the retentions Delta applies by itself (log cleanup at each checkpoint)."""
    return {
        "delta.logRetentionDuration": f"interval {_seconds(cfg.log_retention_days * 86_400)} seconds",
        "delta.deletedFileRetentionDuration": f"interval {_seconds(cfg.retention_hours * 3_600)} seconds",
    }


def _seconds(value: float) -> int:
    return max(1, round(value))


# ------------------------------------------------------------------------------------------ delta-rs (path tables)


def _maintain_rs(cfg: JobConfig, name: str) -> Report:
    from deltalake import DeltaTable as RustTable

    started = time.monotonic()
    path = cfg.table(name)
    table = RustTable(path)
    before = _shape_rs(table, path)
    _retrying(lambda: _set_properties_rs(RustTable(path), log_properties(cfg)), tables.rs_conflicts())
    _retrying(lambda: tables.compact_rs(RustTable(path)), tables.rs_conflicts())
    table = RustTable(path)
    vacuumed = table.vacuum(
        retention_hours=_hours(cfg.retention_hours),
        dry_run=False,
        enforce_retention_duration=cfg.retention_hours >= HOURS_CHECKED,
    )
    table.create_checkpoint()
    table.cleanup_metadata()  # log entries older than delta.logRetentionDuration, before the checkpoint
    after = _shape_rs(RustTable(path), path)
    return Report(name, before, after, len(vacuumed), time.monotonic() - started)


def _hours(value: float) -> int:
    """delta-rs takes whole hours; a retention under an hour (tests, demos) rounds down to none kept."""
    return int(value)


def _shape_rs(table: RustTable, path: str) -> Shape:
    sizes = tables.file_sizes(table)
    return Shape(len(sizes), int(sum(sizes.to_pylist())), _log_entries(os.path.join(path, "_delta_log")))


def _log_entries(log: str) -> int | None:
    try:
        return sum(1 for f in os.listdir(log) if f.endswith(".json") and f[:20].isdigit())
    except OSError:
        return None


def _set_properties_rs(table: RustTable, properties: dict[str, str]) -> None:
    """Only when they differ: a metadata commit conflicts with the job's commits made meanwhile (its appends retry;
    this commit is retried by the caller: delta-rs refuses it after a concurrent delete, a bronze expiry's)."""
    current = table.metadata().configuration
    if any(current.get(k) != v for k, v in properties.items()):
        table.alter.set_table_properties(properties, raise_if_not_exists=False)


T = TypeVar("T")


def _retrying(step: Callable[[], T], conflicts: tuple[type[Exception], ...]) -> T:
    """A step whose commit a concurrent commit conflicted with (the job's appends and their compactions), again."""
    for attempt in range(RETRIES - 1):
        try:
            return step()
        except conflicts:
            time.sleep(min(0.5 * 2**attempt, 10.0))
    return step()


# ------------------------------------------------------------------------------------------ Spark (catalog tables)


def _maintain_spark(spark: SparkSession, cfg: JobConfig, name: str) -> Report:
    started = time.monotonic()
    table = tables.delta(spark, cfg, name)
    before = _shape_spark(spark, cfg, name)
    _retrying(lambda: _set_properties_spark(spark, cfg, name, log_properties(cfg)), tables.delta_conflicts())
    _retrying(lambda: table.optimize().executeCompaction(), tables.delta_conflicts())
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", str(cfg.retention_hours >= HOURS_CHECKED))
    spark.conf.set("spark.databricks.delta.vacuum.logging.enabled", "true")  # its count of deleted files
    table.vacuum(cfg.retention_hours)
    after = _shape_spark(spark, cfg, name)
    return Report(name, before, after, _vacuumed(table), time.monotonic() - started)


def _shape_spark(spark: SparkSession, cfg: JobConfig, name: str) -> Shape:
    detail = tables.delta(spark, cfg, name).detail().select("numFiles", "sizeInBytes", "location").first()
    location = str(detail["location"])
    local = location.removeprefix("file:") if location.startswith(("file:", "/")) else None
    entries = _log_entries(os.path.join(local, "_delta_log")) if local else None
    return Shape(int(detail["numFiles"]), int(detail["sizeInBytes"]), entries)


def _set_properties_spark(spark: SparkSession, cfg: JobConfig, name: str, properties: dict[str, str]) -> None:
    current = tables.delta(spark, cfg, name).detail().select("properties").first()[0] or {}
    if any(current.get(k) != v for k, v in properties.items()):
        pairs = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
        spark.sql(f"ALTER TABLE {_sql_name(cfg, name)} SET TBLPROPERTIES ({pairs})")


def _sql_name(cfg: JobConfig, name: str) -> str:
    return cfg.table(name) if cfg.uses_catalog else f"delta.`{cfg.table(name)}`"


def _vacuumed(table) -> int:
    """Files the last VACUUM deleted, from the table's history (its `VACUUM END` commit)."""
    for row in table.history(3).select("operation", "operationMetrics").collect():
        if row["operation"] == "VACUUM END":
            return int((row["operationMetrics"] or {}).get("numDeletedFiles", 0))
    return 0
