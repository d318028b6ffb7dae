"""The table writers: the job's small reads and idempotent commits, delta-rs on local path tables and Spark's Delta
writer elsewhere, each compacting what it appends to."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from fraudrules.config import JobConfig
from fraudrules.paths import is_remote
from fraudrules.tables.arrow import Rows, arrow_schema, conform_arrow
from fraudrules.tables.reads import read

if TYPE_CHECKING:
    from deltalake import DeltaTable as RustTable


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
        return arrow_schema(name, self.cfg)

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
