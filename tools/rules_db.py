"""`make rules-db`: rules edited with SQL in PostgreSQL reach the running job through Debezium and Kafka; with
`--from delta`, rules edited with SQL in a Delta table reach it through the table's change feed.

PostgreSQL (tools/support/rules_db.py), a local broker, Debezium's PostgreSQL connector and the job (transactions
from its demo generator, rule changes from the connector's topic, `rules_format="debezium"`) are started; a rule is
inserted, its limit updated, then it is disabled and deleted, each with SQL. Prints per rule version its alerts and
the delays from the SQL commit to its change event on the topic, to the job's rule_history (applied) and to the first
event evaluated under it (rule_applied). With `--from delta` the same four changes are Spark SQL statements on a
rules table (`rules init-table`'s columns) that the job reads with `rules_table`. Ctrl-C stops everything it
started.

    python -m tools.rules_db run --work-dir DIR [--from postgres|delta] [--rate N] [--step-seconds S] [--profile]
    python -m tools.rules_db jars       # resolve Debezium's jars once (`make debezium-jars`)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from pyspark.sql.streaming import StreamingQueryListener

from fraudrules import tables
from fraudrules.config import RULES_QUERY, JobConfig
from fraudrules.generator import RateWriter, Workload
from fraudrules.rules.text import iso_time
from tools.support.kafka_broker import TopicTail, create_topics, start_local_broker
from tools.support.rules_db import (
    INSERT_RULE,
    RULES_COLUMNS,
    RULES_TABLE,
    LocalDebezium,
    LocalPostgres,
    resolve_debezium_jars,
)

RULE_ID = 42
STEPS = [
    (
        "INSERT rule 42: SUM(paymentAmount) by payee over 1 min > 300",
        INSERT_RULE,
        (RULE_ID, ["payeeId"], "paymentAmount", "SUM", "GREATER", 300, 1, "rules-db demo"),
    ),
    ("UPDATE its limit to 600", f"UPDATE fraud_rules SET limit_amount = 600 WHERE id = {RULE_ID}", None),
    ("UPDATE disabled = true", f"UPDATE fraud_rules SET disabled = true WHERE id = {RULE_ID}", None),
    ("DELETE it", f"DELETE FROM fraud_rules WHERE id = {RULE_ID}", None),
]


def _rows(spark, cfg: JobConfig, table: str) -> list[dict]:
    """The demo rule's rows of a table (read without Spark), by version."""
    rows = (r for r in tables.writer(spark, cfg).arrow(table).to_pylist() if r["ruleId"] == RULE_ID)
    return sorted(rows, key=lambda r: r["version"])


def _wait_for_version(spark, cfg: JobConfig, version: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while version not in {r["version"] for r in _rows(spark, cfg, "rule_history")} and time.monotonic() < deadline:
        time.sleep(0.1)


def _report(spark, cfg: JobConfig, committed: dict[int, float], published: list[float]) -> None:
    """Per version of the rule: state, limit, alerts, and the delays from its commit to its change event on the topic
    (`published`: when each event reached a reader), to rule_history and to the first event evaluated under it."""
    alerts = tables.read(spark, cfg, "alerts").where(f"ruleId = {RULE_ID}").groupBy("ruleVersion").count()
    counts = {r.ruleVersion: r["count"] for r in alerts.collect()}
    applied = {r["version"]: r for r in _rows(spark, cfg, "rule_applied")}

    def since_commit(version: int, at: float | None) -> str:
        return f"{at - committed[version]:.2f} s" if at and version in committed else "-"

    print(f"\n{'version':>7} {'state':<7} {'limit':>7} {'alerts':>7}   delay from the SQL commit to:")
    print(f"{'':>31} {'the topic':>10} {'rule_history':>13} {'first evaluated':>16}")
    for r in _rows(spark, cfg, "rule_history"):
        v = r["version"]
        first = applied.get(v, {}).get("firstEvaluatedAt")
        on_topic = published[v - 1] if v <= len(published) else None
        limit = json.loads(r["ruleJson"]).get("limit", "")
        print(
            f"{v:>7} {r['ruleState']:<7} {limit:>7} {counts.get(v, 0):>7} {since_commit(v, on_topic):>10} "
            f"{since_commit(v, r['updatedAt'].timestamp()):>13} {since_commit(v, first and first.timestamp()):>16}"
        )


class BatchProfile(StreamingQueryListener):
    """`--profile`: every micro-batch that read rule changes (the rules query's, and the evaluation's that read new
    `rule_history` rows) with when it began and Spark's durations of its steps: where a change's delay goes."""

    def onQueryProgress(self, event) -> None:
        p = event.progress
        rows = sum(s.numInputRows for s in p.sources if p.name == RULES_QUERY or "rule_history" in s.description)
        if rows:
            steps = ", ".join(f"{k} {v}" for k, v in p.durationMs.items() if k != "triggerExecution")
            began = p.timestamp[11:23]
            print(f"  [profile] {p.name} batch {p.batchId} began {began}: {rows} rule rows, {steps} ms", flush=True)

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass


def delta_steps(table: str) -> list[tuple[str, str, None]]:
    """STEPS as Spark SQL on a rules table made by `rules init-table` (a path)."""
    name = f"delta.`{table}`"
    return [
        (
            STEPS[0][0],
            f"INSERT INTO {name} (ruleId, groupingKeyNames, aggregateFieldName, aggregatorFunctionType, "
            f"limitOperatorType, `limit`, windowMinutes, description) VALUES ({RULE_ID}, array('payeeId'), "
            "'paymentAmount', 'SUM', 'GREATER', 300, 1, 'rules-db demo')",
            None,
        ),
        (STEPS[1][0], f"UPDATE {name} SET `limit` = 600 WHERE ruleId = {RULE_ID}", None),
        (STEPS[2][0], f"UPDATE {name} SET disabled = true WHERE ruleId = {RULE_ID}", None),
        (STEPS[3][0], f"DELETE FROM {name} WHERE ruleId = {RULE_ID}", None),
    ]


def _change_rules(
    spark, cfg: JobConfig, execute: Callable[[str, object], object], steps: list, step_seconds: float
) -> dict[int, float]:
    """The SQL steps, `step_seconds` apart (each once the job applied the one before); when each commit returned."""
    committed: dict[int, float] = {}
    time.sleep(step_seconds)
    for version, (what, sql, params) in enumerate(steps, start=1):
        execute(sql, params)
        committed[version] = time.time()
        print(f"--> {what} (committed at {iso_time(committed[version] * 1000)[11:23]})", flush=True)
        _wait_for_version(spark, cfg, version, timeout_s=60)
        time.sleep(max(0.0, committed[version] + step_seconds - time.time()))
    return committed


def run(work_dir: Path, rate: float, step_seconds: float, source: str = "postgres", profile: bool = False) -> int:
    from fraudrules.session import get_spark

    shutil.rmtree(work_dir, ignore_errors=True)
    try:
        with ExitStack() as services:  # each stopped, in reverse order, however the demo ends
            published: list[float] = []  # when each change event (tombstones aside) reached a reader of the topic
            if source == "delta":
                cfg = JobConfig(data_dir=str(work_dir / "data"), rules_table=str((work_dir / "rules_admin").resolve()))
                print(f"rules table {cfg.rules_table} (change data feed on)", flush=True)
            else:
                cfg, execute = _postgres(services, work_dir, published)
            spark = get_spark("fraudrules-rules-db")
            services.callback(spark.stop)
            if profile:
                spark.streams.addListener(BatchProfile())
            steps = STEPS
            if source == "delta":
                from fraudrules.rules import table as rules_table

                rules_table.create(spark, str(cfg.rules_table), [])
                steps, execute = delta_steps(str(cfg.rules_table)), lambda sql, _: spark.sql(sql)
            committed = _demo(spark, cfg, rate, step_seconds, steps, execute)
            _report(spark, cfg, committed, published)
    except KeyboardInterrupt:
        print("interrupted: everything it started is stopped", flush=True)
        return 130
    return 0


def _postgres(services: ExitStack, work_dir: Path, published: list[float]) -> tuple[JobConfig, Callable]:
    """PostgreSQL with the rules table, the broker and Debezium started (stopped with `services`); the job's config
    and what runs a statement."""
    kafka = start_local_broker(str(work_dir / "kafka"))
    services.callback(kafka.stop)
    pg = services.enter_context(LocalPostgres(work_dir / "postgres"))
    pg.execute(RULES_TABLE)
    debezium = LocalDebezium(resolve_debezium_jars(), work_dir / "debezium", pg, kafka.bootstrap, schemas=False)
    create_topics(kafka.bootstrap, [debezium.topic])
    services.enter_context(debezium)
    tail = TopicTail(kafka.bootstrap, debezium.topic, lambda m, ms: m.value() and published.append(ms / 1000))
    tail.start()
    services.callback(tail.stop)
    print(f"PostgreSQL on 127.0.0.1:{pg.port}, Debezium → {debezium.topic} on {kafka.bootstrap}", flush=True)
    cfg = JobConfig(
        data_dir=str(work_dir / "data"),
        kafka_bootstrap=kafka.bootstrap,
        kafka_rules_topic=debezium.topic,
        rules_format="debezium",
        rules_columns=RULES_COLUMNS,
    )
    return cfg, pg.execute


def _demo(spark, cfg: JobConfig, rate: float, step_seconds: float, steps: list, execute) -> dict[int, float]:
    """The job and its transactions, running while the steps change the rule; stopped (results committed) before
    the report. When each step's commit returned."""
    from fraudrules.engine import job

    with ExitStack() as running:
        quiet = job.start(spark, cfg, printer=lambda line: line.startswith("[rules]") and print(line, flush=True))
        running.callback(quiet.stop)
        events = Workload(count=10**9, payees=20, seed=5).transactions()
        writer = RateWriter(cfg.landing, events, rate, realtime=True)
        writer.start()
        running.callback(writer.stop)
        return _change_rules(spark, cfg, execute, steps, step_seconds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.rules_db", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    demo = sub.add_parser("run", help="the demo (its work dir is wiped first)")
    demo.add_argument("--work-dir", type=Path, default=Path("data/rules-db"))
    demo.add_argument(
        "--from",
        dest="source",
        choices=("postgres", "delta"),
        default="postgres",
        help="where the rule is edited: PostgreSQL through Debezium, or a Delta table through its change feed",
    )
    demo.add_argument("--rate", type=float, default=100.0, help="generated transactions per second")
    demo.add_argument("--step-seconds", type=float, default=12.0, help="time between the SQL changes")
    demo.add_argument(
        "--profile", action="store_true", help="print each micro-batch that read rule changes, its steps' durations"
    )
    sub.add_parser("jars", help="resolve Debezium's jars (once) and print where they are")
    args = p.parse_args(argv)
    if args.cmd == "jars":
        print("Debezium jars in", resolve_debezium_jars())
        return 0
    return run(args.work_dir, args.rate, args.step_seconds, args.source, args.profile)


if __name__ == "__main__":
    sys.exit(main())
