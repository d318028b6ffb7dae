"""`fraudrules` command line: argument parsing over the library (what a cluster or an operator runs).

Arguments are checked before Spark starts: a missing or unreadable input, an invalid rules file, an output that
cannot be written, a data dir without the tables a command reads, missing Spark jars or an invalid value ends the
command at once with a one-line error and exit status 2. Commands that only read never create a table.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

from fraudrules import __version__, logs
from fraudrules.config import MAX_RESTARTS, RULES_FORMATS, TABLES, JobConfig, config_from, parse_options
from fraudrules.paths import input_problem, is_remote, output_problem
from fraudrules.rules.text import plural

if TYPE_CHECKING:
    from fraudrules.event_schema import EventSchema
    from fraudrules.rules.model import RuleError

PRODUCTION_RUN = "fraudrules run --no-generator --catalog C --schema S --checkpoint-root DIR [--kafka-bootstrap ...]"
RULE_ACTIONS = (
    "put",
    "shadow",
    "promote",
    "compare",
    "pause",
    "activate",
    "delete",
    "list",
    "history",
    "export",
    "init-table",
)
THRESHOLD_HELP = {
    "stale_after_s": "seconds without a committed evaluate batch, while running, before the job counts as stalled",
    "startup_grace_s": "seconds a fresh process gets to commit its first batch",
    "p99_ms": "alert latency p99 (ms) of the newest batch above which latency counts as high",
    "rising_factor": "factor by which the newer half of recent batches' p99 may exceed the older half",
    "trend_batches": "recent batches looked at for the latency trend",
    "lag_s": "age (s) of the oldest landing file not yet taken above which the lag counts as high",
    "max_restarts_per_hour": "restarts in the last hour above which the job counts as crash-looping",
}


class UsageError(Exception):
    """A command that cannot run as given: its message is printed on one line, the exit status is 2."""


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line, naming the problem and where help is (not the whole usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


# ------------------------------------------------------------------------------------------ checks

N = TypeVar("N", int, float)


def _bounded(kind: Callable[[str], N], low: N, inclusive: bool, what: str) -> Callable[[str], N]:
    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if value < low or (value == low and not inclusive):
            raise argparse.ArgumentTypeError(f"{text} is not {what}")
        return value

    parse.__name__ = what
    return parse


positive_int = _bounded(int, 1, True, "a positive integer")
non_negative_int = _bounded(int, 0, True, "a whole number >= 0")
positive_float = _bounded(float, 0.0, False, "a number > 0")
non_negative_float = _bounded(float, 0.0, True, "a number >= 0")


def add_memory_bounds(p: argparse.ArgumentParser) -> None:
    """The bounds of a micro-batch and of the state a Python worker keeps in memory, for `run` and `backtest`
    alike (`--max-offsets-per-trigger`: Kafka's word)."""
    p.add_argument(
        "--max-records-per-trigger",
        "--max-offsets-per-trigger",
        type=positive_int,
        default=JobConfig.max_records_per_trigger,
        metavar="N",
        help="at most N records (file lines, Kafka records) per micro-batch of each source, whatever the file "
        f"sizes (default {JobConfig.max_records_per_trigger:,})",
    )
    p.add_argument(
        "--state-memory-mb",
        type=non_negative_int,
        default=JobConfig.state_memory_mb,
        metavar="MB",
        help="retained state a Python worker keeps in memory; beyond it, chunks are read again from local disk "
        f"when a micro-batch needs them (default {JobConfig.state_memory_mb})",
    )


def key_value(text: str) -> str:
    try:
        parse_options([text])
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def check(*problems: str | None) -> None:
    """Raise the first problem found (None: fine)."""
    for problem in problems:
        if problem:
            raise UsageError(problem)


def file_problem(path: str | None, what: str = "--rules") -> str | None:
    if path is None or path == "-":
        return None
    if not os.path.isfile(path):
        return f"{what} {path}: no such file"
    return None if os.access(path, os.R_OK) else f"{what} {path}: file is not readable"


def rule_error_text(err: RuleError) -> str:
    """A RuleError for one line: the rule and its problems (a file that is no JSON, or a rule without a usable
    ruleId, has its problem alone)."""
    problems = "; ".join(err.problems)
    return problems if err.rule_id is None else f"invalid rule {err.rule_id}: {problems}"


def read_rules(path: str, what: str, schema: EventSchema, state: str | None = None) -> list:
    """The rules of a JSON file (`-`: stdin), every one valid against the event `schema`; else a UsageError naming
    the problem, after one stderr line per invalid rule when there are several (nothing is used from a file with an
    invalid rule). `state` (SHADOW for `rules shadow`) replaces every rule's state."""
    from fraudrules.rules.model import parse_rules_text

    check(file_problem(path, what))
    data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(
            f"{what} {path}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})"
        ) from None
    rules, errors = parse_rules_text(text, schema, state=state)
    if len(errors) == 1 or any(e.rule_id is None for e in errors):
        raise UsageError(f"{what} {path}: " + "; ".join(rule_error_text(e) for e in errors))
    if errors:
        for err in errors:
            print(rule_error_text(err), file=sys.stderr)
        raise UsageError(f"{what} {path}: {len(errors)} invalid rules")
    if not rules:
        raise UsageError(f"{what} {path}: no rules in it")
    return rules


def jars_missing() -> str | None:
    """Why a local session cannot start: its Delta jars are not where they are looked for (one line)."""
    from fraudrules.jars import jars_problem
    from fraudrules.session import on_databricks

    return None if on_databricks() else jars_problem()


def spark_session(app: str = "fraudrules", **options: object):
    """The Spark session of a command, once its jars are known to be there (else a one-line usage error)."""
    from fraudrules.session import get_spark

    check(jars_missing())
    return get_spark(app, **options)


def job_config(args: argparse.Namespace, **overrides: object) -> JobConfig:
    """The JobConfig of the arguments; an inconsistent one (e.g. Kafka topics without a bootstrap) is a usage
    error."""
    from fraudrules.rules.cdc import ColumnMapping

    try:
        cfg = config_from(vars(args), **overrides)
        ColumnMapping(cfg.rules_columns)  # a column mapped to no rule field (the job would stop at its start)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return cfg


def schema_problem(path: str | None) -> str | None:
    """Why `--event-schema PATH` cannot be used (None: it can)."""
    from fraudrules.event_schema import file_problem as problem

    return problem(path)


EVENT_SCHEMA_HELP = (
    "the transaction event schema: a file of Spark SQL DDL, e.g. `transactionId BIGINT, eventTime BIGINT, "
    "merchant STRUCT<country: STRING>, ...` (default: the schema the job last started with, else the reference "
    "demo's transaction; see lib/fraudrules/schemas)"
)


def data_dir_problem(cfg: JobConfig, tables: bool = True) -> str | None:
    """A local data dir that does not exist (a mistyped --data-dir) or, with `tables`, holds no tables: a command
    that only reads it must not create them (catalog and remote data dirs are checked by Spark)."""
    where = os.path.abspath(cfg.data_dir)
    if cfg.uses_catalog or is_remote(cfg.data_dir):
        return None
    if not os.path.isdir(where):
        return f"no data dir {where} (check --data-dir)"
    if tables and not os.path.isdir(os.path.join(where, "tables")):
        return f"no tables under {where} (run the job first, e.g. `make run`, or check --data-dir)"
    return None


def table_problem(cfg: JobConfig, *names: str) -> str | None:
    """Local tables that do not exist: an error for a command that reads them, which never creates them."""
    if cfg.uses_catalog or is_remote(cfg.data_dir):
        return None
    missing = [n for n in names if not os.path.isdir(os.path.join(cfg.table(n), "_delta_log"))]
    if not missing:
        return None
    where = f"{os.path.abspath(cfg.data_dir)}/tables"
    return data_dir_problem(cfg) or f"no table {', '.join(missing)} under {where} (run the job first, e.g. `make run`)"


# ------------------------------------------------------------------------------------------ run


def cmd_run(args: argparse.Namespace) -> int:
    sources = {"--transactions": args.transactions_source, "--logins": args.logins_source}
    check(
        schema_problem(args.event_schema),
        *(input_problem(path, flag, must_have_files=False) for flag, path in sources.items() if path),
    )
    from fraudrules import event_schema

    if args.rules:  # against the schema the job will start with
        read_rules(args.rules, "--rules", event_schema.for_job(job_config(args)))
    from fraudrules.engine import progress, run
    from fraudrules.event_schema import SchemaError
    from fraudrules.generator import demo_writers, sample_rules_path
    from fraudrules.ops import health
    from fraudrules.rules.model import RuleError
    from fraudrules.session import kafka_secret_options, on_databricks

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
    if not on_databricks():  # a cluster's driver log keeps them
        logs.quiet_query_failures(spark)
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
        print(f"the job failed: {_died(failed) or progress.error_line(failed)}", file=sys.stderr)
        return 1
    health.mark_stopped(cfg.data_dir)
    print("stopped cleanly; run again to resume from the checkpoints")
    return 0


def _died(err: BaseException) -> str | None:
    """One line when Spark's JVM or a Python worker died under the command (see `failures`), else None."""
    if "pyspark" not in sys.modules:  # Spark never started: not such a failure
        return None
    from fraudrules import failures

    return failures.explain(err)


# ------------------------------------------------------------------------------------------ backtest, export, generate


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


# ------------------------------------------------------------------------------------------ rules


def rule_id(args: argparse.Namespace) -> int:
    if args.target is None:
        raise UsageError(f"rules {args.action} needs a rule id, e.g. `fraudrules rules {args.action} 1`")
    try:
        return int(args.target)
    except ValueError:
        raise UsageError(f"rules {args.action}: rule id {args.target!r} is not an integer") from None


RULE_TABLES = ("rules", "rule_history", "rules_export")
COMPARED_TABLES = ("alerts", "shadow_alerts", "rule_applied", "batches")


def cmd_rules(args: argparse.Namespace) -> int:
    from fraudrules import event_schema
    from fraudrules.rules.model import RuleError

    changes, target, period = [], None, {}
    if args.action in ("put", "shadow"):
        if args.target is None:
            raise UsageError(f"rules {args.action} needs a rules file, or - to read them from stdin")
        schema = event_schema.for_job(job_config(args))  # the schema the job last started with
        changes = read_rules(args.target, f"rules {args.action}", schema, "SHADOW" if args.action == "shadow" else None)
    elif args.action in ("pause", "activate", "delete", "history", "promote", "compare"):
        target = rule_id(args)
    if args.action == "compare":
        from fraudrules.rules.shadow import parse_time

        try:
            period = {k: parse_time(v) for k, v in (("since", args.since), ("until", args.until)) if v}
        except ValueError as err:
            raise UsageError(f"rules compare: {err}") from None
    cfg = job_config(args)
    if args.action == "init-table" and not cfg.rules_table:
        raise UsageError("rules init-table needs --rules-table TABLE (a catalog name, or a path)")
    if args.action not in ("put", "shadow", "init-table"):  # only new rules may start a rules table
        check(table_problem(cfg, *RULE_TABLES, *(COMPARED_TABLES if args.action == "compare" else ())))

    from fraudrules import tables

    spark = spark_session("fraudrules-rules", short_lived=True, cfg=cfg)
    try:
        if args.action == "compare":
            lines = _compare(spark, cfg, int(target or 0), period, args.top)
        else:
            if args.action not in ("list", "history"):
                tables.ensure(spark, cfg, *RULE_TABLES)
            lines = _rules_action(spark, cfg, args.action, changes, target, args.author)
    except RuleError as err:
        raise UsageError(str(err)) from None
    finally:
        spark.stop()
    for line in lines:
        print(line)
    return 0


def history_lines(rows: list[dict], describe) -> list[str]:
    """`rules history`: a line per version, each column as wide as its longest value (authors and changes such as
    `promote:105` or a CDC position vary in length), the rule's definition last."""
    cells = [
        (
            f"v{row['version']}",
            row["updatedAt"].strftime("%Y-%m-%dT%H:%M:%SZ") if row["updatedAt"] else "-",
            row["updatedBy"] or "-",
            row["change"] or "-",
            row["ruleState"],
        )
        for row in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))] if cells else []
    return [
        " ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + f" {describe(row)}"
        for line, row in zip(cells, rows, strict=True)
    ]


def _rules_action(spark, cfg: JobConfig, action: str, changes: list, target: int | None, author: str) -> list[str]:
    from fraudrules import event_schema
    from fraudrules.rules import store
    from fraudrules.rules.codec import from_row
    from fraudrules.rules.model import RuleError
    from fraudrules.rules.text import rule_text

    schema = event_schema.for_job(cfg)

    def describe(row: dict) -> str:
        rule = from_row(row, schema)
        return rule_text(rule) + (f" · shadows rule {rule.shadow_of}" if rule.shadow_of is not None else "")

    def changed(row: dict) -> str:
        shadows = json.loads(row["ruleJson"]).get("shadowOf")
        return (
            f"rule {row['ruleId']} v{row['version']} {row['ruleState']}"
            + (f" (shadows rule {shadows})" if shadows is not None and row["ruleState"] == "SHADOW" else "")
            + (f" -> {cfg.rules_table} (the job applies it at its next micro-batch)" if cfg.rules_table else "")
        )

    if action == "init-table":
        return [_init_table(spark, cfg, schema)]
    if action == "put":
        return [changed(row) for row in store.submit(spark, cfg, changes, author=author)]
    if action == "shadow":
        return [changed(row) for row in store.shadow(spark, cfg, changes, author=author)]
    if action == "promote":
        rows = store.promote(spark, cfg, int(target or 0), author=author)
        return [f"{changed(row)}  [{row['change']}]" for row in rows]
    if action in ("pause", "activate", "delete"):
        state = {"pause": "PAUSE", "activate": "ACTIVE", "delete": "DELETE"}[action]
        return [changed(store.set_state(spark, cfg, int(target or 0), state, author=author))]
    if action == "list":
        rows = sorted(store.current(spark, cfg).items())
        return [f"{rid:>6} v{row['version']:<4} {row['ruleState']:<7} {describe(row)}" for rid, row in rows] or [
            "no rules (add some with `fraudrules rules put FILE`)"
        ]
    if action == "history":
        rows = store.history(spark, cfg, int(target or 0))
        if not rows:
            raise RuleError(target, ["no such rule"])
        return history_lines(rows, describe)
    return [f"exported to {store.export_current(spark, cfg)}"]


def _init_table(spark, cfg: JobConfig, schema) -> str:
    """`rules init-table`: the rules table made, with the rules in force (an existing data dir's move to a table)."""
    from fraudrules.rules import store
    from fraudrules.rules import table as rules_table
    from fraudrules.rules.codec import from_row

    rows = store.current(spark, cfg).values()
    in_force = [from_row(r, schema) for r in rows if r["ruleState"] != "DELETE"]
    if not rules_table.create(spark, str(cfg.rules_table), in_force):
        return f"{cfg.rules_table} exists already: nothing done"
    return (
        f"created {cfg.rules_table} (change data feed on) with {plural(len(in_force), 'rule')} in force: run the job "
        f"with --rules-table {cfg.rules_table}, and edit the rules there (docs/rules.md)"
    )


def _compare(spark, cfg: JobConfig, shadow_id: int, period: dict, top: int) -> list[str]:
    from fraudrules.rules import shadow

    return shadow.compare(spark, cfg, shadow_id, **period).lines(top)


# ------------------------------------------------------------------------------------------ quality, status


def cmd_quality(args: argparse.Namespace) -> int:
    from fraudrules.ops import quality

    cfg = job_config(args)
    check(output_problem(args.report, "--report") if args.report else None, data_dir_problem(cfg))
    from fraudrules.session import on_databricks

    dq_dir = os.path.abspath(args.dq_dir or os.path.join(args.data_dir, "dq"))
    from fraudrules.local_runtime import QUALITY_HEAP

    spark = spark_session("fraudrules-quality", short_lived=True, cfg=cfg, heap=QUALITY_HEAP)
    try:
        report = quality.run(spark, cfg, dq_dir, max_age_minutes=args.max_age_minutes)
    finally:
        if not on_databricks():
            spark.stop()
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps(report.to_json(), indent=2, default=str))
    for line in report.summary_lines():
        print(line)
    return 0 if report.success else 1


def cmd_status(args: argparse.Namespace) -> int:
    from fraudrules.ops import health

    if args.facts and args.facts != "-":
        check(file_problem(args.facts, "--facts"))
    th = health.Thresholds(**{name: getattr(args, name) for name in health.Thresholds.__dataclass_fields__})
    if args.facts:
        facts = json.loads(sys.stdin.read() if args.facts == "-" else Path(args.facts).read_text())
        out = health.judge_facts(facts, th)
    else:
        # a data dir with a job's pid file is judged before the job made its tables
        check(data_dir_problem(JobConfig(data_dir=args.data_dir), tables=not health.run_dir(args.data_dir).is_dir()))
        out = health.status(args.data_dir, th)
    print(json.dumps(out, default=str))
    return 0


def cmd_maintain(args: argparse.Namespace) -> int:
    from fraudrules import maintenance, tables

    cfg = job_config(args)
    check(data_dir_problem(cfg), table_problem(cfg, *args.tables))
    spark = None if tables.uses_delta_rs(cfg) else spark_session("fraudrules-maintain", short_lived=True, cfg=cfg)
    where = f"{cfg.catalog}.{cfg.schema}" if cfg.uses_catalog else f"{os.path.abspath(cfg.data_dir)}/tables"
    print(
        f"maintaining {len(args.tables)} tables in {where}: removed files kept {cfg.retention_hours:g} h, "
        f"log entries {cfg.log_retention_days:g} days"
    )
    started = time.monotonic()
    try:
        for report in maintenance.maintain(spark, cfg, tuple(args.tables)):
            print(report.line())
    finally:
        if spark is not None and not _on_databricks():
            spark.stop()
    print(f"done in {time.monotonic() - started:.1f} s")
    return 0


def _on_databricks() -> bool:
    from fraudrules.session import on_databricks

    return on_databricks()


# ------------------------------------------------------------------------------------------ parser


def _common_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help=f"show Spark's warnings and its Python workers' output (same as {logs.ENV}=WARN)",
    )
    return p


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
        "--shards",
        type=positive_int,
        default=JobConfig.shards,
        help="state groups of the stateful stages (best: one per partition)",
    )
    p.add_argument(
        "--shuffle-partitions",
        type=positive_int,
        default=JobConfig.shuffle_partitions,
        help="partitions of the stateful stages (one per core they may use)",
    )
    p.add_argument(
        "--lateness-ms", type=non_negative_int, default=60_000, help="allowed lateness of the watermark (ms)"
    )
    return p


def threshold_arguments() -> argparse.ArgumentParser:
    """One option per health threshold (`--stale-after-s`, `--p99-ms`, ...), defaults from health.Thresholds."""
    from fraudrules.ops.health import Thresholds

    p = argparse.ArgumentParser(add_help=False)
    defaults = Thresholds()
    for name in Thresholds.__dataclass_fields__:
        value = getattr(defaults, name)
        kind = positive_int if isinstance(value, int) else positive_float
        p.add_argument(
            f"--{name.replace('_', '-')}",
            type=kind,
            default=value,
            help=f"{THRESHOLD_HELP.get(name, name)} (default {value:g})",
        )
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


def _add_backtest(sub, parents: list[argparse.ArgumentParser]) -> None:
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


def add_rules_table_arguments(parser: argparse.ArgumentParser, table_help: str, column_scope: str) -> None:
    """--rules-table and --rules-column (docs/rules.md)."""
    parser.add_argument("--rules-table", metavar="TABLE", help=table_help)
    parser.add_argument(
        "--rules-column",
        dest="rules_columns",
        action="append",
        type=key_value,
        metavar="FIELD=COLUMN",
        help=f"{column_scope}: the column holding a rule field, repeatable, e.g. limit=limit_amount (a field not "
        "named: the column of its own name)",
    )


def _add_rules(sub, parents: list[argparse.ArgumentParser]) -> None:
    ru = sub.add_parser(
        "rules",
        parents=parents,
        help="manage rules: put, shadow, promote, compare, pause, activate, delete, list, history, export",
        description="put FILE|- (a rule or a JSON list), shadow FILE|- (candidates in SHADOW: evaluated like "
        "ACTIVE rules, hits to shadow_alerts only; `shadowOf` names the live rule challenged), promote ID (the "
        "shadow rule replaces its live rule: one new version, one change), compare ID [--since ...] (shadow vs "
        "live alerts over the same batches), pause ID, activate ID, delete ID, list, history ID, export. "
        "A running job applies each change at its next micro-batch.",
    )
    ru.add_argument("action", choices=RULE_ACTIONS, help="what to do")
    ru.add_argument(
        "target",
        nargs="?",
        help="rules file or - (put, shadow), or a rule id (promote, compare, pause, activate, delete, history)",
    )
    ru.add_argument("--since", help="compare: from this time (ISO, UTC) or age (30m, 2h, 1d); default: run start")
    ru.add_argument("--until", help="compare: up to this time or age; default: the end of the shadow run, or now")
    ru.add_argument("--top", type=positive_int, default=10, help="compare: keys listed that differ most")
    ru.add_argument("--author", default=os.environ.get("USER", "cli"), help="recorded in rule_history (default $USER)")
    add_rules_table_arguments(
        ru,
        "the job's rules table (as `run --rules-table`): put, shadow, promote, pause, activate and delete write to it "
        "and the job applies them from its change feed; init-table creates it with the rules in force",
        "with --rules-table",
    )
    ru.set_defaults(func=cmd_rules)


def _add_quality(sub, parents: list[argparse.ArgumentParser]) -> None:
    q = sub.add_parser(
        "quality",
        parents=parents,
        help="data quality: the Great Expectations checkpoint over the tables and the streaming state",
    )
    q.add_argument("--dq-dir", help="validation results and Data Docs of every run (default <data-dir>/dq)")
    q.add_argument(
        "--max-age-minutes", type=positive_float, default=60.0, help="freshness: newest bronze row / alert age"
    )
    q.add_argument("--report", help="write the report as JSON here")
    q.set_defaults(func=cmd_quality)


def _add_maintain(sub, parents: list[argparse.ArgumentParser]) -> None:
    m = sub.add_parser(
        "maintain",
        parents=parents,
        help="table maintenance: compaction, VACUUM, the Delta log (safe while the job runs)",
        description="Per table: small files compacted, files no version within the retention needs vacuumed, the "
        "Delta log checkpointed and its expired entries removed; prints files, bytes and log entries before and "
        "after. Safe while the job writes; bronze retention is the job's own (`run --bronze-retention-days`). "
        "See docs/operations.md.",
    )
    m.add_argument(
        "--retention-hours",
        type=non_negative_float,
        default=JobConfig.retention_hours,
        help="VACUUM keeps removed files this long: the time travel of notebooks and data-quality history",
    )
    m.add_argument(
        "--log-retention-days",
        type=non_negative_float,
        default=JobConfig.log_retention_days,
        help="the Delta log keeps its entries this long (a table property: Delta applies it at each checkpoint)",
    )
    m.add_argument(
        "--tables", nargs="+", choices=TABLES, default=list(TABLES), metavar="TABLE", help="default: every table"
    )
    m.set_defaults(func=cmd_maintain)


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="fraudrules",
        description="Dynamic fraud rules on Spark Structured Streaming + Delta Lake: run the job, backtest rules "
        "over files, manage the rules, export tables, check data quality and health.",
        epilog="`fraudrules COMMAND --help` describes a command. Spark logs only errors unless -v/--verbose "
        f"or {logs.ENV}=WARN|INFO|DEBUG.",
    )
    p.add_argument("--version", action="version", version=f"fraudrules {__version__}")
    common, where, engine = _common_parent(), _tables_parent(), _engine_parent()
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(sub, [common, where, engine])
    _add_backtest(sub, [common, engine])

    ex = sub.add_parser("export", parents=[common, where], help="dump a Delta table as JSON lines")
    ex.add_argument("table", choices=TABLES, metavar="TABLE", help=f"one of: {', '.join(TABLES)}")
    ex.add_argument("--out", required=True, metavar="FILE", help="the JSON-lines file to write")
    ex.set_defaults(func=cmd_export)

    gen = sub.add_parser("generate", parents=[common], help="write a reproducible demo workload as JSON-lines files")
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

    _add_rules(sub, [common, where])
    _add_quality(sub, [common, where, engine])
    _add_maintain(sub, [common, where])

    st = sub.add_parser("status", parents=[common, threshold_arguments()], help="health of the job as JSON")
    st.add_argument("--data-dir", default="data", help="the local job's data dir")
    st.add_argument("--facts", help="judge facts observed elsewhere instead (JSON file or -: the Databricks target)")
    st.set_defaults(func=cmd_status)
    return p


def main(argv: list[str] | None = None) -> int:
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)  # progress shows as it happens, also through a pipe
    args = parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        if args.verbose:
            logs.set_verbose()
        try:
            logs.level()
        except ValueError as err:
            raise UsageError(str(err)) from None
        return int(args.func(args) or 0)
    except UsageError as err:
        print(f"fraudrules {args.command}: {err}", file=sys.stderr)
        return 2
    except Exception as err:
        if (why := _died(err)) is None:
            raise
        print(f"fraudrules {args.command}: {why}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # no Spark shutdown to run; threads and native libraries still bound to it must not hold the exit
    except KeyboardInterrupt:
        print(f"fraudrules {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
