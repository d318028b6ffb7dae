"""The job in the foreground (`fraudrules run`): every query until Ctrl-C/SIGTERM, a time limit, the end of
the input (available-now) or a failed query.

Stopping lets in-flight micro-batches finish first, so nothing is interrupted mid-commit. A failed query ends
the run with its error, so that whatever supervises the process (Databricks' continuous trigger, the local
supervisor) restarts it; it resumes from the checkpoints.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from pyspark.sql import SparkSession

from fraudrules import tables
from fraudrules.config import JobConfig
from fraudrules.engine import job
from fraudrules.engine.progress import ProgressPrinter
from fraudrules.engine.sinks import Printer
from fraudrules.rules import store
from fraudrules.rules.model import load_rules_file


class Writer(Protocol):
    """Something feeding the sources while the job runs (the demo generator's paced writers)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


def prepare(spark: SparkSession, cfg: JobConfig, rules_file: str | None, printer: Printer = print) -> None:
    """Create missing tables; an empty rules table gets the rules of `rules_file` (if given)."""
    tables.ensure(spark, cfg)
    if rules_file and not store.current(spark, cfg):
        store.upsert(spark, cfg, load_rules_file(rules_file), author="fraudrules run")
        printer(f"loaded rules from {rules_file}")


def run(
    spark: SparkSession,
    cfg: JobConfig,
    writers: Sequence[Writer] = (),
    seconds: float = 0.0,
    printer: Printer = print,
) -> BaseException | None:
    """Run the job (and start `writers`, the demo generator) until it is told to stop; the failed query's error,
    if one failed."""
    stopping = threading.Event()  # Ctrl-C / SIGTERM ask the loop below to stop; no exception mid-call into the JVM
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    spark.streams.addListener(ProgressPrinter(printer))
    running = job.start(spark, cfg, printer=printer)
    for writer in writers:
        writer.start()
    deadline = time.time() + seconds if seconds else None
    failed: list[BaseException] = []
    try:
        while not stopping.is_set() and all(q.isActive for q in running.queries):
            if deadline is not None and time.time() >= deadline:
                break
            stopping.wait(1)
        while cfg.available_now and not stopping.is_set() and any(q.isActive for q in running.queries):
            time.sleep(0.5)  # the other queries finish their input
        printer("\nstopping…")
    finally:
        for writer in writers:
            writer.stop()
        failed = [q.exception() for q in running.queries if not q.isActive and q.exception()]
        spark.sparkContext.setLogLevel("FATAL")  # a batch still running after the drain is interrupted: not an error
        running.stop(drain_s=0 if failed else 60)  # the generators are stopped: in-flight batches finish first
    return failed[0] if failed else None
