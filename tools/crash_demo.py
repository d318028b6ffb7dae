"""`make crash-demo`: exactly-once across crashes, shown by killing the job with SIGKILL, or with `--faults` across
outages (the harness is `tools/support/crash_demo.py`, and `tools/support/faults.py` for the outages).

1. A workload (transactions with injected bursts, logins with injected attacks, and a sprinkling of bad
   records of every class) is written into files, or produced into Kafka topics (`source="kafka"`).
2. The job runs in a child process (`fraudrules run --no-generator --available-now ...`) in bounded
   micro-batches; with `--production`, as the bundle runs it: catalog tables written by Spark's Delta writer
   (`saveAsTable`, in a local catalog), 16 shards and state partitions, PySpark's own input regrouping. It is
   killed with SIGKILL, together with its JVM and Python workers (the whole process group: a real crash, no
   shutdown hook runs), at random points — just after a micro-batch was planned, just after a sink's Delta
   commit, just after a micro-batch was committed — and restarted on the same checkpoints each time. After the
   last kill it runs to the end.
3. The same input is backtested with the same rules in a fresh directory, and the two `alerts` tables
   are compared per alertId: expected vs found, lost, duplicated, unexpected, different aggregate; the
   bronze and quarantine tables are reconciled with the input (input = valid + quarantined, no record
   twice; valid = evaluated + late; the evaluation query's own count of keyed events matches).

With `--faults`, instead of the kills, the job runs continuously (`fraudrules run --no-generator`) and its input
arrives in parts, one before the faults and one with each: the Kafka broker stopped for `--outage-s` and started
again (with `--source kafka`; the job's Kafka client timeouts are shortened to 5 s so that the outage fails its
queries), the `alerts` table's storage unwritable for as long (`chattr +i` on its `_delta_log`), and another
process appending rows to `alerts` and compacting it. One line per fault says what the job did (rode it out, or
failed and restarted itself), then the tables are compared as after the kills (the other writer's rows apart).

With `--rules-from cdc`, an admin edits a rule with SQL while the job is killed and restarted (inserted, its limit
updated, disabled, deleted, one as each run starts): in a Delta rules table the job follows through its change
feed, or, with `--source kafka`, in a real PostgreSQL whose changes a real Debezium publishes to the rules topic
(`tools/support/cdc_rules.py`). The backtest applies the same changes at the positions where the job applied them
(its evaluation's offset log), and each edit must be in `rule_history` once.

With Kafka, the alerts are also published to the alerts topic; it is at-least-once (a batch replayed
after a crash publishes again), so the demo reports its duplicate messages next to the missing keys.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from fraudrules.config import EVALUATE_QUERY
from tools.rules_db import RULE_ID, STEPS, delta_steps
from tools.support import cdc_rules
from tools.support.crash_demo import PRODUCTION_SHARDS, Demo, Report
from tools.support.faults import CLIENT_TIMEOUTS, FAULTS, Faults


def main(
    root: str,
    kills: int = 3,
    count: int = 2_000,
    logins_count: int = 600,
    per_file: int = 250,
    seed: int = 7,
    source: str = "files",
    shards: int = 2,
    rules: str | None = None,
    event_schema: str | None = None,
    production: bool = False,
    faults: bool = False,
    outage_s: float = 30.0,
    rules_from: str = "file",
) -> int:
    from fraudrules.session import get_spark

    demo = Demo(
        event_schema=event_schema,
        root=root,
        count=count,
        logins_count=logins_count,
        per_file=per_file,
        seed=seed,
        source=source,
        shards=PRODUCTION_SHARDS if production else shards,
        rules_path=rules,
        production=production,
    ).prepare()
    cfg = demo.job_cfg
    demo.say(
        f"the job: {cfg.shards} shards, {cfg.shuffle_partitions} state partitions, "
        + (f"catalog tables {cfg.catalog}.{cfg.schema} (Spark's Delta writer)" if cfg.uses_catalog else "path tables")
        + (", PySpark's own input regrouping" if production else "")
    )
    broker = None
    services = ExitStack()
    try:
        if source == "kafka":
            from tools.support.kafka_broker import start_local_broker

            broker = start_local_broker(os.path.join(root, "kafka"))
            if faults:  # the input arrives in parts, with the faults
                demo.use_broker(broker.bootstrap)
                demo.kafka_options = CLIENT_TIMEOUTS
            else:
                demo.produce(broker.bootstrap)
        edits = None
        if rules_from == "cdc":
            edits = _admin_edits(demo, services, broker)
        if faults:
            injected = FAULTS if broker is not None else tuple(f for f in FAULTS if f != "broker")
            if broker is None:
                demo.say("faults: no broker to stop with files as the source (--source kafka adds it)")
            report = Report(faults=Faults(demo, broker, outage_s).run(injected))
        else:
            report = Report(kills=demo.crash_loop(kills, rng_seed=seed, before_run=edits and edits.before_run))
        spark = get_spark("fraudrules-crash-demo")
        try:
            if edits is not None:
                _where_rules_changed(spark, demo, edits.done, report)
            demo.compare(spark, report)
        finally:
            spark.stop()
    finally:
        services.close()
        if broker is not None:
            broker.stop()
    print(report.summary())
    return 0 if report.ok else 1


def _where_rules_changed(spark, demo: Demo, edits: int, report: Report) -> None:
    """Where the job applied rule changes (for the backtest), and whether it applied each edit once."""
    history = demo.path("rule_history")
    demo.rule_segments = cdc_rules.segments(spark, demo.job_cfg.checkpoint(EVALUATE_QUERY), history, demo.per_file)
    line, ok = cdc_rules.applied_once(spark, demo.path, RULE_ID, edits, demo.rule_segments)
    report.reconciliation.append(line)
    report.reconciled &= ok


def _admin_edits(demo: Demo, services: ExitStack, broker) -> cdc_rules.AdminEdits:
    """The admin's SQL edits: on a Delta rules table (created with the demo's rules), or with a broker on
    PostgreSQL through Debezium (the demo's rules loaded from its file); the job told where its rules come from."""
    if broker is None:
        from fraudrules.rules import table as rules_table
        from fraudrules.rules.model import load_rules_file
        from fraudrules.session import get_spark

        admin = get_spark("fraudrules-crash-demo-admin")
        services.callback(admin.stop)
        demo.rules_table = os.path.abspath(os.path.join(demo.root, "admin", "rules"))
        rules_table.create(admin, demo.rules_table, load_rules_file(demo.rules, demo.schema))
        demo.say(f"rules: SQL edits of the Delta table {demo.rules_table}, followed through its change feed")
        steps, execute = delta_steps(demo.rules_table), lambda sql, _: admin.sql(sql)
    else:
        from tools.support.kafka_broker import create_topics, end_offsets
        from tools.support.rules_db import (
            RULES_COLUMNS,
            RULES_TABLE,
            LocalDebezium,
            LocalPostgres,
            resolve_debezium_jars,
        )

        work = Path(demo.root) / "cdc"
        pg = services.enter_context(LocalPostgres(work / "postgres"))
        pg.execute(RULES_TABLE)
        debezium = LocalDebezium(resolve_debezium_jars(), work / "debezium", pg, broker.bootstrap, schemas=False)
        create_topics(broker.bootstrap, [debezium.topic])
        services.enter_context(debezium)
        columns = [part for kv in RULES_COLUMNS.items() for part in ("--rules-column", "=".join(kv))]
        demo.rules_args = ["--rules-format", "debezium", "--rules-topic", debezium.topic, *columns]
        demo.say(f"rules: SQL edits in PostgreSQL on 127.0.0.1:{pg.port}, Debezium → {debezium.topic}")

        def execute(sql: str, params: object) -> None:
            """The statement, once its change event is on the topic (the next run's queries read the topic as it
            is at their start)."""
            before = sum(end_offsets(broker.bootstrap, debezium.topic).values())
            pg.execute(sql, params)
            deadline = time.monotonic() + 60
            while sum(end_offsets(broker.bootstrap, debezium.topic).values()) == before:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no change event on {debezium.topic} 60 s after: {sql}")
                time.sleep(0.1)

        steps = STEPS
    demo.kill_after_evaluation = True  # each version evaluates events before the next kill
    return cdc_rules.AdminEdits(steps, execute, demo.say)


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.crash_demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default="data/crash-demo", help="wiped first")
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--count", type=int, default=2_000, help="transactions")
    p.add_argument("--logins-count", type=int, default=600)
    p.add_argument("--per-file", type=int, default=250, help="records per file (= per micro-batch)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--source", choices=["files", "kafka"], default="files")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--rules", help="rules file (default: the sample rules, incl. the login detector)")
    p.add_argument("--event-schema", help="transactions' schema (DDL file; the rich one: rich events and rules)")
    p.add_argument(
        "--production",
        action="store_true",
        help=f"as the bundle runs: catalog tables through Spark's Delta writer (a local catalog), {PRODUCTION_SHARDS} "
        "shards and state partitions, PySpark's own input regrouping",
    )
    p.add_argument(
        "--faults",
        action="store_true",
        help="instead of the kills, outages while the job runs: the broker stopped (--source kafka), the alerts "
        "table's storage unwritable, another process writing to alerts",
    )
    p.add_argument(
        "--outage-s", type=float, default=30.0, help="with --faults: how long the broker and storage are out"
    )
    p.add_argument(
        "--rules-from",
        choices=["file", "cdc"],
        default="file",
        help="cdc: an admin edits a rule with SQL while the job is killed: in a Delta table (its change feed), or with "
        "--source kafka in PostgreSQL (through Debezium)",
    )
    a = p.parse_args(argv)
    if a.rules_from == "cdc" and a.faults:
        p.error("--rules-from cdc goes with the kills, not --faults")
    return main(
        a.data_dir,
        a.kills,
        a.count,
        a.logins_count,
        a.per_file,
        a.seed,
        a.source,
        a.shards,
        a.rules,
        a.event_schema,
        a.production,
        a.faults,
        a.outage_s,
        a.rules_from,
    )


if __name__ == "__main__":
    sys.exit(cli())
