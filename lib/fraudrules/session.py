"""Spark session: local Spark + Delta + RocksDB state store here, the cluster's session on Databricks.

Locally the Delta and Kafka-connector jars come from the folder named by `FRAUDRULES_JARS` (the Makefile
sets it to the repository's `.jars/spark`, which `make setup` fills with Maven), else from `.jars/spark`
under the current directory.
"""

from __future__ import annotations

import contextlib
import glob
import os
import sys
from importlib import resources
from typing import Any

from pyspark import SparkContext
from pyspark.sql import SparkSession

from fraudrules import logs
from fraudrules.config import JobConfig

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
FS_CHECKPOINTS = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
POOLS = "fairscheduler.xml"  # scheduler pools of the job (see engine/job.py)
DEFAULT_JARS = os.path.join(".jars", "spark")


def on_databricks() -> bool:
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


def local_jars() -> list[str]:
    """The jars of `FRAUDRULES_JARS`, else of ./.jars/spark; raises when there are none."""
    folder = os.path.abspath(os.environ.get("FRAUDRULES_JARS") or DEFAULT_JARS)
    jars = sorted(glob.glob(os.path.join(folder, "*.jar")))
    if not jars:
        raise RuntimeError(f"no jars in {folder}: run `make setup` first, or point FRAUDRULES_JARS at them")
    return jars


def get_spark(app: str = "fraudrules", shuffle_partitions: int = JobConfig.shuffle_partitions) -> SparkSession:
    # Workers must run this interpreter (the venv with fraudrules), not whatever `python3` is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if on_databricks():
        spark = SparkSession.builder.getOrCreate()
    else:
        builder = (
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
            .config("spark.scheduler.mode", "FAIR")
            .config("spark.scheduler.allocation.file", str(resources.files("fraudrules").joinpath(POOLS)))
            # Hadoop's FileContext renames fork a `readlink` process per checkpoint file on local disks
            .config("spark.sql.streaming.checkpointFileManagerClass", FS_CHECKPOINTS)
            .config("spark.driver.extraJavaOptions", logs.java_options())  # quiet from the JVM's first line
        )
        with logs.launching_jvm() if SparkContext._gateway is None else contextlib.nullcontext():
            spark = builder.getOrCreate()
        logs.quiet_python_workers(spark)
        spark.sparkContext.setLogLevel(logs.level())
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
    return spark


def dbutils() -> Any:
    """Databricks' dbutils: the notebook's own when there is one, else one for the cluster's session."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None and "dbutils" in shell.user_ns:
            return shell.user_ns["dbutils"]
    except ImportError:
        pass
    from pyspark.dbutils import DBUtils  # type: ignore[import-not-found]  # Databricks runtime only

    return DBUtils(SparkSession.builder.getOrCreate())


def kafka_secret_options(secret_scope: str | None) -> dict[str, str]:
    """SASL_SSL client options from a Databricks secret scope (keys `kafka-username`, `kafka-password`).

    Without a scope, or off Databricks (the local PLAINTEXT broker), there are none.
    """
    if not secret_scope or not on_databricks():
        return {}
    secrets = dbutils().secrets
    user, password = secrets.get(secret_scope, "kafka-username"), secrets.get(secret_scope, "kafka-password")
    login = "kafkashaded.org.apache.kafka.common.security.plain.PlainLoginModule"  # Databricks shades the client
    return {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": f'{login} required username="{user}" password="{password}";',
    }
