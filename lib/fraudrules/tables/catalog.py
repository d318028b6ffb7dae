"""Which tables exist, their creation (a path table's first commit written by hand, `compat.delta_log`) and their
schema evolution."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from fraudrules.compat import delta_log
from fraudrules.config import JOB_TABLES, JobConfig
from fraudrules.event_schema import SchemaError
from fraudrules.session import on_databricks
from fraudrules.tables.reads import delta, read
from fraudrules.tables.schemas import LINE_TABLES, LINES_FROM_1, properties, schema
from fraudrules.tables.writers import DeltaRsWriter, uses_delta_rs


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
    if not cfg.uses_catalog:
        delta_log.clear_unfinished(cfg.table(name))
    where = cfg.table(name) if cfg.uses_catalog else f"delta.`{cfg.table(name)}`"
    spark.sql(f"CREATE TABLE IF NOT EXISTS {where} ({columns}) USING delta TBLPROPERTIES ({listed})")


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
