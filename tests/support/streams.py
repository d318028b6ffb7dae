"""Helpers to drive the real streaming job batch by batch from files (Spark's own TWS test style)."""

from __future__ import annotations

import json
import os
import time
from decimal import Decimal

from fraudrules import tables
from fraudrules.config import JobConfig
from fraudrules.engine import job
from fraudrules.rules import store
from fraudrules.rules.model import Rule


class FileStream:
    """A running job whose landing folder the test fills one file (= one micro-batch) at a time."""

    def __init__(
        self,
        spark,
        data_dir: str,
        rules: list[Rule],
        lateness_ms: int = 60_000,
        shards: int = 4,
        logins: bool = False,
        event_schema: str | None = None,
        catalog: str | None = None,
        schema: str | None = None,
        rules_table: str | None = None,
    ):
        self.spark = spark
        # every file waits for the background queries' next trigger: 0.5 s apart here, not the job's 5 s
        self.cfg = JobConfig(
            data_dir=data_dir,
            shards=shards,
            lateness_ms=lateness_ms,
            logins=logins,
            background_trigger_seconds=0.5,
            event_schema=event_schema,
            catalog=catalog,
            schema=schema,
            rules_table=rules_table,
        )
        os.makedirs(self.cfg.landing, exist_ok=True)
        os.makedirs(self.cfg.logins_landing, exist_ok=True)
        tables.ensure(spark, self.cfg)
        if rules:
            store.upsert(spark, self.cfg, rules, author="test")
        self.files = 0
        self.job: job.Job | None = None

    def start(self) -> FileStream:
        self.job = job.start(self.spark, self.cfg, printer=None)
        return self

    def feed(self, lines: list[str | dict], folder: str | None = None) -> None:
        """Write one file and wait until every query has processed it."""
        text = "".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines)
        tmp = os.path.join(self.cfg.data_dir, f".f{self.files}.tmp")
        with open(tmp, "w") as fh:
            fh.write(text)
        final = os.path.join(folder or self.cfg.landing, f"f{self.files:05d}.json")
        os.replace(tmp, final)
        mtime = time.time() + self.files  # strictly increasing: defines source order across files
        os.utime(final, (mtime, mtime))
        self.files += 1
        self.job.process_all_available()

    def change_rules(self, changes: list[dict] | dict | str) -> None:
        """Drop a rule change file where the running job's rules stream picks it up, and wait for it."""
        text = changes if isinstance(changes, str) else json.dumps(changes)
        folder = self.cfg.rules_landing
        os.makedirs(folder, exist_ok=True)
        self.changes = getattr(self, "changes", 0) + 1
        tmp = os.path.join(self.cfg.data_dir, f".r{self.changes}.tmp")
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, os.path.join(folder, f"change-{self.changes:04d}.json"))
        self.job.rules.processAllAvailable()

    def feed_logins(self, events: list[str | dict]) -> None:
        self.feed(events, self.cfg.logins_landing)

    def stop(self) -> None:
        if self.job:
            self.job.stop()
            self.job = None

    def alerts(self) -> dict[tuple[int, int], Decimal]:
        rows = tables.read(self.spark, self.cfg, "alerts").select("ruleId", "transactionId", "aggregate").collect()
        return {(r.ruleId, r.transactionId): r.aggregate for r in rows}

    def alert_rows(self) -> list:
        return tables.read(self.spark, self.cfg, "alerts").collect()

    def table(self, name: str):
        return tables.read(self.spark, self.cfg, name)
