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

With Kafka, the alerts are also published to the alerts topic; it is at-least-once (a batch replayed
after a crash publishes again), so the demo reports its duplicate messages next to the missing keys.
"""

from __future__ import annotations

import argparse
import os
import sys

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
    try:
        if source == "kafka":
            from tools.support.kafka_broker import start_local_broker

            broker = start_local_broker(os.path.join(root, "kafka"))
            if faults:  # the input arrives in parts, with the faults
                demo.use_broker(broker.bootstrap)
                demo.kafka_options = CLIENT_TIMEOUTS
            else:
                demo.produce(broker.bootstrap)
        if faults:
            injected = FAULTS if broker is not None else tuple(f for f in FAULTS if f != "broker")
            if broker is None:
                demo.say("faults: no broker to stop with files as the source (--source kafka adds it)")
            report = Report(faults=Faults(demo, broker, outage_s).run(injected))
        else:
            report = Report(kills=demo.crash_loop(kills, rng_seed=seed))
        spark = get_spark("fraudrules-crash-demo")
        try:
            demo.compare(spark, report)
        finally:
            spark.stop()
    finally:
        if broker is not None:
            broker.stop()
    print(report.summary())
    return 0 if report.ok else 1


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
    a = p.parse_args(argv)
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
    )


if __name__ == "__main__":
    sys.exit(cli())
