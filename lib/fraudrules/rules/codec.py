"""The one codec of a rule crossing the Python/SQL boundary, each form with its writer and its reader.

- **table row**: a `Rule` as a row of the rules and rule_history Delta tables (`to_row`) and back
  (`from_row`). The row's `sig` names an ACTIVE incarnation's windows (`incarnation_sig`): it changes when
  the rule is (re)activated or changes what its windows hold, and the engine then starts those windows
  afresh.
- **rule change**: a rule_history row as the stateful stages receive it, beside the events: one JSON text
  column `RULE_CHANGE` with `RULE_FIELDS` (null on event rows; one column keeps event rows narrow). Written
  in SQL by `change_column`, in Python by `encode_change`; read by `decode_change`.

The shards keep the rules they hold as `engine.ruleset.RuleSet` JSON: a change of these forms needs a state
migration.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from fraudrules.event_schema import EventSchema
from fraudrules.rules.model import Rule, stored_rule

RULE_CHANGE = "ruleChange"
RULE_FIELDS = ("ruleId", "version", "ruleState", "ruleJson", "sig", "epoch")


# ------------------------------------------------------------------------------------------ table row


def incarnation_sig(rule: Rule, active_since: int) -> int:
    """The rules table's `sig`: what retained events depend on, for the incarnation active since that version."""
    return zlib.crc32(f"{rule.sig}:{active_since}".encode())


def to_row(rule: Rule, version: int, active_since: int, epoch: int, now: datetime, author: str) -> dict[str, Any]:
    """A rule as a row of the rules table (`tables.SCHEMAS["rules"]`; rule_history adds the change)."""
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
        # every comparison of the filter, for SQL and people (its AND/OR/NOT structure is in ruleJson)
        "filter": [
            {"field": c.field, "op": c.op, "numeric": c.scale is not None, "values": list(c.values)}
            for t in rule.filter
            for c in t.leaves()
        ],
        "unique": list(rule.unique),
        "ruleType": rule.rule_type,
        "minFailures": rule.min_failures,
        "minDistinctIps": rule.min_distinct_ips,
        "sig": incarnation_sig(rule, active_since),
        "activeSince": active_since,
        "epoch": epoch,
        "ruleJson": json.dumps(rule.to_json()),
        "updatedAt": now,
        "updatedBy": author,
    }


def from_row(row: Mapping[str, Any], schema: EventSchema | None = None) -> Rule:
    """The rule a rules-table (or rule_history) row holds, with its version, resolved against `schema`."""
    return stored_rule(json.loads(row["ruleJson"]), schema).with_version(row["version"])


# ------------------------------------------------------------------------------------------ rule change


def change_column() -> Column:
    """A rule_history row's `RULE_CHANGE` text (SQL)."""
    return F.to_json(F.struct(*RULE_FIELDS)).alias(RULE_CHANGE)


def encode_change(row: Mapping[str, Any]) -> str:
    """A rule_history row's `RULE_CHANGE` text, as `change_column` writes it."""
    return json.dumps({f: row.get(f) for f in RULE_FIELDS}, separators=(",", ":"))


def decode_change(text: str) -> dict[str, Any]:
    return json.loads(text)
