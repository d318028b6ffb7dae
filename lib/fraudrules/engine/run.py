"""The job in the foreground (`fraudrules run`): every query until Ctrl-C/SIGTERM, a time limit, the end of
the input (available-now) or a failed query.

Stopping lets in-flight micro-batches finish first, so nothing is interrupted mid-commit (a second Ctrl-C stops
at once: an interrupted batch is redone on restart). Long waits show their progress: the first micro-batches
(Python workers and state stores start) and the drain. A failed query ends the run with its error, so that
whatever supervises the process (Databricks' continuous trigger, the local supervisor) restarts it; it resumes
from the checkpoints.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from pyspark.sql import SparkSession

from fraudrules import event_schema, tables
from fraudrules.config import JobConfig
from fraudrules.engine import job, progress
from fraudrules.engine.messages import rule_text
from fraudrules.engine.progress import Printer, ProgressPrinter, say
from fraudrules.rules import store
from fraudrules.rules.model import load_rules_file

DRAIN_S = 60.0  # how long a stop waits for the micro-batches in progress
TICK_S = 5.0  # progress of a long wait, this often
REPORT_S = 10.0  # throughput of the stateful queries, this often
ENDED_WAIT_S = 5.0  # after the stop, how long the queries' "stopped" lines may take to arrive


class Writer(Protocol):
    """Something feeding the sources while the job runs (the demo generator's paced writers)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


def prepare(spark: SparkSession, cfg: JobConfig, rules_file: str | None, printer: Printer = say) -> None:
    """Create missing tables and adopt the event schema (`job.adopt_schema`: SchemaError when it does not fit the
    job); an empty rules table gets the rules of `rules_file` (if given), validated against it (RuleError)."""
    created = tables.ensure(spark, cfg)
    if created:
        printer(f"created {len(created)} tables: {', '.join(created)}")
    added = job.adopt_schema(spark, cfg)
    if added:
        printer(f"bronze transactions gained the event schema's new fields: {', '.join(added)}")
    if rules_file and not store.current(spark, cfg):
        rules = load_rules_file(rules_file, event_schema.for_job(cfg))
        store.upsert(spark, cfg, rules, author="fraudrules run")
        printer(f"loaded {len(rules)} rules from {rules_file}:")
        for rule in rules:
            printer(f"  rule {rule.rule_id}: {rule_text(rule)}")


class Stop:
    """Ctrl-C / SIGTERM: the first asks the run to stop after the batches in progress, the second to hurry.

    Installed once Spark is up, it replaces PySpark's own handler, which raises KeyboardInterrupt in the middle
    of a call into the JVM (Py4J then logs tracebacks). While the job starts (`starting` names what it is
    doing), the first signal lets that step finish and the second quits the process at once (the JVM goes
    with it: it ends when its parent's pipe closes).
    """

    def __init__(self, printer: Printer = say) -> None:
        self.requested, self.hurry = threading.Event(), threading.Event()
        self.starting: str | None = None
        self.printer = printer
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._signal)

    def _signal(self, *_: object) -> None:
        if self.starting is not None and self.requested.is_set():
            self.printer("  stopping at once")
            sys.stdout.flush()
            os._exit(130)
        elif self.starting is not None:
            self.printer(f"  stopping once {self.starting} (Ctrl-C again: at once)")
        if self.requested.is_set():
            self.hurry.set()
        self.requested.set()


def run(
    spark: SparkSession,
    cfg: JobConfig,
    writers: Sequence[Writer] = (),
    seconds: float = 0.0,
    printer: Printer = say,
    stop: Stop | None = None,
) -> BaseException | None:
    """Run the job (and start `writers`, the demo generator) until it is told to stop; the error of a query
    (or committer) that failed, if one did."""
    stop = stop or Stop(printer)  # no exception mid-call into the JVM: the loops below look at it
    stop.starting = None
    listener = ProgressPrinter(printer)
    spark.streams.addListener(listener)
    for writer in writers:  # first: the queries' first micro-batch already holds input
        writer.start()
    try:
        running = job.start(spark, cfg, printer=printer)
    except BaseException:
        _stop_writers(writers)
        raise
    reason = "stopping"
    try:
        reason = watch(running, listener, cfg, stop, seconds, printer)
    finally:
        _stop_writers(writers)
        failed = failure(running)
        printer(f"{reason}…" if failed else f"{reason}: micro-batches in progress finish (Ctrl-C again: at once)…")
        spark.sparkContext.setLogLevel("FATAL")  # a batch still running after the drain is interrupted: not an error
        drain(running, stop, 0 if failed else DRAIN_S, printer)
        listener.wait_ended(list(running.by_name), ENDED_WAIT_S)
        spark.streams.removeListener(listener)
    return failed or failure(running)


def _stop_writers(writers: Sequence[Writer]) -> None:
    for writer in writers:
        writer.stop()


def watch(
    running: job.Job, listener: ProgressPrinter, cfg: JobConfig, stop: Stop, seconds: float, printer: Printer
) -> str:
    """Until a stop, the time limit, a failed query or (available-now) the end of the input, which it returns:
    the wait for the first micro-batches, then every REPORT_S the stateful queries' throughput."""
    started = time.monotonic()
    deadline = started + seconds if seconds else None
    stateful = [name for name in running.by_name if name in progress.STATEFUL]
    printer(f"waiting for the first micro-batches of {', '.join(stateful)} (Python workers and state stores start)")
    last_tick = last_report = started
    waiting = stateful
    while True:
        if reason := _ended(running, cfg, stop, deadline):
            return reason
        stop.requested.wait(1)
        now = time.monotonic()
        still = listener.waiting_for_first_batch(stateful)
        if still and now - last_tick >= TICK_S:
            printer(f"  … {now - started:.0f} s: first micro-batch of {', '.join(still)} still running")
            last_tick = now
        elif waiting and not still:  # the first batches are in: report from here on
            progress.TALLIES.take()
            listener.take_durations()
            last_report = now
        elif not still and now - last_report >= REPORT_S:
            for line in progress.throughput_lines(
                progress.TALLIES.take(), listener.take_durations(), now - last_report
            ):
                printer(line)
            last_report = now
        waiting = still


def _ended(running: job.Job, cfg: JobConfig, stop: Stop, deadline: float | None) -> str | None:
    """Why the run should stop now, if it should."""
    if stop.requested.is_set():
        return "stopping"
    if failure(running) is not None:
        return "a query failed: stopping the others"
    active = [q.isActive for q in running.queries]
    if cfg.available_now and not any(active):
        return "the input is processed: stopping"
    if not cfg.available_now and not all(active):
        return "a query stopped: stopping the others"
    if deadline is not None and time.monotonic() >= deadline:
        return "time is up: stopping"
    return None


def drain(running: job.Job, stop: Stop, drain_s: float, printer: Printer) -> None:
    """Stop every query, giving each up to `drain_s` to finish its micro-batch (none after a second Ctrl-C),
    then commit what the committers hold; prints what it is waiting for meanwhile."""
    stopper = threading.Thread(target=running.stop, kwargs={"drain_s": drain_s}, name="drain", daemon=True)
    started = last_tick = time.monotonic()
    stopper.start()
    hurried = False
    while stopper.is_alive():
        stopper.join(timeout=1.0)
        if stop.hurry.is_set() and not hurried:
            hurried = True
            printer("  stopping at once: micro-batches in progress are redone on the next start")
            for q in running.queries:
                if q.isActive:
                    q.stop()
        now = time.monotonic()
        if stopper.is_alive() and now - last_tick >= TICK_S:
            last_tick, elapsed = now, now - started
            busy = [name for name, q in running.by_name.items() if q.isActive and q.status["isTriggerActive"]]
            what = f"{', '.join(busy)} finishing a micro-batch" if busy else "committing results to Delta"
            printer(f"  … {elapsed:.0f} s: {what}")


def failure(running: job.Job) -> BaseException | None:
    """The error of a query that died, or of a committer that could not write to Delta."""
    errors = [q.exception() for q in running.queries if not q.isActive and q.exception() is not None]
    errors += [c.error for c in running.committers if c.error is not None]
    return errors[0] if errors else None
