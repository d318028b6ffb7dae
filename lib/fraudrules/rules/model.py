"""Rules as validated data: the reference demo's rule schema, extended with filters and distinct counts.

A rule arrives as a JSON object (numbers may be JSON numbers or strings). `parse_rule` turns it into
an immutable `Rule` or raises `RuleError` naming the rule and every problem found, checking every field it
names against the declared event schema (`event_schema`; the default one unless given). A rule is resolved
against that schema: the decimal places of its aggregated field and of its filter fields are part of it.
`stored_rule` reads back a rule that was validated when it was submitted.

A filter is a list of terms that must all hold; a term is `{field, op, value|values}`, `{"any": [terms]}` (OR)
or `{"not": term}`. They are evaluated with SQL's three-valued logic (see `engine.keying.truth`).
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import Any, Union

from fraudrules.event_schema import DEFAULT, EventSchema, Field, builtins_declaring

LOGIN_RULE = "LOGIN_ANOMALY"
COUNT_FIELD = "COUNT_FLINK"
RESET_FIELD = "COUNT_WITH_RESET_FLINK"
COUNT_FIELDS = frozenset({COUNT_FIELD, RESET_FIELD})
# The fields of a window rule's JSON, and the login detector's own (a rule's other keys are kept as `extra`).
WINDOW_FIELDS = (
    "ruleId",
    "ruleState",
    "ruleType",
    "groupingKeyNames",
    "aggregateFieldName",
    "aggregatorFunctionType",
    "limitOperatorType",
    "limit",
    "windowMinutes",
    "filter",
    "unique",
    "shadowOf",
)
LOGIN_FIELDS = ("minFailures", "minDistinctIps")

STATES = ("ACTIVE", "SHADOW", "PAUSE", "DELETE", "CONTROL")
# States whose rules are keyed and evaluated: a SHADOW rule exactly like an ACTIVE one, its hits go to
# `shadow_alerts` instead of `alerts` (and are never published).
EVALUATED = ("ACTIVE", "SHADOW")
AGGREGATORS = ("SUM", "AVG", "MIN", "MAX")
OPERATORS = ("EQUAL", "NOT_EQUAL", "GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL")
CONTROL_TYPES = ("CLEAR_STATE_ALL", "DELETE_RULES_ALL", "EXPORT_RULES_CURRENT")
FILTER_OPS = ("EQ", "NE", "GT", "GE", "LT", "LE", "IN", "NOT_IN", "IS_NULL", "NOT_NULL")
ORDER_OPS = ("GT", "GE", "LT", "LE")
SET_OPS = ("IN", "NOT_IN")
NULL_OPS = ("IS_NULL", "NOT_NULL")


class RuleError(ValueError):
    """A rule that cannot be used; `problems` lists every reason."""

    def __init__(self, rule_id: object, problems: list[str]):
        self.rule_id = rule_id
        self.problems = problems
        super().__init__(f"rule {rule_id}: " + "; ".join(problems))


@dataclass(frozen=True)
class Condition:
    """One filter term: `field op value` (or `field IN values`, `field IS_NULL`). Declarative, never evaluated
    code. `scale`: the field's decimal places when it is numeric (None: text or boolean)."""

    field: str
    op: str
    values: tuple[str, ...]
    scale: int | None = None

    def to_json(self) -> dict[str, Any]:
        if self.op in SET_OPS:
            return {"field": self.field, "op": self.op, "values": list(self.values)}
        if self.op in NULL_OPS:
            return {"field": self.field, "op": self.op}
        return {"field": self.field, "op": self.op, "value": self.values[0]}

    def leaves(self) -> list[Condition]:
        return [self]


@dataclass(frozen=True)
class AnyOf:
    """`{"any": [terms]}`: TRUE when one term is TRUE, FALSE when all are FALSE, else UNKNOWN."""

    terms: tuple[Term, ...]

    def to_json(self) -> dict[str, Any]:
        return {"any": [t.to_json() for t in self.terms]}

    def leaves(self) -> list[Condition]:
        return [c for t in self.terms for c in t.leaves()]


@dataclass(frozen=True)
class Not:
    """`{"not": term}`: TRUE when the term is FALSE, FALSE when it is TRUE, UNKNOWN stays UNKNOWN."""

    term: Term

    def to_json(self) -> dict[str, Any]:
        return {"not": self.term.to_json()}

    def leaves(self) -> list[Condition]:
        return self.term.leaves()


Term = Union[Condition, AnyOf, Not]  # noqa: UP007 - a runtime alias (Python 3.10)


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
    filter: tuple[Term, ...] = ()
    unique: tuple[str, ...] = ()
    version: int = 0
    rule_type: str = "WINDOW"  # or LOGIN_ANOMALY (seed 000's detector)
    min_failures: int = 3
    min_distinct_ips: int = 2
    shadow_of: int | None = None  # a SHADOW rule's live rule (the one `rules promote` replaces), if any
    scale: int = 0  # decimal places of the aggregated values (0 for counts), from the event schema
    extra: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, hash=False)

    @property
    def evaluated(self) -> bool:
        """Keyed and evaluated (ACTIVE or SHADOW)."""
        return self.state in EVALUATED

    @property
    def window_ms(self) -> int:
        return self.window_minutes * 60_000

    def fields(self) -> set[str]:
        """Every event field the rule reads."""
        named = {*self.grouping_key_names, *self.unique, *(c.field for t in self.filter for c in t.leaves())}
        return named | ({self.field} if self.rule_type == "WINDOW" and self.field not in COUNT_FIELDS else set())

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


@dataclass
class _Names:
    """The event fields a rule names, checked against the schema (`strict`, a submission) or only resolved
    (a stored rule, validated when it was submitted)."""

    schema: EventSchema
    strict: bool
    problems: list[str]

    def known(self, name: str, where: str, also: Iterable[str] = ()) -> Field | None:
        """The declared field `name`; a submission naming none is a problem, with the closest names (`also`: the
        names other than fields allowed in its place)."""
        found = self.schema.field(name)
        if found is None and self.strict:
            close = self.schema.closest(name, also=also)
            hint = f"closest: {', '.join(close)}" if close else f"declared: {', '.join(self.schema.fields)}"
            if shipped := builtins_declaring(name):
                hint += f"; {shipped[0]} declares it: give that file as --event-schema"
            self.problems.append(f"{where}: {name!r} is not in the event schema ({hint})")
        return found


def _text(value: Any) -> str | None:
    """A filter value as text (JSON booleans as true/false); None for objects and lists."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return None if isinstance(value, (dict, list)) else str(value)


def _filter(raw: Any, names: _Names) -> tuple[Term, ...]:
    if raw is None:
        return ()
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list):
        names.problems.append("filter must be a list of terms ({field, op, value|values}, {any: [...]}, {not: ...})")
        return ()
    terms = [_term(t, names) for t in raw]
    return tuple(t for t in terms if t is not None)


def _term(raw: Any, names: _Names) -> Term | None:
    """One filter term, or None (its problems added)."""
    problems = names.problems
    kinds = [k for k in ("field", "any", "not") if isinstance(raw, dict) and k in raw]
    if len(kinds) != 1:
        problems.append(f"filter term {raw!r} must be an object with one of field, any, not")
        return None
    if kinds == ["not"]:
        inner = _term(raw["not"], names)
        return None if inner is None else Not(inner)
    if kinds == ["any"]:
        items = raw["any"]
        if not isinstance(items, list) or not items:
            problems.append("filter: any needs a non-empty list of terms")
            return None
        terms = [_term(t, names) for t in items]
        return None if any(t is None for t in terms) else AnyOf(tuple(t for t in terms if t is not None))
    return _condition(raw, names)


def _condition(raw: dict[str, Any], names: _Names) -> Condition | None:
    problems = names.problems
    name, op = raw.get("field"), str(raw.get("op", "")).upper()
    if not isinstance(name, str):
        problems.append(f"filter term {raw!r}: field must be a field name")
        return None
    if op not in FILTER_OPS:
        problems.append(f"filter op {raw.get('op')!r} on {name!r} is not one of {', '.join(FILTER_OPS)}")
        return None
    declared = names.known(name, "filter")
    if op in SET_OPS:
        values = raw.get("values")
        if not isinstance(values, list) or not values:
            problems.append(f"filter: {op} on {name!r} needs a non-empty list 'values'")
            return None
    elif op in NULL_OPS:
        values = []
    else:
        if raw.get("value") is None:
            problems.append(f"filter: {op} on {name!r} needs a 'value' (IS_NULL tests for null)")
            return None
        values = [raw["value"]]
    texts = [_text(v) for v in values]
    if None in texts:
        problems.append(f"filter: {op} on {name!r} compares with a number, text or boolean, not {values!r}")
        return None
    if declared is None:
        return Condition(name, op, tuple(str(t) for t in texts)) if not names.strict else None
    if op in ORDER_OPS and not declared.numeric:
        problems.append(f"filter: {op} on {name!r} needs a numeric field, {name} is {declared.sql}")
        return None
    bad = [t for t in texts if not _parses(str(t), declared)]
    if bad:
        what = "true or false" if declared.kind == "boolean" else "a number"
        problems.append(f"filter: {op} on {name!r}: {bad[0]!r} is not {what} ({name} is {declared.sql})")
        return None
    if declared.kind == "boolean":
        texts = [str(t).strip().lower() for t in texts]
    return Condition(name, op, tuple(str(t) for t in texts), declared.scale if declared.numeric else None)


def _parses(text: str, declared: Field) -> bool:
    """Whether a filter value is of the field's type (numbers for numeric fields, true/false for booleans)."""
    if declared.kind == "boolean":
        return text.strip().lower() in ("true", "false")
    if not declared.numeric:
        return True
    try:
        _as_decimal(text)
    except (InvalidOperation, ValueError):
        return False
    return True


def _names(obj: dict[str, Any], key: str, names: _Names, required: bool) -> tuple[str, ...]:
    raw = obj.get(key)
    if raw is None:
        if required:
            names.problems.append(f"missing {key}")
        return ()
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        names.problems.append(f"{key} must be a list of field names")
        return ()
    for n in raw:
        names.known(n, key)
    if len(set(raw)) != len(raw):
        names.problems.append(f"{key} repeats a field")
    return tuple(raw)


def _aggregated(field_name: Any, names: _Names) -> int:
    """Check `aggregateFieldName`; the decimal places of its values."""
    if field_name is None:
        names.problems.append("missing aggregateFieldName")
        return 0
    if field_name in COUNT_FIELDS:
        return 0
    if not isinstance(field_name, str):
        names.problems.append(f"aggregateFieldName {field_name!r} must be a field name or COUNT_FLINK")
        return 0
    declared = names.known(field_name, "aggregateFieldName", also=sorted(COUNT_FIELDS))
    if declared is not None and not declared.numeric:
        if names.strict:
            names.problems.append(
                f"aggregateFieldName {field_name!r} is non-numeric ({declared.sql}): aggregate an integer or "
                "decimal field, or count with COUNT_FLINK"
            )
        return 0
    return declared.scale if declared is not None else 0


def parse_rule(obj: Any, schema: EventSchema = DEFAULT) -> Rule:
    """Validate one rule object against the event schema; raise RuleError with every problem found."""
    return _parse(obj, _Names(schema, True, []))


def stored_rule(obj: Any, schema: EventSchema | None = None) -> Rule:
    """A rule as stored (validated when it was submitted), resolved against `schema` (default: the default
    schema) without checking its fields again: a schema may have changed since."""
    return _parse(obj, _Names(schema or DEFAULT, False, []))


def validate(rule: Rule, schema: EventSchema) -> Rule:
    """The rule checked against `schema` (and resolved against it); RuleError if it names fields it lacks."""
    return replace(parse_rule({**rule.extra, **rule.to_json()}, schema), version=rule.version)


def resolve(rule: Rule, schema: EventSchema) -> Rule:
    """The rule resolved against `schema`, unchecked (a paused or deleted rule may name a field no longer
    declared)."""
    return replace(stored_rule({**rule.extra, **rule.to_json()}, schema), version=rule.version)


def _parse(obj: Any, names: _Names) -> Rule:
    if not isinstance(obj, dict):
        raise RuleError(None, [f"a rule must be a JSON object, got {type(obj).__name__}"])
    problems = names.problems
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
    keys = _names(obj, "groupingKeyNames", names, required=True)
    unique = _names(obj, "unique", names, required=False)
    field_name = obj.get("aggregateFieldName")
    scale = _aggregated(field_name, names)
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
    conditions = _filter(obj.get("filter"), names)
    if problems:
        raise RuleError(rule_id, problems)
    known = {*WINDOW_FIELDS, "controlType"}
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
        scale=scale,
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


def parse_rules_text(
    text: str, schema: EventSchema = DEFAULT, state: str | None = None
) -> tuple[list[Rule], list[RuleError]]:
    """Parse a JSON list (or one object) of rules, each validated against the event schema; valid rules and
    per-rule errors, in input order.

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
            rules.append(parse_rule(item, schema))
        except RuleError as err:
            errors.append(err)
    return rules, errors


def load_rules_file(path: str, schema: EventSchema = DEFAULT) -> list[Rule]:
    """Rules from a JSON file, validated against the event schema; raise the first RuleError (all of them
    listed) if any rule is invalid."""
    with open(path, encoding="utf-8") as fh:
        rules, errors = parse_rules_text(fh.read(), schema)
    if errors:
        raise RuleError(", ".join(str(e.rule_id) for e in errors), [str(e) for e in errors])
    return rules
