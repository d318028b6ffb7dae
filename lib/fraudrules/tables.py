"""Delta tables of the project: schemas, creation, reads, the table writer (idempotent appends), export."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from fraudrules import event_schema
from fraudrules.compat import delta_log
from fraudrules.config import JOB_TABLES, JobConfig
from fraudrules.event_schema import DEFAULT as DEFAULT_EVENTS
from fraudrules.event_schema import SchemaError
from fraudrules.paths import is_remote
from fraudrules.session import on_databricks

if TYPE_CHECKING:
    from deltalake import DeltaTable as RustTable

FILTER_TYPE = "array<struct<field:string,op:string,numeric:boolean,values:array<string>>>"
RULE_ROW = (
    "ruleId int, version long, ruleState string, groupingKeyNames array<string>, "
    "aggregateFieldName string, aggregatorFunctionType string, limitOperatorType string, "
    f"limit string, windowMinutes int, windowMs long, scale int, filter {FILTER_TYPE}, "
    "unique array<string>, ruleType string, minFailures int, minDistinctIps int, "
    "sig long, activeSince long, epoch long, ruleJson string, updatedAt timestamp, "
    "updatedBy string"
)
ALERT_ROW = (
    "alertId string, kind string, ruleId int, ruleVersion long, transactionId long, userId long, key string, "
    "groupingKeyNames array<string>, aggregate decimal(38,18), aggregateFieldName string, "
    "aggregatorFunctionType string, limitOperatorType string, limit decimal(38,18), windowMinutes int, "
    "eventTime timestamp, eventTimeMs long, ingestionTimestamp long, producedAt timestamp, "
    "producedAtMs long, publishedAtMs long, watermarkMs long, batchId long, shard int, message string, "
    "details string"
)
# Bronze transactions: the declared event schema's typed columns (see `ddl`), then these.
BRONZE_TAIL = "raw string, srcName string, srcPos long, ingestedAt timestamp"
SCHEMAS: dict[str, str] = {
    "transactions": f"{DEFAULT_EVENTS.spark_ddl}, {BRONZE_TAIL}",  # with the default event schema
    "quarantine": ("kind string, raw string, reason string, srcName string, srcPos long, quarantinedAt timestamp"),
    "rules": RULE_ROW,
    # every change, the whole rule as it became (control commands carry their epoch); streamed by the job
    "rule_history": RULE_ROW + ", change string, changeId string",
    "rule_errors": "ruleId string, raw string, reason string, source string, receivedAt timestamp",
    "rules_export": (
        "exportId string, ruleId int, version long, ruleState string, ruleJson string, exportedAt timestamp"
    ),
    "rule_applied": (
        "ruleId int, version long, changedAt timestamp, firstEvaluatedAt timestamp, delayMs long, batchId long"
    ),
    "logins": (
        "userId long, eventType string, ipAddress string, eventTimestamp long, ingestionTimestamp long, raw string, "
        "srcName string, srcPos long, ingestedAt timestamp"
    ),
    "alerts": ALERT_ROW,
    # hits of SHADOW rules: never in `alerts` nor published; `shadowOf` = the live rule challenged, if any
    "shadow_alerts": ALERT_ROW + ", shadowOf int",
    "late_events": (
        "kind string, transactionId long, userId long, ruleId int, ruleVersion long, key string, eventTimeMs long, "
        "watermarkMs long, reason string, detectedAt timestamp, batchId long"
    ),
    "batches": (
        "query string, batchId long, committedAt timestamp, inputRows long, alerts long, lateEvents long, "
        "watermarkMs long, latencyP50Ms double, latencyP99Ms double, latencyMaxMs double, retainedEvents long, "
        "chunks int, chunksFromStore int, transactions long, pythonMs double, pythonStages string, logins long"
    ),
}


# ------------------------------------------------------------------------------------------ bronze: the event schema


def ddl(name: str, cfg: JobConfig | None = None) -> str:
    """A table's DDL: `SCHEMAS`, bronze `transactions` with the job's declared event schema's typed columns."""
    if name == "transactions" and cfg is not None:
        return f"{event_schema.for_job(cfg).spark_ddl}, {BRONZE_TAIL}"
    return SCHEMAS[name]


def _missing(declared: StructType, existing: StructType, prefix: str = "") -> tuple[list[str], list[str]]:
    """Declared columns (and struct fields) a table lacks, and those it has with another type."""
    have = {f.name.lower(): f.dataType for f in existing.fields}  # Delta matches names whatever their case
    added, changed = [], []
    for f in declared.fields:
        path, there = prefix + f.name, have.get(f.name.lower())
        if there is None:
            added.append(path)
        elif isinstance(f.dataType, StructType) and isinstance(there, StructType):
            more, other = _missing(f.dataType, there, path + ".")
            added, changed = added + more, changed + other
        elif f.dataType != there:
            changed.append(f"{path} is {there.simpleString()}, declared {f.dataType.simpleString()}")
    return added, changed


def evolve(spark: SparkSession, cfg: JobConfig, name: str) -> list[str]:
    """Give a table the columns its DDL declares and it lacks (bronze `transactions`: the fields the event schema
    added; a job table: the columns a newer release added), by Delta schema evolution (an empty append with
    mergeSchema); the columns added. SchemaError when a declared column has another type there."""
    declared = schema(name, cfg)
    if uses_delta_rs(cfg):
        existing = StructType.fromJson(json.loads(DeltaRsWriter(spark, cfg).table(name).schema().to_json()))
    else:
        existing = read(spark, cfg, name).schema
    added, changed = _missing(declared, existing)
    if changed:
        raise SchemaError(f"table {name} cannot change a column's type: " + "; ".join(changed))
    if added:
        writer = spark.createDataFrame([], declared).write.format("delta").mode("append").option("mergeSchema", "true")
        if cfg.uses_catalog:
            writer.saveAsTable(cfg.table(name))
        else:
            writer.save(cfg.table(name))
    return added


# ------------------------------------------------------------------------------------------ creation, reads, writes


# Delta writes a checkpoint (a Spark job over the whole log) every `checkpointInterval` commits, synchronously
# in the committing query. The job commits bronze and results every few seconds: at Delta's default of 10 that
# is a multi-second stall of a background query every ~50 s, on the cores the evaluation needs.
PROPERTIES = {"delta.checkpointInterval": "100"}

# Rows read from files name their line in `srcPos` from 1 (a Kafka record's: its offset); releases up to a5f864d
# counted lines from 0. Each table holding such rows records since when its rows count from 1 (ISO time, UTC, to
# compare with the rows' `ingestedAt` / `quarantinedAt`): its creation, or the first start of a later release on a
# table of an earlier one, before any row is written (`ensure`).
LINES_FROM_1 = "fraudrules.srcPos.linesFrom1Since"
LINE_TABLES = ("transactions", "logins", "quarantine")


def properties(name: str, now: str) -> dict[str, str]:
    """A new table's properties (`now`: its creation time, ISO)."""
    return PROPERTIES | ({LINES_FROM_1: now} if name in LINE_TABLES else {})


# Writer-side compaction (docs/operations.md#table-maintenance), the same policy on both writers as Delta's own auto
# compaction: once a table holds `JobConfig.compact_min_files` files under SMALL_FILE_BYTES, the writer that just
# appended merges its small files into files of up to WRITER_TARGET_BYTES (a commit of dataChange=false: streams
# of the table skip it, appends of other writers do not conflict with it). The writers' target is small on purpose:
# each compaction rewrites the growing file with the new small ones, so building a file of size S from increments of
# s rewrites ~S²/2s bytes; at 128 MiB that was 20 times what a bronze table received (the 90-minute soak). `maintain`
# compacts to COMPACT_TARGET_BYTES once a day.
WRITER_TARGET_BYTES = 16 * 2**20
SMALL_FILE_BYTES = WRITER_TARGET_BYTES // 4
COMPACT_TARGET_BYTES = 128 * 2**20
CONFLICT_RETRIES = 8  # attempts of an append that a concurrent commit conflicted with


def schema(name: str, cfg: JobConfig | None = None) -> StructType:
    """A table's schema from its DDL (`ddl`), read by Spark's DDL parser (a session must be active). Not through an
    empty DataFrame: that took 60-90 ms per table, a second at every start of a job."""
    return StructType.fromDDL(ddl(name, cfg))


def ensure(spark: SparkSession, cfg: JobConfig, *names: str) -> list[str]:
    """Create the named tables (by default the job's) that do not exist yet, and mark the tables of an earlier
    release whose rows count lines from 0 (`LINES_FROM_1`); returns the names of those created."""
    if cfg.uses_catalog and not on_databricks():  # a local catalog starts empty (Unity Catalog's schema is made)
        spark.sql(f"CREATE SCHEMA IF NOT EXISTS {cfg.catalog}.{cfg.schema}")
    wanted = names or JOB_TABLES
    missing = [n for n in wanted if not exists(spark, cfg, n)]
    now = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    if not cfg.uses_catalog and delta_log.writes_first_commits():
        for name in missing:
            delta_log.first_commit(cfg.table(name), schema(name, cfg).json(), properties(name, now))
    else:
        with ThreadPoolExecutor(max_workers=4) as pool:  # each creation is a Delta commit: overlap them
            list(pool.map(lambda name: _create(spark, cfg, name, properties(name, now)), missing))
    for name in (n for n in LINE_TABLES if n in wanted and n not in missing):
        _mark_lines_from_1(spark, cfg, name, now)
    return missing


def _mark_lines_from_1(spark: SparkSession, cfg: JobConfig, name: str, now: str) -> None:
    """Record on a table that lacks it that its rows count lines from 1 from `now` on (one metadata commit, once)."""
    if uses_delta_rs(cfg):
        table = DeltaRsWriter(spark, cfg).table(name)
        if LINES_FROM_1 not in table.metadata().configuration:  # delta-rs checks only the keys it knows: not ours
            table.alter.set_table_properties({LINES_FROM_1: now}, raise_if_not_exists=False)
        return
    if LINES_FROM_1 not in delta(spark, cfg, name).detail().first()["properties"]:
        where = cfg.table(name) if cfg.uses_catalog else f"delta.`{cfg.table(name)}`"
        spark.sql(f"ALTER TABLE {where} SET TBLPROPERTIES ('{LINES_FROM_1}' = '{now}')")


def exists(spark: SparkSession, cfg: JobConfig, name: str) -> bool:
    if cfg.uses_catalog:
        return bool(spark.catalog.tableExists(cfg.table(name)))
    return delta_log.has_version(cfg.table(name))


def _create(spark: SparkSession, cfg: JobConfig, name: str, configuration: dict[str, str]) -> None:
    """A table, in SQL (a path table where Delta's first commit is not written here, `delta_log`): Delta's table
    builder takes no three-part name outside Databricks."""
    columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in schema(name, cfg).fields)
    listed = ", ".join(f"'{k}' = '{v}'" for k, v in configuration.items())
    where = cfg.table(name) if cfg.uses_catalog else f"delta.`{cfg.table(name)}`"
    spark.sql(f"CREATE TABLE IF NOT EXISTS {where} ({columns}) USING delta TBLPROPERTIES ({listed})")


def read(spark: SparkSession, cfg: JobConfig, name: str) -> DataFrame:
    if cfg.uses_catalog:
        return spark.read.table(cfg.table(name))
    return spark.read.format("delta").load(cfg.table(name))


def read_stream(spark: SparkSession, cfg: JobConfig, name: str) -> DataFrame:
    """A table as a streaming source: its rows now, then every append.

    While a path table's log still holds its first commit, the stream reads every commit from there: for an
    append-only table the same rows as its current snapshot, without the Spark job that computes the snapshot
    at a new query's first micro-batch (seconds in a fresh JVM, and it waits for a free task slot)."""
    if cfg.uses_catalog:
        return spark.readStream.table(cfg.table(name))
    reader = spark.readStream.format("delta")
    if os.path.exists(os.path.join(cfg.table(name), "_delta_log", f"{0:020d}.json")):
        reader = reader.option("startingVersion", "0")
    return reader.load(cfg.table(name))


def delta(spark: SparkSession, cfg: JobConfig, name: str) -> DeltaTable:
    if cfg.uses_catalog:
        return DeltaTable.forName(spark, cfg.table(name))
    return DeltaTable.forPath(spark, cfg.table(name))


Rows = pa.Table | list[dict]


@dataclass(frozen=True)
class Txn:
    """Delta's own idempotence (a SetTransaction action): the commit holding (app, version) is made at most once,
    and a table skips an append whose version for its app is not above the last it recorded."""

    app: str
    version: int

    @classmethod
    def of(cls, cfg: JobConfig, query: str, version: int) -> Txn:
        """The query's transaction: app = its name and id (kept in its checkpoint, new for a new checkpoint)."""
        return cls(f"{query}:{cfg.query_id(query)}", version)

    def note(self) -> str:
        """The commit's userMetadata: which query and micro-batch appended it (for people and analyst views)."""
        return json.dumps({"app": self.app, "batch": self.version})


class TableWriter(ABC):
    """The small reads and commits of the job's tables, one implementation per JobConfig (`writer`): delta-rs for
    local path tables, Spark's Delta writer for catalog and remote tables. Both pass the same contract tests
    (tests/integration/test_tables.py): append, overwrite, appends made exactly once per transaction, reads,
    counts. Rows are Arrow tables or lists of dicts, conformed to the table's schema (decimals rounded half up to
    the column's scale, as Spark's cast rounds)."""

    def __init__(self, spark: SparkSession, cfg: JobConfig):
        self.spark, self.cfg = spark, cfg

    @abstractmethod
    def append(self, name: str, rows: Rows, txn: Txn | None = None) -> None:
        """Append the rows in one commit; with `txn`, unless the table already has that transaction."""

    @abstractmethod
    def overwrite(self, name: str, rows: Rows) -> None:
        """Replace the table's rows in one commit."""

    @abstractmethod
    def arrow(
        self, name: str, columns: Sequence[str] | None = None, where: tuple[str, object] | None = None
    ) -> pa.Table:
        """A (small) table's rows as Arrow: timestamps in UTC, decimals exact; `where` = (column, value): only the
        rows with that value."""

    @abstractmethod
    def count(self, name: str) -> int:
        """A table's row count."""

    def target(self, name: str) -> pa.Schema:
        return _arrow_schema(name, self.cfg)

    def rows(self, name: str, rows: Rows) -> pa.Table:
        return conform_arrow(rows, self.target(name))


class DeltaRsWriter(TableWriter):
    """Local path tables through delta-rs, the Rust implementation of the same protocol: ~20 ms a commit, where a
    Spark Delta commit costs the driver 0.3-1 s (a planned write job, a snapshot, the log) and a core meanwhile."""

    def table(self, name: str) -> RustTable:
        from deltalake import DeltaTable as RustTable

        return RustTable(self.cfg.table(name))

    def target(self, name: str) -> pa.Schema:
        return pa.schema(self.table(name).schema().to_arrow())

    def append(self, name: str, rows: Rows, txn: Txn | None = None) -> None:
        for attempt in range(CONFLICT_RETRIES):
            table = self.table(name)
            if txn is not None and _at_least(table.transaction_version(txn.app), txn.version):
                return  # delta-rs records transactions but leaves the check to its caller
            try:
                return self._write(table, rows, "append", txn)
            except rs_conflicts():
                # delta-rs checks an append against concurrent commits as if it had read the table (a DELETE of
                # old bronze rows by `maintain` conflicts with it): nothing was committed, so try again, from the
                # transaction check
                if attempt == CONFLICT_RETRIES - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))

    def overwrite(self, name: str, rows: Rows) -> None:
        self._write(self.table(name), rows, "overwrite", None)

    def _write(self, table: RustTable, rows: Rows, mode: str, txn: Txn | None) -> None:
        from deltalake import CommitProperties, Transaction, write_deltalake

        data = conform_arrow(rows, pa.schema(table.schema().to_arrow()))
        properties = CommitProperties(
            custom_metadata={"userMetadata": txn.note()} if txn else None,
            app_transactions=[Transaction(txn.app, txn.version)] if txn else None,
        )
        write_deltalake(table, data, mode=mode, commit_properties=properties)  # `table` now at the new version
        if due_for_compaction(file_sizes(table), self.cfg.compact_min_files):
            _compact_after_commit(table)

    def arrow(
        self, name: str, columns: Sequence[str] | None = None, where: tuple[str, object] | None = None
    ) -> pa.Table:
        # Arrow's own local filesystem reads the files: scanned through delta-rs's, a process sometimes aborted
        # at exit ("terminate called without an active exception", 2 short scripts in 12)
        files = pafs.SubTreeFileSystem(self.cfg.table(name), pafs.LocalFileSystem())  # an absolute path
        dataset = self.table(name).to_pyarrow_dataset(filesystem=files)
        matching = None if where is None else pc.field(where[0]) == where[1]
        return pa.table(dataset.to_table(columns=list(columns) if columns else None, filter=matching))

    def count(self, name: str) -> int:
        """From the data files' statistics when every file has them, else by reading the table."""
        records = pa.table(self.table(name).get_add_actions(flatten=True)).column("num_records")
        if records.null_count == 0:
            return int(pc.sum(records).as_py() or 0)
        return self.arrow(name, [self.target(name).names[0]]).num_rows


def file_sizes(table: RustTable) -> pa.Array:
    """The sizes of a delta-rs table's live data files."""
    return pa.table(table.get_add_actions(flatten=True)).column("size_bytes").combine_chunks()


def due_for_compaction(sizes: pa.Array, min_files: int) -> bool:
    """The writers' compaction policy: `min_files` (0: never) or more files under SMALL_FILE_BYTES."""
    return bool(min_files) and pc.sum(pc.less(sizes, SMALL_FILE_BYTES)).as_py() >= min_files


def _compact_after_commit(table: RustTable) -> None:
    """Compaction after an append, which has committed: a conflict with a concurrent commit (another compaction, a
    delete) leaves the files for the next append to merge, and is no failure of the append."""
    with contextlib.suppress(*rs_conflicts()):
        compact_rs(table, WRITER_TARGET_BYTES)


def compact_rs(table: RustTable, target: int = COMPACT_TARGET_BYTES) -> None:
    """delta-rs's OPTIMIZE (it merges the files under `target`), on one core (the evaluation has the other)."""
    table.optimize.compact(target_size=target, max_concurrent_tasks=1)


class SparkWriter(TableWriter):
    """Spark's Delta writer, as on a cluster: Unity Catalog tables by name (`saveAsTable`), other tables by path.
    A commit with a transaction costs Delta a look at the table's transactions (docs/performance.md). Compaction
    after a commit is Delta's own auto compaction, set up on the session (`auto_compaction`)."""

    def __init__(self, spark: SparkSession, cfg: JobConfig):
        super().__init__(spark, cfg)
        auto_compaction(spark, cfg)

    def append(self, name: str, rows: Rows, txn: Txn | None = None) -> None:
        writer = self._frame(name, rows).write.format("delta").mode("append")
        if txn is not None:
            writer = writer.option("txnAppId", txn.app).option("txnVersion", str(txn.version))
            writer = writer.option("userMetadata", txn.note())
        for attempt in range(CONFLICT_RETRIES):
            try:
                return self._save(writer, name)
            except delta_conflicts():
                # a concurrent metadata change (`maintain` setting a retention) or commit Delta could not reconcile:
                # nothing was committed, and Delta's transaction makes the next attempt of a replayed batch a no-op
                if attempt == CONFLICT_RETRIES - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))

    def overwrite(self, name: str, rows: Rows) -> None:
        self._save(self._frame(name, rows).write.format("delta").mode("overwrite"), name)

    def _frame(self, name: str, rows: Rows) -> DataFrame:
        # one file: a stream of the table with a files bound never splits the commit
        return self.spark.createDataFrame(self.rows(name, rows)).coalesce(1)

    def _save(self, writer, name: str) -> None:
        if self.cfg.uses_catalog:
            writer.saveAsTable(self.cfg.table(name))
        else:
            writer.save(self.cfg.table(name))

    def arrow(
        self, name: str, columns: Sequence[str] | None = None, where: tuple[str, object] | None = None
    ) -> pa.Table:
        df = read(self.spark, self.cfg, name)
        df = df if where is None else df.where(F.col(where[0]) == F.lit(where[1]))
        return (df.select(*columns) if columns else df).toArrow()

    def count(self, name: str) -> int:
        return read(self.spark, self.cfg, name).count()


def rs_conflicts() -> tuple[type[Exception], ...]:
    """delta-rs's conflict of a commit with a concurrent one."""
    from deltalake.exceptions import CommitFailedError

    return (CommitFailedError,)


def delta_conflicts() -> tuple[type[Exception], ...]:
    """Spark's Delta conflicts of a commit with a concurrent one (PySpark raises their `captured` subclasses)."""
    from delta import exceptions as e

    return (
        e.ConcurrentAppendException,
        e.ConcurrentDeleteReadException,
        e.ConcurrentDeleteDeleteException,
        e.ConcurrentTransactionException,
        e.ConcurrentWriteException,
        e.MetadataChangedException,
        e.ProtocolChangedException,
    )


def auto_compaction(spark: SparkSession, cfg: JobConfig) -> None:
    """Delta's auto compaction (a post-commit hook of Spark's Delta writer) with the writers' policy
    (`due_for_compaction`); runtime settings of the session, so also on a Databricks cluster's."""
    conf = {
        "spark.databricks.delta.autoCompact.enabled": str(bool(cfg.compact_min_files)).lower(),
        "spark.databricks.delta.autoCompact.minNumFiles": str(max(cfg.compact_min_files, 2)),
        "spark.databricks.delta.autoCompact.maxFileSize": str(WRITER_TARGET_BYTES),
        "spark.databricks.delta.autoCompact.minFileSize": str(SMALL_FILE_BYTES),
        "spark.databricks.delta.optimize.maxFileSize": str(COMPACT_TARGET_BYTES),
    }
    for key, value in conf.items():
        if spark.conf.get(key, None) != value:
            spark.conf.set(key, value)


def _at_least(recorded: int | None, version: int) -> bool:
    return recorded is not None and recorded >= version


def uses_delta_rs(cfg: JobConfig) -> bool:
    """Local path tables, with `deltalake` installed: their small commits and reads go through delta-rs."""
    return not cfg.uses_catalog and not is_remote(cfg.data_dir) and importlib.util.find_spec("deltalake") is not None


def writer(spark: SparkSession, cfg: JobConfig) -> TableWriter:
    """The table writer of a configuration: delta-rs for local path tables, Spark's Delta writer otherwise."""
    return DeltaRsWriter(spark, cfg) if uses_delta_rs(cfg) else SparkWriter(spark, cfg)


_ARROW_SCHEMAS: dict[str, pa.Schema] = {}


def _arrow_schema(name: str, cfg: JobConfig) -> pa.Schema:
    """A table's columns as Arrow types (timestamps in UTC microseconds, as Delta stores them)."""
    text = ddl(name, cfg)
    if text not in _ARROW_SCHEMAS:
        from pyspark.sql.pandas.types import to_arrow_schema

        _ARROW_SCHEMAS[text] = to_arrow_schema(schema(name, cfg), timezone="UTC")
    return _ARROW_SCHEMAS[text]


def conform_arrow(rows: Rows, target: pa.Schema) -> pa.Table:
    """Rows with the table's columns, in order, cast to its types: decimals rounded half up to the column's scale
    (as Spark's cast rounds), no other rounding or overflow."""
    if not isinstance(rows, pa.Table):
        rows = pa.Table.from_pylist(rows, schema=pa.schema([_widest(f) for f in target]))
    missing = pa.nulls(rows.num_rows)  # bronze keeps the column of a field the event schema no longer declares
    columns = [rows.column(f.name) if f.name in rows.column_names else missing for f in target]
    return pa.table([_cast(c, f.type) for c, f in zip(columns, target, strict=True)], schema=target)


WIDE_DECIMAL = pa.decimal256(76, 38)  # takes any value of the tables' decimal columns, and more digits


def _widest(field: pa.Field) -> pa.Field:
    """A field that takes the column's Python values without loss."""
    return pa.field(field.name, WIDE_DECIMAL) if pa.types.is_decimal(field.type) else field


def _cast(column: pa.ChunkedArray | pa.Array, kind: pa.DataType) -> pa.ChunkedArray | pa.Array:
    if pa.types.is_decimal(kind):
        if not pa.types.is_decimal(column.type):  # text (the outbox's exact aggregates) or integers
            column = column.cast(WIDE_DECIMAL)
        if column.type.scale > kind.scale:  # Spark's cast rounds half up: ties away from zero
            column = pc.round(column, ndigits=kind.scale, round_mode="half_towards_infinity")
    return column.cast(kind)


def export_jsonl(spark: SparkSession, cfg: JobConfig, name: str, out: str, order_by: list[str] | None = None) -> int:
    """Write a table as JSON lines (decimals as exact JSON numbers); returns the row count."""
    df = read(spark, cfg, name)
    if order_by:
        df = df.orderBy(*order_by)
    n = 0
    with open(out, "w", encoding="utf-8") as fh:
        for row in df.toLocalIterator():
            fh.write(to_json_line(row.asDict(recursive=True)) + "\n")
            n += 1
    return n


_NUM = "\u0000num:"


def to_json_line(record: dict) -> str:
    """JSON with Decimals written as exact JSON numbers (not floats, not strings)."""
    from datetime import datetime

    def conv(v):
        if isinstance(v, Decimal):
            return exact_number(v)
        if isinstance(v, datetime):
            return v.isoformat()
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, list):
            return [conv(x) for x in v]
        return v

    return json_text({k: conv(v) for k, v in record.items()})


def number_text(v: Decimal) -> str:
    """A Decimal as an exact JSON number: no exponent, no trailing zeros."""
    return format(v.normalize(), "f") if v != 0 else "0"


def per_distinct(column: pa.ChunkedArray, f: Callable[[object], object], type_: pa.DataType) -> pa.Array:
    """`f` of each row's value, called once per distinct value, not once per row; nulls stay null."""
    codes = pc.dictionary_encode(column.combine_chunks())
    return pa.array([f(v) for v in codes.dictionary.to_pylist()], type_).take(codes.indices)


def exact_number(v: Decimal) -> str:
    """A Decimal's stand-in in a record for `json_text`, which writes it as an exact JSON number."""
    return _NUM + number_text(v)


_NUMBER = re.compile(r'"\\u0000num:([^"]*)"')


def json_text(record: dict) -> str:
    """A record of plain JSON values and `exact_number`s as one line of JSON."""
    return _NUMBER.sub(r"\1", json.dumps(record, default=str))
