"""What every command shares: one-line usage errors, argument types and checks made before Spark starts, the
parent parsers of the options several commands take."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

from fraudrules import logs
from fraudrules.config import JobConfig, config_from, on_databricks, parse_options
from fraudrules.paths import is_remote

if TYPE_CHECKING:
    from fraudrules.event_schema import EventSchema
    from fraudrules.rules.model import RuleError


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


class UsageError(Exception):
    """A command that cannot run as given: its message is printed on one line, the exit status is 2."""


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line, naming the problem and where help is (not the whole usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


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

    return None if on_databricks() else jars_problem()


def spark_session(app: str = "fraudrules", **options: object):
    """The Spark session of a command, once its jars are known to be there (else a one-line usage error)."""
    from fraudrules.session import get_spark

    check(jars_missing())
    return get_spark(app, **options)


def job_config(args: argparse.Namespace, **overrides: object) -> JobConfig:
    """The JobConfig of the arguments; an inconsistent one (e.g. Kafka topics without a bootstrap) is a usage
    error."""
    from fraudrules import event_schema
    from fraudrules.rules.cdc import ColumnMapping

    try:
        cfg = config_from(vars(args), **overrides)
        ColumnMapping(cfg.rules_columns)  # a column mapped to no rule field (the job would stop at its start)
    except ValueError as err:
        raise UsageError(str(err)) from None
    with contextlib.suppress(event_schema.SchemaError):  # a file it cannot use: the commands that need it say so
        cfg = event_schema.resolved(cfg)
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


def died(err: BaseException) -> str | None:
    """One line when Spark's JVM or a Python worker died under the command (see `failures`), else None."""
    if "pyspark" not in sys.modules:  # Spark never started: not such a failure
        return None
    from fraudrules import failures

    return failures.explain(err)


THRESHOLD_HELP = {
    "stale_after_s": "seconds without a committed evaluate batch, while running, before the job counts as stalled",
    "startup_grace_s": "seconds a fresh process gets to commit its first batch",
    "p99_ms": "alert latency p99 (ms) of the newest batch above which latency counts as high",
    "rising_factor": "factor by which the newer half of recent batches' p99 may exceed the older half",
    "trend_batches": "recent batches looked at for the latency trend",
    "lag_s": "age (s) of the oldest landing file not yet taken above which the lag counts as high",
    "max_restarts_per_hour": "restarts in the last hour above which the job counts as crash-looping",
}


def common_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help=f"show Spark's warnings and its Python workers' output (same as {logs.ENV}=WARN)",
    )
    return p


def tables_parent() -> argparse.ArgumentParser:
    """Where the tables and checkpoints are."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--data-dir", default="data", help="root of local tables, checkpoints and landing folders")
    p.add_argument("--catalog", help="Unity Catalog catalog (with --schema): catalog tables instead of paths")
    p.add_argument("--schema", help="Unity Catalog schema (with --catalog)")
    p.add_argument("--checkpoint-root", help="the queries' checkpoints (default <data-dir>/checkpoints)")
    return p


def engine_parent() -> argparse.ArgumentParser:
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
