"""Spark's JVM internals the job names or reaches through py4j, each guarded: on a Spark that moved one, the job goes
on without the workaround, and a test names what moved (`tests/integration/test_compat_spark_jvm.py`).

The checkpoint file manager of local sessions. Spark's default (`FileContextBasedCheckpointFileManager`) renames
through Hadoop's FileContext, which forks a `readlink` process per checkpoint file on a local disk; the file-system
based one does not. Its class is internal and moved package in Spark 4 (`CHECKPOINT_FILES`): named only on the
Spark minor release it was found in (`checkpoint_files_conf`), Spark's default elsewhere.

A Python data source's envVars race (Spark 4.2). Every function of a registered Python data source carries the
same `java.util.HashMap` of environment variables, its class's: the read tasks of every query on it, and the
driver's streaming-source runner, whose `PythonStreamingSourceRunner.init` puts SPARK_LOCAL_DIRS,
SPARK_AUTH_SOCKET_TIMEOUT, SPARK_BUFFER_SIZE and SPARK_PYTHON_RUNTIME into that very map. When one query's
runner starts while the scheduler serializes another query's task, the map grows under the serializer: the task
carries other entries than its count says and cannot be read back (`java.io.OptionalDataException` at
`HashMap.readObject`, in about one backtest in eight, which reads transactions and logins through two queries of
the source). With the keys already there, the runner's puts only replace values, with the same values: the map no
longer changes shape.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pyspark
from py4j.protocol import Py4JError
from pyspark import SparkContext
from pyspark.sql import SparkSession

CHECKPOINT_FILES = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
CHECKPOINT_FILES_SPARK = "4.2"  # the minor release whose class that is
RUNNER_ENV = ("SPARK_LOCAL_DIRS", "SPARK_AUTH_SOCKET_TIMEOUT", "SPARK_BUFFER_SIZE", "SPARK_PYTHON_RUNTIME")


def runner_env(spark: SparkSession) -> dict[str, str]:
    """What `PythonStreamingSourceRunner.init` puts, computed as it does: the block manager's local folders, the
    Python socket timeout in seconds, the buffer size, the kind of Python process."""
    jvm, conf = spark.sparkContext._jvm, spark.sparkContext.getConf()
    env = jvm.org.apache.spark.SparkEnv.get()  # type: ignore[union-attr]
    folders = ",".join(str(f.getPath()) for f in env.blockManager().diskBlockManager().localDirs())
    timeout = jvm.org.apache.spark.network.util.JavaUtils.timeStringAsSec(  # type: ignore[union-attr]
        conf.get("spark.python.authenticate.socketTimeout", "15s")
    )
    values = (folders, str(timeout), conf.get("spark.buffer.size", "65536"), "PYTHON_WORKER")
    return dict(zip(RUNNER_ENV, values, strict=True))


def settle_source_env(spark: SparkSession, name: str) -> bool:
    """Put `RUNNER_ENV` into the registered Python data source `name`'s environment before any query on it starts
    (see the module's docstring). False where this Spark does not have the internals it reaches for."""
    try:
        source = spark._jsparkSession.sessionState().dataSourceManager().lookupDataSource(name)  # type: ignore[union-attr]
        env_vars = source.dataSourceCls().envVars()
        for key, value in runner_env(spark).items():
            if not env_vars.containsKey(key):
                env_vars.put(key, value)
    except Py4JError:
        return False
    return True


def checkpoint_files_conf() -> dict[str, str]:
    """A local session's checkpoint file manager setting: the file-system based one on the Spark release whose class
    name `CHECKPOINT_FILES` is, nothing (Spark's default) on another."""
    minor = ".".join(pyspark.__version__.split(".")[:2])
    return (
        {"spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILES} if minor == CHECKPOINT_FILES_SPARK else {}
    )


def jvm_of(spark: SparkSession) -> Any:
    """The py4j view of the session's JVM (PySpark's `SparkContext._jvm`), to call Java's and log4j's public APIs."""
    return spark.sparkContext._jvm


def launched_jvm() -> subprocess.Popen | None:
    """The JVM process this Python process launched (PySpark's gateway's); None before one, or on a cluster's
    driver, whose JVM launched the Python process."""
    return getattr(SparkContext._gateway, "proc", None)


def ignore_sigterm(spark: SparkSession) -> bool:
    """From now on the local driver JVM ignores SIGTERM (`sun.misc.Signal`, in the JDK's `jdk.unsupported` module),
    as PySpark starts it ignoring SIGINT: a SIGTERM to the job's process group (a service manager's stop, Airflow
    killing a task) reaches the Python driver, whose handler stops the queries and Spark in order, and no longer
    also the JVM under it, which ran its shutdown hooks and left the driver's calls failing (exit 143). The JVM
    still ends with its driver (PySpark's gateway ends when its stdin closes). False where the call is not there."""
    try:
        jvm = jvm_of(spark)
        jvm.sun.misc.Signal.handle(jvm.sun.misc.Signal("TERM"), jvm.sun.misc.SignalHandler.SIG_IGN)
    except Py4JError:
        return False
    return True


def has_gateway() -> bool:
    """Whether this process is connected to a JVM already (a class path and a heap are a JVM's from its launch)."""
    return SparkContext._gateway is not None
