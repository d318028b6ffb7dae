"""The job in the foreground (`fraudrules run`): every query until Ctrl-C/SIGTERM, a time limit or the end of the
input (available-now), restarted from its checkpoints after a failure.

Stopping lets in-flight micro-batches finish first, so nothing is interrupted mid-commit (a second Ctrl-C stops
at once: an interrupted batch is redone on restart). Long waits show their progress: the first micro-batches
(Python workers and state stores start) and the drain. A failed query or committer stops the others, and after a
backoff the job starts its queries again in the same session, as a cluster retries a failed task or run: a broker
or storage that is down for a while costs restarts, not the job (`Restarts`, `restartable`). Replays are
idempotent (outbox and Delta transactions), so a restart loses and duplicates nothing. A JVM that died, too many
restarts in an hour, or an error a restart meets again end the run with the error, for whatever supervises the
process (Databricks' continuous trigger, the local supervisor).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pyspark.sql import SparkSession

from fraudrules import event_schema, logs, tables
from fraudrules.config import MAX_RESTARTS, JobConfig
from fraudrules.engine import job, progress
from fraudrules.engine.progress import Printer, ProgressPrinter, error_line, say
from fraudrules.event_schema import SchemaError
from fraudrules.rules import store
from fraudrules.rules import table as rules_table
from fraudrules.rules.model import RuleError, load_rules_file
from fraudrules.rules.text import rule_text

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
    job); an empty rules table gets the rules of `rules_file` (if given), validated against it (RuleError). With a
    rules table of the admins' (`cfg.rules_table`), that table is made when missing (`_prepare_rules_table`)."""
    created = tables.ensure(spark, cfg)
    if created:
        printer(f"created {len(created)} tables: {', '.join(created)}")
    added = job.adopt_schema(spark, cfg)
    if added:
        printer(f"bronze transactions gained the event schema's new fields: {', '.join(added)}")
    if cfg.rules_table:
        _prepare_rules_table(spark, cfg, rules_file, printer)
    elif rules_file and not store.current(spark, cfg):
        rules = load_rules_file(rules_file, event_schema.for_job(cfg))
        store.upsert(spark, cfg, rules, author="fraudrules run")
        printer(f"loaded {len(rules)} rules from {rules_file}:")
        for rule in rules:
            printer(f"  rule {rule.rule_id}: {rule_text(rule)}")


def _prepare_rules_table(spark: SparkSession, cfg: JobConfig, rules_file: str | None, printer: Printer) -> None:
    """The job's rules table made when missing, with the rules of `rules_file` (if given); an existing one is the
    admins': the file does not overwrite it."""
    rules = load_rules_file(rules_file, event_schema.for_job(cfg)) if rules_file else []
    if rules_table.create(spark, str(cfg.rules_table), rules):
        loaded = f" with {len(rules)} rules from {rules_file}" if rules else ""
        printer(f"created the rules table {cfg.rules_table} (change data feed on){loaded}")
    elif rules_file:
        printer(f"rules from the rules table {cfg.rules_table}; {rules_file} not loaded")


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
    restarts: Restarts | None = None,
) -> BaseException | None:
    """Run the job (and start `writers`, the demo generator) until it is told to stop; the error that ended it, if
    one did. A query or committer that fails stops the others; after a backoff the queries start again from their
    checkpoints in this session, as long as `restarts` allows (default `Restarts()`) and the error is `restartable`.
    A first start that fails raises its error."""
    stop = stop or Stop(printer)  # no exception mid-call into the JVM: the loops below look at it
    stop.starting = None
    restarts = restarts or Restarts()
    deadline = time.monotonic() + seconds if seconds else None
    for writer in writers:  # first: the queries' first micro-batch already holds input
        writer.start()
    try:
        started = time.monotonic()
        failed = attempt(spark, cfg, stop, deadline, printer, first=True)
        while failed is not None and not stop.requested.is_set() and restartable(failed):
            wait_s = restarts.backoff(time.monotonic() - started)
            if wait_s is None:
                if restarts.per_hour:
                    printer(f"no restart: {restarts.per_hour} in the last hour already (--max-restarts)")
                break
            n = restarts.count
            printer(f"the job failed: {error_line(failed)}; restart {n} in {wait_s:.0f} s")
            if stop.requested.wait(wait_s):
                return None  # everything is stopped already: a clean stop
            printer(f"restart {n}: the queries start again from their checkpoints")
            spark.sparkContext.setLogLevel(logs.level())  # the failure's drain silenced Spark
            started = time.monotonic()
            failed = attempt(spark, cfg, stop, deadline, printer)
        return failed
    finally:
        _stop_writers(writers)


@dataclass
class Restarts:
    """When a failed job restarts (`run`): at most `per_hour` restarts in any hour (0: none), each after a backoff
    that doubles from `first_s` up to `max_s`, and is back to `first_s` once a run lasted `healthy_s`."""

    per_hour: int = MAX_RESTARTS
    first_s: float = 5.0
    max_s: float = 60.0
    healthy_s: float = 300.0
    made: list[float] = field(default_factory=list)  # when each restart was decided (monotonic)
    wait_s: float = 0.0  # the last backoff

    @property
    def count(self) -> int:
        return len(self.made)

    def backoff(self, ran_s: float) -> float | None:
        """After a run of `ran_s` that failed: how long to wait before its restart, or None when the last hour's
        restarts are used up."""
        now = time.monotonic()
        if sum(now - t < 3600 for t in self.made) >= self.per_hour:
            return None
        healthy = ran_s >= self.healthy_s or not self.made
        self.wait_s = self.first_s if healthy else min(2 * self.wait_s, self.max_s)
        self.made.append(now)
        return self.wait_s


def restartable(err: BaseException) -> bool:
    """Whether a restart in this process may get past `err`: the errors of a source, a sink, the table writer or
    the publisher (a broker or storage that is down, a failed commit), as a cluster's task and run retries retry
    them; not a JVM that died, ran out of memory or lost a Python worker (`failures.explain`: the process has to
    go), nor a job that does not fit its checkpoint or rules (SchemaError, RuleError: a restart meets them again)."""
    from fraudrules import failures  # not at import: it loads local_runtime, which a cluster's job never needs

    return not isinstance(err, SchemaError | RuleError) and failures.explain(err) is None


def attempt(
    spark: SparkSession, cfg: JobConfig, stop: Stop, deadline: float | None, printer: Printer, first: bool = False
) -> BaseException | None:
    """Start the queries and run them until a stop, the deadline, the end of the input or a failure, then stop
    them all; the failure, if one ended them, or a start's error (raised on the `first` start)."""
    listener = ProgressPrinter(printer)  # one per start: the queries' names come again
    spark.streams.addListener(listener)
    try:
        try:
            running = job.start(spark, cfg, printer=printer)
        except Exception as err:
            if first:
                raise
            return err
        reason = "stopping"
        try:
            reason = watch(running, listener, cfg, stop, deadline, printer)
        finally:
            failed = failure(running)
            printer(f"{reason}…" if failed else f"{reason}: micro-batches in progress finish (Ctrl-C again: at once)…")
            # a batch still running after the drain is interrupted: not an error
            spark.sparkContext.setLogLevel("FATAL")
            drain(running, stop, 0 if failed else DRAIN_S, printer, failed=failed is not None)
            listener.wait_ended(list(running.by_name), ENDED_WAIT_S)
        return failed or failure(running)
    finally:
        spark.streams.removeListener(listener)


def _stop_writers(writers: Sequence[Writer]) -> None:
    for writer in writers:
        writer.stop()


def watch(
    running: job.Job, listener: ProgressPrinter, cfg: JobConfig, stop: Stop, deadline: float | None, printer: Printer
) -> str:
    """Until a stop, the deadline, a failed query or (available-now) the end of the input, which it returns: the
    wait for the first micro-batches, then every REPORT_S the stateful queries' throughput."""
    started = time.monotonic()
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
        return "a query or committer failed: stopping the others"
    active = [q.isActive for q in running.queries]
    if cfg.available_now and not any(active):
        return "the input is processed: stopping"
    if not cfg.available_now and not all(active):
        return "a query stopped: stopping the others"
    if deadline is not None and time.monotonic() >= deadline:
        return "time is up: stopping"
    return None


def drain(running: job.Job, stop: Stop, drain_s: float, printer: Printer, failed: bool = False) -> None:
    """Stop every query, giving each up to `drain_s` to finish its micro-batch (none after a second Ctrl-C),
    then commit what the committers hold (after a failure, what they can: `Job.stop`); prints what it is waiting
    for meanwhile."""
    stop_args = {"drain_s": drain_s, "failed": failed}
    stopper = threading.Thread(target=running.stop, kwargs=stop_args, name="drain", daemon=True)
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
    """The error of a committer that could not write to Delta (first: the query it serves fails of it too), or of
    a query that died."""
    errors = [c.error for c in running.committers if c.error is not None]
    errors += [q.exception() for q in running.queries if not q.isActive and q.exception() is not None]
    return errors[0] if errors else None
