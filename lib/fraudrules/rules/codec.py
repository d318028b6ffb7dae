"""The one codec of a rule crossing the Python/SQL boundary, each form with its writers and its reader.

- **table row**: a `Rule` as a row of the rules Delta table (`to_row`) and back (`from_row`). The row's `sig`
  names an ACTIVE incarnation's windows (`incarnation_sig`): it changes when the rule is (re)activated or
  changes what its windows hold, and the engine then starts those windows afresh.
- **spec**: a window rule's evaluation parameters, carried by every keyed row as one "|"-joined string in
  `SPEC_FIELDS` order (one string column instead of seven: conversion to pandas costs per column and per
  string). Written by keying in SQL (`spec_column`) or in Python (`encode_spec`); read by `decode_spec`.
- **active window rules**: "ruleId:sig:windowMs,..." — the ACTIVE window rules as a shard last saw them,
  which is what decides what its retained events are kept for (`active_windows_column`, `encode_active_windows`
  ⇄ `decode_active_windows`).
- **active login rules**: "ruleId:windowMs,..." for the login detector (`active_logins_column`,
  `encode_active_logins` ⇄ `decode_active_logins`).

The formats are part of the checkpointed state (the processors keep the active strings): change them only
together with a state migration.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from functools import lru_cache
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from fraudrules.rules.model import NUMERIC_FIELDS, Rule, parse_rule

SPEC_FIELDS = (
    "version",
    "aggregateFieldName",
    "aggregatorFunctionType",
    "limitOperatorType",
    "limit",
    "windowMs",
    "distinct",
)
SPEC_SEP = "|"
ITEM_SEP, PART_SEP = ",", ":"  # of the active strings


# ------------------------------------------------------------------------------------------ table row


def incarnation_sig(rule: Rule, active_since: int) -> int:
    """The rules table's `sig`: what retained events depend on, for the incarnation active since that version."""
    return zlib.crc32(f"{rule.sig}:{active_since}".encode())


def to_row(rule: Rule, version: int, active_since: int, epoch: int, now: datetime, author: str) -> dict[str, Any]:
    """A rule as a row of the rules table (`tables.SCHEMAS["rules"]`)."""
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


def from_row(row: Mapping[str, Any]) -> Rule:
    """The rule a rules-table (or rule_history) row holds, with its version."""
    return parse_rule(json.loads(row["ruleJson"])).with_version(row["version"])


# ------------------------------------------------------------------------------------------ spec


def spec_column() -> Column:
    """The keyed row's `spec`, from the rules-table columns behind SPEC_FIELDS ("distinct" as 0/1)."""
    parts = [F.col(c).cast("string") for c in SPEC_FIELDS[:-1]]
    parts.append((F.size("unique") > 0).cast("int").cast("string"))
    return F.concat_ws(SPEC_SEP, *parts)


def encode_spec(rule: Rule) -> str:
    """A rule's `spec` as `spec_column` writes it."""
    distinct = int(bool(rule.unique))
    parts = (rule.version, rule.field, rule.aggregator, rule.operator, rule.limit, rule.window_ms, distinct)
    return SPEC_SEP.join(str(p) for p in parts)


@lru_cache(maxsize=4096)
def decode_spec(rule_id: int, spec: str) -> Rule:
    """The evaluation parameters a keyed row carries, as a Rule (grouping and filter are already applied)."""
    version, field, aggregator, operator, limit, window_ms, distinct = spec.split(SPEC_SEP)
    return Rule(
        rule_id=rule_id,
        state="ACTIVE",
        field=field,
        aggregator=aggregator,
        operator=operator,
        limit=Decimal(limit),
        window_minutes=int(window_ms) // 60_000,
        version=int(version),
        unique=("distinct",) if distinct == "1" else (),
    )


# ------------------------------------------------------------------------------------------ active sets


def _joined(*columns: str) -> Column:
    """Aggregate: every row's columns joined with ":", the rows joined with ","."""
    return F.array_join(F.collect_list(F.concat_ws(PART_SEP, *columns)), ITEM_SEP)


def active_windows_column() -> Column:
    """Aggregate over the ACTIVE window rules: their "ruleId:sig:windowMs,..." string."""
    return _joined("ruleId", "sig", "windowMs")


def encode_active_windows(rules: Iterable[tuple[int, int, int]]) -> str:
    """(ruleId, sig, windowMs) triples as `active_windows_column` writes them."""
    return ITEM_SEP.join(PART_SEP.join(str(x) for x in triple) for triple in rules)


def decode_active_windows(text: str) -> dict[int, tuple[int, int]]:
    """{ruleId: (sig, windowMs)} from "ruleId:sig:windowMs,..."."""
    parts = (item.split(PART_SEP) for item in text.split(ITEM_SEP) if item)
    return {int(rid): (int(sig), int(window)) for rid, sig, window in parts}


def active_logins_column() -> Column:
    """Aggregate over the ACTIVE login rules: their "ruleId:windowMs,..." string."""
    return _joined("ruleId", "windowMs")


def encode_active_logins(windows: Mapping[int, int]) -> str:
    """{ruleId: windowMs} as `active_logins_column` writes it."""
    return ITEM_SEP.join(f"{rule}{PART_SEP}{window}" for rule, window in windows.items())


def decode_active_logins(text: str) -> dict[int, int]:
    """{ruleId: windowMs} from "ruleId:windowMs,..."."""
    return {int(r): int(w) for r, w in (item.split(PART_SEP) for item in text.split(ITEM_SEP) if item)}
