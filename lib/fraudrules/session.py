"""Spark session: local Spark + Delta + RocksDB state store here, the cluster's session on Databricks.

Locally the Delta and Kafka-connector jars are those of `jars` (`FRAUDRULES_JARS`, else the repository's).

What only a local session needs (the driver JVM's options, Hadoop's local file system without a forked `chmod`,
the class-data archive, thread niceness) is `local_runtime`, loaded only for a local session.
"""

from __future__ import annotations

import contextlib
import os
import sys
from importlib import resources
from typing import Any

from pyspark.sql import SparkSession

from fraudrules import logs
from fraudrules.compat import spark_jvm
from fraudrules.config import JobConfig, on_databricks
from fraudrules.jars import local_jars

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
POOLS = "fairscheduler.xml"  # scheduler pools of the job (see engine/job.py)


def background_thread(spark: SparkSession) -> None:
    """Background work of the calling thread: at the lowest priority in a local session
    (`local_runtime.lower_priority`). A cluster's driver is left as it is: its JVM maps no priorities, and a Spark
    Connect session has no JVM to reach."""
    if not on_databricks():
        from fraudrules import local_runtime

        local_runtime.lower_priority(spark)


def local_catalog_options(folder: str) -> dict[str, str]:
    """A local session's catalog in `folder`, for catalog tables (`catalog`/`schema` set) outside Databricks: a
    Hive metastore (embedded Derby) and a warehouse, kept across JVMs as Unity Catalog keeps a cluster's tables."""
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": os.path.join(folder, "warehouse"),
        "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={folder}/metastore_db;create=true",
    }


# how long a query's stop() waits for its stream thread (`spark.sql.streaming.stopTimeout`, set below)
STOP_TIMEOUT_MS = 120_000


def get_spark(
    app: str = "fraudrules",
    shuffle_partitions: int = JobConfig.shuffle_partitions,
    short_lived: bool = False,
    cfg: JobConfig | None = None,
    tiered_jit: bool = False,
    heap: str | None = None,
    fixed_heap: bool = False,
) -> SparkSession:
    """The session: the cluster's on Databricks, else a local one. `short_lived`: a command or notebook
    that ends within minutes (local JVM tuned to start fast, `local_runtime`), not the continuous job; `tiered_jit`:
    one that still runs long enough for the JIT's optimising compiler to pay off; `heap`: a local JVM's heap when it
    is launched, where the kind's default is not enough (`local_runtime.driver_memory`); `fixed_heap`: the
    continuous job, whose heap is committed at launch. `cfg`: the job's configuration (its shuffle partitions; a
    local catalog for its catalog tables)."""
    catalog = cfg.local_catalog if cfg else None
    shuffle_partitions = cfg.shuffle_partitions if cfg else shuffle_partitions
    # Workers must run this interpreter (the venv with fraudrules), not whatever `python3` is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if on_databricks():
        spark = SparkSession.builder.getOrCreate()
    else:
        from fraudrules import local_runtime

        memory = local_runtime.driver_memory(short_lived, heap)
        master = os.environ.get("FRAUDRULES_MASTER", "local[2]")
        builder = (
            SparkSession.builder.master(master)
            .appName(app)
            .config("spark.jars", ",".join(local_jars()))
            .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
            .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
            .config("spark.driver.memory", memory)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.adaptive.enabled", "false")
            # Generated code is cached by its text, 100 entries by default: too few for the job's queries and
            # Delta's own plans (the running job compiled ~4 classes a second, each also new work for the JIT)
            .config("spark.sql.codegen.cache.maxEntries", "2000")
            .config("spark.databricks.delta.snapshotPartitions", "1")
            .config("spark.sql.sources.parallelPartitionDiscovery.parallelism", "2")
            .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
            .config("spark.sql.streaming.minBatchesToRetain", "20")
            .config("spark.scheduler.mode", "FAIR")
            .config("spark.scheduler.allocation.file", str(resources.files("fraudrules").joinpath(POOLS)))
            # Hadoop's FileContext renames fork a `readlink` process per checkpoint file on local disks
            .config(map=spark_jvm.checkpoint_files_conf())
            # quiet from its first line
            .config(
                "spark.driver.extraJavaOptions",
                local_runtime.jvm_options(short_lived, catalog, tiered_jit, memory if fixed_heap else None),
            )
        )
        for key, value in local_catalog_options(catalog).items() if catalog else ():
            builder = builder.config(key, value)
        new_jvm = not spark_jvm.has_gateway()
        if new_jvm:  # a class path and a heap are the JVM's from its launch: only for a new one
            for key, value in local_runtime.local_fs_options(master).items():
                builder = builder.config(key, value)
            local_runtime.launched(memory)
            local_runtime.malloc_env()
        with logs.launching_jvm() if new_jvm else contextlib.nullcontext():
            spark = builder.getOrCreate()
        logs.quiet_python_workers(spark)
        logs.quiet_driver_threads(spark)
        spark.sparkContext.setLogLevel(logs.level())
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
    # A query's stop() waits for its stream thread, by default for ever: one stuck in a task (a Python worker that
    # does not answer) would hold the job's stop, and a restart, up for good. After this it raises instead.
    spark.conf.set("spark.sql.streaming.stopTimeout", str(STOP_TIMEOUT_MS))
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
