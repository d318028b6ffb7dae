"""Delta tables of the project: schemas, creation, reads, idempotent appends, export."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from fraudrules import event_schema
from fraudrules.config import JOB_TABLES, JobConfig
from fraudrules.event_schema import DEFAULT as DEFAULT_EVENTS
from fraudrules.event_schema import SchemaError
from fraudrules.paths import is_remote

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
BRONZE_TAIL = "fields map<string,string>, raw string, srcName string, srcPos long, ingestedAt timestamp"
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
        "chunks int, chunksFromStore int, transactions long, pythonMs double, pythonStages string"
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
    have = {f.name: f.dataType for f in existing.fields}
    added, changed = [], []
    for f in declared.fields:
        path = prefix + f.name
        if f.name not in have:
            added.append(path)
        elif isinstance(f.dataType, StructType) and isinstance(have[f.name], StructType):
            more, other = _missing(f.dataType, have[f.name], path + ".")
            added, changed = added + more, changed + other
        elif f.dataType != have[f.name]:
            changed.append(f"{path} is {have[f.name].simpleString()}, declared {f.dataType.simpleString()}")
    return added, changed


def evolve_bronze(spark: SparkSession, cfg: JobConfig) -> list[str]:
    """Give bronze `transactions` the columns of fields the event schema added (Delta schema evolution: an empty
    append with mergeSchema); the fields added. SchemaError when a declared field has another type there."""
    declared = schema(spark, "transactions", cfg)
    if native(cfg):
        existing = StructType.fromJson(json.loads(_rust_table(cfg, "transactions").schema().to_json()))
    else:
        existing = read(spark, cfg, "transactions").schema
    added, changed = _missing(declared, existing)
    if changed:
        raise SchemaError("bronze transactions cannot change a column's type: " + "; ".join(changed))
    if added:
        writer = spark.createDataFrame([], declared).write.format("delta").mode("append").option("mergeSchema", "true")
        if cfg.uses_catalog:
            writer.saveAsTable(cfg.table("transactions"))
        else:
            writer.save(cfg.table("transactions"))
    return added


# ------------------------------------------------------------------------------------------ creation, reads, writes


# Delta writes a checkpoint (a Spark job over the whole log) every `checkpointInterval` commits, synchronously
# in the committing query. The job commits bronze and results every few seconds: at Delta's default of 10 that
# is a multi-second stall of a background query every ~50 s, on the cores the evaluation needs.
PROPERTIES = {"delta.checkpointInterval": "100"}


def schema(spark: SparkSession, name: str, cfg: JobConfig | None = None) -> StructType:
    """A table's schema from its DDL (`ddl`; all columns nullable)."""
    return spark.createDataFrame([], ddl(name, cfg)).schema


def ensure(spark: SparkSession, cfg: JobConfig, *names: str) -> list[str]:
    """Create the named tables (by default the job's) that do not exist yet; returns their names."""
    missing = [n for n in names or JOB_TABLES if not exists(spark, cfg, n)]
    if not cfg.uses_catalog:
        for name in missing:
            first_commit(cfg.table(name), schema(spark, name, cfg).json())
        return missing
    with ThreadPoolExecutor(max_workers=4) as pool:  # each creation is a Delta commit: overlap them
        list(pool.map(lambda name: _create(spark, cfg, name), missing))
    return missing


_VERSION_FILE = re.compile(r"^\d{20}\.(json|checkpoint\b)")


def exists(spark: SparkSession, cfg: JobConfig, name: str) -> bool:
    if cfg.uses_catalog:
        return bool(spark.catalog.tableExists(cfg.table(name)))
    log = os.path.join(cfg.table(name), "_delta_log")
    # a commit or checkpoint, not just the folder: a creation killed half-way leaves an empty log behind
    return os.path.isdir(log) and any(_VERSION_FILE.match(f) for f in os.listdir(log))


def first_commit(path: str, schema_json: str) -> None:
    """Create a path table: its version 0 as `CREATE TABLE` writes it (protocol 1/2, the schema, no
    partitions, `PROPERTIES`), without the Spark job and Delta transaction that cost ~1 s per table. If
    another writer created the table first, theirs stands."""
    log = os.path.join(path, "_delta_log")
    os.makedirs(log, exist_ok=True)
    now = int(time.time() * 1000)
    actions = [
        {"commitInfo": {"timestamp": now, "operation": "CREATE TABLE", "isBlindAppend": True}},
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {
            "metaData": {
                "id": str(uuid.uuid4()),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": schema_json,
                "partitionColumns": [],
                "configuration": PROPERTIES,
                "createdTime": now,
            }
        },
    ]
    tmp = os.path.join(log, f".{uuid.uuid4().hex}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(a) + "\n" for a in actions))
    try:
        os.link(tmp, os.path.join(log, f"{0:020d}.json"))  # atomic, and never over an existing version 0
    except FileExistsError:
        pass
    finally:
        os.remove(tmp)


def _create(spark: SparkSession, cfg: JobConfig, name: str) -> None:
    builder = DeltaTable.createIfNotExists(spark).tableName(cfg.table(name))
    for key, value in PROPERTIES.items():
        builder = builder.property(key, value)
    for field in schema(spark, name, cfg).fields:
        builder = builder.addColumn(field.name, field.dataType, nullable=field.nullable)
    builder.execute()


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


def append(df: DataFrame, cfg: JobConfig, name: str, marker: str | None = None) -> None:
    """Append in one commit; `marker` goes into the commit's userMetadata (see Ledger)."""
    writer = conform(df, name, cfg).write.format("delta").mode("append")
    if marker is not None:
        writer = writer.option("userMetadata", marker)
    if cfg.uses_catalog:
        writer.saveAsTable(cfg.table(name))
    else:
        writer.save(cfg.table(name))


class Ledger:
    """Exactly-once appends of numbered batches by one writer (`app`) to one table.

    Each append records {"app", "batch"} in its commit's userMetadata; a batch at or below the last one
    recorded is skipped. The last one is read back from the table's history once per process, so an
    append costs one plain Delta commit (Delta's own txnAppId/txnVersion would rebuild the table state
    for every commit). One writer per app: the app names a checkpoint, which one query runs at a time.
    """

    def __init__(self, spark: SparkSession, cfg: JobConfig, name: str, app: str):
        self.spark, self.cfg, self.name, self.app = spark, cfg, name, app
        self._last: int | None = None

    def last(self) -> int:
        """The last batch this app committed to the table, -1 if none."""
        if self._last is None:
            self._last = -1
            for page in (50, 1000, None):
                notes = self._user_metadata(page)
                marks = [json.loads(n) for n in notes if n and n.startswith("{")]
                found = [m["batch"] for m in marks if m.get("app") == self.app]
                if found or page is None or len(notes) < page:
                    self._last = max(found, default=-1)
                    break
        return self._last

    def _user_metadata(self, page: int | None) -> list[str | None]:
        """The userMetadata of the table's newest `page` commits (all with None), newest first."""
        if native(self.cfg):
            return [c.get("userMetadata") for c in _rust_table(self.cfg, self.name).history(page)]
        table = delta(self.spark, self.cfg, self.name)
        history = table.history(page) if page else table.history()
        return [r.userMetadata for r in history.select("userMetadata").collect()]

    def append(self, rows: DataFrame | pa.Table | list[dict], batch: int) -> bool:
        """Append unless this batch is already in; True when it appended."""
        if batch <= self.last():
            return False
        marker = json.dumps({"app": self.app, "batch": batch})
        if isinstance(rows, DataFrame):
            append(rows, self.cfg, self.name, marker)
        else:
            write(self.spark, self.cfg, self.name, rows, marker=marker)
        self._last = batch
        return True


def overwrite(df: DataFrame, cfg: JobConfig, name: str) -> None:
    """Replace the table's rows in one commit."""
    writer = conform(df, name, cfg).write.format("delta").mode("overwrite")
    if cfg.uses_catalog:
        writer.saveAsTable(cfg.table(name))
    else:
        writer.save(cfg.table(name))


# Small reads and commits without the JVM. A Spark Delta commit costs the driver ~0.3-0.5 s (a planned write job,
# a snapshot, the log), several seconds in a JVM that has not made one yet, and it takes a core from the evaluation
# meanwhile. The job makes many small ones off its data path: results and heartbeats, rule changes, the rules
# table. On local path tables those go through delta-rs (the Rust implementation of the same protocol: same
# commits, same userMetadata, checkpoints at the table's interval) in ~20 ms. Unity Catalog and remote tables,
# and rows whose cast Spark does differently (a decimal with more digits than its column), take Spark's writer.
def native(cfg: JobConfig) -> bool:
    """Whether the table's small reads and commits go through delta-rs (local path tables, `deltalake` there)."""
    return not cfg.uses_catalog and not is_remote(cfg.data_dir) and importlib.util.find_spec("deltalake") is not None


def _rust_table(cfg: JobConfig, name: str) -> RustTable:
    from deltalake import DeltaTable as RustTable

    return RustTable(cfg.table(name))


def arrow(spark: SparkSession, cfg: JobConfig, name: str, columns: Sequence[str] | None = None) -> pa.Table:
    """A (small) table's rows as Arrow: timestamps in UTC, decimals exact."""
    if native(cfg):
        # Arrow's own local filesystem reads the files: scanned through delta-rs's, a process sometimes aborted
        # at exit ("terminate called without an active exception", 2 short scripts in 12)
        files = pafs.SubTreeFileSystem(cfg.table(name), pafs.LocalFileSystem())  # an absolute path (JobConfig.table)
        dataset = _rust_table(cfg, name).to_pyarrow_dataset(filesystem=files)
        return pa.table(dataset.to_table(columns=list(columns) if columns else None))
    df = read(spark, cfg, name)
    return (df.select(*columns) if columns else df).toArrow()


def count(spark: SparkSession, cfg: JobConfig, name: str) -> int:
    """A table's row count: from the data files' statistics when every file has them, else by reading it."""
    if native(cfg):
        records = pa.table(_rust_table(cfg, name).get_add_actions(flatten=True)).column("num_records")
        if records.null_count == 0:
            return int(pc.sum(records).as_py() or 0)
    return read(spark, cfg, name).count()


def write(
    spark: SparkSession,
    cfg: JobConfig,
    name: str,
    rows: pa.Table | list[dict],
    mode: str = "append",
    marker: str | None = None,
) -> None:
    """Append (or with mode "overwrite", replace) rows in one commit; `marker` goes into its userMetadata."""
    if native(cfg):
        from deltalake import CommitProperties, write_deltalake

        target = _rust_table(cfg, name)
        try:
            data = _conform_arrow(rows, pa.schema(target.schema().to_arrow()))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            data = None  # Spark's cast (rounding) decides, as for every other table
        if data is not None:
            metadata = {"userMetadata": marker} if marker is not None else None
            write_deltalake(target, data, mode=mode, commit_properties=CommitProperties(custom_metadata=metadata))
            return
    df = spark.createDataFrame(rows) if isinstance(rows, pa.Table) else spark.createDataFrame(rows, SCHEMAS[name])
    df = df.coalesce(1)  # one file: a stream with maxFilesPerTrigger never splits the commit
    if mode == "overwrite":
        overwrite(df, cfg, name)
    else:
        append(df, cfg, name, marker)


def _conform_arrow(rows: pa.Table | list[dict], target: pa.Schema) -> pa.Table:
    """Rows with the table's columns, in order, cast (safely: no rounding, no overflow) to its types."""
    if not isinstance(rows, pa.Table):
        return pa.Table.from_pylist(rows, schema=target)
    columns = [rows.column(f.name) if f.name in rows.column_names else pa.nulls(rows.num_rows) for f in target]
    return pa.table([c.cast(f.type) for c, f in zip(columns, target, strict=True)], schema=target)


def conform(df: DataFrame, name: str, cfg: JobConfig | None = None) -> DataFrame:
    """The table's columns, in order, cast to the table's types (null where `df` lacks one: bronze keeps the
    column of a field the event schema no longer declares)."""
    fields = schema(df.sparkSession, name, cfg).fields
    return df.select(
        *((F.col(f.name) if f.name in df.columns else F.lit(None)).cast(f.dataType).alias(f.name) for f in fields)
    )


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
    from decimal import Decimal

    def conv(v):
        if isinstance(v, Decimal):
            return _NUM + (format(v.normalize(), "f") if v != 0 else "0")
        if isinstance(v, datetime):
            return v.isoformat()
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, list):
            return [conv(x) for x in v]
        return v

    text = json.dumps({k: conv(v) for k, v in record.items()}, default=str)
    return re.sub(r'"\\u0000num:([^"]*)"', r"\1", text)


class Ledgers:
    """A query's ledgers, one per table it writes, made on first use (the query id is in the checkpoint
    once the query runs)."""

    def __init__(self, cfg: JobConfig, query: str):
        self.cfg, self.query = cfg, query
        self.by_table: dict[str, Ledger] = {}

    def get(self, spark: SparkSession, name: str) -> Ledger:
        if name not in self.by_table:
            app = f"{self.query}:{self.cfg.query_id(self.query)}"
            self.by_table[name] = Ledger(spark, self.cfg, name, app)
        return self.by_table[name]
