"""Spark session: local Spark + Delta + RocksDB state store here, the cluster's session on Databricks."""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_REPO_JARS = Path(__file__).resolve().parents[2] / ".jars" / "spark"


def on_databricks() -> bool:
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


def local_jars() -> list[str]:
    """Delta and Kafka-connector jars resolved by `make setup` (FRAUDRULES_JARS overrides the folder)."""
    folder = os.environ.get("FRAUDRULES_JARS") or str(_REPO_JARS)
    jars = sorted(glob.glob(os.path.join(folder, "*.jar")))
    if not jars:
        raise RuntimeError(f"no jars in {folder}: run `make setup` first")
    return jars


def get_spark(app: str = "fraudrules", shuffle_partitions: int = 2) -> SparkSession:
    # Workers must run this interpreter (the venv with fraudrules), not whatever `python3` is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if on_databricks():
        spark = SparkSession.builder.getOrCreate()
    else:
        spark = (
            SparkSession.builder.master(os.environ.get("FRAUDRULES_MASTER", "local[2]"))
            .appName(app)
            .config("spark.jars", ",".join(local_jars()))
            .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
            .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
            .config("spark.driver.memory", os.environ.get("FRAUDRULES_DRIVER_MEMORY", "4g"))
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.adaptive.enabled", "false")
            .config("spark.databricks.delta.snapshotPartitions", "1")
            .config("spark.sql.sources.parallelPartitionDiscovery.parallelism", "2")
            .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
            .config("spark.sql.streaming.minBatchesToRetain", "20")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel(os.environ.get("FRAUDRULES_LOG_LEVEL", "ERROR"))
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
    return spark
