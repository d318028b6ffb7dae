"""`fraudrules` command line: argument parsing over the library (what a cluster or an operator runs)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from fraudrules import __version__
from fraudrules.config import TABLES, config_from, parse_options

PRODUCTION_RUN = "fraudrules run --no-generator --catalog C --schema S --checkpoint-root DIR [--kafka-bootstrap ...]"


# ------------------------------------------------------------------------------------------ run


def cmd_run(args: argparse.Namespace) -> int:
    from fraudrules.engine import run
    from fraudrules.generator import demo_writers, sample_rules_path
    from fraudrules.session import get_spark, kafka_secret_options, on_databricks

    secrets = kafka_secret_options(args.kafka_secret_scope) if args.kafka_bootstrap else {}
    cfg = config_from(vars(args), logins=True, kafka_options={**parse_options(args.kafka_option), **secrets})
    generate = args.rate > 0 and not args.no_generator
    spark = get_spark(shuffle_partitions=cfg.shuffle_partitions)
    run.prepare(spark, cfg, args.rules or (sample_rules_path() if generate else None))
    writers = demo_writers(cfg, args.rate) if generate else []
    if writers:
        into = (
            f"topics {cfg.kafka_transactions_topic}, {cfg.kafka_logins_topic}"
            if cfg.source == "kafka"
            else f"{cfg.landing} and {cfg.logins_landing}"
        )
        print(f"generating {args.rate:g} transactions/s (and logins) into {into}")
    where = f"{cfg.catalog}.{cfg.schema}" if cfg.uses_catalog else f"{os.path.abspath(cfg.data_dir)}/tables"
    print(f"tables in {where}; Ctrl-C stops")
    failed = run.run(spark, cfg, writers, args.seconds)
    if not on_databricks():
        spark.stop()
    if failed:
        print(f"a query failed: {failed}", file=sys.stderr)
        return 1
    print("stopped cleanly; run again to resume from the checkpoint")
    return 0


# ------------------------------------------------------------------------------------------ backtest, export, generate


def cmd_backtest(args: argparse.Namespace) -> int:
    from fraudrules import backtest
    from fraudrules.rules.model import parse_rules_text
    from fraudrules.session import get_spark

    if not (args.transactions_input or args.logins_input):
        print("backtest needs --transactions and/or --logins", file=sys.stderr)
        return 2
    try:
        rules, errors = parse_rules_text(Path(args.rules).read_text(encoding="utf-8"))
    except OSError as err:
        print(f"cannot read rules: {err}", file=sys.stderr)
        return 2
    for err in errors:  # like the rules stream: invalid rules are reported, the valid ones still run
        print(f"skipping invalid rule {err.rule_id}: {'; '.join(err.problems)}", file=sys.stderr)
    if not rules:
        print("no valid rules to backtest", file=sys.stderr)
        return 2
    work = args.data_dir or tempfile.mkdtemp(prefix="fraudrules-backtest-")
    if args.data_dir is None or args.fresh:
        shutil.rmtree(work, ignore_errors=True)
    cfg = config_from(vars(args), data_dir=work)
    spark = get_spark(shuffle_partitions=cfg.shuffle_partitions)
    result = backtest.run(spark, cfg, args.transactions_input, rules, logins=args.logins_input)
    n = backtest.write_alerts(spark, cfg, args.out)
    print(result.summary())
    print(f"wrote {n} alerts to {args.out} (tables in {work})")
    spark.stop()
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from fraudrules import tables
    from fraudrules.session import get_spark

    spark = get_spark()
    n = tables.export_jsonl(spark, config_from(vars(args)), args.table, args.out)
    print(f"wrote {n} rows of {args.table} to {args.out}")
    spark.stop()
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from fraudrules.generator import Workload, write_jsonl

    wl = Workload(count=args.count, seed=args.seed, payees=args.payees, beneficiaries=args.beneficiaries)
    n = write_jsonl(args.out, wl.transactions(), per_file=args.per_file)
    print(f"wrote {n} transactions to {args.out}")
    return 0


# ------------------------------------------------------------------------------------------ rules


def cmd_rules(args: argparse.Namespace) -> int:
    from fraudrules import tables
    from fraudrules.rules import store
    from fraudrules.rules.model import RuleError, parse_rules_text
    from fraudrules.session import get_spark

    if args.action == "put":
        text = sys.stdin.read() if args.target == "-" else Path(args.target).read_text(encoding="utf-8")
        changes, errors = parse_rules_text(text)
        if errors:  # nothing is applied from a file with an invalid rule
            for err in errors:
                print(f"invalid rule {err.rule_id}: {'; '.join(err.problems)}", file=sys.stderr)
            return 2
    cfg = config_from(vars(args))
    spark = get_spark("fraudrules-rules")
    tables.ensure(spark, cfg, "rules", "rule_history", "rules_export")
    try:
        if args.action == "put":
            for row in store.apply(spark, cfg, changes, author=args.author):
                print(f"rule {row['ruleId']} v{row['version']} {row['ruleState']}")
        elif args.action in ("pause", "activate", "delete"):
            state = {"pause": "PAUSE", "activate": "ACTIVE", "delete": "DELETE"}[args.action]
            row = store.set_state(spark, cfg, int(args.target), state, author=args.author)
            print(f"rule {row['ruleId']} v{row['version']} {row['ruleState']}")
        elif args.action == "list":
            for rid, row in sorted(store.current(spark, cfg).items()):
                print(f"{rid:>6} v{row['version']:<4} {row['ruleState']:<7} {row['ruleJson']}")
        elif args.action == "history":
            for row in store.history(spark, cfg, int(args.target)):
                when, who, change = row["updatedAt"], row["updatedBy"], row["change"]
                print(f"v{row['version']:<4} {when} {who:<12} {change:<8} {row['ruleState']:<7} {row['ruleJson']}")
        elif args.action == "export":
            print(f"exported to {store.export_current(spark, cfg)}")
    except RuleError as err:
        print(f"rule {err.rule_id}: {'; '.join(err.problems)}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    return 0


# ------------------------------------------------------------------------------------------ quality, status


def cmd_quality(args: argparse.Namespace) -> int:
    from fraudrules.ops import quality
    from fraudrules.session import get_spark, on_databricks

    cfg = config_from(vars(args))
    dq_dir = os.path.abspath(args.dq_dir or os.path.join(args.data_dir, "dq"))
    spark = get_spark("fraudrules-quality")
    try:
        report = quality.run(spark, cfg, dq_dir, max_age_minutes=args.max_age_minutes)
    finally:
        if not on_databricks():
            spark.stop()
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps(report.to_json(), indent=2, default=str))
    for note in report.notes:
        print(note)
    print(report.message())
    print(f"Data Docs: {report.docs_index}")
    return 0 if report.success else 1


def cmd_status(args: argparse.Namespace) -> int:
    from fraudrules.ops import health

    th = health.Thresholds(**{name: getattr(args, name) for name in health.Thresholds.__dataclass_fields__})
    if args.facts:
        facts = json.loads(sys.stdin.read() if args.facts == "-" else Path(args.facts).read_text())
        out = health.judge_facts(facts, th)
    else:
        out = health.status(args.data_dir, th)
    print(json.dumps(out, default=str))
    return 0


# ------------------------------------------------------------------------------------------ parser


def _tables_parent() -> argparse.ArgumentParser:
    """Where the tables and checkpoints are."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--data-dir", default="data", help="root of local tables, checkpoints and landing folders")
    p.add_argument("--catalog", help="Unity Catalog catalog (with --schema): catalog tables instead of paths")
    p.add_argument("--schema", help="Unity Catalog schema (with --catalog)")
    p.add_argument("--checkpoint-root", help="the queries' checkpoints (default <data-dir>/checkpoints)")
    return p


def _engine_parent() -> argparse.ArgumentParser:
    """Settings fixed for the life of a checkpoint, which every command reading the state must share."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--shards", type=int, default=2, help="state groups of the stateful stages (best: one per partition)"
    )
    p.add_argument("--shuffle-partitions", type=int, default=2)
    p.add_argument("--lateness-ms", type=int, default=60_000, help="allowed lateness of the watermark")
    return p


def threshold_arguments() -> argparse.ArgumentParser:
    """One option per health threshold (`--stale-after-s`, `--p99-ms`, ...), defaults from health.Thresholds."""
    from fraudrules.ops.health import Thresholds

    p = argparse.ArgumentParser(add_help=False)
    defaults = Thresholds()
    for name in Thresholds.__dataclass_fields__:
        value = getattr(defaults, name)
        p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    return p


def _add_run(sub, parents: list[argparse.ArgumentParser]) -> None:
    run = sub.add_parser(
        "run",
        parents=parents,
        help="run the continuous job (all queries, logins included)",
        description=f"The continuous job. On a cluster: {PRODUCTION_RUN}. Locally, by default, with the "
        "embedded demo generator and the sample rules.",
    )
    run.add_argument("--no-generator", action="store_true", help="no embedded generator (production)")
    run.add_argument("--rate", type=float, default=200.0, help="generated transactions per second (0: none)")
    run.add_argument("--rules", help="rules file loaded into an empty rules table (default with the generator: demo)")
    run.add_argument("--trigger-seconds", type=float, default=0.1, help="a stateful micro-batch at most this often")
    run.add_argument("--seconds", type=float, default=0, help="stop after this long (0: until Ctrl-C)")
    run.add_argument("--available-now", action="store_true", help="process the input present at start, then stop")
    run.add_argument("--transactions", dest="transactions_source", help="folder of transaction files")
    run.add_argument("--logins", dest="logins_source", help="folder of login-event files")
    run.add_argument("--max-files-per-trigger", type=int, default=None, help="bound of a file micro-batch")
    run.add_argument("--source", choices=["files", "kafka"], help="default: kafka with a bootstrap, else files")
    run.add_argument("--kafka-bootstrap", help="bootstrap servers (`make run SOURCE=kafka` starts a local broker)")
    run.add_argument("--kafka-option", action="append", metavar="KEY=VALUE", help="e.g. kafka.sasl.mechanism=PLAIN")
    run.add_argument("--kafka-secret-scope", help="Databricks secret scope with kafka-username / kafka-password")
    run.add_argument("--transactions-topic", dest="kafka_transactions_topic", default="transactions")
    run.add_argument("--logins-topic", dest="kafka_logins_topic", default="logins")
    run.add_argument("--rules-topic", dest="kafka_rules_topic", default="rules", help="rule changes ('' for none)")
    run.add_argument("--alerts-topic", dest="kafka_alerts_topic", default="alerts", help="alerts also here ('' none)")
    run.add_argument("--starting-offsets", dest="kafka_starting_offsets", default="earliest", help="fresh checkpoint")
    run.add_argument("--max-offsets-per-trigger", type=int, default=None, help="bound of a Kafka micro-batch")
    run.set_defaults(func=cmd_run)


def _add_quality(sub, parents: list[argparse.ArgumentParser]) -> None:
    q = sub.add_parser(
        "quality",
        parents=parents,
        help="data quality: the Great Expectations checkpoint over the tables and the streaming state",
    )
    q.add_argument("--dq-dir", help="validation results and Data Docs of every run (default <data-dir>/dq)")
    q.add_argument("--max-age-minutes", type=float, default=60.0, help="freshness: newest bronze row / alert age")
    q.add_argument("--report", help="write the report as JSON here")
    q.set_defaults(func=cmd_quality)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fraudrules", description=__doc__)
    p.add_argument("--version", action="version", version=f"fraudrules {__version__}")
    where, engine = _tables_parent(), _engine_parent()
    sub = p.add_subparsers(dest="command", required=True)
    _add_run(sub, [where, engine])

    bt = sub.add_parser("backtest", parents=[engine], help="evaluate rules over files of transactions and logins")
    bt.add_argument("--transactions", dest="transactions_input", help="JSON-lines file or folder of transactions")
    bt.add_argument("--logins", dest="logins_input", help="JSON-lines file or folder of login events")
    bt.add_argument("--rules", required=True, help="JSON list of rules")
    bt.add_argument("--out", required=True, help="alerts as JSON lines")
    bt.add_argument("--data-dir", default=None, help="work folder of its tables (default: a temporary one)")
    bt.add_argument("--max-files-per-trigger", type=int, default=None)
    bt.add_argument("--fresh", action="store_true", help="wipe --data-dir first")
    bt.set_defaults(func=cmd_backtest)

    ex = sub.add_parser("export", parents=[where], help="dump a Delta table as JSON lines")
    ex.add_argument("table", choices=TABLES)
    ex.add_argument("--out", required=True)
    ex.set_defaults(func=cmd_export)

    gen = sub.add_parser("generate", help="write a reproducible demo workload as JSON-lines files")
    gen.add_argument("--out", required=True)
    gen.add_argument("--count", type=int, default=10_000)
    gen.add_argument("--seed", type=int, default=7)
    gen.add_argument("--payees", type=int, default=2_000)
    gen.add_argument("--beneficiaries", type=int, default=500)
    gen.add_argument("--per-file", type=int, default=5_000)
    gen.set_defaults(func=cmd_generate)

    ru = sub.add_parser("rules", parents=[where], help="manage rules: put, pause, activate, delete, list, history")
    ru.add_argument("action", choices=["put", "pause", "activate", "delete", "list", "history", "export"])
    ru.add_argument("target", nargs="?", help="rules file or - (put), or a ruleId")
    ru.add_argument("--author", default=os.environ.get("USER", "cli"))
    ru.set_defaults(func=cmd_rules)

    _add_quality(sub, [where, engine])

    st = sub.add_parser("status", parents=[threshold_arguments()], help="health of the job as JSON")
    st.add_argument("--data-dir", default="data", help="the local job's data dir")
    st.add_argument("--facts", help="judge facts observed elsewhere instead (JSON file or -: the Databricks target)")
    st.set_defaults(func=cmd_status)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
