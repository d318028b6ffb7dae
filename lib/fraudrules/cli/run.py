"""`fraudrules run`: the continuous job."""

from __future__ import annotations

import argparse
import os
import sys
import time

from fraudrules import logs
from fraudrules.cli.common import (
    EVENT_SCHEMA_HELP,
    UsageError,
    add_memory_bounds,
    add_rules_table_arguments,
    check,
    died,
    jars_missing,
    job_config,
    key_value,
    non_negative_float,
    non_negative_int,
    positive_float,
    read_rules,
    schema_problem,
    spark_session,
)
from fraudrules.config import MAX_RESTARTS, RULES_FORMATS, JobConfig, on_databricks, parse_options
from fraudrules.paths import input_problem, is_remote

PRODUCTION_RUN = "fraudrules run --no-generator --catalog C --schema S --checkpoint-root DIR [--kafka-bootstrap ...]"


def cmd_run(args: argparse.Namespace) -> int:
    sources = {"--transactions": args.transactions_source, "--logins": args.logins_source}
    check(
        schema_problem(args.event_schema),
        *(input_problem(path, flag, must_have_files=False) for flag, path in sources.items() if path),
    )
    from fraudrules import event_schema

    if args.rules:  # against the schema the job will start with
        read_rules(args.rules, "--rules", event_schema.for_job(job_config(args)))
    from fraudrules.compat import spark_jvm
    from fraudrules.engine import progress, run
    from fraudrules.event_schema import SchemaError
    from fraudrules.generator import demo_writers, sample_rules_path
    from fraudrules.ops import health
    from fraudrules.rules.model import RuleError
    from fraudrules.session import kafka_secret_options

    secrets = kafka_secret_options(args.kafka_secret_scope) if args.kafka_bootstrap else {}
    cfg = job_config(args, logins=True, kafka_options={**parse_options(args.kafka_option), **secrets})
    check(jars_missing())
    if not on_databricks() and not is_remote(cfg.data_dir):  # `status` knows the job by this, whoever started it
        other = health.process(cfg.data_dir)
        if other["alive"] and other["pid"] != os.getpid():
            raise UsageError(f"a job already runs on {os.path.abspath(cfg.data_dir)}: process {other['pid']}")
        health.register(cfg.data_dir, sys.argv)
    generate = args.rate > 0 and not args.no_generator
    started = time.monotonic()
    with progress.ticker(print, "starting Spark (local JVM and Delta)"):
        spark = spark_session(cfg=cfg, fixed_heap=True)
    print(f"Spark {spark.version} ready in {time.monotonic() - started:.1f} s")
    if not on_databricks():  # a cluster's driver log keeps them; its JVM is not ours to keep from signals
        logs.quiet_query_failures(spark)
        spark_jvm.ignore_sigterm(spark)  # a SIGTERM to the process group is the driver's to handle (run.Stop)
    stop = run.Stop()
    stop.starting = "the tables are ready"
    where = f"{cfg.catalog}.{cfg.schema}" if cfg.uses_catalog else f"{os.path.abspath(cfg.data_dir)}/tables"
    try:
        with progress.ticker(print, f"preparing tables in {where}"):
            run.prepare(spark, cfg, args.rules or (sample_rules_path(event_schema.for_job(cfg)) if generate else None))
    except (SchemaError, RuleError) as err:  # the schema does not fit the job's rules, or the rules file the schema
        spark.stop()
        raise UsageError(str(err)) from None
    if stop.requested.is_set():
        spark.stop()
        health.mark_stopped(cfg.data_dir)  # `status`: stopped, not dead
        print("stopped before the queries started")
        return 0
    writers = demo_writers(cfg, args.rate, event_schema.for_job(cfg)) if generate else []
    if writers:
        into = (
            f"topics {cfg.kafka_transactions_topic}, {cfg.kafka_logins_topic}"
            if cfg.source == "kafka"
            else f"{cfg.landing} and {cfg.logins_landing}"
        )
        print(f"generating {args.rate:g} transactions/s (bursts of large payments) and logins into {into}")
    print("starting the queries; Ctrl-C stops")
    failed = run.run(spark, cfg, writers, args.seconds, stop=stop, restarts=run.Restarts(per_hour=args.max_restarts))
    if not on_databricks():
        spark.stop()
    if failed:
        print(f"the job failed: {died(failed) or progress.error_line(failed)}", file=sys.stderr)
        return 1
    health.mark_stopped(cfg.data_dir)
    print("stopped cleanly; run again to resume from the checkpoints")
    return 0


def add_run(sub, parents: list[argparse.ArgumentParser]) -> None:
    run = sub.add_parser(
        "run",
        parents=parents,
        help="run the continuous job (all queries, logins included)",
        description=f"The continuous job. On a cluster: {PRODUCTION_RUN}. Locally, by default, with the "
        "embedded demo generator and the sample rules.",
    )
    run.add_argument("--no-generator", action="store_true", help="no embedded generator (production)")
    run.add_argument(
        "--rate", type=non_negative_float, default=200.0, help="generated transactions per second (0: none)"
    )
    run.add_argument("--rules", help="rules file loaded into an empty rules table (default with the generator: demo)")
    run.add_argument("--event-schema", metavar="FILE", help=EVENT_SCHEMA_HELP)
    run.add_argument(
        "--trigger-seconds", type=positive_float, default=0.1, help="a stateful micro-batch at most this often"
    )
    run.add_argument("--seconds", type=non_negative_float, default=0, help="stop after this long (0: until Ctrl-C)")
    run.add_argument("--available-now", action="store_true", help="process the input present at start, then stop")
    run.add_argument(
        "--max-restarts",
        type=non_negative_int,
        default=MAX_RESTARTS,
        help="after a failure the queries restart from their checkpoints (backoff 5 s doubling to 60 s), at most "
        f"this often in an hour (default {MAX_RESTARTS}; 0: exit on the first failure)",
    )
    run.add_argument(
        "--transactions",
        dest="transactions_source",
        metavar="PATH",
        help="transactions: a folder, a JSON-lines file or a glob (default <data-dir>/landing/transactions)",
    )
    run.add_argument(
        "--logins",
        dest="logins_source",
        metavar="PATH",
        help="login events: a folder, a JSON-lines file or a glob (default <data-dir>/landing/logins)",
    )
    add_memory_bounds(run)
    run.add_argument(
        "--compact-min-files",
        type=non_negative_int,
        default=JobConfig.compact_min_files,
        help="the job's writers compact a table once it holds this many small files (0: never; see maintain)",
    )
    run.add_argument(
        "--bronze-retention-days",
        type=non_negative_float,
        default=JobConfig.bronze_retention_days,
        help="bronze rows (transactions, logins) ingested longer ago are deleted, hourly (0: kept)",
    )
    run.add_argument("--source", choices=["files", "kafka"], help="default: kafka with a bootstrap, else files")
    run.add_argument("--kafka-bootstrap", help="bootstrap servers (`make run SOURCE=kafka` starts a local broker)")
    run.add_argument(
        "--kafka-option",
        action="append",
        type=key_value,
        metavar="KEY=VALUE",
        help="Kafka client option, repeatable, e.g. kafka.sasl.mechanism=PLAIN",
    )
    run.add_argument("--kafka-secret-scope", help="Databricks secret scope with kafka-username / kafka-password")
    run.add_argument(
        "--transactions-topic", dest="kafka_transactions_topic", default="transactions", help="transactions topic"
    )
    run.add_argument("--logins-topic", dest="kafka_logins_topic", default="logins", help="login events topic")
    run.add_argument("--rules-topic", dest="kafka_rules_topic", default="rules", help="rule changes ('' for none)")
    run.add_argument("--alerts-topic", dest="kafka_alerts_topic", default="alerts", help="alerts also here ('' none)")
    run.add_argument(
        "--rules-format",
        choices=RULES_FORMATS,
        help="what a rules message (topic or folder) holds: our rule JSON (default) or a Debezium change event of a "
        "database's rules table (docs/rules.md)",
    )
    add_rules_table_arguments(
        run,
        "rule changes from this Delta table's change feed instead of the rules folder or "
        "topic: a table admins edit with SQL, one row per rule (catalog.schema.table, or a path; docs/rules.md)",
        "with --rules-format debezium or --rules-table",
    )
    run.add_argument(
        "--starting-offsets",
        dest="kafka_starting_offsets",
        default="earliest",
        help="where a fresh checkpoint starts reading: earliest, latest or JSON offsets",
    )
    run.set_defaults(func=cmd_run)
