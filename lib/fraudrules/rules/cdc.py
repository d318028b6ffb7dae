"""Rules from a rules table that someone else owns, as row changes: Debezium change events of a database's table on
the rules topic (`rules_format="debezium"`), or the Change Data Feed of a Delta table that admins edit with SQL
(`rules_table`).

A Debezium message is one change of one row, in Debezium's JSON envelope, with or without the converter's `schema`
part (`{"schema": ..., "payload": {...}}` or the payload alone). The payload's `op` says what happened to the row:
`c` (insert), `u` (update) and `r` (a snapshot read) put the row's new image (`after`) as the rule; `d` (delete)
deletes the rule its old image (`before`, at least the primary key) names. A message without a value (Debezium's
tombstone after a delete) is skipped. A Delta change feed row (`table_change`) is the same with Delta's names:
`insert` and `update_postimage` put the row, `delete` deletes its rule (`update_preimage` rows never reach here).

A row becomes a rule through a `ColumnMapping` (rule field -> column; identity by default): the rule JSON that
`rules put` takes, validated by the same code against the job's event schema. A row whose `disabled` column is true
is a paused rule (the seed's "if rule.disabled = true, it is removed"). json/jsonb columns arrive as JSON text and
are decoded; numeric columns must arrive as text or numbers (the connector's `decimal.handling.mode=string` or
`double`, not its default base64 bytes).

Order and idempotence: every change carries its position in its log (`Position`): for Debezium, from
`source.sequence` (`["lastCommitLsn", "lsn"]`), else `source.lsn`, else the payload's `ts_ms` and the message's
topic offset; for a Delta table, the commit's version. The position goes into the rule_history row's change id
(`change_id`); a change whose position is not after the last one applied to its rule (a redelivered or an older
event, a replayed micro-batch) is a no-op.

Standard library and the rule model only: no Spark (the rules query's sink, `engine/rule_changes.py`, applies the
changes).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from fraudrules.event_schema import EventSchema
from fraudrules.rules.model import LOGIN_FIELDS, WINDOW_FIELDS, Rule, RuleError, parse_rule

# The rule's fields a column may hold (model.py), and `disabled`: true pauses the rule.
RULE_FIELDS = (*WINDOW_FIELDS, *LOGIN_FIELDS)
DISABLED = "disabled"
FIELDS = (*RULE_FIELDS, DISABLED)
JSON_FIELDS = frozenset({"groupingKeyNames", "filter", "unique"})  # may be json/jsonb columns (JSON text)
UPSERT_OPS = ("c", "u", "r")
DELETE_OP = "d"
DEBEZIUM = "debezium"  # the change ids' prefix (`change_set_id`) of each origin
DELTA = "delta"
# A Delta change feed row's `_change_type` as a Debezium op (update_preimage rows are filtered out at the source)
TABLE_OPS = {"insert": "c", "update_postimage": "u", "delete": DELETE_OP}
CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")  # what the change feed adds to a row


class ChangeError(RuleError):
    """A message that is no usable change event (its rule id when known)."""

    def __init__(self, rule_id: object, reason: str):
        super().__init__(rule_id, [reason])


@dataclass(frozen=True)
class ColumnMapping:
    """Which column of the rules table holds each rule field (`rules_columns`: FIELD -> COLUMN); a field not
    named is read from the column of its own name. Columns that no field names (a description, an audit
    timestamp) are ignored."""

    columns: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.columns) - set(FIELDS))
        if unknown:
            raise ValueError(f"rules_columns: {', '.join(unknown)} not a rule field (fields: {', '.join(FIELDS)})")

    def column(self, name: str) -> str:
        return self.columns.get(name, name)

    def rule_id(self, row: Mapping[str, Any]) -> int:
        """The row's rule id; ChangeError when its column holds none."""
        value = row.get(self.column("ruleId"))
        if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
            raise ChangeError(None, f"column {self.column('ruleId')}: {value!r} is not a rule id")
        return int(value)

    def rule_json(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The rule JSON a row holds (null columns left out: the rule's defaults apply); a disabled row is PAUSE,
        a row without a state ACTIVE."""
        out = {f: _decoded(f, row[self.column(f)]) for f in RULE_FIELDS if row.get(self.column(f)) is not None}
        out.setdefault("ruleState", "ACTIVE")
        if row.get(self.column(DISABLED)) in (True, "true", 1):
            out["ruleState"] = "PAUSE"
        return out

    def explained(self, problem: str) -> str:
        """A validation problem naming the column of the field it is about (the first one it names)."""
        found = [(m.start(), f) for f in FIELDS if (m := re.search(rf"\b{f}\b", problem))]
        return f"column {self.column(min(found)[1])}: {problem}" if found else problem


def _decoded(name: str, value: Any) -> Any:
    """A column's value as the rule field takes it: JSON text of a list or object decoded for the list fields."""
    if name in JSON_FIELDS and isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value  # validation names the field
    return value


@dataclass(frozen=True)
class Position:
    """Where a change is in the database's log: `lsn` (commit LSN, LSN; a snapshot read or a first event has no
    commit LSN: its own LSN stands in) or, without one, `ts` (the event's ts_ms, its topic offset)."""

    kind: str
    major: int
    minor: int

    @property
    def token(self) -> str:
        return f"{self.kind}:{self.major}:{self.minor}"

    @classmethod
    def parse(cls, token: str) -> Position:
        kind, major, minor = token.split(":")
        return cls(kind, int(major), int(minor))

    def after(self, other: Position | None) -> bool:
        """Whether this change comes after `other` (the last applied). Positions of different kinds (a connector
        that started or stopped reporting LSNs) do not compare: the change counts as newer."""
        return other is None or other.kind != self.kind or (self.major, self.minor) > (other.major, other.minor)


@dataclass(frozen=True)
class Change:
    """One row change: `op`, the rule id, the row image it carries (`after`; `before` for a delete), its origin
    (DEBEZIUM or DELTA)."""

    op: str
    rule_id: int
    row: Mapping[str, Any]
    position: Position
    origin: str = DEBEZIUM

    @property
    def change_id(self) -> str:
        """The rule_history change id of this change applied alone (`debezium:<ruleId>:lsn:<commitLsn>:<lsn>`)."""
        return change_set_id([self])


def change_set_id(changes: list[Change]) -> str:
    """The rule_history change id of changes applied together (one commit of a rules table; or one change): the
    first one's origin and position, the rules' ids (`delta:3,7:version:12:0`)."""
    first = changes[0]
    return f"{first.origin}:{','.join(str(c.rule_id) for c in changes)}:{first.position.token}"


def decode(value: str, source: str, mapping: ColumnMapping) -> Change | None:
    """The change a message holds; None for a tombstone (no value). `source` names the message
    ("topic-partition:offset" on the rules topic). ChangeError when it is no change event."""
    if not value.strip():
        return None
    try:
        message = json.loads(value)
    except json.JSONDecodeError as err:
        raise ChangeError(None, f"malformed JSON: {err}") from None
    payload = message.get("payload") if isinstance(message, dict) and "schema" in message else message
    if payload is None:
        return None
    if not isinstance(payload, dict) or "op" not in payload:
        raise ChangeError(None, "not a Debezium change event: no op (expected {op, before, after, source, ...})")
    op = payload["op"]
    if op not in (*UPSERT_OPS, DELETE_OP):
        raise ChangeError(None, f"unknown op {op!r} (expected c, u, r or d)")
    image = "before" if op == DELETE_OP else "after"
    row = payload.get(image)
    if not isinstance(row, dict):
        raise ChangeError(None, f"op {op} without the row's {image} image")
    return Change(op, mapping.rule_id(row), row, position(payload, source))


def table_change(value: str, mapping: ColumnMapping) -> Change:
    """The change a Delta change feed row holds: `value` is the row with its change columns (`CHANGE_COLUMNS`) as
    JSON (`sources.table_changes`). ChangeError when its change type or rule id is not usable."""
    row = json.loads(value, parse_float=_plain)
    change_type, version, _ = (row.pop(c, None) for c in CHANGE_COLUMNS)
    if change_type not in TABLE_OPS or not isinstance(version, int):
        raise ChangeError(None, f"not a change feed row: change type {change_type!r}, version {version!r}")
    return Change(TABLE_OPS[change_type], mapping.rule_id(row), row, Position("version", version, 0), DELTA)


def _plain(text: str) -> str:
    """A JSON number with a fraction as exact decimal text without trailing zeros (a DECIMAL(38, 18) column's 500
    arrives as 500.000000000000000000; a limit is text anyway)."""
    return format(Decimal(text).normalize(), "f")


def position(payload: Mapping[str, Any], source: str) -> Position:
    """The change's position: source.sequence, else source.lsn, else ts_ms and the message's offset."""
    meta = payload.get("source") if isinstance(payload.get("source"), dict) else {}
    sequence = _sequence(meta.get("sequence"))
    if sequence is not None:
        return Position("lsn", *sequence)
    if isinstance(meta.get("lsn"), int):
        return Position("lsn", meta["lsn"], meta["lsn"])
    offset = source.rpartition(":")[2]
    return Position("ts", int(payload.get("ts_ms") or 0), int(offset) if offset.isdigit() else 0)


def _sequence(text: Any) -> tuple[int, int] | None:
    """`source.sequence` (a JSON text `["lastCommitLsn", "lsn"]`) as numbers; None when it has no LSN."""
    try:
        commit, lsn = json.loads(text) if isinstance(text, str) else (None, None)
        return (int(commit if commit is not None else lsn), int(lsn)) if lsn is not None else None
    except (ValueError, TypeError):
        return None


def applied_positions(history: Iterable[Mapping[str, Any]]) -> dict[int, Position]:
    """The position of each rule's newest version that a row change made (rule_history rows)."""
    newest: dict[int, tuple[int, Position]] = {}
    for row in history:
        parts = (row.get("changeId") or "").split(":", 2)
        if parts[0] in (DEBEZIUM, DELTA) and len(parts) == 3 and row["version"] > newest.get(row["ruleId"], (0,))[0]:
            newest[row["ruleId"]] = (row["version"], Position.parse(parts[2]))
    return {rule_id: p for rule_id, (_, p) in newest.items()}


def to_rule(change: Change, mapping: ColumnMapping, schema: EventSchema, stored: Rule | None) -> Rule:
    """The rule change a row change makes, validated as `rules put` validates (against the event schema);
    `stored` is the rule in force with that id. RuleError naming the columns when the row is not a valid rule."""
    if change.op == DELETE_OP:
        if stored is None:
            raise RuleError(change.rule_id, ["no such rule"])
        return replace(stored, state="DELETE")
    obj = mapping.rule_json(change.row)
    if str(obj["ruleState"]).upper() == "CONTROL":
        raise RuleError(change.rule_id, [mapping.explained("ruleState CONTROL: control commands are not rows")])
    try:
        return parse_rule(obj, schema)
    except RuleError as err:
        raise RuleError(err.rule_id, [mapping.explained(p) for p in err.problems]) from None
