"""Rules in Delta: the append-only change history (the engine's rule stream) and the current rules.

`rule_history` is the truth: every change is one appended row carrying the whole rule as it now is, with
the next version of its rule (control commands carry the state epoch). The running job streams this table
into its stateful stages, so a change reaches evaluation in the next micro-batch. `rules` (one row per
ruleId) is rewritten from it after each change, for people and tools that want the rules in force.

`sig` identifies an ACTIVE incarnation's windows: it changes when a rule is (re)activated or changes what
its windows hold, so the engine starts those windows afresh, and stays put for changes of limit, operator,
aggregator or window length. `epoch` counts CLEAR_STATE_ALL commands; the engine empties its window state
when it rises.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from fraudrules import tables
from fraudrules.config import JobConfig
from fraudrules.rules.codec import from_row, incarnation_sig, to_row
from fraudrules.rules.model import Rule, RuleError


def _history_rows(spark: SparkSession, cfg: JobConfig) -> list[dict]:
    return [r.asDict(recursive=True) for r in tables.read(spark, cfg, "rule_history").collect()]


def _latest(rows: list[dict]) -> dict[int, dict]:
    """The newest version of every rule (control commands are not rules)."""
    out: dict[int, dict] = {}
    for r in rows:
        if r["ruleState"] != "CONTROL" and (r["ruleId"] not in out or out[r["ruleId"]]["version"] < r["version"]):
            out[r["ruleId"]] = r
    return out


def current(spark: SparkSession, cfg: JobConfig) -> dict[int, dict]:
    """The rules in force (any state), by ruleId, from the history."""
    return _latest(_history_rows(spark, cfg))


def history(spark: SparkSession, cfg: JobConfig, rule_id: int) -> list[dict]:
    rows = tables.read(spark, cfg, "rule_history").where(F.col("ruleId") == rule_id).orderBy("version").collect()
    return [r.asDict() for r in rows]


@dataclass
class Plan:
    """What a change set does: the history rows to append, the rules after it, exports it asks for."""

    log: list[dict]
    rows: dict[int, dict]
    epoch: int
    exports: list[dict[int, dict]]


def plan(
    rows: dict[int, dict], epoch: int, changes: list[Rule], now: datetime, author: str, change_id: str | None
) -> Plan:
    """Versions, window signatures and epochs of a change set applied to the rules in force (`rows`)."""
    rows, log, exports = dict(rows), [], []

    def put(rule: Rule, change: str) -> None:
        prev = rows.get(rule.rule_id)
        version = prev["version"] + 1 if prev else 1
        same_windows = (
            prev and prev["ruleState"] == "ACTIVE" and prev["sig"] == incarnation_sig(rule, prev["activeSince"])
        )
        active_since = prev["activeSince"] if same_windows and rule.state == "ACTIVE" else version
        row = to_row(rule, version, active_since, epoch, now, author)
        rows[rule.rule_id] = {**row, "change": change, "changeId": change_id}
        log.append(rows[rule.rule_id])

    for rule in changes:
        if rule.state != "CONTROL":
            prev = rows.get(rule.rule_id)
            put(rule, "create" if not prev else "state" if prev["ruleState"] != rule.state else "update")
            continue
        if rule.control_type == "CLEAR_STATE_ALL":
            epoch += 1
        elif rule.control_type == "DELETE_RULES_ALL":
            for row in list(rows.values()):
                if row["ruleState"] != "DELETE":
                    put(replace(from_row(row), state="DELETE"), "control:DELETE_RULES_ALL")
        elif rule.control_type == "EXPORT_RULES_CURRENT":
            exports.append(dict(rows))
        log.append(_control_row(rule, epoch, change_id, now, author))
    return Plan(log, rows, epoch, exports)


def apply(
    spark: SparkSession, cfg: JobConfig, changes: list[Rule], author: str = "cli", change_id: str | None = None
) -> list[dict]:
    """Apply rule changes and control commands in order; returns the changed rules' rows.

    One append to `rule_history` (what the running job sees), then `rules` is rewritten. With a `change_id`
    the call is idempotent: a change set already in the history is skipped.
    """
    past = _history_rows(spark, cfg)
    if change_id and any(r["changeId"] == change_id for r in past):
        return []
    epoch = max((r["epoch"] or 0 for r in past), default=0)
    p = plan(_latest(past), epoch, changes, datetime.now(timezone.utc), author, change_id)
    if p.log:
        tables.append(spark.createDataFrame(p.log, tables.SCHEMAS["rule_history"]), cfg, "rule_history")
        latest = [{**r, "epoch": p.epoch} for r in p.rows.values()]
        tables.overwrite(spark.createDataFrame(latest, tables.SCHEMAS["rules"]), cfg, "rules")
    for snapshot in p.exports:
        export_rows(spark, cfg, snapshot)
    return [r for r in p.log if r["ruleState"] != "CONTROL"]


def _control_row(rule: Rule, epoch: int, change_id: str | None, now: datetime, author: str) -> dict:
    return {
        "ruleId": rule.rule_id,
        "version": 0,
        "ruleState": "CONTROL",
        "ruleJson": json.dumps(rule.to_json()),
        "epoch": epoch,
        "change": f"control:{rule.control_type}",
        "changeId": change_id,
        "updatedAt": now,
        "updatedBy": author,
    }


def upsert(spark: SparkSession, cfg: JobConfig, rules: list[Rule], author: str = "cli") -> list[dict]:
    return apply(spark, cfg, rules, author)


def set_state(spark: SparkSession, cfg: JobConfig, rule_id: int, state: str, author: str = "cli") -> dict:
    """Pause, activate or delete an existing rule (a new version with the same parameters)."""
    row = current(spark, cfg).get(rule_id)
    if row is None:
        raise RuleError(rule_id, ["no such rule"])
    return apply(spark, cfg, [replace(from_row(row), state=state)], author)[0]


def export_current(spark: SparkSession, cfg: JobConfig) -> str:
    """Snapshot the rules in force into the rules_export table and a JSON file; returns the file path."""
    return export_rows(spark, cfg, current(spark, cfg))


def export_rows(spark: SparkSession, cfg: JobConfig, in_force: dict[int, dict]) -> str:
    export_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    rows = [r for r in in_force.values() if r["ruleState"] != "DELETE"]
    exported_at = datetime.now(timezone.utc)
    snapshot = [
        {
            "exportId": export_id,
            "ruleId": r["ruleId"],
            "version": r["version"],
            "ruleState": r["ruleState"],
            "ruleJson": r["ruleJson"],
            "exportedAt": exported_at,
        }
        for r in rows
    ]
    if snapshot:
        tables.append(spark.createDataFrame(snapshot, tables.SCHEMAS["rules_export"]), cfg, "rules_export")
    folder = os.path.join(cfg.data_dir, "exports")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rules-{export_id}.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump([json.loads(r["ruleJson"]) for r in sorted(rows, key=lambda r: r["ruleId"])], fh, indent=2)
    return path
