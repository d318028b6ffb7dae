"""The rules Delta table: current rules (one row per ruleId) plus the full change history.

Every change gets the next version of its rule. `sig` identifies an ACTIVE incarnation's windows:
it changes when a rule is (re)activated or changes what its windows hold, so the engine starts those
windows afresh, and stays put for changes of limit, operator, aggregator or window length.
`epoch` counts CLEAR_STATE_ALL commands; the engine empties its window state when it rises.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import replace
from datetime import datetime, timezone

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from fraudrules import tables
from fraudrules.config import JobConfig
from fraudrules.rules.codec import from_row, incarnation_sig, to_row
from fraudrules.rules.model import Rule, RuleError


def current(spark: SparkSession, cfg: JobConfig) -> dict[int, dict]:
    return {row.ruleId: row.asDict(recursive=True) for row in tables.read(spark, cfg, "rules").collect()}


def history(spark: SparkSession, cfg: JobConfig, rule_id: int) -> list[dict]:
    rows = tables.read(spark, cfg, "rule_history").where(F.col("ruleId") == rule_id).orderBy("version").collect()
    return [r.asDict() for r in rows]


def apply(
    spark: SparkSession, cfg: JobConfig, changes: list[Rule], author: str = "cli", change_id: str | None = None
) -> list[dict]:
    """Apply rule changes and control commands in order; returns the changed rows.

    With a `change_id` the call is idempotent: a change set already in the history is skipped.
    """
    if change_id and tables.read(spark, cfg, "rule_history").where(F.col("changeId") == change_id).limit(1).count():
        return []
    rows = current(spark, cfg)
    epoch = max((r["epoch"] for r in rows.values()), default=0)
    now = datetime.now(timezone.utc)
    changed: dict[int, dict] = {}
    log: list[dict] = []

    def put(rule: Rule, change: str) -> None:
        prev = rows.get(rule.rule_id)
        version = prev["version"] + 1 if prev else 1
        same_windows = (
            prev and prev["ruleState"] == "ACTIVE" and prev["sig"] == incarnation_sig(rule, prev["activeSince"])
        )
        active_since = prev["activeSince"] if same_windows and rule.state == "ACTIVE" else version
        rows[rule.rule_id] = changed[rule.rule_id] = to_row(rule, version, active_since, epoch, now, author)
        log.append(
            {
                "ruleId": rule.rule_id,
                "version": version,
                "ruleState": rule.state,
                "ruleJson": rows[rule.rule_id]["ruleJson"],
                "change": change,
                "changeId": change_id,
                "updatedAt": now,
                "updatedBy": author,
            }
        )

    for rule in changes:
        if rule.state != "CONTROL":
            prev = rows.get(rule.rule_id)
            put(rule, "create" if not prev else "state" if prev["ruleState"] != rule.state else "update")
        elif rule.control_type == "CLEAR_STATE_ALL":
            epoch += 1
            for rid, row in rows.items():
                rows[rid] = changed[rid] = {**row, "epoch": epoch}
            log.append(_control_log(rule, change_id, now, author))
        elif rule.control_type == "DELETE_RULES_ALL":
            for row in list(rows.values()):
                if row["ruleState"] != "DELETE":
                    put(replace(from_row(row), state="DELETE"), "control:DELETE_RULES_ALL")
            log.append(_control_log(rule, change_id, now, author))
        elif rule.control_type == "EXPORT_RULES_CURRENT":
            _write_rules(spark, cfg, changed)
            changed.clear()
            export_current(spark, cfg)
            log.append(_control_log(rule, change_id, now, author))
    _write_rules(spark, cfg, changed)
    if log:
        tables.append(spark.createDataFrame(log, tables.SCHEMAS["rule_history"]), cfg, "rule_history")
    return list(changed.values())


def _control_log(rule: Rule, change_id: str | None, now: datetime, author: str) -> dict:
    return {
        "ruleId": rule.rule_id,
        "version": 0,
        "ruleState": "CONTROL",
        "ruleJson": json.dumps(rule.to_json()),
        "change": f"control:{rule.control_type}",
        "changeId": change_id,
        "updatedAt": now,
        "updatedBy": author,
    }


def _write_rules(spark: SparkSession, cfg: JobConfig, changed: dict[int, dict]) -> None:
    if not changed:
        return
    updates = spark.createDataFrame(list(changed.values()), tables.SCHEMAS["rules"])
    (
        tables.delta(spark, cfg, "rules")
        .alias("r")
        .merge(updates.alias("u"), "r.ruleId = u.ruleId")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )


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
    export_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    rows = [r for r in current(spark, cfg).values() if r["ruleState"] != "DELETE"]
    snapshot = [
        {
            "exportId": export_id,
            "ruleId": r["ruleId"],
            "version": r["version"],
            "ruleState": r["ruleState"],
            "ruleJson": r["ruleJson"],
            "exportedAt": datetime.now(timezone.utc),
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
