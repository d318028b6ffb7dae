"""`fraudrules` command line: a thin layer over the library."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from importlib import resources
from pathlib import Path

from fraudrules.config import TABLES, JobConfig

SAMPLE_RULES = "sample_rules.json"


def _cfg(args: argparse.Namespace, **extra: object) -> JobConfig:
    return JobConfig(
        data_dir=args.data_dir,
        shards=args.shards,
        lateness_ms=args.lateness_ms,
        shuffle_partitions=args.shuffle_partitions,
        **extra,
    )


def _rules_path(name_or_path: str | None) -> str:
    if name_or_path:
        return name_or_path
    return str(resources.files("fraudrules").joinpath(SAMPLE_RULES))


def _io_options(args: argparse.Namespace) -> tuple[dict, object | None]:
    """JobConfig fields of `run`'s source options; with `--source kafka` and no bootstrap, a local broker."""
    opts: dict = {"available_now": args.available_now, "max_files_per_trigger": args.max_files_per_trigger,
                  "transactions_source": args.transactions, "logins_source": args.logins}  # fmt: skip
    if args.source != "kafka":
        return opts, None
    from fraudrules import kafka_io

    broker = None
    if not args.kafka_bootstrap:
        broker = kafka_io.start_local_broker(os.path.join(args.data_dir, "kafka"))
        print(f"started a local Kafka broker: bootstrap.servers={broker.bootstrap} (logs: {broker.log_file})")
    opts.update(
        source="kafka",
        kafka_bootstrap=args.kafka_bootstrap or broker.bootstrap,
        kafka_options=kafka_io.parse_options(args.kafka_option),
        kafka_transactions_topic=args.transactions_topic,
        kafka_logins_topic=args.logins_topic,
        kafka_rules_topic=args.rules_topic or None,
        kafka_alerts_topic=args.alerts_topic or None,
        kafka_starting_offsets=args.starting_offsets,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
    )
    if broker is not None:
        topics = [args.transactions_topic, args.logins_topic, args.rules_topic, args.alerts_topic]
        kafka_io.create_topics(opts["kafka_bootstrap"], [t for t in topics if t])
    return opts, broker


def cmd_run(args: argparse.Namespace) -> int:
    from fraudrules import job, kafka_io, rulebook, tables
    from fraudrules.generator import LoginWorkload, RateWriter, Workload
    from fraudrules.progress import ProgressPrinter
    from fraudrules.rules import load_rules_file
    from fraudrules.session import get_spark

    io_options, broker = _io_options(args)
    cfg = _cfg(args, trigger_seconds=args.trigger_seconds, logins=True, **io_options)
    spark = get_spark(shuffle_partitions=cfg.shuffle_partitions)
    stopping = threading.Event()  # Ctrl-C / SIGTERM ask the loop below to stop; no exception mid-call into the JVM
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    tables.ensure(spark, cfg)
    if not rulebook.current(spark, cfg):
        rulebook.upsert(spark, cfg, load_rules_file(_rules_path(args.rules)), author="make run")
        print(f"loaded rules from {_rules_path(args.rules)}")
    spark.streams.addListener(ProgressPrinter())
    running = job.start(spark, cfg)
    writers = []
    if args.rate > 0:
        first_id = int(time.time() * 1000) * 1000  # fresh ids on every start
        transactions = Workload(count=10**12, seed=first_id % 2**32, first_id=first_id, burst_every=500)
        logins = LoginWorkload(count=10**12, seed=first_id % 2**31, attack_every=200)
        streams = [
            (cfg.landing, cfg.kafka_transactions_topic, transactions.transactions(), args.rate, "eventTime"),
            (cfg.logins_landing, cfg.kafka_logins_topic, logins.events(), max(1.0, args.rate / 10), "eventTimestamp"),
        ]
        for folder, topic, events, rate, field in streams:  # files locally, the topics on Kafka
            writers.append(
                kafka_io.KafkaRateWriter(cfg.kafka_bootstrap, topic, events, rate, realtime=True, time_field=field)
                if cfg.source == "kafka"
                else RateWriter(folder, events, rate, realtime=True, time_field=field)
            )
        for writer in writers:
            writer.start()
        into = (f"topics {cfg.kafka_transactions_topic}, {cfg.kafka_logins_topic}" if cfg.source == "kafka"
                else f"{cfg.landing} and {cfg.logins_landing}")  # fmt: skip
        print(f"generating {args.rate:g} transactions/s (and logins) into {into}")
    print(f"tables under {os.path.abspath(cfg.data_dir)}/tables; Ctrl-C stops")
    deadline = time.time() + args.seconds if args.seconds else None
    try:
        while not stopping.is_set() and all(q.isActive for q in running.queries):
            if deadline is not None and time.time() >= deadline:
                break
            stopping.wait(1)
        while cfg.available_now and not stopping.is_set() and any(q.isActive for q in running.queries):
            time.sleep(0.5)  # the other queries finish their input
        print("\nstopping…", flush=True)
    finally:
        for writer in writers:
            writer.stop()
        failed = [q.exception() for q in running.queries if not q.isActive and q.exception()]
        spark.sparkContext.setLogLevel("FATAL")  # a batch still running after the drain is interrupted: not an error
        running.stop(drain_s=0 if failed else 60)  # the generators are stopped: in-flight batches finish first
        spark.stop()
        if broker is not None:
            broker.stop()
    if failed:
        print(f"a query failed: {failed[0]}", file=sys.stderr)
        return 1
    print("stopped cleanly; run again to resume from the checkpoint")
    return 0


def cmd_backtest(args: argparse.Namespace) -> int:
    from fraudrules import backtest
    from fraudrules.rules import parse_rules_text
    from fraudrules.session import get_spark

    if not (args.transactions or args.logins):
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
    cfg = _cfg(args).with_(data_dir=work, max_files_per_trigger=args.max_files_per_trigger)
    spark = get_spark(shuffle_partitions=cfg.shuffle_partitions)
    result = backtest.run(spark, cfg, args.transactions, rules, logins=args.logins)
    n = backtest.write_alerts(spark, cfg, args.out)
    print(result.summary())
    print(f"wrote {n} alerts to {args.out} (tables in {work})")
    spark.stop()
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from fraudrules import tables
    from fraudrules.session import get_spark

    cfg = _cfg(args)
    spark = get_spark()
    n = tables.export_jsonl(spark, cfg, args.table, args.out)
    print(f"wrote {n} rows of {args.table} to {args.out}")
    spark.stop()
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from fraudrules.generator import Workload, write_jsonl

    wl = Workload(count=args.count, seed=args.seed, payees=args.payees, beneficiaries=args.beneficiaries)
    n = write_jsonl(args.out, wl.transactions(), per_file=args.per_file)
    print(f"wrote {n} transactions to {args.out}")
    return 0


def _rules_session(args: argparse.Namespace):
    from fraudrules import tables
    from fraudrules.session import get_spark

    cfg = _cfg(args)
    spark = get_spark("fraudrules-rules")
    tables.ensure(spark, cfg, "rules", "rule_history", "rules_export")
    return cfg, spark


def cmd_rules(args: argparse.Namespace) -> int:
    from fraudrules import rulebook
    from fraudrules.rules import RuleError, parse_rules_text

    if args.action == "put":
        text = sys.stdin.read() if args.target == "-" else Path(args.target).read_text(encoding="utf-8")
        changes, errors = parse_rules_text(text)
        if errors:  # nothing is applied from a file with an invalid rule
            for err in errors:
                print(f"invalid rule {err.rule_id}: {'; '.join(err.problems)}", file=sys.stderr)
            return 2
    cfg, spark = _rules_session(args)
    try:
        if args.action == "put":
            for row in rulebook.apply(spark, cfg, changes, author=args.author):
                print(f"rule {row['ruleId']} v{row['version']} {row['ruleState']}")
        elif args.action in ("pause", "activate", "delete"):
            state = {"pause": "PAUSE", "activate": "ACTIVE", "delete": "DELETE"}[args.action]
            row = rulebook.set_state(spark, cfg, int(args.target), state, author=args.author)
            print(f"rule {row['ruleId']} v{row['version']} {row['ruleState']}")
        elif args.action == "list":
            for rid, row in sorted(rulebook.current(spark, cfg).items()):
                print(f"{rid:>6} v{row['version']:<4} {row['ruleState']:<7} {row['ruleJson']}")
        elif args.action == "history":
            for row in rulebook.history(spark, cfg, int(args.target)):
                print(f"v{row['version']:<4} {row['updatedAt']} {row['updatedBy']:<12} {row['change']:<8} "
                      f"{row['ruleState']:<7} {row['ruleJson']}")  # fmt: skip
        elif args.action == "export":
            print(f"exported to {rulebook.export_current(spark, cfg)}")
    except RuleError as err:
        print(f"rule {err.rule_id}: {'; '.join(err.problems)}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    return 0


def cmd_demo_rules(args: argparse.Namespace) -> int:
    from fraudrules import demo

    return demo.main(args.data_dir, args.rate, args.step_seconds)


def cmd_crash_demo(args: argparse.Namespace) -> int:
    from fraudrules import crash_demo

    return crash_demo.main(args.data_dir, args.kills, args.count, args.logins_count, args.per_file, args.seed,
                           args.source, args.shards, args.rules)  # fmt: skip


def cmd_bench(args: argparse.Namespace) -> int:
    from fraudrules import bench

    bench.main(args.data_dir, args.mode, args.count, args.rate, args.seconds, args.shards)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fraudrules", description=__doc__)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default="data", help="root of the local Delta tables and checkpoints")
    common.add_argument("--shards", type=int, default=16, help="state groups of the stateful stage")
    common.add_argument("--shuffle-partitions", type=int, default=2)
    common.add_argument("--lateness-ms", type=int, default=60_000, help="allowed lateness of the watermark")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", parents=[common], help="run the continuous job on the embedded generator")
    run.add_argument("--rate", type=float, default=200.0, help="generated transactions per second (0: none)")
    run.add_argument("--rules", help="rules file loaded into an empty rules table (default: demo rules)")
    run.add_argument("--trigger-seconds", type=float, default=0.0)
    run.add_argument("--seconds", type=float, default=0, help="stop after this long (0: until Ctrl-C)")
    run.add_argument("--available-now", action="store_true", help="process the input present at start, then stop")
    run.add_argument("--transactions", help="folder of transaction files (default: DATA_DIR/landing/transactions)")
    run.add_argument("--logins", help="folder of login-event files (default: DATA_DIR/landing/logins)")
    run.add_argument("--max-files-per-trigger", type=int, default=None, help="bound of a file micro-batch")
    run.add_argument("--source", choices=["files", "kafka"], default="files")
    run.add_argument("--kafka-bootstrap", help="bootstrap servers (default: start a local broker in DATA_DIR/kafka)")
    run.add_argument("--kafka-option", action="append", metavar="KEY=VALUE", help="e.g. kafka.sasl.mechanism=PLAIN")
    run.add_argument("--transactions-topic", default="transactions")
    run.add_argument("--logins-topic", default="logins")
    run.add_argument("--rules-topic", default="rules", help="rule changes topic ('' for none)")
    run.add_argument("--alerts-topic", default="alerts", help="alerts are also published here ('' for none)")
    run.add_argument("--starting-offsets", default="earliest", help="for a fresh checkpoint")
    run.add_argument("--max-offsets-per-trigger", type=int, default=None, help="bound of a Kafka micro-batch")
    run.set_defaults(func=cmd_run)

    cd = sub.add_parser("crash-demo", help="SIGKILL the job several times, restart it, compare with a backtest")
    cd.add_argument("--data-dir", default="data/crash-demo", help="wiped first")
    cd.add_argument("--kills", type=int, default=3)
    cd.add_argument("--count", type=int, default=2_000, help="transactions")
    cd.add_argument("--logins-count", type=int, default=600)
    cd.add_argument("--per-file", type=int, default=250, help="records per file (= per micro-batch)")
    cd.add_argument("--seed", type=int, default=7)
    cd.add_argument("--source", choices=["files", "kafka"], default="files")
    cd.add_argument("--shards", type=int, default=4)
    cd.add_argument("--rules", help="rules file (default: the sample rules, incl. the login detector)")
    cd.set_defaults(func=cmd_crash_demo)

    bt = sub.add_parser("backtest", parents=[common], help="evaluate rules over files of transactions")
    bt.add_argument("--transactions", help="JSON-lines file or folder of transactions")
    bt.add_argument("--logins", help="JSON-lines file or folder of login events (login anomaly rules)")
    bt.add_argument("--rules", required=True, help="JSON list of rules")
    bt.add_argument("--out", required=True, help="alerts as JSON lines")
    bt.add_argument("--max-files-per-trigger", type=int, default=None)
    bt.add_argument("--fresh", action="store_true", help="wipe --data-dir first")
    bt.set_defaults(func=cmd_backtest, data_dir=None)

    ex = sub.add_parser("export", parents=[common], help="dump a Delta table as JSON lines")
    ex.add_argument("table", choices=TABLES)
    ex.add_argument("--out", required=True)
    ex.set_defaults(func=cmd_export)

    gen = sub.add_parser("generate", help="write a reproducible workload as JSON-lines files")
    gen.add_argument("--out", required=True)
    gen.add_argument("--count", type=int, default=10_000)
    gen.add_argument("--seed", type=int, default=7)
    gen.add_argument("--payees", type=int, default=2_000)
    gen.add_argument("--beneficiaries", type=int, default=500)
    gen.add_argument("--per-file", type=int, default=5_000)
    gen.set_defaults(func=cmd_generate)

    ru = sub.add_parser("rules", parents=[common], help="manage rules: put, pause, activate, delete, list, history")
    ru.add_argument("action", choices=["put", "pause", "activate", "delete", "list", "history", "export"])
    ru.add_argument("target", nargs="?", help="rules file or - (put), or a ruleId")
    ru.add_argument("--author", default=os.environ.get("USER", "cli"))
    ru.set_defaults(func=cmd_rules)

    dr = sub.add_parser("demo-rules", help="rule changes applied to a running job, with apply delays")
    dr.add_argument("--data-dir", default="data/demo-rules")
    dr.add_argument("--rate", type=float, default=100.0)
    dr.add_argument("--step-seconds", type=float, default=12.0)
    dr.set_defaults(func=cmd_demo_rules)

    sub.add_parser("quality", add_help=False, help="data-quality suites (Great Expectations); see quality --help")
    sub.add_parser("monitor", add_help=False, help="heartbeat / restart of the local job; see monitor --help")

    be = sub.add_parser("bench", help="throughput and latency benchmark")
    be.add_argument("--data-dir", default="bench/work")
    be.add_argument("--mode", choices=["all", "throughput", "latency"], default="all")
    be.add_argument("--count", type=int, default=200_000)
    be.add_argument("--rate", type=float, default=1_000.0)
    be.add_argument("--seconds", type=float, default=60.0)
    be.add_argument("--shards", type=int, default=16)
    be.set_defaults(func=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["quality"], ["monitor"]):  # sub-tools with their own argument parsers
        import importlib

        return int(importlib.import_module(f"fraudrules.{argv[0]}").main(argv[1:]) or 0)
    args = parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
