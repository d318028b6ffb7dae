"""The committer: a thread per stateful query that appends its outbox to the Delta tables (and, with an alerts
topic, its publisher: `engine/publisher.py`).

Several micro-batches go into one commit per table, each commit with Delta's transaction (query, the commit's last
batch id: `tables.Txn`), so that a batch already in a table is never appended again. Which batches a commit holds
is recorded before it is made (`outbox.Progress`): after a crash exactly that commit is made again. A crash
between outbox and Delta loses nothing: the next start commits what the outbox holds before the queries resume.
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Callable

import pandas as pd
import pyarrow as pa
from pyspark.sql import SparkSession

from fraudrules import tables
from fraudrules.config import JobConfig
from fraudrules.engine import progress
from fraudrules.engine.outbox import OUTBOX_FOLDER, TIMES, Outbox, Progress, with_times
from fraudrules.engine.progress import Printer
from fraudrules.engine.publisher import Publisher
from fraudrules.session import background_thread

BACKGROUND_POOL = "background"
HOT_POOL = "evaluate"  # scheduler pool (fairscheduler.xml) of evaluation and rule changes
PUBLISH_WAIT_S = 5.0  # after a failure, how long a publish in flight may take before it is cancelled


class Committer(threading.Thread):
    """Appends a query's outbox to Delta in the background: per table, the batches it does not have yet, in one
    commit with the transaction (query, last batch of the commit). With `publish`, the query's alerts also go to
    the alerts topic through a `Publisher`, and a batch leaves the outbox once it has them too."""

    def __init__(
        self,
        spark: SparkSession,
        cfg: JobConfig,
        query: str,
        printer: Printer | None,
        min_interval_s: float = 2.0,
        publish: Callable[[pa.Table], None] | None = None,
    ):
        super().__init__(daemon=True, name=f"committer-{query}")
        self.spark, self.cfg, self.query, self.printer = spark, cfg, query, printer
        self.outbox = Outbox(os.path.join(cfg.checkpoint(query), OUTBOX_FOLDER))
        self.min_interval_s = min_interval_s
        self.wake, self.halt = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        self.lock = threading.Lock()  # the thread and callers of commit_pending (drains, tests) take turns
        self.reported: set[tuple[int, int]] | None = None  # rule versions whose apply delay is recorded
        self.writer = tables.writer(spark, cfg)
        self.publisher = Publisher(publish, self.outbox) if publish else None

    def run(self) -> None:
        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", BACKGROUND_POOL)
        background_thread(self.spark)
        while not self.halt.is_set():
            self.wake.wait(timeout=self.min_interval_s)
            self.wake.clear()
            try:
                self.commit_pending()
            except Exception as err:  # surfaced to the query by the sink's next micro-batch
                self.error = err
                traceback.print_exc()
                return
            self.halt.wait(self.min_interval_s)

    def stop(self, failed: bool = False) -> None:
        """Publish and commit what is pending and end the thread. After a failure (`failed`) what cannot be written
        now is left in the outbox, which the next start commits and publishes first: a publish the broker has not
        taken within PUBLISH_WAIT_S is cancelled, and a commit that fails is reported, not raised."""
        if failed and self.publisher:  # first: a micro-batch waiting for this publish holds its query's stop up
            self.publisher.abort(PUBLISH_WAIT_S)
        self.halt.set()
        self.wake.set()
        if self.is_alive():
            self.join()
        if not failed:
            self.drain()
            if self.publisher:
                self.publisher.close()
            return
        try:
            self.commit_pending()
        except Exception as err:
            if self.printer:
                self.printer(
                    f"[{self.query}] results stay in the outbox for the next start: {progress.error_line(err)}"
                )

    def discard(self) -> None:
        """End a committer whose thread has not started, writing nothing (the outbox keeps it all): its publisher's
        thread and producer."""
        if self.publisher:
            self.publisher.abort(0)

    def drain(self) -> None:
        """Wait for the publish in flight (raising its error), then commit every finished micro-batch."""
        if self.publisher:
            self.publisher.flush()
        self.commit_pending()

    def commit_pending(self) -> int:
        with self.lock:
            return self._commit()

    def _commit(self) -> int:
        batches = self.outbox.pending()
        if not batches:
            return 0
        for name, times in TIMES.items():
            self._commit_table(name, name, batches, lambda parts, t=times: with_times(pa.concat_tables(parts), t))
        self._commit_table("rule_applied", "rule_seen", batches, self._rule_applied)
        done = min(self.outbox.progress(table).committed for table in (*TIMES, "rule_applied"))
        if self.publisher:
            done = min(done, self.publisher.published())
        self.outbox.remove([b for b in batches if b <= done])
        return len(batches)

    def _commit_table(
        self, table: str, part: str, batches: list[int], rows_of: Callable[[list[pa.Table]], tables.Rows]
    ) -> None:
        """Commit the rows `part` of the batches `table` does not have yet (`rows_of` makes them table rows)."""
        progress = self.outbox.progress(table)
        group = progress.group or [b for b in batches if b > progress.committed]
        if not group:
            return
        self.outbox.set_progress(table, Progress(progress.committed, group))
        parts = [t for b in group if (t := self.outbox.read(b, part)) is not None and t.num_rows]
        rows = rows_of(parts) if parts else []
        if len(rows):
            self.writer.append(table, rows, tables.Txn.of(self.cfg, self.query, group[-1]))
        self.outbox.set_progress(table, Progress(group[-1], None))

    def _rule_applied(self, parts: list[pa.Table]) -> list[dict]:
        """Rows of rule_applied: once per rule version, the delay from its change to the first event evaluated
        under it."""
        seen = pa.concat_tables(parts).to_pandas()
        if self.reported is None:
            rows = self.writer.arrow("rule_applied", ["ruleId", "version"]).to_pylist()
            self.reported = {(r["ruleId"], r["version"]) for r in rows}
        first = seen.sort_values(["firstMs", "batchId"]).groupby(["ruleId", "ruleVersion"]).first()
        new = {k: v for k, v in first.iterrows() if (int(k[0]), int(k[1])) not in self.reported}
        if not new:
            return []
        columns = ["ruleId", "version", "ruleState", "updatedAt"]
        history = self.writer.arrow("rule_history", columns).to_pylist()
        changed = {(r["ruleId"], r["version"]): r["updatedAt"] for r in history if r["ruleState"] != "CONTROL"}
        records = []
        for (rule_id, version), first in new.items():
            at = changed.get((int(rule_id), int(version)))
            delay = None if at is None else int(first["firstMs"]) - int(at.timestamp() * 1000)
            records.append(
                {
                    "ruleId": int(rule_id),
                    "version": int(version),
                    "changedAt": at,
                    "delayMs": delay,
                    "firstEvaluatedAt": pd.Timestamp(int(first["firstMs"]), unit="ms", tz="UTC").to_pydatetime(),
                    "batchId": int(first["batchId"]),
                }
            )
            self.reported.add((int(rule_id), int(version)))
        if self.printer:
            for line in progress.rules_in_force_lines(self.query, records):
                self.printer(line)
        return records
