"""What a local Spark session needs and a cluster does not: the driver JVM's options (heap, logging, thread
niceness, the class-data archive, the C1-only JIT of short-lived sessions) and Hadoop's local file system without a
forked `chmod`. `session` loads this module only for a local session; a Databricks cluster's JVM is the cluster's.

A local JVM starts cold: its first seconds go to loading classes and interpreting Spark's and Delta's planner (a
process's first Delta read is much slower than the next ones). Two remedies: the class-data archive `make setup`
writes beside the jars (classes mapped from it instead of loaded and verified), and, for sessions that end within
a minute or two (`short_lived`: every Spark command but `run`, the notebooks), the C1-only JIT, which compiles at
once rather than after profiling. Long-lived sessions (the continuous job, the bench, the test suite's shared
session) keep the default tiered JIT for its steady-state speed, and so does a short-lived one that asks for it
(`tiered_jit`: a backtest of a large input, `backtest.long_running`).
"""

from __future__ import annotations

import os
import re

from pyspark.sql import SparkSession

from fraudrules import logs
from fraudrules.compat.spark_jvm import jvm_of
from fraudrules.jars import jars_file

DRIVER_MEMORY_ENV = "FRAUDRULES_DRIVER_MEMORY"  # the local JVM's heap
# Hadoop's local file system without a forked `chmod` per created file (jvm/localfs), built by `make setup` into
# the jars folder's driver/ (not a Spark jar: the driver's class path, where Hadoop looks file systems up)
LOCAL_FS = "io.fraudrules.hadoop.NoForkLocalFileSystem"
LOCAL_FS_JAR = os.path.join("driver", "fraudrules-localfs.jar")
CLASS_ARCHIVE = "fraudrules.jsa"  # the JVM's class-data archive, in the jars folder (`make setup` writes it)
TRAIN_ENV = "FRAUDRULES_CLASS_ARCHIVE_TRAINING"  # set: this JVM writes the archive of the classes it loaded
# The local JVM's JIT, whatever the session: "c1" (C1 only) or "tiered". The test suite sets "c1": its JVMs, the
# continuous jobs' included, live seconds to minutes, and the tiered JIT's C2 compilations were CPU their tests
# waited for on 2 cores. Unset: C1 only for short-lived sessions, unless they ask for the tiered JIT.
JIT_ENV = "FRAUDRULES_JIT"
# The JVM's own warnings go to stderr (unified logging writes them to stdout, where command output goes);
# the class-data archive's notices are off (a JVM that cannot map the archive just loads its classes).
JVM_LOGGING = ("-Xlog:disable", "-Xlog:all=warning:stderr", "-Xlog:cds*=off:stderr")
# C1 alone gets a 48 MiB code cache (the client default), which a backtest fills, and the JVM then stops
# compiling. 240 MiB is the tiered JIT's default; it is reserved address space, committed as used.
C1_ONLY = ("-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=240m")
# Java thread priorities as OS nice values: MIN_PRIORITY threads (`lower_priority`) run at nice 19, every other
# priority at nice 0 as before. On 2 cores the driver side of the bronze ingest and of the Delta commits of
# results then takes only the CPU the evaluation leaves idle. (HotSpot's own mapping would also raise the GC and
# JIT threads to nice -5.)
BACKGROUND_NICE = (
    "-XX:ThreadPriorityPolicy=1",
    "-XX:JavaPriority1_To_OSPriority=19",
    *(f"-XX:JavaPriority{p}_To_OSPriority=0" for p in range(2, 11)),
)


# A short-lived session's heap holds one bounded micro-batch at a time (`max_records_per_trigger`), a few hundred MB
# at most; the serial collector keeps committed what it uses (G1 grew a backtest's 768 MB heap to its maximum while
# using ~200 MB of it). Long-lived sessions keep G1 and a bigger heap, for the job's allocation rate.
SHORT_LIVED_HEAP = "768m"
SHORT_LIVED_GC = ("-XX:+UseSerialGC",)
# The continuous job's heap is committed and touched at launch (-Xms as -Xmx): G1 otherwise grows it in steps over
# the first hour (the soak's JVM went from 1.4 to 2.2 GiB between minutes 5 and 70), which reads as a leak and hides
# one; the job's memory is then its steady state from its first minute.
FIXED_HEAP = ("-XX:+AlwaysPreTouch",)
# The data-quality run checks a detector's retained state (after an hour at 1,000 tx/s, millions of events), built by
# Spark's tasks: 2 GB checked the soak's hour of state in 4 min 16 s. (Built from the driver's rows, it had run 2 GB
# out of memory and needed 4 GB: 6 min 24 s.) 768 MB, the short-lived default, is not measured on that state.
QUALITY_HEAP = "2g"
# glibc's malloc serves a request of this size or more with its own mapping, returned to the system when freed.
# Left unset, glibc raises that threshold to the size of each freed mapping (up to 32 MiB), and from then on the
# JVM's native buffers and the Python workers' arrays are carved from heaps it never gives back. A 1M-record
# backtest peaked at 2.2-2.3 GiB with 1 MiB, 2.5-2.6 GiB without (128 KiB: as low, but ~15% slower).
# The JVM and its Python workers inherit the variable.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
_launched: list[str] = []  # the heap of the JVM this process launched


def driver_memory(short_lived: bool = False, default: str | None = None) -> str:
    """The local JVM's heap: `FRAUDRULES_DRIVER_MEMORY`, else the session's `default`, else 768m for a short-lived
    session (a command or a notebook), 3g for the continuous job (committed at launch, `FIXED_HEAP`: what
    `make bench` needs, not more: docs/performance.md)."""
    return os.environ.get(DRIVER_MEMORY_ENV) or default or (SHORT_LIVED_HEAP if short_lived else "3g")


def launched(heap: str) -> None:
    """Note the heap of the JVM this process is launching (what a failure report names)."""
    _launched[:] = [heap]


def malloc_env() -> None:
    """`MALLOC_ENV` for the JVM this process is about to launch and its Python workers, unless already set."""
    for key, value in MALLOC_ENV.items():
        os.environ.setdefault(key, value)


def launched_heap() -> str:
    """The heap of the JVM this process launched, else what a new long-lived one would get."""
    return _launched[0] if _launched else driver_memory()


def lower_priority(spark: SparkSession) -> None:
    """Run the calling thread's JVM side (a query's stream thread in its foreachBatch, the JVM thread that serves
    a Python thread) at Java's lowest priority, which `BACKGROUND_NICE` maps to nice 19."""
    jvm_of(spark).java.lang.Thread.currentThread().setPriority(1)


def local_fs_options(master: str) -> dict[str, str]:
    """`file:` paths through LOCAL_FS in a local session (one JVM, not `local-cluster`), when `make setup` built
    it. Without Hadoop's native library (the pyspark wheel has none) the stock local file system forks a `chmod`
    of the whole driver JVM for every file it creates: checkpoint logs, state store and Parquet files, several
    per micro-batch. Delta's own log writes go through Hadoop's FileContext, which this does not change."""
    jar = jars_file(LOCAL_FS_JAR)
    if not re.fullmatch(r"local(\[[^\]]*\])?", master) or jar is None or not os.path.exists(jar):
        return {}
    return {"spark.driver.extraClassPath": jar, "spark.hadoop.fs.file.impl": LOCAL_FS}


def jvm_options(
    short_lived: bool, catalog: str | None = None, tiered_jit: bool = False, fixed_heap: str | None = None
) -> str:
    """The local driver JVM's options: logging, thread niceness, the class-data archive (when there is one; an
    archive that does not match this JDK or class path is skipped without a word), the serial collector of
    short-lived sessions and their C1-only JIT (unless `tiered_jit`), Derby's home (its log) in the local catalog's
    folder; `fixed_heap`: the continuous job's heap, committed and touched at launch (`FIXED_HEAP`)."""
    archive = jars_file(CLASS_ARCHIVE)
    options = [logs.java_options(), *JVM_LOGGING, *BACKGROUND_NICE]
    if catalog:
        options.append(f"-Dderby.system.home={catalog}")
    if os.environ.get(TRAIN_ENV) and archive:
        options.append(f"-XX:ArchiveClassesAtExit={archive}")
    elif archive and os.path.exists(archive):
        options.append(f"-XX:SharedArchiveFile={archive}")
    if c1_only(short_lived, tiered_jit):
        options.extend(C1_ONLY)
    if short_lived:
        options.extend(SHORT_LIVED_GC)
    if fixed_heap:
        options.extend((f"-Xms{fixed_heap}", *FIXED_HEAP))
    return " ".join(options)


def c1_only(short_lived: bool, tiered_jit: bool) -> bool:
    """Whether the local JVM gets the C1-only JIT: as `JIT_ENV` says, else a short-lived session's unless it asked
    for the tiered JIT."""
    choice = os.environ.get(JIT_ENV, "")
    if choice not in ("", "c1", "tiered"):
        raise ValueError(f"{JIT_ENV}={choice!r}: c1 or tiered (or unset)")
    return choice == "c1" or (not choice and short_lived and not tiered_jit)
