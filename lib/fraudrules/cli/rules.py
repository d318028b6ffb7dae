"""`fraudrules rules`: the rules table managed by hand (put, shadow, promote, compare, pause, activate, delete,
list, history, export, init-table)."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING

from fraudrules.config import JobConfig
from fraudrules.rules.text import plural

if TYPE_CHECKING:
    pass
from fraudrules.cli.common import (
    UsageError,
    add_rules_table_arguments,
    check,
    job_config,
    positive_int,
    read_rules,
    spark_session,
    table_problem,
)

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


def add_rules(sub, parents: list[argparse.ArgumentParser]) -> None:
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
