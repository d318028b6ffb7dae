"""Spark session: local Spark + Delta + RocksDB state store here, the cluster's session on Databricks.

Locally the Delta and Kafka-connector jars come from the folder named by `FRAUDRULES_JARS`, else, for an
editable install (`make setup`), from its repository's `.jars/spark`, which `make setup` fills with Maven: the
same from any current folder. An installed wheel has no jars of its own: it needs `FRAUDRULES_JARS`.

A local JVM starts cold: its first seconds go to loading classes and interpreting Spark's and Delta's planner
(a process's first Delta read is much slower than the next ones). Two remedies, both for local sessions: the
class-data archive `make setup` writes beside the jars (classes mapped from it instead of loaded and verified),
and, for sessions that end within a minute or two (`short_lived`: every Spark command but `run`, the notebooks), the
C1-only JIT, which compiles at once rather than after profiling. Long-lived sessions (the continuous job, the
bench, the test suite's shared session) keep the default tiered JIT for its steady-state speed.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import sys
from importlib import metadata, resources
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from pyspark import SparkContext
from pyspark.sql import SparkSession

from fraudrules import logs
from fraudrules.config import JobConfig

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
FS_CHECKPOINTS = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
POOLS = "fairscheduler.xml"  # scheduler pools of the job (see engine/job.py)
JARS_ENV = "FRAUDRULES_JARS"
REQUIRED_JARS = ("delta-spark_", "delta-storage-")  # a local session cannot read or write a table without them
DRIVER_MEMORY_ENV = "FRAUDRULES_DRIVER_MEMORY"  # the local JVM's heap
# Hadoop's local file system without a forked `chmod` per created file (jvm/localfs), built by `make setup` into
# the jars folder's driver/ (not a Spark jar: the driver's class path, where Hadoop looks file systems up)
LOCAL_FS = "io.fraudrules.hadoop.NoForkLocalFileSystem"
LOCAL_FS_JAR = os.path.join("driver", "fraudrules-localfs.jar")
CLASS_ARCHIVE = "fraudrules.jsa"  # the JVM's class-data archive, in the jars folder (`make setup` writes it)
TRAIN_ENV = "FRAUDRULES_CLASS_ARCHIVE_TRAINING"  # set: this JVM writes the archive of the classes it loaded
# The JVM's own warnings go to stderr (unified logging writes them to stdout, where command output goes);
# the class-data archive's notices are off (a JVM that cannot map the archive just loads its classes).
JVM_LOGGING = ("-Xlog:disable", "-Xlog:all=warning:stderr", "-Xlog:cds*=off:stderr")
# C1 alone gets a 48 MiB code cache (the client default); a backtest filled it in 30 s and the JVM stopped
# compiling. 240 MiB is the tiered JIT's default; it is reserved address space, committed as used.
C1_ONLY = ("-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=240m")

# Java thread priorities as OS nice values: MIN_PRIORITY threads (`background_thread`) run at nice 19, every
# other priority at nice 0 as before. On 2 cores the driver side of the bronze ingest and of the Delta commits
# of results then takes only the CPU the evaluation leaves idle. (HotSpot's own mapping would also raise the
# GC and JIT threads to nice -5.)
BACKGROUND_NICE = (
    "-XX:ThreadPriorityPolicy=1",
    "-XX:JavaPriority1_To_OSPriority=19",
    *(f"-XX:JavaPriority{p}_To_OSPriority=0" for p in range(2, 11)),
)


def on_databricks() -> bool:
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


def background_thread(spark: SparkSession) -> None:
    """Run the calling thread's JVM side (a query's stream thread in its foreachBatch, the JVM thread that
    serves a Python thread) at nice 19 in a local session (`BACKGROUND_NICE`). A cluster's driver is left as
    it is: its JVM maps no priorities, and a Spark Connect session has no JVM to reach."""
    if not on_databricks():
        spark._jvm.java.lang.Thread.currentThread().setPriority(1)  # type: ignore[union-attr]


def driver_memory() -> str:
    """The local JVM's heap: `FRAUDRULES_DRIVER_MEMORY`, default 3g. The heap grows to its maximum under the job's
    allocation rate and stays there, so the default is what `make bench` needs, not more (docs/performance.md)."""
    return os.environ.get(DRIVER_MEMORY_ENV) or "3g"


def source_tree() -> Path | None:
    """The repository of an editable install (`make setup`), as its record says (PEP 610: `direct_url.json`);
    None for an installed wheel."""
    try:
        record = json.loads(metadata.distribution("fraudrules").read_text("direct_url.json") or "{}")
    except metadata.PackageNotFoundError:
        return None
    url = urlparse(str(record.get("url", "")))
    editable = bool(record.get("dir_info", {}).get("editable"))
    return Path(unquote(url.path)) if editable and url.scheme == "file" else None


def jars_folder() -> str | None:
    """`FRAUDRULES_JARS`, else the `.jars/spark` of the repository of an editable install (None for a wheel)."""
    if os.environ.get(JARS_ENV):
        return os.path.abspath(os.environ[JARS_ENV])
    repo = source_tree()
    return str(repo / ".jars" / "spark") if repo else None


def jars_problem() -> str | None:
    """Why a local session cannot start for want of its jars, in one line; None when they are there."""
    folder = jars_folder()
    if folder is None:
        return (
            f"no Spark jars: set {JARS_ENV} to a folder holding the Delta and Kafka jars (an installed fraudrules has "
            "none of its own; `make setup` puts them in the repository's .jars/spark)"
        )
    names = [os.path.basename(p) for p in glob.glob(os.path.join(folder, "*.jar"))]
    if not names:
        return f"no jars in {folder}: run `make setup` in the repository, or point {JARS_ENV} at a folder of them"
    missing = [prefix for prefix in REQUIRED_JARS if not any(n.startswith(prefix) for n in names)]
    return f"no {' or '.join(m + '*.jar' for m in missing)} in {folder}: run `make setup` again" if missing else None


def jars_file(name: str) -> str | None:
    """A file of the jars folder (the no-fork file system's jar, the class-data archive); None without a folder."""
    folder = jars_folder()
    return os.path.join(folder, name) if folder else None


def local_jars() -> list[str]:
    """The jars of `jars_folder()`; raises RuntimeError saying why when they are not there."""
    problem = jars_problem()
    if problem:
        raise RuntimeError(problem)
    return sorted(glob.glob(os.path.join(str(jars_folder()), "*.jar")))


def local_fs_options(master: str) -> dict[str, str]:
    """`file:` paths through LOCAL_FS in a local session (one JVM, not `local-cluster`), when `make setup` built
    it. Without Hadoop's native library (the pyspark wheel has none) the stock local file system forks a `chmod`
    of the whole driver JVM for every file it creates: checkpoint logs, state store and Parquet files, several
    per micro-batch (walCommit and commitOffsets took 9-11 ms each, 2 ms without). Delta's own log writes go
    through Hadoop's FileContext, which this does not change."""
    jar = jars_file(LOCAL_FS_JAR)
    if not re.fullmatch(r"local(\[[^\]]*\])?", master) or jar is None or not os.path.exists(jar):
        return {}
    return {"spark.driver.extraClassPath": jar, "spark.hadoop.fs.file.impl": LOCAL_FS}


def local_catalog_options(folder: str) -> dict[str, str]:
    """A local session's catalog in `folder`, for catalog tables (`catalog`/`schema` set) outside Databricks: a
    Hive metastore (embedded Derby) and a warehouse, kept across JVMs as Unity Catalog keeps a cluster's tables."""
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": os.path.join(folder, "warehouse"),
        "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={folder}/metastore_db;create=true",
    }


def jvm_options(short_lived: bool, catalog: str | None = None) -> str:
    """The local driver JVM's options: logging, the class-data archive (when there is one; an archive that
    does not match this JDK or class path is skipped without a word), C1-only JIT for short-lived commands,
    Derby's home (its log) in the local catalog's folder."""
    archive = jars_file(CLASS_ARCHIVE)
    options = [logs.java_options(), *JVM_LOGGING, *BACKGROUND_NICE]
    if catalog:
        options.append(f"-Dderby.system.home={catalog}")
    if os.environ.get(TRAIN_ENV) and archive:
        options.append(f"-XX:ArchiveClassesAtExit={archive}")
    elif archive and os.path.exists(archive):
        options.append(f"-XX:SharedArchiveFile={archive}")
    if short_lived:
        options.extend(C1_ONLY)
    return " ".join(options)


def get_spark(
    app: str = "fraudrules",
    shuffle_partitions: int = JobConfig.shuffle_partitions,
    short_lived: bool = False,
    cfg: JobConfig | None = None,
) -> SparkSession:
    """The session: the cluster's on Databricks, else a local one. `short_lived`: a command or notebook
    that ends within minutes (local JVM tuned to start fast, see above), not the continuous job. `cfg`: the job's
    configuration (its shuffle partitions; a local catalog for its catalog tables)."""
    catalog = cfg.local_catalog if cfg else None
    shuffle_partitions = cfg.shuffle_partitions if cfg else shuffle_partitions
    # Workers must run this interpreter (the venv with fraudrules), not whatever `python3` is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if on_databricks():
        spark = SparkSession.builder.getOrCreate()
    else:
        master = os.environ.get("FRAUDRULES_MASTER", "local[2]")
        builder = (
            SparkSession.builder.master(master)
            .appName(app)
            .config("spark.jars", ",".join(local_jars()))
            .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
            .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
            .config("spark.driver.memory", driver_memory())
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
            .config("spark.sql.streaming.checkpointFileManagerClass", FS_CHECKPOINTS)
            .config("spark.driver.extraJavaOptions", jvm_options(short_lived, catalog))  # quiet from its first line
        )
        for key, value in local_catalog_options(catalog).items() if catalog else ():
            builder = builder.config(key, value)
        new_jvm = SparkContext._gateway is None
        if new_jvm:  # a class path is the JVM's from its launch: only for a new one
            for key, value in local_fs_options(master).items():
                builder = builder.config(key, value)
        with logs.launching_jvm() if new_jvm else contextlib.nullcontext():
            spark = builder.getOrCreate()
        logs.quiet_python_workers(spark)
        logs.quiet_driver_threads(spark)
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
