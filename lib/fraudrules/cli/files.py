"""The commands over files: `backtest` (the job's queries over files, available-now), `export` (a table as JSON
lines), `generate` (a demo workload)."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from fraudrules.cli.common import (
    EVENT_SCHEMA_HELP,
    UsageError,
    add_memory_bounds,
    check,
    job_config,
    non_negative_int,
    positive_int,
    read_rules,
    schema_problem,
    spark_session,
    table_problem,
)
from fraudrules.config import TABLES
from fraudrules.paths import input_problem, output_problem
from fraudrules.rules.text import plural

ALERT_TABLES = ("alerts", "shadow_alerts")  # exported as alerts: one format of alerts in files


def cmd_backtest(args: argparse.Namespace) -> int:
    if not (args.transactions_input or args.logins_input):
        raise UsageError("backtest needs --transactions and/or --logins")
    check(
        input_problem(args.transactions_input, "--transactions") if args.transactions_input else None,
        input_problem(args.logins_input, "--logins") if args.logins_input else None,
        schema_problem(args.event_schema),
        output_problem(args.out, "--out"),
    )
    from fraudrules import event_schema

    # every rule against the schema, before Spark starts: a rule left out would make a backtest that answers
    # another question
    rules = read_rules(args.rules, "--rules", event_schema.of(args.event_schema))
    from fraudrules import backtest

    if args.data_dir is not None and args.fresh:
        shutil.rmtree(args.data_dir, ignore_errors=True)
    cfg = job_config(args)  # checked before a temporary folder exists
    cfg = cfg.with_(data_dir=args.data_dir or tempfile.mkdtemp(prefix="fraudrules-backtest-"))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    try:
        long_running = backtest.long_running(args.transactions_input, args.logins_input)
        spark = spark_session(short_lived=True, cfg=cfg, tiered_jit=long_running)
        try:
            result = backtest.run(spark, cfg, args.transactions_input, rules, logins=args.logins_input)
            quarantined = backtest.write_quarantine(spark, cfg, backtest.quarantine_path(args.out))
        except BaseException:
            spark.stop()
            raise
        n = backtest.write_alerts_then_stop(spark, cfg, args.out)
    finally:
        if args.data_dir is None:  # its tables and checkpoints were only the means to the alerts
            backtest.discard(cfg)
    print(result.summary())
    for line in quarantined:
        print(line)
    print(f"wrote {plural(n, 'alert')} to {args.out}" + (f" (tables in {cfg.data_dir})" if args.data_dir else ""))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    cfg = job_config(args)
    check(output_problem(args.out, "--out"), table_problem(cfg, args.table))
    from fraudrules import tables

    spark = spark_session(short_lived=True, cfg=cfg)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    if args.table in ALERT_TABLES:  # as `backtest --out` writes them
        from fraudrules.backtest import write_alerts

        n = write_alerts(spark, cfg, args.out, args.table)
    else:
        n = tables.export_jsonl(spark, cfg, args.table, args.out)
    print(f"wrote {plural(n, 'row')} of {args.table} to {args.out}")
    spark.stop()
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    check(output_problem(os.path.join(args.out, "part-000000.json"), "--out"))
    from fraudrules.generator import RichWorkload, Workload, write_jsonl

    kind = RichWorkload if args.events == "rich" else Workload
    wl = kind(count=args.count, seed=args.seed, payees=args.payees, beneficiaries=args.beneficiaries)
    n = write_jsonl(args.out, wl.transactions(), per_file=args.per_file)
    files = -(-n // args.per_file)
    print(f"wrote {plural(n, 'transaction')} to {args.out} ({plural(files, 'file')})")
    return 0


def add_backtest(sub, parents: list[argparse.ArgumentParser]) -> None:
    bt = sub.add_parser(
        "backtest",
        parents=parents,
        help="evaluate rules over files of transactions and logins",
        description="The job's own queries, run to completion over JSON-lines input, then the alerts as JSON "
        "lines. PATH: a JSON-lines file, a folder of them, or a glob (quote it).",
    )
    bt.add_argument("--transactions", dest="transactions_input", metavar="PATH", help="transactions (file/folder/glob)")
    bt.add_argument("--logins", dest="logins_input", metavar="PATH", help="login events (file/folder/glob)")
    bt.add_argument("--rules", required=True, metavar="FILE", help="rules: a JSON list (or one rule)")
    bt.add_argument(
        "--event-schema",
        metavar="FILE",
        help=EVENT_SCHEMA_HELP.replace("the job last started with", "of --data-dir's last run"),
    )
    bt.add_argument("--out", required=True, metavar="FILE", help="where the alerts go, as JSON lines")
    bt.add_argument("--data-dir", default=None, help="work folder of its tables (default: a fresh temporary one)")
    bt.add_argument("--catalog", help="with --schema: write catalog tables (as the bundle does) instead of paths")
    bt.add_argument("--schema", help="with --catalog: the schema of its catalog tables")
    add_memory_bounds(bt)
    bt.add_argument("--fresh", action="store_true", help="wipe --data-dir first")
    bt.set_defaults(func=cmd_backtest)


def add_export(sub, parents: list[argparse.ArgumentParser]) -> None:
    ex = sub.add_parser(
        "export", parents=parents, help="dump a Delta table as JSON lines (alerts as backtest --out writes them)"
    )
    ex.add_argument("table", choices=TABLES, metavar="TABLE", help=f"one of: {', '.join(TABLES)}")
    ex.add_argument("--out", required=True, metavar="FILE", help="the JSON-lines file to write")
    ex.set_defaults(func=cmd_export)


def add_generate(sub, parents: list[argparse.ArgumentParser]) -> None:
    gen = sub.add_parser("generate", parents=parents, help="write a reproducible demo workload as JSON-lines files")
    gen.add_argument("--out", required=True, metavar="DIR", help="folder for the files (created if missing)")
    gen.add_argument("--count", type=positive_int, default=10_000, help="transactions to write")
    gen.add_argument(
        "--seed", type=non_negative_int, default=7, help="random seed: the same seed writes the same workload"
    )
    gen.add_argument("--payees", type=positive_int, default=2_000, help="distinct payees (Zipf-skewed)")
    gen.add_argument("--beneficiaries", type=positive_int, default=500, help="distinct beneficiaries (Zipf-skewed)")
    gen.add_argument("--per-file", type=positive_int, default=5_000, help="transactions per file")
    gen.add_argument(
        "--events",
        choices=["default", "rich"],
        default="default",
        help="the events' schema: the reference demo's transaction, or lib/fraudrules/schemas/rich.ddl (merchant, "
        "channel, device, basket, card; bursts also from one device and into one merchant country)",
    )
    gen.set_defaults(func=cmd_generate)
