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

from fraudrules import event_schema, tables
from fraudrules.config import JobConfig
from fraudrules.event_schema import EventSchema
from fraudrules.rules import table as rules_table
from fraudrules.rules.cdc import ColumnMapping
from fraudrules.rules.codec import from_row, incarnation_sig, to_row
from fraudrules.rules.model import EVALUATED, Rule, RuleError, resolve, validate


def history_rows(spark: SparkSession, cfg: JobConfig) -> list[dict]:
    """Every row of rule_history (no order)."""
    return tables.writer(spark, cfg).arrow("rule_history").to_pylist()


def latest(rows: list[dict]) -> dict[int, dict]:
    """The newest version of every rule (control commands are not rules)."""
    out: dict[int, dict] = {}
    for r in rows:
        if r["ruleState"] != "CONTROL" and (r["ruleId"] not in out or out[r["ruleId"]]["version"] < r["version"]):
            out[r["ruleId"]] = r
    return out


def current(spark: SparkSession, cfg: JobConfig) -> dict[int, dict]:
    """The rules in force (any state), by ruleId, from the history."""
    return latest(history_rows(spark, cfg))


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
    rows: dict[int, dict],
    epoch: int,
    changes: list[Rule],
    now: datetime,
    author: str,
    change_id: str | None,
    label: str | None = None,
    schema: EventSchema | None = None,
) -> Plan:
    """Versions, window signatures and epochs of a change set applied to the rules in force (`rows`), the rules
    resolved against the event `schema`.

    An evaluated rule (ACTIVE or SHADOW) that stays evaluated and keeps what its windows hold keeps its
    windows, also across ACTIVE <-> SHADOW. `label`, when given, is every history row's `change`.
    """
    rows, log, exports = dict(rows), [], []

    def put(rule: Rule, change: str) -> None:
        prev = rows.get(rule.rule_id)
        version = prev["version"] + 1 if prev else 1
        same_windows = (
            prev and prev["ruleState"] in EVALUATED and prev["sig"] == incarnation_sig(rule, prev["activeSince"])
        )
        active_since = prev["activeSince"] if same_windows and rule.evaluated else version
        row = to_row(rule, version, active_since, epoch, now, author)
        rows[rule.rule_id] = {**row, "change": label or change, "changeId": change_id}
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
                    put(replace(from_row(row, schema), state="DELETE"), "control:DELETE_RULES_ALL")
        elif rule.control_type == "EXPORT_RULES_CURRENT":
            exports.append(dict(rows))
        log.append(_control_row(rule, epoch, change_id, now, author))
    return Plan(log, rows, epoch, exports)


def apply(
    spark: SparkSession,
    cfg: JobConfig,
    changes: list[Rule],
    author: str = "cli",
    change_id: str | None = None,
    label: str | None = None,
) -> list[dict]:
    """Apply rule changes and control commands in order; returns the changed rules' rows. A rule to be
    evaluated (ACTIVE or SHADOW) must name only fields of the job's event schema (RuleError otherwise).

    One append to `rule_history` (what the running job sees), then `rules` is rewritten. The append is one
    file in one commit, so the job's rule stream never splits a change set across micro-batches: every
    shard applies all of it at the same batch boundary. With a `change_id` the call is idempotent: a change
    set already in the history is skipped.
    """
    p = _planned(spark, cfg, changes, author, change_id, label)
    if p is None:
        return []
    if p.log:
        writer = tables.writer(spark, cfg)
        writer.append("rule_history", p.log)
        writer.overwrite("rules", [{**r, "epoch": p.epoch} for r in p.rows.values()])
    for snapshot in p.exports:
        export_rows(spark, cfg, snapshot)
    return [r for r in p.log if r["ruleState"] != "CONTROL"]


def _planned(
    spark: SparkSession, cfg: JobConfig, changes: list[Rule], author: str, change_id: str | None, label: str | None
) -> Plan | None:
    """The change set's plan against the history now, its rules validated (a RuleError stops the whole change
    set); None when the history has its `change_id` already."""
    schema = event_schema.for_job(cfg)
    resolved = [validate(r, schema) if r.evaluated else resolve(r, schema) for r in changes]
    past = history_rows(spark, cfg)
    if change_id and any(r["changeId"] == change_id for r in past):
        return None
    epoch = max((r["epoch"] or 0 for r in past), default=0)
    return plan(latest(past), epoch, resolved, datetime.now(timezone.utc), author, change_id, label, schema)


def submit(
    spark: SparkSession, cfg: JobConfig, changes: list[Rule], author: str = "cli", label: str | None = None
) -> list[dict]:
    """A change set from people and tools (the CLI, the notebooks, `fraudrules run --rules`): applied, or, when the
    job's rules come from a rules table (`cfg.rules_table`), written to that table in one commit, which the job
    applies through the table's change feed, so that the table stays the one definition of the rules. Returns the
    changed rules' rows; written to a table, the versions they will get (the plan against the history now).
    Control commands are not rows: they are applied (DELETE_RULES_ALL is refused with a table: delete its rows)."""
    if not cfg.rules_table or all(r.state == "CONTROL" for r in changes):
        if cfg.rules_table and any(r.control_type == "DELETE_RULES_ALL" for r in changes):
            raise RuleError(None, [f"DELETE_RULES_ALL: the rules are rows of {cfg.rules_table}; delete those"])
        return apply(spark, cfg, changes, author, label=label)
    if any(r.state == "CONTROL" for r in changes):
        raise RuleError(None, ["control commands are not rows of the rules table: send them on their own"])
    p = _planned(spark, cfg, changes, author, None, label)
    if p is None:  # only with a change id
        return []
    rules_table.write(spark, cfg.rules_table, [from_row(r) for r in p.log], ColumnMapping(cfg.rules_columns))
    return p.log


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
    return submit(spark, cfg, rules, author)


def set_state(spark: SparkSession, cfg: JobConfig, rule_id: int, state: str, author: str = "cli") -> dict:
    """Pause, activate or delete an existing rule (a new version with the same parameters)."""
    row = current(spark, cfg).get(rule_id)
    if row is None:
        raise RuleError(rule_id, ["no such rule"])
    rule = from_row(row, event_schema.for_job(cfg))
    if rule.state == "DELETE" and state != "DELETE":  # a deleted rule comes back only as a definition, on purpose
        raise RuleError(rule_id, ["is deleted: `rules put` its definition again to bring it back"])
    if state == "ACTIVE" and rule.shadow_of is not None:
        raise RuleError(rule_id, [f"it shadows rule {rule.shadow_of}: `rules promote {rule_id}` replaces that rule"])
    return submit(spark, cfg, [replace(rule, state=state)], author)[0]


# ------------------------------------------------------------------------------------------ shadow rules


def shadow_changes(rows: dict[int, dict], candidates: list[Rule]) -> list[Rule]:
    """Candidates as SHADOW rules beside the rules in force; RuleError if one would take over a live rule.

    A candidate's own id must not be an ACTIVE rule (that would silence it): give it a new id and name the
    live rule in `shadowOf`, which must exist and must not be a shadow rule itself.
    """
    out = []
    for rule in candidates:
        problems = []
        if rule.state == "CONTROL":
            problems.append("a control command cannot be a shadow rule")
        prev = rows.get(rule.rule_id)
        if prev is not None and prev["ruleState"] == "ACTIVE":
            problems.append("is ACTIVE: shadow a candidate under a new ruleId with shadowOf naming this rule")
        if rule.shadow_of is not None:
            live = rows.get(rule.shadow_of)
            if live is None:
                problems.append(f"shadowOf {rule.shadow_of}: no such rule")
            elif from_row(live).shadow_of is not None or live["ruleState"] == "SHADOW":
                problems.append(f"shadowOf {rule.shadow_of}: that is a shadow rule itself")
        if problems:
            raise RuleError(rule.rule_id, problems)
        out.append(replace(rule, state="SHADOW"))
    return out


def promotion(rows: dict[int, dict], shadow_id: int) -> list[Rule]:
    """The change set that promotes a SHADOW rule: one change set, so one rule_history commit and one
    rules-table rewrite, applied by every shard at the same micro-batch boundary.

    With `shadowOf: L`, rule L gets one new version with the shadow's definition (ACTIVE, same ruleId L, so
    alerts and their consumers keep the rule's identity) and the shadow rule is deleted (its state freed):
    every transaction is evaluated by L's old version up to the switch and by the new one from it, never by
    both, never by neither. L's windows carry on when the definition keeps what they hold (same keys,
    aggregated field and distinct fields; e.g. a new limit), else they start afresh like any such change.
    Without `shadowOf` the shadow rule itself becomes ACTIVE and keeps its windows.
    """
    row = rows.get(shadow_id)
    if row is None:
        raise RuleError(shadow_id, ["no such rule"])
    if row["ruleState"] != "SHADOW":
        raise RuleError(shadow_id, [f"is {row['ruleState']}, not SHADOW: only a shadow rule can be promoted"])
    shadow = from_row(row)
    if shadow.shadow_of is None:
        return [replace(shadow, state="ACTIVE")]
    live = rows.get(shadow.shadow_of)
    if live is not None and live["ruleState"] == "SHADOW":
        raise RuleError(shadow_id, [f"shadowOf {shadow.shadow_of} is a shadow rule itself"])
    return [
        replace(shadow, rule_id=shadow.shadow_of, state="ACTIVE", shadow_of=None),
        replace(shadow, state="DELETE"),
    ]


def shadow(spark: SparkSession, cfg: JobConfig, candidates: list[Rule], author: str = "cli") -> list[dict]:
    """Put candidate rules in SHADOW (see `shadow_changes`); returns their rows."""
    return submit(spark, cfg, shadow_changes(current(spark, cfg), candidates), author)


def promote(spark: SparkSession, cfg: JobConfig, shadow_id: int, author: str = "cli") -> list[dict]:
    """Promote a SHADOW rule (see `promotion`); returns the changed rows, the promoted version first."""
    changes = promotion(current(spark, cfg), shadow_id)
    return submit(spark, cfg, changes, author, label=f"promote:{shadow_id}")


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
        tables.writer(spark, cfg).append("rules_export", snapshot)
    folder = os.path.join(cfg.data_dir, "exports")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rules-{export_id}.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump([json.loads(r["ruleJson"]) for r in sorted(rows, key=lambda r: r["ruleId"])], fh, indent=2)
    return path
