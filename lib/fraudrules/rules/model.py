"""Rules as validated data: the reference demo's rule schema, extended with filters and distinct counts.

A rule arrives as a JSON object (numbers may be JSON numbers or strings). `parse_rule` turns it into
an immutable `Rule` or raises `RuleError` naming the rule and every problem found.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import Any

# Transaction fields a rule may name, with the decimal scale of the numeric ones.
NUMERIC_FIELDS: dict[str, int] = {
    "transactionId": 0,
    "eventTime": 0,
    "payeeId": 0,
    "beneficiaryId": 0,
    "paymentAmount": 2,
    "ingestionTimestamp": 0,
}
TEXT_FIELDS = frozenset({"paymentType"})
PAYMENT_TYPES = ("CSH", "CRD")  # the engine carries paymentType as its position here
TRANSACTION_FIELDS = frozenset(NUMERIC_FIELDS) | TEXT_FIELDS

LOGIN_RULE = "LOGIN_ANOMALY"
COUNT_FIELD = "COUNT_FLINK"
RESET_FIELD = "COUNT_WITH_RESET_FLINK"
COUNT_FIELDS = frozenset({COUNT_FIELD, RESET_FIELD})

STATES = ("ACTIVE", "SHADOW", "PAUSE", "DELETE", "CONTROL")
# States whose rules are keyed and evaluated: a SHADOW rule exactly like an ACTIVE one, its hits go to
# `shadow_alerts` instead of `alerts` (and are never published).
EVALUATED = ("ACTIVE", "SHADOW")
AGGREGATORS = ("SUM", "AVG", "MIN", "MAX")
OPERATORS = ("EQUAL", "NOT_EQUAL", "GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL")
CONTROL_TYPES = ("CLEAR_STATE_ALL", "DELETE_RULES_ALL", "EXPORT_RULES_CURRENT")
FILTER_OPS = ("EQ", "NE", "GT", "GE", "LT", "LE", "IN", "NOT_IN")


class RuleError(ValueError):
    """A rule that cannot be used; `problems` lists every reason."""

    def __init__(self, rule_id: object, problems: list[str]):
        self.rule_id = rule_id
        self.problems = problems
        super().__init__(f"rule {rule_id}: " + "; ".join(problems))


@dataclass(frozen=True)
class Condition:
    """One filter term: `field op value` (or `field IN values`). Declarative, never evaluated code."""

    field: str
    op: str
    values: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        if self.op in ("IN", "NOT_IN"):
            return {"field": self.field, "op": self.op, "values": list(self.values)}
        return {"field": self.field, "op": self.op, "value": self.values[0]}


@dataclass(frozen=True)
class Rule:
    rule_id: int
    state: str
    grouping_key_names: tuple[str, ...] = ()
    field: str = COUNT_FIELD
    aggregator: str = "SUM"
    operator: str = "GREATER"
    limit: Decimal = Decimal(0)
    window_minutes: int = 1
    control_type: str | None = None
    filter: tuple[Condition, ...] = ()
    unique: tuple[str, ...] = ()
    version: int = 0
    rule_type: str = "WINDOW"  # or LOGIN_ANOMALY (seed 000's detector)
    min_failures: int = 3
    min_distinct_ips: int = 2
    shadow_of: int | None = None  # a SHADOW rule's live rule (the one `rules promote` replaces), if any
    extra: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, hash=False)

    @property
    def evaluated(self) -> bool:
        """Keyed and evaluated (ACTIVE or SHADOW)."""
        return self.state in EVALUATED

    @property
    def window_ms(self) -> int:
        return self.window_minutes * 60_000

    @property
    def scale(self) -> int:
        """Decimal places of the aggregated values (0 for counts)."""
        return 0 if self.field in COUNT_FIELDS else NUMERIC_FIELDS[self.field]

    @property
    def limit_fraction(self) -> tuple[int, int]:
        """The limit as (n, e) with limit == n / 10**e exactly."""
        sign, digits, exp = self.limit.as_tuple()
        n = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        if isinstance(exp, int) and exp >= 0:
            return n * 10**exp, 0
        return n, -int(exp)

    @property
    def sig(self) -> int:
        """Signature of what retained events depend on; a change starts the rule's windows afresh."""
        basis = json.dumps([self.rule_type, list(self.grouping_key_names), self.field, list(self.unique)])
        return zlib.crc32(basis.encode())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ruleId": self.rule_id, "ruleState": self.state}
        if self.state == "CONTROL":
            out["controlType"] = self.control_type
            return out
        if self.shadow_of is not None:
            out["shadowOf"] = self.shadow_of
        if self.rule_type == LOGIN_RULE:
            out.update(
                ruleType=LOGIN_RULE,
                minFailures=self.min_failures,
                minDistinctIps=self.min_distinct_ips,
                windowMinutes=self.window_minutes,
            )
            return out
        out.update(
            groupingKeyNames=list(self.grouping_key_names),
            aggregateFieldName=self.field,
            aggregatorFunctionType=self.aggregator,
            limitOperatorType=self.operator,
            limit=str(self.limit),
            windowMinutes=self.window_minutes,
        )
        if self.filter:
            out["filter"] = [c.to_json() for c in self.filter]
        if self.unique:
            out["unique"] = list(self.unique)
        return out

    def with_version(self, version: int) -> Rule:
        return replace(self, version=version)


def _as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, int):
        return value
    d = Decimal(str(value).strip())
    if d != d.to_integral_value():
        raise ValueError
    return int(d)


def _as_decimal(value: Any) -> Decimal:
    if isinstance(value, bool) or value is None:
        raise ValueError
    d = Decimal(str(value).strip())
    if not d.is_finite():
        raise ValueError
    return d


def _enum(obj: dict[str, Any], name: str, allowed: Iterable[str], problems: list[str]) -> str | None:
    value = obj.get(name)
    if value is None:
        problems.append(f"missing {name}")
        return None
    text = str(value).strip().upper()
    if text not in allowed:
        problems.append(f"{name} {value!r} is not one of {', '.join(allowed)}")
        return None
    return text


def _conditions(raw: Any, problems: list[str]) -> tuple[Condition, ...]:
    if raw is None:
        return ()
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list):
        problems.append("filter must be a list of {field, op, value|values} objects")
        return ()
    out = []
    for term in raw:
        if not isinstance(term, dict):
            problems.append(f"filter term {term!r} is not an object")
            continue
        name, op = term.get("field"), str(term.get("op", "")).upper()
        if name not in TRANSACTION_FIELDS:
            problems.append(f"filter on unknown field {name!r}")
            continue
        if op not in FILTER_OPS:
            problems.append(f"filter op {term.get('op')!r} is not one of {', '.join(FILTER_OPS)}")
            continue
        if op in ("IN", "NOT_IN"):
            values = term.get("values")
            if not isinstance(values, list) or not values:
                problems.append(f"filter {op} on {name} needs a non-empty list 'values'")
                continue
            texts = tuple(str(v) for v in values)
        else:
            if "value" not in term or term["value"] is None:
                problems.append(f"filter {op} on {name} needs a 'value'")
                continue
            texts = (str(term["value"]),)
        if op in ("GT", "GE", "LT", "LE") or name in NUMERIC_FIELDS:
            try:
                for v in texts:
                    _as_decimal(v)
            except (InvalidOperation, ValueError):
                problems.append(f"filter {op} on {name} needs numeric values, got {list(texts)}")
                continue
            if name not in NUMERIC_FIELDS:
                problems.append(f"filter {op} needs a numeric field, {name} is text")
                continue
        out.append(Condition(name, op, texts))
    return tuple(out)


def _names(obj: dict[str, Any], key: str, problems: list[str], required: bool) -> tuple[str, ...]:
    raw = obj.get(key)
    if raw is None:
        if required:
            problems.append(f"missing {key}")
        return ()
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        problems.append(f"{key} must be a list of field names")
        return ()
    unknown = [n for n in raw if n not in TRANSACTION_FIELDS]
    if unknown:
        problems.append(f"{key} names unknown field(s) {', '.join(unknown)}")
    if len(set(raw)) != len(raw):
        problems.append(f"{key} repeats a field")
    return tuple(raw)


def parse_rule(obj: Any) -> Rule:
    """Validate one rule object; raise RuleError with every problem found."""
    if not isinstance(obj, dict):
        raise RuleError(None, [f"a rule must be a JSON object, got {type(obj).__name__}"])
    problems: list[str] = []
    raw_id = obj.get("ruleId")
    try:
        rule_id = _as_int(raw_id)
    except (InvalidOperation, ValueError, TypeError):
        raise RuleError(raw_id, ["ruleId must be an integer"]) from None
    state = _enum(obj, "ruleState", STATES, problems)
    if state == "CONTROL":
        control = _enum(obj, "controlType", CONTROL_TYPES, problems)
        if problems:
            raise RuleError(rule_id, problems)
        return Rule(rule_id=rule_id, state=state, control_type=control)

    shadow_of = _shadow_of(obj, rule_id, state, problems)
    rule_type = str(obj.get("ruleType", "WINDOW")).upper()
    if rule_type == LOGIN_RULE:
        return replace(_parse_login_rule(obj, rule_id, state, problems), shadow_of=shadow_of)
    if rule_type != "WINDOW":
        problems.append(f"ruleType {obj.get('ruleType')!r} is not one of WINDOW, {LOGIN_RULE}")
    keys = _names(obj, "groupingKeyNames", problems, required=True)
    unique = _names(obj, "unique", problems, required=False)
    field_name = obj.get("aggregateFieldName")
    if field_name is None:
        problems.append("missing aggregateFieldName")
    elif field_name not in COUNT_FIELDS and field_name not in NUMERIC_FIELDS:
        kind = "non-numeric" if field_name in TEXT_FIELDS else "unknown"
        problems.append(f"aggregateFieldName {field_name!r} is {kind}; use a numeric field or COUNT_FLINK")
    aggregator = _enum(obj, "aggregatorFunctionType", AGGREGATORS, problems)
    operator = _enum(obj, "limitOperatorType", OPERATORS, problems)
    limit = Decimal(0)
    if obj.get("limit") is None:
        problems.append("missing limit")
    else:
        try:
            limit = _as_decimal(obj["limit"])
        except (InvalidOperation, ValueError):
            problems.append(f"limit {obj['limit']!r} is not a number")
    window = 0
    try:
        window = _as_int(obj.get("windowMinutes"))
        if window <= 0:
            problems.append("windowMinutes must be > 0")
    except (InvalidOperation, ValueError, TypeError):
        problems.append(f"windowMinutes {obj.get('windowMinutes')!r} is not a whole number")
    if unique and field_name == RESET_FIELD:
        problems.append("unique (distinct count) cannot be combined with COUNT_WITH_RESET_FLINK")
    conditions = _conditions(obj.get("filter"), problems)
    if problems:
        raise RuleError(rule_id, problems)
    known = {
        "ruleId",
        "ruleState",
        "ruleType",
        "groupingKeyNames",
        "aggregateFieldName",
        "aggregatorFunctionType",
        "limitOperatorType",
        "limit",
        "windowMinutes",
        "controlType",
        "filter",
        "unique",
        "shadowOf",
    }
    return Rule(
        rule_id=rule_id,
        state=str(state),
        grouping_key_names=keys,
        field=str(field_name),
        aggregator=str(aggregator),
        operator=str(operator),
        limit=limit,
        window_minutes=window,
        filter=conditions,
        unique=unique,
        shadow_of=shadow_of,
        extra={k: v for k, v in obj.items() if k not in known},
    )


def _shadow_of(obj: dict[str, Any], rule_id: int, state: str | None, problems: list[str]) -> int | None:
    """The live rule a SHADOW rule challenges (`shadowOf`); a paused or deleted shadow rule keeps it."""
    raw = obj.get("shadowOf")
    if raw is None:
        return None
    try:
        live = _as_int(raw)
    except (InvalidOperation, ValueError, TypeError):
        problems.append(f"shadowOf {raw!r} is not a rule id")
        return None
    if live == rule_id:
        problems.append("a rule cannot shadow itself")
    if state == "ACTIVE":
        problems.append(f"an ACTIVE rule shadows nothing (promote the shadow rule to replace rule {live})")
    return live


def _positive(obj: dict[str, Any], name: str, default: int, problems: list[str]) -> int:
    try:
        value = _as_int(obj.get(name, default))
    except (InvalidOperation, ValueError, TypeError):
        problems.append(f"{name} {obj.get(name)!r} is not a whole number")
        return default
    if value <= 0:
        problems.append(f"{name} must be > 0")
    return value


def _parse_login_rule(obj: dict[str, Any], rule_id: int, state: str | None, problems: list[str]) -> Rule:
    """The login anomaly detector's parameters (defaults: 3 failures, 2 distinct IPs, 10 minutes)."""
    failures = _positive(obj, "minFailures", 3, problems)
    ips = _positive(obj, "minDistinctIps", 2, problems)
    window = _positive(obj, "windowMinutes", 10, problems)
    if problems:
        raise RuleError(rule_id, problems)
    return Rule(
        rule_id=rule_id,
        state=str(state),
        rule_type=LOGIN_RULE,
        min_failures=failures,
        min_distinct_ips=ips,
        window_minutes=window,
    )


def parse_rules_text(text: str, state: str | None = None) -> tuple[list[Rule], list[RuleError]]:
    """Parse a JSON list (or one object) of rules; valid rules and per-rule errors, in input order.

    `state` (e.g. SHADOW for `rules shadow`) replaces every rule's `ruleState`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return [], [RuleError(None, [f"malformed JSON: {exc}"])]
    items = data if isinstance(data, list) else [data]
    rules, errors = [], []
    for item in items:
        if state and isinstance(item, dict):
            item = {**item, "ruleState": state}
        try:
            rules.append(parse_rule(item))
        except RuleError as err:
            errors.append(err)
    return rules, errors


def load_rules_file(path: str) -> list[Rule]:
    """Rules from a JSON file; raise the first RuleError (all of them listed) if any rule is invalid."""
    with open(path, encoding="utf-8") as fh:
        rules, errors = parse_rules_text(fh.read())
    if errors:
        raise RuleError(", ".join(str(e.rule_id) for e in errors), [str(e) for e in errors])
    return rules
