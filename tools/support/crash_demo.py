"""The crash demo's harness: a workload with bad records of every class, the job in a child process killed with
SIGKILL at random points and restarted (or, continuous, put through outages: `tools/support/faults.py`), and its
tables compared with a backtest of the same input (`Demo`, `Report`). `tools/crash_demo.py` (`make crash-demo`),
`tests/e2e/test_crash_recovery.py` and `tests/e2e/test_outages.py` run it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fraudrules import event_schema
from fraudrules.compat import spark_checkpoint
from fraudrules.compat.pyspark import UPSTREAM_ENV
from fraudrules.config import EVALUATE_QUERY, QUERIES, JobConfig
from fraudrules.engine.lines import open_fs
from fraudrules.event_schema import EventSchema
from fraudrules.generator import LoginWorkload, RichWorkload, Workload, is_rich, sample_rules_path
from fraudrules.rules.model import LOGIN_RULE

SINK_TABLES = ("transactions", "logins", "quarantine", "alerts", "late_events", "batches")
PRODUCTION_SCHEMA = "fraudrules"
PRODUCTION_SHARDS = 16  # the bundle's
FOREIGN = "concurrent-writer:"  # alertId prefix of the rows another writer appends to `alerts` (faults.py)
KILL_MODES = {
    "planned": "just after a micro-batch was planned",
    "sink": "just after a sink's Delta commit",
    "committed": "just after a micro-batch was committed",
}

# One of each bad-input class, cycled through; `{i}` keeps each one distinct.
BAD_TRANSACTIONS = (
    '{{"transactionId": {i}, "eventTime": 17000000',  # invalid JSON
    '{{"transactionId": {i}, "eventTime": 1700000000000, "payeeId": 1, "beneficiaryId": 2, "paymentType": "CSH"}}',
    '{{"transactionId": {i}, "eventTime": 1700000000000, "payeeId": "p{i}", "beneficiaryId": 2, '
    '"paymentAmount": "1.00", "paymentType": "CSH"}}',  # mistyped field
    '{{"transactionId": {i}, "eventTime": 1700000000000, "payeeId": 1, "beneficiaryId": 2, '
    '"paymentAmount": "1.00", "paymentType": "BTC"}}',  # unknown paymentType
    '{{"transactionId": {i}, "eventTime": 1700000000000, "payeeId": 1, "beneficiaryId": 2, '
    '"paymentAmount": "12,5", "paymentType": "CRD"}}',  # non-numeric amount
    '{{"transactionId": {i}, "eventTime": 99999999999999999, "payeeId": 1, "beneficiaryId": 2, '
    '"paymentAmount": "1.00", "paymentType": "CRD"}}',  # absurd timestamp
    "[1, 2, 3]",  # JSON, but not an object
)
BAD_RICH_TRANSACTIONS = (  # with the rich schema (--event-schema): mistyped nested fields
    '{{"transactionId": {i}, "eventTime": 1700000000000, "payeeId": 1, "beneficiaryId": 2, "paymentAmount": "1.00", '
    '"paymentType": "CSH", "merchant": "FR"}}',
    '{{"transactionId": {i}, "eventTime": 1700000000000, "payeeId": 1, "beneficiaryId": 2, "paymentAmount": "1.00", '
    '"paymentType": "CRD", "basket": {{"items": "many"}}}}',
)
BAD_LOGINS = (
    '{{"userId": {i}, "eventType": "FAIL"',
    '{{"userId": {i}, "eventType": "MAYBE", "ipAddress": "10.0.0.1", "eventTimestamp": 1700000000000}}',
    '{{"eventType": "FAIL", "ipAddress": "10.0.0.{i}", "eventTimestamp": 1700000000000}}',
    '{{"userId": {i}, "eventType": "FAIL", "ipAddress": "10.0.0.1", "eventTimestamp": -5}}',
)


@dataclass
class Outcome:
    """Alerts of one detector: the crashed job's table against the backtest's."""

    label: str
    expected: int
    found: int  # rows in the alerts table
    unique: int  # distinct alertIds among them
    lost: int
    duplicated: int  # rows beyond the first of their alertId
    unexpected: int
    different: int  # same alertId, different aggregate

    @property
    def ok(self) -> bool:
        return self.lost == self.duplicated == self.unexpected == self.different == 0 and self.found == self.expected

    def line(self) -> str:
        return (
            f"{self.label:<12} alerts expected {self.expected:>5}, found {self.found:>5} "
            f"(distinct {self.unique}); lost {self.lost}, duplicated {self.duplicated}, "
            f"unexpected {self.unexpected}, different aggregate {self.different}"
        )


@dataclass
class Report:
    kills: list[str] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    reconciliation: list[str] = field(default_factory=list)
    reconciled: bool = True
    kafka_lines: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)  # instead of kills: one line per fault (faults.py)

    @property
    def ok(self) -> bool:
        return self.reconciled and all(o.ok for o in self.outcomes)

    def summary(self) -> str:
        if self.faults:
            lines = [f"faults: {len(self.faults)} while the job ran, then a clean stop", *self.faults]
        else:
            lines = [f"crashes: {len(self.kills)} × SIGKILL, then a run to the end", *self.kills]
        lines += [o.line() for o in self.outcomes] + self.reconciliation + self.kafka_lines
        lines.append("RESULT: exactly once, nothing lost" if self.ok else "RESULT: MISMATCH")
        return "\n".join(lines)


@dataclass
class Demo:
    """The work directory of one demo: input, the crashed job's tables and the backtest's."""

    root: str
    count: int = 3_000
    logins_count: int = 800
    per_file: int = 250
    seed: int = 7
    bad_every: int = 97  # one bad record per this many lines
    shards: int = 2
    production: bool = False  # as the bundle runs: catalog tables (Spark's writer), 16 shards, upstream regrouping
    source: str = "files"
    batch_files: int = 1  # a micro-batch holds batch_files × per_file records (--max-records-per-trigger)
    rules_path: str | None = None
    event_schema: str | None = None  # the transactions' schema (DDL file): the rich one generates rich events
    printer: object = print
    kafka_bootstrap: str | None = None
    kafka_options: dict[str, str] = field(default_factory=dict)  # the job's --kafka-option
    foreign_rows: int = 0  # rows another writer appended to `alerts` (FOREIGN ids): found once each, not compared
    rules_table: str | None = None  # rules from this Delta table's change feed instead of the rules file
    rules_args: list[str] = field(default_factory=list)  # the job's other options for its rules (a Debezium topic)
    rule_segments: list = field(default_factory=list)  # cdc_rules.Segment: the backtest applies rule changes there
    kill_after_evaluation: bool = False  # a run is killed only once its evaluation committed a batch it planned
    lines: dict[str, list[str]] = field(default_factory=dict)
    bad: dict[str, int] = field(default_factory=dict)

    @property
    def job_cfg(self) -> JobConfig:
        cfg = JobConfig(
            data_dir=os.path.join(self.root, "job"), shards=self.shards, logins=True, event_schema=self.event_schema
        )
        if self.production:
            cfg = cfg.with_(catalog="spark_catalog", schema=PRODUCTION_SCHEMA, shuffle_partitions=self.shards)
        return cfg

    def path(self, table: str) -> str:
        """Where a table of the job is: its path, or a catalog table's folder in the local catalog's warehouse
        (read by path: the comparing session has its own catalog)."""
        cfg = self.job_cfg
        if not cfg.uses_catalog:
            return cfg.table(table)
        return os.path.join(str(cfg.local_catalog), "warehouse", f"{cfg.schema}.db", table)

    def read(self, spark, table: str):
        return spark.read.format("delta").load(self.path(table))

    @property
    def backtest_cfg(self) -> JobConfig:
        root = os.path.join(self.root, "backtest")
        return JobConfig(data_dir=root, shards=self.shards, event_schema=self.event_schema)

    @property
    def schema(self) -> EventSchema:
        return event_schema.of(self.event_schema)

    def input_dir(self, kind: str) -> str:
        return os.path.join(self.root, "input", kind)

    def landing_dir(self, kind: str) -> str:
        """Where the continuous job reads its files, delivered in parts (faults.py)."""
        return os.path.join(self.root, "landing", kind)

    @property
    def rules(self) -> str:
        return self.rules_path or sample_rules_path(self.schema)

    def say(self, text: str) -> None:
        if self.printer:
            self.printer(text)

    # -- 1. input ----------------------------------------------------------------------------------------------

    def prepare(self) -> Demo:
        shutil.rmtree(self.root, ignore_errors=True)
        rich = is_rich(self.schema)
        kind = RichWorkload if rich else Workload
        txs = kind(count=self.count, seed=self.seed, payees=200, beneficiaries=50, burst_every=250)
        logins = LoginWorkload(count=self.logins_count, seed=self.seed + 1, users=60, attack_every=40)
        bad = (BAD_RICH_TRANSACTIONS if rich else ()) + BAD_TRANSACTIONS  # the rich ones first: a short run has them
        self.lines["transactions"], self.bad["transactions"] = _with_bad(
            map(json.dumps, txs.transactions()), bad, self.bad_every
        )
        self.lines["logins"], self.bad["logins"] = _with_bad(
            map(json.dumps, logins.events()), BAD_LOGINS, self.bad_every
        )
        for kind, lines in self.lines.items():
            _write_files(self.input_dir(kind), lines, self.per_file)
        n, bad = {k: len(v) for k, v in self.lines.items()}, self.bad
        self.say(
            f"input: {n['transactions']} transaction records ({bad['transactions']} bad), "
            f"{n['logins']} login records ({bad['logins']} bad) in {self.root}/input"
        )
        return self

    def use_broker(self, bootstrap: str) -> None:
        """Kafka variant: the job's topics on this broker."""
        from tools.support.kafka_broker import create_topics

        self.kafka_bootstrap = bootstrap
        cfg = self.job_cfg
        create_topics(bootstrap, [cfg.kafka_transactions_topic, cfg.kafka_logins_topic, "rules", "alerts"])

    def produce(self, bootstrap: str) -> None:
        """Kafka variant: the same records, in the same order, into the transactions and logins topics."""
        from tools.support.kafka_broker import produce

        self.use_broker(bootstrap)
        cfg = self.job_cfg
        for kind, topic in (("transactions", cfg.kafka_transactions_topic), ("logins", cfg.kafka_logins_topic)):
            produce(bootstrap, topic, self.lines[kind])
        self.say(f"produced the records into Kafka topics {cfg.kafka_transactions_topic} and {cfg.kafka_logins_topic}")

    # -- 2. crashes ---------------------------------------------------------------------------------------------

    def child_command(self, continuous: bool = False) -> list[str]:
        """The job to the end of its input, or (`continuous`) until it is stopped, on the landing folders."""
        cfg = self.job_cfg
        run = [sys.executable, "-m", "fraudrules.cli", "run", "--no-generator"]
        run += [] if continuous else ["--available-now"]
        options = {
            "--data-dir": cfg.data_dir,
            "--shards": str(cfg.shards),
            "--shuffle-partitions": str(cfg.shuffle_partitions),
            "--max-records-per-trigger": str(self.batch_files * self.per_file),
        }
        options |= {"--rules-table": self.rules_table} if self.rules_table else {"--rules": self.rules}
        if cfg.uses_catalog:
            options |= {"--catalog": str(cfg.catalog), "--schema": str(cfg.schema)}
        if self.event_schema:
            options["--event-schema"] = self.event_schema
        folder = self.landing_dir if continuous else self.input_dir
        if self.source == "kafka":
            options |= {"--source": "kafka", "--kafka-bootstrap": str(self.kafka_bootstrap)}
        else:
            options |= {"--transactions": folder("transactions"), "--logins": folder("logins")}
        kafka_options = [part for kv in self.kafka_options.items() for part in ("--kafka-option", "=".join(kv))]
        return [*run, *(part for option in options.items() for part in option), *kafka_options, *self.rules_args]

    def _batches(self) -> tuple[int, int]:
        """Micro-batches planned (offset log entries) and committed (commit log entries), over all queries."""
        counts = []
        for sub in ("offsets", "commits"):
            counts.append(sum(_log_entries(Path(self.job_cfg.checkpoint(q)) / sub) for q in QUERIES))
        return counts[0], counts[1]

    def _evaluated(self, log: str) -> int:
        """The evaluation's planned (`offsets`) or committed (`commits`) micro-batches."""
        return _log_entries(Path(self.job_cfg.checkpoint(EVALUATE_QUERY)) / log)

    def _sink_commits(self) -> int:
        """Delta commits of the tables the streaming sinks append to (version 0 is the table's creation)."""
        logs = [Path(self.path(t)) / "_delta_log" for t in SINK_TABLES]
        return sum(sum(1 for f in d.glob("*.json") if f.stem.isdigit() and int(f.stem) > 0) for d in logs if d.is_dir())

    def _progress(self, mode: str) -> int:
        return self._sink_commits() if mode == "sink" else self._batches()[0 if mode == "planned" else 1]

    def log_path(self, attempt: int) -> Path:
        return Path(self.root) / "logs" / f"run-{attempt}.log"

    def spawn(self, attempt: int, continuous: bool = False) -> subprocess.Popen:
        """The job in a child process of its own process group, its output in `log_path(attempt)`."""
        logs = Path(self.root) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        if self.production:
            env[UPSTREAM_ENV] = "1"
        with open(self.log_path(attempt), "wb") as out:
            # Own process group: the kill takes the driver, its JVM and the Python workers at once.
            return subprocess.Popen(
                self.child_command(continuous),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    def log_tail(self, attempt: int, lines: int = 40) -> str:
        path = self.log_path(attempt)
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def crash_loop(
        self,
        kills: int = 3,
        rng_seed: int | None = None,
        max_steps: int = 3,
        timeout_s: float = 1800,
        before_run: Callable[[bool], None] | None = None,
    ) -> list[str]:
        """Kill the running job `kills` times at random points, restart it each time, then let it finish;
        `before_run(last)` is called as each run starts.

        Kill points cycle through three moments, each after a random number of new events of its kind and a
        random delay: a micro-batch was just planned (offset log written, nothing done yet); a sink just
        committed to Delta (the batch's commit log entry is most likely still missing, so the restart replays
        a batch whose appends Delta already has); a micro-batch was just committed (the next one is starting).
        """
        rng = random.Random(rng_seed)
        modes = rng.sample(list(KILL_MODES), len(KILL_MODES))
        log: list[str] = []
        deadline = time.monotonic() + timeout_s
        for attempt in range(kills + 1):
            started = time.monotonic()
            mode = modes[attempt % len(modes)]
            before = self._progress(mode)
            new_batch = self._evaluated("offsets") + 1  # committed past what the run found planned: one it planned
            if before_run is not None:
                before_run(attempt == kills)
            child = self.spawn(attempt)
            try:
                if attempt < kills:
                    target = before + rng.randint(1, max_steps)
                    while (
                        child.poll() is None
                        and (
                            self._progress(mode) < target
                            or (self.kill_after_evaluation and self._evaluated("commits") < new_batch)
                        )
                        and time.monotonic() < deadline
                    ):
                        time.sleep(0.02)
                    time.sleep(rng.uniform(0, 0.3 if mode == "sink" else 1.5))
                    if child.poll() is None:
                        planned, committed = self._batches()
                        kill_group(child)
                        line = (
                            f"  kill {attempt + 1}: SIGKILL {time.monotonic() - started:.1f} s into run "
                            f"{attempt + 1}, {KILL_MODES[mode]}; micro-batches so far: {planned} planned, "
                            f"{committed} committed ({planned - committed} to replay)"
                        )
                        log.append(line)
                        self.say(line)
                        continue
                    self.say(f"  run {attempt + 1} finished before its kill point")
                code = child.wait(timeout=max(1.0, deadline - time.monotonic()))
            finally:
                if child.poll() is None:
                    kill_group(child)
            if code != 0:
                raise RuntimeError(f"job run {attempt + 1} exited with {code}:\n{self.log_tail(attempt)}")
            planned, committed = self._batches()
            self.say(
                f"  run {attempt + 1} (not killed): finished in {time.monotonic() - started:.1f} s; "
                f"micro-batches in all: {planned} planned, {committed} committed"
            )
            break
        return log

    # -- 3. comparison ------------------------------------------------------------------------------------------

    def compare(self, spark, report: Report) -> Report:
        from pyspark.sql import functions as F

        from fraudrules import backtest, tables
        from fraudrules.rules.model import load_rules_file

        bt_cfg = self.backtest_cfg
        shutil.rmtree(bt_cfg.data_dir, ignore_errors=True)
        if self.rule_segments:
            self._backtest_in_segments(spark, bt_cfg)
        else:
            self.say("backtest of the same input with the same rules ...")
            backtest.run(
                spark,
                bt_cfg,
                self.input_dir("transactions"),
                load_rules_file(self.rules, self.schema),
                logins=self.input_dir("logins"),
            )
        rows = self.read(spark, "alerts").collect()
        got = [(r.alertId, r.kind, r.aggregate) for r in rows if not r.alertId.startswith(FOREIGN)]
        if self.foreign_rows:
            report.reconciliation.append(self._foreign_line(Counter(r.alertId for r in rows), report))
        want = [(r.alertId, r.kind, r.aggregate) for r in tables.read(spark, bt_cfg, "alerts").collect()]
        for label, is_login in (("transactions", False), ("logins", True)):
            mine = [a for a in got if (a[1] == LOGIN_RULE) == is_login]
            ref = {a[0]: a[2] for a in want if (a[1] == LOGIN_RULE) == is_login}
            counts = Counter(a[0] for a in mine)
            aggs = {a[0]: a[2] for a in mine}
            report.outcomes.append(
                Outcome(
                    label=label,
                    expected=len(ref),
                    found=len(mine),
                    unique=len(counts),
                    lost=len(set(ref) - set(counts)),
                    duplicated=sum(n - 1 for n in counts.values()),
                    unexpected=len(set(counts) - set(ref)),
                    different=sum(1 for k, v in ref.items() if k in aggs and aggs[k] != v),
                )
            )

        quarantine = self.read(spark, "quarantine")
        late = self.read(spark, "late_events")
        for kind, bronze_name, qkind, id_col in (
            ("transactions", "transactions", "transaction", "transactionId"),
            ("logins", "logins", "login", "userId"),
        ):
            records = len(self.lines[kind])
            bad_in = self.bad[kind]
            bronze = self.read(spark, bronze_name)
            q = quarantine.where(F.col("kind") == qkind)
            valid, quarantined = bronze.count(), q.count()
            twice = (valid - bronze.select("srcName", "srcPos").distinct().count()) + (
                quarantined - q.select("srcName", "srcPos").distinct().count()
            )
            time_col = "eventTime" if kind == "transactions" else "eventTimestamp"
            late_keys = (
                late.where(F.col("kind") == qkind)
                .select(F.col(id_col).alias("id"), F.col("eventTimeMs").alias("t"))
                .distinct()
            )
            n_late = late_keys.count()
            evaluated = (
                bronze.select(F.col(id_col).alias("id"), F.col(time_col).alias("t"))
                .join(late_keys, ["id", "t"], "left_anti")
                .count()
            )
            ok = records == valid + quarantined and quarantined == bad_in and twice == 0 and valid == evaluated + n_late
            report.reconciled &= ok
            report.reconciliation.append(
                f"{kind:<12} input {records} = {valid} valid + {quarantined} quarantined "
                f"(bad records written: {bad_in}); records stored twice: {twice}; "
                f"valid {valid} = {evaluated} evaluated + {n_late} late{'' if ok else '  <-- MISMATCH'}"
            )
        keyed = self._keyed_counts(spark)
        report.reconciled &= not any("MISMATCH" in line for line in keyed)
        report.reconciliation += keyed
        reasons = Counter(r.reason for r in quarantine.collect())
        report.reconciliation.append(
            "quarantine reasons: " + "; ".join(f"{n}× {r}" for r, n in sorted(reasons.items()))
        )
        if self.source == "kafka" and self.kafka_bootstrap:
            report.kafka_lines = self._kafka_alerts(got)
        return report

    def _backtest_in_segments(self, spark, bt_cfg: JobConfig) -> None:
        """The backtest fed the input segment by segment (`rule_segments`), each segment's rule changes applied
        before its records, as the job applied them; its checkpoints and state carry over between segments."""
        from fraudrules import backtest
        from fraudrules.rules.codec import from_row

        self.say(
            f"backtest of the same input, the job's rule changes applied at the same {len(self.rule_segments)} "
            "positions ..."
        )
        folders = {kind: os.path.join(bt_cfg.data_dir, "input", kind) for kind in self.lines}
        ends = self.rule_segments[1:]
        base = time.time() - 3600
        for k, segment in enumerate(self.rule_segments):
            for kind, start in (("transactions", segment.transactions), ("logins", segment.logins)):
                end = getattr(ends[k], kind) if k < len(ends) else len(self.lines[kind])
                _write_part(folders[kind], k, self.lines[kind][start:end], base + k)
            changes = [from_row(r, self.schema) for r in segment.changes]
            backtest.run(spark, bt_cfg, folders["transactions"], changes, logins=folders["logins"])

    def _foreign_line(self, ids: Counter, report: Report) -> str:
        """The other writer's rows in `alerts`: each one there once."""
        foreign = {k: n for k, n in ids.items() if k.startswith(FOREIGN)}
        ok = len(foreign) == sum(foreign.values()) == self.foreign_rows
        report.reconciled &= ok
        return (
            f"the other writer's rows in alerts: {self.foreign_rows} appended, {sum(foreign.values())} found "
            f"({len(foreign)} distinct){'' if ok else '  <-- MISMATCH'}"
        )

    def _keyed_counts(self, spark) -> list[str]:
        """The evaluation query's own count (batches.inputRows: keyed events evaluated) against valid × rules.

        Every valid transaction is keyed once per ACTIVE window rule (when no rule has a filter), and each
        keyed event is either evaluated or late.
        """
        from pyspark.sql import functions as F

        if self.rule_segments:  # the rules changed on the way: no one count of rules to multiply by
            return []
        rules = self.read(spark, "rules").where("ruleState = 'ACTIVE' AND coalesce(ruleType, 'WINDOW') = 'WINDOW'")
        if rules.where(F.size(F.coalesce("filter", F.array())) > 0).count():
            return []
        n_rules, valid = rules.count(), self.read(spark, "transactions").count()
        batches = self.read(spark, "batches").where(F.col("query") == EVALUATE_QUERY)
        counted = batches.agg(F.coalesce(F.sum("inputRows"), F.lit(0))).first()[0]
        late = self.read(spark, "late_events").where("kind = 'transaction'").count()
        ok = counted + late == valid * n_rules
        self_ok = batches.select("batchId").distinct().count() == batches.count()
        return [
            f"evaluation query's own count: {counted} keyed events evaluated + {late} late = {valid} valid × "
            f"{n_rules} window rules{'' if ok and self_ok else '  <-- MISMATCH'}"
        ]

    def _kafka_alerts(self, delta_alerts: list[tuple]) -> list[str]:
        from tools.support.kafka_broker import consume_all

        keys = Counter(m.key().decode() for m in consume_all(self.kafka_bootstrap, "alerts"))
        missing = len({a[0] for a in delta_alerts} - set(keys))
        return [
            f"Kafka alerts topic (at-least-once): {sum(keys.values())} messages, {len(keys)} distinct alertIds, "
            f"{sum(keys.values()) - len(keys)} re-published by replays, {missing} missing"
        ]


def _with_bad(good, bad: tuple[str, ...], every: int) -> tuple[list[str], int]:
    """The good lines with one bad record (cycling through the classes) inserted every `every` lines."""
    out: list[str] = []
    k = 0
    for i, line in enumerate(good):
        if every and i % every == every // 2:
            out.append(bad[k % len(bad)].format(i=900_000_000 + k))
            k += 1
        out.append(line)
    return out, k


def _write_files(folder: str, lines: list[str], per_file: int) -> None:
    """Numbered JSON-lines files with increasing modification times (the file source's order)."""
    base = time.time() - 3600
    for index in range(0, len(lines), per_file):
        _write_part(folder, index // per_file, lines[index : index + per_file], base + index // per_file)


def _write_part(folder: str, index: int, lines: list[str], mtime: float) -> None:
    """One more file of a folder the file source reads in modification-time order (none for no lines)."""
    os.makedirs(folder, exist_ok=True)
    if not lines:
        return
    path = os.path.join(folder, f"part-{index:05d}.json")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("".join(x + "\n" for x in lines))
    os.utime(path, (mtime, mtime))


def _log_entries(folder: Path) -> int:
    """The numbered entries of a checkpoint's offset or commit log. A folder can vanish while it is counted: a
    starting job clears the logs of a query that never planned a batch (`job.discard_unstarted`)."""
    try:
        return len(spark_checkpoint.logged_batches(*open_fs(str(folder.parent)), folder.name))
    except FileNotFoundError:
        return 0


def kill_group(child: subprocess.Popen) -> None:
    """SIGKILL the child's process group and wait until none of its processes is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    for _ in range(200):
        try:
            os.killpg(child.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise RuntimeError(f"processes of group {child.pid} still alive after SIGKILL")
