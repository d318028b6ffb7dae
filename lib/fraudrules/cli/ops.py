"""The operator's commands: `quality` (the data-quality run), `status` (health as JSON), `maintain` (table
maintenance)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fraudrules.config import TABLES, JobConfig, on_databricks
from fraudrules.paths import output_problem

if TYPE_CHECKING:
    pass
from fraudrules.cli.common import (
    check,
    data_dir_problem,
    file_problem,
    job_config,
    non_negative_float,
    positive_float,
    spark_session,
    table_problem,
    threshold_arguments,
)


def cmd_quality(args: argparse.Namespace) -> int:
    from fraudrules.ops import quality

    cfg = job_config(args)
    check(output_problem(args.report, "--report") if args.report else None, data_dir_problem(cfg))

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
        if spark is not None and not on_databricks():
            spark.stop()
    print(f"done in {time.monotonic() - started:.1f} s")
    return 0


def add_quality(sub, parents: list[argparse.ArgumentParser]) -> None:
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


def add_maintain(sub, parents: list[argparse.ArgumentParser]) -> None:
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


def add_status(sub, parents: list[argparse.ArgumentParser]) -> None:
    st = sub.add_parser("status", parents=[*parents, threshold_arguments()], help="health of the job as JSON")
    st.add_argument("--data-dir", default="data", help="the local job's data dir")
    st.add_argument("--facts", help="judge facts observed elsewhere instead (JSON file or -: the Databricks target)")
    st.set_defaults(func=cmd_status)
