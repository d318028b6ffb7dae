"""Outages of a running job, for `make crash-demo ARGS="--faults"` and tests/e2e/test_outages.py: the Kafka broker
stopped and started again, the `alerts` table's storage made unwritable, another process appending to `alerts` and
compacting it. One line per fault says what the job did.

The job runs continuously (`fraudrules run --no-generator`, `Demo.spawn(continuous=True)`) and its input arrives in
parts: the first before any fault, then one part with each fault (once the broker is back, or while storage is
unwritable or the other writer writes), each waited for until the job has evaluated and committed it
(`Faults.wait_processed`). Then the job is stopped cleanly and its tables are compared with a backtest of the same
input (`Demo.compare`).

Storage is made unwritable with `chattr +i` on the table's `_delta_log` folder (immutable: no file is created in it,
not even by root, who ignores permission bits): the table's data files are still written, its commits fail, as on a
read-only or full volume.
"""

from __future__ import annotations

import multiprocessing
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from tools.support.crash_demo import FOREIGN, Demo, kill_group
from tools.support.kafka_broker import LocalKafka, produce

PROGRESS_TABLES = ("transactions", "logins", "quarantine", "batches")  # what says how far the job got
FAULTS = ("broker", "storage", "writer")  # the broker's needs a Kafka source
MIN_ROUNDS = 6  # appends of the concurrent writer, at least
# Client timeouts short enough for an outage of seconds to fail a query (Kafka's own are 60 s)
CLIENT_TIMEOUTS = {"kafka.default.api.timeout.ms": "5000", "kafka.request.timeout.ms": "5000"}
FAILED = re.compile(r"^the job failed: (.*); restart \d+ in \d+ s$", re.MULTILINE)
RESTARTED = re.compile(r"^restart \d+: the queries start again from their checkpoints$", re.MULTILINE)


@dataclass
class Faults:
    """The continuous job of `demo` put through faults, one after the other (`run`)."""

    demo: Demo
    broker: LocalKafka | None = None  # with a Kafka source: the broker to stop and start
    outage_s: float = 20.0
    timeout_s: float = 600.0  # for the job to take each part of the input
    delivered: dict[str, int] = field(default_factory=dict)  # records of each kind given to the job so far
    child: subprocess.Popen | None = None

    @property
    def log(self) -> Path:
        return self.demo.log_path(0)

    def run(self, faults: tuple[str, ...] = FAULTS) -> list[str]:
        """Start the job, deliver the first part, inject each fault with a part of its own, stop the job cleanly:
        one line per fault."""
        parts = self._parts(len(faults) + 1)
        self.child = self.demo.spawn(0, continuous=True)
        lines = []
        try:
            self._deliver(parts[0])
            self.wait_processed()
            for name, part in zip(faults, parts[1:], strict=True):
                started, mark = time.monotonic(), self._log_text()
                what = INJECT[name](self, part)
                self.wait_processed()
                taken = f"{time.monotonic() - started:.0f} s"
                lines.append(
                    f"  {what}: {self._what_the_job_did(mark)}; its input in the tables {taken} after it began"
                )
                self.demo.say(lines[-1])
            self.child.send_signal(signal.SIGTERM)
            code = self.child.wait(timeout=120)
        finally:
            if self.child.poll() is None:
                kill_group(self.child)
        if code != 0:
            raise RuntimeError(f"the job exited with {code}:\n{self.demo.log_tail(0)}")
        return lines

    def restarts(self) -> int:
        """Restarts the job made so far, by its output."""
        return len(RESTARTED.findall(self._log_text()))

    # -- the faults ---------------------------------------------------------------------------------------------

    def stop_broker(self, part: dict[str, list[str]]) -> str:
        if self.broker is None:
            raise ValueError("the broker fault needs a Kafka source")
        self.broker.stop()
        try:
            time.sleep(self.outage_s)
        finally:
            self.broker.start()
        self._deliver(part)
        return f"Kafka broker stopped for {self.outage_s:.0f} s"

    def unwritable_alerts(self, part: dict[str, list[str]]) -> str:
        log = Path(self.demo.path("alerts")) / "_delta_log"
        _chattr("+i", log)
        try:
            self._deliver(part)
            time.sleep(self.outage_s)
        finally:
            _chattr("-i", log)
        return f"alerts table's storage unwritable for {self.outage_s:.0f} s (chattr +i on its _delta_log)"

    def concurrent_writer(self, part: dict[str, list[str]], rows: int = 50) -> str:
        """Another process appends `rows` rows to `alerts` every second, with a Delta app id of its own, and compacts
        the table after every other append (delta-rs `optimize.compact`), from before the job gets `part` until the
        job has it in its tables: every commit the job makes meanwhile races the other writer's."""
        context = multiprocessing.get_context("spawn")
        halt, rounds = context.Event(), context.Value("i", 0)
        args = (self.demo.path("alerts"), self.demo.foreign_rows, rows, halt, rounds)
        writer = context.Process(target=append_and_compact, args=args)
        writer.start()
        try:
            self._deliver(part)
            self.wait_processed()
        finally:
            halt.set()
            writer.join(timeout=120)
        if writer.exitcode != 0:
            raise RuntimeError(f"the concurrent writer failed (exit code {writer.exitcode})")
        self.demo.foreign_rows += rounds.value * rows
        return (
            f"another process appended {rounds.value * rows} rows to alerts in {rounds.value} commits and compacted "
            f"it {rounds.value // 2} times"
        )

    # -- input and progress -------------------------------------------------------------------------------------

    def _parts(self, n: int) -> list[dict[str, list[str]]]:
        """The input of each kind cut into `n` parts of whole files (those the backtest reads), in order."""
        parts: list[dict[str, list[str]]] = [{} for _ in range(n)]
        for kind in self.demo.lines:
            files = sorted(Path(self.demo.input_dir(kind)).iterdir())
            for i, part in enumerate(parts):
                part[kind] = [str(f) for f in files[len(files) * i // n : len(files) * (i + 1) // n]]
        return parts

    def _deliver(self, part: dict[str, list[str]]) -> None:
        """Files into the landing folders (in order: the file source reads them by modification time), or their
        records into the topics."""
        cfg = self.demo.job_cfg
        topics = {"transactions": cfg.kafka_transactions_topic, "logins": cfg.kafka_logins_topic}
        for kind, files in part.items():
            records = [line for f in files for line in Path(f).read_text(encoding="utf-8").splitlines()]
            self.delivered[kind] = self.delivered.get(kind, 0) + len(records)
            if self.demo.source == "kafka":
                produce(str(self.demo.kafka_bootstrap), topics[kind], records)
                continue
            Path(self.demo.landing_dir(kind)).mkdir(parents=True, exist_ok=True)
            for f in files:
                shutil.copy2(f, self.demo.landing_dir(kind))

    def wait_processed(self) -> None:
        """Until every record delivered is in bronze or quarantine and every valid one was evaluated by a
        micro-batch whose results are committed (`batches`, committed after `alerts`)."""
        deadline = time.monotonic() + self.timeout_s
        while not self._processed():
            if self.child is not None and self.child.poll() is not None:
                raise RuntimeError(f"the job exited with {self.child.returncode}:\n{self.demo.log_tail(0)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the job did not take its input in {self.timeout_s:.0f} s: {self.delivered}")
            time.sleep(1.0)

    def _processed(self) -> bool:
        from deltalake import DeltaTable

        def rows(table: str, columns: list[str]) -> pa.Table:
            return DeltaTable(self.demo.path(table)).to_pyarrow_table(columns=columns)

        if not all(DeltaTable.is_deltatable(self.demo.path(t)) for t in PROGRESS_TABLES):
            return False  # the job has not made its tables yet
        quarantined = rows("quarantine", ["kind"])["kind"].to_pylist()
        evaluated = rows("batches", ["query", "transactions", "logins"])
        evaluated = evaluated.filter(pc.equal(evaluated["query"], "evaluate"))
        for kind, bronze, quarantine_kind in (
            ("transactions", "transactions", "transaction"),
            ("logins", "logins", "login"),
        ):
            valid = rows(bronze, ["srcPos"]).num_rows
            if valid + quarantined.count(quarantine_kind) != self.delivered.get(kind, 0):
                return False
            if (pc.sum(evaluated[kind]).as_py() or 0) != valid:
                return False
        return True

    # -- the job's output ---------------------------------------------------------------------------------------

    def _log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def _what_the_job_did(self, before: str) -> str:
        """Failures and restarts the job printed since its output was `before`."""
        text = self._log_text()[len(before) :]
        failed, restarted = FAILED.findall(text), RESTARTED.findall(text)
        if not failed:
            return "the job rode it out (no failure)"
        return f"the job failed {len(failed)}× (first: {failed[0]}) and restarted {len(restarted)}×"


INJECT: dict[str, Callable[[Faults, dict[str, list[str]]], str]] = {
    "broker": Faults.stop_broker,
    "storage": Faults.unwritable_alerts,
    "writer": Faults.concurrent_writer,
}


def append_and_compact(path: str, first: int, rows: int, halt: Event, rounds: Synchronized) -> None:
    """Another writer of the table at `path` (run in a process of its own): until `halt` and at least MIN_ROUNDS
    times, an append of `rows` rows with FOREIGN alert ids from `first` on, each with its own Delta transaction, and
    a compaction after every other; `rounds` counts the appends."""
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    while not halt.is_set() or rounds.value < MIN_ROUNDS:
        table, n = DeltaTable(path), rounds.value
        schema = pa.schema(table.schema().to_arrow())
        ids = pa.array([f"{FOREIGN}{first + n * rows + i}" for i in range(rows)])
        data = pa.table([ids if f.name == "alertId" else pa.nulls(rows, f.type) for f in schema], schema=schema)
        done = CommitProperties(app_transactions=[Transaction("concurrent-writer", first + n)])
        write_deltalake(table, data, mode="append", commit_properties=done)
        rounds.value = n + 1
        if n % 2:
            DeltaTable(path).optimize.compact()
        time.sleep(1.0)


def _chattr(flag: str, folder: Path) -> None:
    done = subprocess.run(["chattr", flag, str(folder)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"chattr {flag} {folder} failed: {done.stderr.strip()}")
