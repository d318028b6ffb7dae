"""What the running job prints: each line labelled by its query, counts in transactions, times readable.

- the stateful queries' sinks print a batch's alerts as soon as they have them (`batch_lines`: one line per rule
  and key, and which batches since the last one printed had none) and add the batch's transactions to `TALLIES`;
- `ProgressPrinter` (a streaming query listener) says when a query starts, finishes its first micro-batch
  (the slow one: Python workers and state stores start) and stops or fails;
- the run loop prints, every few seconds, each stateful query's throughput in transactions
  (`throughput_lines`), and `Ticker` shows that long waits (start-up, draining on Ctrl-C) are progressing.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from fraudrules.compat.pyspark import JsonEventsListener
from fraudrules.config import EVALUATE_QUERY
from fraudrules.rules.text import duration_text, iso_time, plural

Printer = Callable[[str], None]
_SAY = threading.Lock()


def say(line: str) -> None:
    """`print` for the job's threads (query sinks, listener, run loop): one write a line, so two lines printed at
    the same moment never share one (print writes the text and its newline apart)."""
    with _SAY:
        sys.stdout.write(f"{line}\n")
        sys.stdout.flush()


STATEFUL = (EVALUATE_QUERY,)  # the job's stateful query: both detectors
TRACEBACK = "Traceback (most recent call last):"
RAISED = re.compile(r"^[A-Za-z_][\w.]*: \S.*$", re.MULTILINE)  # a traceback's "SomeError: message" line
ROOT_CAUSE = re.compile(r"^Caused by: (.+)$", re.MULTILINE)  # a Java stack trace's causes, the root one last
ANSI = re.compile(r"\x1b\[[0-9;]*m")
CAUSED = "↳"  # delta-rs puts each cause of an error on a line of its own, after this


def error_line(error: BaseException | str) -> str:
    """What failed, in one line: for an error a Python function raised inside Spark (a foreachBatch sink), whose
    message is the traceback, the error it ends with and what that came from; otherwise the first line, with the
    causes delta-rs lists below it; then the root cause of a Java stack trace in it (a failed task's)."""
    text = ANSI.sub("", str(error)).strip()
    line = _raised_in_python(text) or _first_line(text) or type(error).__name__
    root = [cause.strip() for cause in ROOT_CAUSE.findall(text)]
    return f"{line} (caused by {root[-1]})" if root and root[-1] not in line else line


def _raised_in_python(text: str) -> str | None:
    if TRACEBACK not in text:
        return None
    traceback = text[text.index(TRACEBACK) :].split("\n=== Streaming Query ===")[0]
    raised = list(dict.fromkeys(RAISED.findall(traceback)))  # Spark may quote the traceback twice
    return raised[-1] + "".join(f" (from {cause})" for cause in reversed(raised[:-1])) if raised else None


def _first_line(text: str) -> str:
    first, *rest = text.splitlines() or [""]
    causes = [row.strip().removeprefix(CAUSED).strip() for row in rest if row.strip().startswith(CAUSED)]
    return ": ".join([first, *causes])


def inputs_text(transactions: int, logins: int, period_s: float | None = None) -> str:
    """`1,000 transactions`, with login events `1,000 transactions and 40 login events`; over `period_s`, each with
    its rate (`1,000 transactions (100/s)`)."""
    parts = [(transactions, "transactions")] + ([(logins, "login events")] if logins else [])
    rate = (lambda n: f" ({n / period_s:,.0f}/s)") if period_s else (lambda n: "")
    return " and ".join(f"{n:,} {unit}{rate(n)}" for n, unit in parts)


@dataclass
class Tally:
    """What one stateful query did since the last report."""

    transactions: int = 0
    logins: int = 0
    alerts: int = 0
    late: int = 0
    batches: int = 0


@dataclass
class Tallies:
    """Per query, the sinks' counts since the last `take` (sinks run on Spark's threads, the report on ours), and
    the batches since the last one printed."""

    by_query: dict[str, Tally] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    unprinted: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # first, last, count since the last print

    def add(self, query: str, heartbeat: Mapping[str, Any], alerts: int) -> None:
        with self.lock:
            t = self.by_query.setdefault(query, Tally())
            t.transactions += int(heartbeat.get("transactions") or 0)
            t.logins += int(heartbeat.get("logins") or 0)
            t.alerts += alerts
            t.late += int(heartbeat.get("lateEvents") or 0)
            t.batches += 1

    def silent_before(self, query: str, batch_id: int, printed: bool) -> tuple[int, int, int] | None:
        """Record a batch; when it is `printed`, the batches of this process since the last printed one (first,
        last, how many: they had no alerts and no late events), which the printed line names so that its number
        does not skip unexplained."""
        with self.lock:
            before = self.unprinted.pop(query, None)
            if printed:
                return before
            first, _, count = before or (batch_id, batch_id, 0)
            self.unprinted[query] = (first, batch_id, count + 1)
            return None

    def take(self) -> dict[str, Tally]:
        with self.lock:
            taken, self.by_query = self.by_query, {}
        return taken


TALLIES = Tallies()  # what this process's stateful sinks report


def _latency(heartbeat: Mapping[str, Any]) -> str:
    p50, p99 = heartbeat.get("latencyP50Ms"), heartbeat.get("latencyP99Ms")
    return f"; ingestion→alert p50 {duration_text(p50)}, p99 {duration_text(p99)}" if p50 is not None else ""


def alert_line(alert: Mapping[str, Any]) -> str:
    """One alert for the console: rule, the transaction (or user) and its event time, the message."""
    tx = alert["transactionId"]
    who = f"tx {tx}" if tx is not None else f"user {alert['userId']}"
    return f"  ALERT rule {alert['ruleId']} · {who} at {iso_time(alert['eventTimeMs'])} · {alert['message']}"


def first_per_key(alerts: pa.Table) -> list[tuple[int, int]]:
    """The first alert of each (rule, key) in the batch, in order, as (its row, the key's number of alerts): a key
    is one line, and a burst's alerts do not hide the batch's other incidents."""
    first: dict[tuple[Any, Any], list[int]] = {}  # (rule, key) → [first row, alerts]
    for row, rule_key in enumerate(zip(alerts["ruleId"].to_pylist(), alerts["key"].to_pylist(), strict=True)):
        if seen := first.get(rule_key):
            seen[1] += 1
        else:
            first[rule_key] = [row, 1]
    return [(row, count) for row, count in first.values()]


def batch_range_text(first: int, last: int, count: int) -> str:
    """`batch 7`, `batches 6–8` (consecutive) or `6 batches of 3–11`."""
    if count == 1:
        return f"batch {first}"
    return f"batches {first}–{last}" if last - first + 1 == count else f"{count} batches of {first}–{last}"


def batch_lines(query: str, batch_id: int, heartbeat: Mapping[str, Any], alerts: pa.Table, show: int = 5) -> list[str]:
    """A stateful micro-batch for the console (nothing when it had no alerts and no late events), counted in
    `TALLIES`: a line with its counts, latency and the batches since the last one printed (they had none), then
    the first alert of each of its first `show` (rule, key) pairs."""
    late = int(heartbeat.get("lateEvents") or 0)
    TALLIES.add(query, heartbeat, len(alerts))
    silent = TALLIES.silent_before(query, batch_id, printed=bool(len(alerts) or late))
    if not len(alerts) and not late:
        return []
    inputs = inputs_text(int(heartbeat.get("transactions") or 0), int(heartbeat.get("logins") or 0))
    counts = f"{plural(len(alerts), 'alert')} in {inputs}" + (f", {late:,} late" if late else "")
    quiet = f" ({batch_range_text(*silent)}: no alerts)" if silent else ""
    lines = [f"[{query}] batch {batch_id}: {counts}{_latency(heartbeat)}{quiet}"]
    keys = first_per_key(alerts)
    for row, of_key in keys[:show]:
        more = f" (+{of_key - 1:,} more of this key)" if of_key > 1 else ""
        lines.append(alert_line(alerts.slice(row, 1).to_pylist()[0]) + more)
    if len(keys) > show:
        per_rule = sorted(Counter(alerts["ruleId"].to_pylist()).items())
        rules = ", ".join(f"{r}: {n:,}" for r, n in per_rule)
        lines.append(f"  … {plural(len(keys) - show, 'more key')}; all {plural(len(alerts), 'alert')} by rule: {rules}")
    return lines


def rules_in_force_lines(query: str, applied: list[Mapping[str, Any]]) -> list[str]:
    """Rule versions a query evaluated for the first time (rule_applied rows) in one line, with the delay from
    their change."""
    timed = sorted((r for r in applied if r.get("delayMs") is not None), key=lambda r: (r["ruleId"], r["version"]))
    if not timed:
        return []
    names = ", ".join(f"rule {r['ruleId']} v{r['version']}" for r in timed)
    low, high = min(r["delayMs"] for r in timed), max(r["delayMs"] for r in timed)
    first, last = duration_text(low), duration_text(high)
    span = first if first == last else f"{first} to {last}"
    return [f"[{query}] in force: {names} (first evaluated {span} after the change)"]


class ProgressPrinter(JsonEventsListener):
    """Query lifecycle on the console, by query name; remembers batch durations for `throughput_lines`."""

    def __init__(self, printer: Printer = say):
        self.printer = printer
        self.names: dict[str, str] = {}
        self.first_batch: dict[str, float] = {}
        self.durations: dict[str, list[float]] = {}
        self.ended: set[str] = set()  # queries whose termination was reported
        self.lock = threading.Condition()

    def onQueryStarted(self, event) -> None:
        name = event.name or str(event.id)
        with self.lock:
            self.names[str(event.id)] = name
        self.printer(f"[{name}] started")

    def onQueryProgress(self, event) -> None:
        p = event.progress
        name = p.name or str(p.id)
        with self.lock:
            self.durations.setdefault(name, []).append(float(p.batchDuration))
            first = name not in self.first_batch
            if first:
                self.first_batch[name] = time.monotonic()
        if first and name in STATEFUL:
            resumed = f", batch {p.batchId}: numbers go on from the checkpoint" if p.batchId else ""
            self.printer(
                f"[{name}] first micro-batch done in {duration_text(p.batchDuration)} (incl. start-up{resumed})"
            )

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        name = self.names.get(str(event.id), str(event.id))
        if event.exception:
            self.printer(f"[{name}] FAILED: {error_line(event.exception)}")
        else:
            self.printer(f"[{name}] stopped")
        with self.lock:
            self.ended.add(name)
            self.lock.notify_all()

    def wait_ended(self, names: list[str], timeout_s: float) -> list[str]:
        """Until the termination of each named query was reported, at most `timeout_s`: a query's events reach
        the listener after `stop()` returns, and a listener removed before then never prints them. The names
        still not reported."""
        with self.lock:
            self.lock.wait_for(lambda: self.ended.issuperset(names), timeout=timeout_s)
            return [n for n in names if n not in self.ended]

    def waiting_for_first_batch(self, names: list[str]) -> list[str]:
        with self.lock:
            return [n for n in names if n not in self.first_batch]

    def take_durations(self) -> dict[str, list[float]]:
        with self.lock:
            taken, self.durations = self.durations, {}
        return taken


def throughput_lines(tallies: Mapping[str, Tally], durations: Mapping[str, list[float]], period_s: float) -> list[str]:
    """Per stateful query, what it did in the last `period_s`: input in its unit and per second, alerts, and
    how long its micro-batches took."""
    lines = []
    for query in STATEFUL:
        t, times = tallies.get(query), durations.get(query, [])
        if t is None and not times:
            continue
        t = t or Tally()
        took = (
            f"; micro-batches took {duration_text(float(np.median(times)))} (median of {len(times)})" if times else ""
        )
        late = f", {t.late:,} late" if t.late else ""
        lines.append(
            f"[{query}] last {period_s:.0f} s: {inputs_text(t.transactions, t.logins, period_s)}, "
            f"{plural(t.alerts, 'alert')}{late}{took}"
        )
    return lines


@contextmanager
def ticker(
    printer: Printer, what: str, every_s: float = 5.0, status: Callable[[], str] | None = None
) -> Iterator[None]:
    """Print `what…` now, then every `every_s` while the block runs the time spent (and `status()`, if given),
    so that a long wait is visibly progressing."""
    printer(f"{what}…")
    started, done = time.monotonic(), threading.Event()

    def tick() -> None:
        while not done.wait(every_s):
            extra = status() if status else ""
            printer(f"  … {time.monotonic() - started:.0f} s{': ' + extra if extra else ''}")

    thread = threading.Thread(target=tick, name="ticker", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
