"""Quiet by default: the project's own lines and real errors, not Spark's chatter.

`FRAUDRULES_LOG_LEVEL` (default ERROR) is the level of Spark's JVM logs; at ERROR and above the output of the
local JVM is also kept to errors:

- log4j is configured from the package's `log4j2.properties` from the JVM's first line (`java_options`), so
  Spark's start-up warnings (loopback address, native Hadoop) do not show;
- the Python processes Spark starts (PySpark workers, the transformWithState driver worker that prints its
  UDF and key schema whenever a stateful query starts) have their stdout and stderr copied by the JVM to its
  `System.err` (PythonWorkerFactory.redirectStreamsToStderr); PySpark has no switch for that output, so
  `quiet_python_workers` points the JVM's `System.err` at the null device once the session exists (log4j
  keeps the stderr it was configured with, so real errors still show; failures of Python code reach the
  driver as exceptions, not through stderr);
- the JVM's own notice about incubator modules, printed before any configuration applies, is dropped from
  its stderr (`launching_jvm`).

`fraudrules --verbose`, or FRAUDRULES_LOG_LEVEL=WARN|INFO|DEBUG, brings everything back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Iterator
from importlib import resources
from typing import Any

ENV = "FRAUDRULES_LOG_LEVEL"
DEFAULT = "ERROR"
VERBOSE = "WARN"
LEVELS = ("ALL", "TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")
CONFIG = "log4j2.properties"
QUERY_FAILURES = "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution"  # logs a query that failed
# Printed by the JVM itself, not log lines: the module system's for the vector module Spark's launcher adds, and
# the launcher's when the environment sets JDK_JAVA_OPTIONS.
JVM_NOTICES = (b"WARNING: Using incubator modules: jdk.incubator.vector", b"NOTE: Picked up JDK_JAVA_OPTIONS:")


def level() -> str:
    """Spark's log level: FRAUDRULES_LOG_LEVEL (upper-cased, default ERROR)."""
    value = os.environ.get(ENV, DEFAULT).strip().upper() or DEFAULT
    if value not in LEVELS:
        raise ValueError(f"{ENV}={value!r} is not a log level; use one of {', '.join(LEVELS)}")
    return value


def quiet() -> bool:
    """True unless Spark's warnings (or more) were asked for."""
    return LEVELS.index(level()) >= LEVELS.index("ERROR")


def set_verbose() -> None:
    """`--verbose`: Spark's warnings and the Python workers' output (a level already set more verbose stays)."""
    if quiet():
        os.environ[ENV] = VERBOSE


def java_options() -> str:
    """JVM options for the driver: log4j configured from the package's properties file."""
    return f"-Dlog4j2.configurationFile={resources.files('fraudrules').joinpath(CONFIG)}"


@contextlib.contextmanager
def launching_jvm() -> Iterator[None]:
    """Around the start of the local JVM: its stderr is a pipe forwarded to ours, minus `JVM_NOTICES`.

    The JVM inherits this process's stderr (fd 2) when it starts; for that moment fd 2 is the pipe, so the JVM
    keeps it and a thread forwards its lines for as long as the JVM lives. Not quiet: nothing changes.
    """
    if not quiet():
        yield
        return
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    original = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)
    threading.Thread(target=_forward, args=(read_end, original), name="jvm-stderr", daemon=True).start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(original, 2)


def _forward(read_end: int, target: int) -> None:
    with os.fdopen(read_end, "rb", buffering=0) as pipe, contextlib.suppress(OSError):
        for line in iter(pipe.readline, b""):
            if not line.rstrip().startswith(JVM_NOTICES):
                while line:
                    line = line[os.write(target, line) :]
    os.close(target)


def quiet_driver_threads(spark: Any) -> None:
    """Quiet: the driver's threads that talk to the JVM stay silent about a broken connection. When the JVM dies,
    every thread still talking to it (the queries' foreachBatch callbacks, PySpark's accumulator server) prints
    the broken connection with a traceback (Py4J partly through the root logger); the command says what happened
    once (`failures`)."""
    if not quiet():
        return
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    py4j = f"{os.sep}py4j{os.sep}"
    logging.getLogger().addFilter(lambda record: py4j not in record.pathname)
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None:
        server.handle_error = lambda *_: None  # socketserver's own prints the traceback


def quiet_query_failures(spark: Any) -> None:
    """Quiet: Spark does not log a streaming query's failure, its whole error (Java stack traces and a sink's Python
    traceback, some 200 lines a query, each time a broker is down): `fraudrules run` says what failed in one line
    and restarts the queries."""
    if not quiet():
        return
    from fraudrules.compat.spark_jvm import jvm_of

    log4j = jvm_of(spark).org.apache.logging.log4j
    log4j.core.config.Configurator.setLevel(QUERY_FAILURES, log4j.Level.OFF)


def quiet_python_workers(spark: Any) -> None:
    """Quiet: the JVM's System.err (where it copies the output of the Python processes it starts) goes to the
    null device; log4j's console appender keeps the stream it was configured with."""
    if not quiet():
        return
    from fraudrules.compat.spark_jvm import jvm_of

    jvm = jvm_of(spark)
    null = jvm.java.io.PrintStream(jvm.java.io.FileOutputStream(os.devnull), True)
    jvm.java.lang.System.setErr(null)
