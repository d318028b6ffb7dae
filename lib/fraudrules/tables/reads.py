"""A table as Spark reads it: a batch DataFrame, a stream, Delta's table API; by name or by path."""

from __future__ import annotations

import os

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from fraudrules.config import JobConfig


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
