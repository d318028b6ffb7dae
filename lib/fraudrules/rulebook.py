"""The rules Delta table: current rules (one row per ruleId) plus the full change history.

Every change gets the next version of its rule. `sig` identifies an ACTIVE incarnation's windows:
it changes when a rule is (re)activated or changes what its windows hold, so the engine starts those
windows afresh, and stays put for changes of limit, operator, aggregator or window length.
"""

from __future__ import annotations

import json
import zlib
from datetime import datetime, timezone

from pyspark.sql import SparkSession

from fraudrules import tables
from fraudrules.config import JobConfig
from fraudrules.rules import NUMERIC_FIELDS, Rule


def current(spark: SparkSession, cfg: JobConfig) -> dict[int, dict]:
    return {row.ruleId: row.asDict(recursive=True) for row in tables.read(spark, cfg, "rules").collect()}


def _row(rule: Rule, version: int, active_since: int, now: datetime, author: str) -> dict:
    return {
        "ruleId": rule.rule_id,
        "version": version,
        "ruleState": rule.state,
        "groupingKeyNames": list(rule.grouping_key_names),
        "aggregateFieldName": rule.field,
        "aggregatorFunctionType": rule.aggregator,
        "limitOperatorType": rule.operator,
        "limit": str(rule.limit),
        "windowMinutes": rule.window_minutes,
        "windowMs": rule.window_ms,
        "scale": rule.scale,
        "filter": [
            {"field": c.field, "op": c.op, "numeric": c.field in NUMERIC_FIELDS, "values": list(c.values)}
            for c in rule.filter
        ],
        "unique": list(rule.unique),
        "sig": zlib.crc32(f"{rule.sig}:{active_since}".encode()),
        "activeSince": active_since,
        "ruleJson": json.dumps(rule.to_json()),
        "updatedAt": now,
        "updatedBy": author,
    }


def upsert(spark: SparkSession, cfg: JobConfig, rules: list[Rule], author: str = "cli") -> list[dict]:
    """Apply rule changes in order; returns the new rows. CONTROL rules are commands, not stored here."""
    existing = current(spark, cfg)
    now = datetime.now(timezone.utc)
    rows: dict[int, dict] = {}
    history = []
    for rule in rules:
        prev = rows.get(rule.rule_id) or existing.get(rule.rule_id)
        version = (prev["version"] + 1) if prev else 1
        same_windows = (
            prev
            and prev["ruleState"] == "ACTIVE"
            and prev["sig"] == zlib.crc32(f"{rule.sig}:{prev['activeSince']}".encode())
        )
        active_since = prev["activeSince"] if same_windows and rule.state == "ACTIVE" else version
        row = _row(rule, version, active_since, now, author)
        rows[rule.rule_id] = row
        change = "create" if not prev else ("state" if prev["ruleState"] != rule.state else "update")
        history.append(
            {
                "ruleId": rule.rule_id,
                "version": version,
                "ruleState": rule.state,
                "ruleJson": row["ruleJson"],
                "change": change,
                "updatedAt": now,
                "updatedBy": author,
            }
        )
    if not rows:
        return []
    updates = spark.createDataFrame(list(rows.values()), tables.SCHEMAS["rules"])
    (
        tables.delta(spark, cfg, "rules")
        .alias("r")
        .merge(updates.alias("u"), "r.ruleId = u.ruleId")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    tables.append(spark.createDataFrame(history, tables.SCHEMAS["rule_history"]), cfg, "rule_history")
    return list(rows.values())
