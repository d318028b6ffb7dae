"""Brute-force reference evaluator: the spec (docs/semantics.md) and the rules reference's filter and null
semantics (docs/rules.md, "Filters and nulls") read literally, O(n²).

Independent of the engine's vectorised code: it reads each event's fields from the raw record by their dotted
path, as Python values of their declared type, evaluates filters term by term with None as UNKNOWN, keeps every
keyed event in a list per (rule, key) and rescans the list for every event, with Fractions for exact arithmetic.
"""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from fractions import Fraction

from fraudrules.event_schema import DEFAULT, EventSchema
from fraudrules.rules.model import COUNT_FIELDS, RESET_FIELD, AnyOf, Not, Rule, Term

OPS = {
    "EQUAL": lambda a, b: a == b,
    "NOT_EQUAL": lambda a, b: a != b,
    "GREATER": lambda a, b: a > b,
    "GREATER_EQUAL": lambda a, b: a >= b,
    "LESS": lambda a, b: a < b,
    "LESS_EQUAL": lambda a, b: a <= b,
}
SCHEMA: EventSchema = DEFAULT  # the events' declared schema (`run(..., schema=...)` sets it)


def value(tx: dict, path: str):
    """The field at a dotted path as its declared type: Decimal for numbers, bool, str; None when null or absent."""
    v = tx
    for name in path.split("."):
        v = v.get(name) if isinstance(v, dict) else None
    if v is None:
        return None
    kind = SCHEMA.fields[path].kind
    if kind in ("integer", "decimal"):
        return Decimal(str(v))
    if kind == "boolean":
        return v if isinstance(v, bool) else str(v).strip().lower() == "true"
    return str(v)


def _literal(path: str, text: str):
    kind = SCHEMA.fields[path].kind
    if kind in ("integer", "decimal"):
        return Decimal(text)
    return text == "true" if kind == "boolean" else text


def truth(term: Term, tx: dict) -> bool | None:
    """SQL's three-valued logic, literally: True, False or None (UNKNOWN)."""
    if isinstance(term, Not):
        inner = truth(term.term, tx)
        return None if inner is None else not inner
    if isinstance(term, AnyOf):
        parts = [truth(t, tx) for t in term.terms]
        return True if True in parts else (None if None in parts else False)
    v = value(tx, term.field)
    if term.op in ("IS_NULL", "NOT_NULL"):
        return (v is None) == (term.op == "IS_NULL")
    if v is None:
        return None
    return _check(term.op, v, [_literal(term.field, x) for x in term.values])


def passes(rule: Rule, tx: dict) -> bool:
    """Keyed: every filter term TRUE, every grouping field and (unless counting) the aggregated field non-null."""
    if not all(truth(t, tx) is True for t in rule.filter):
        return False
    if any(value(tx, n) is None for n in rule.grouping_key_names):
        return False
    return rule.field in COUNT_FIELDS or value(tx, rule.field) is not None


def _check(op: str, val, refs: list) -> bool:
    if op == "IN":
        return val in refs
    if op == "NOT_IN":
        return val not in refs
    ref = refs[0]
    return {"EQ": val == ref, "NE": val != ref, "GT": val > ref, "GE": val >= ref, "LT": val < ref, "LE": val <= ref}[
        op
    ]


def aggregate(rule: Rule, window: list[dict]) -> Fraction:
    if rule.unique:  # COUNT(DISTINCT ...): tuples with a null are not counted
        tuples = {tuple(value(e, f) for f in rule.unique) for e in window}
        return Fraction(len({t for t in tuples if None not in t}))
    if rule.field in COUNT_FIELDS:
        return Fraction(len(window))
    vals = [Fraction(value(e, rule.field)) for e in window]
    return {
        "SUM": lambda: sum(vals, Fraction(0)),
        "AVG": lambda: sum(vals, Fraction(0)) / len(vals),
        "MIN": lambda: min(vals),
        "MAX": lambda: max(vals),
    }[rule.aggregator]()


def run(batches: list[list[dict]], rules_per_batch: list[list[Rule]], lateness_ms: int, schema: EventSchema = DEFAULT):
    """Alerts {(ruleId, transactionId): aggregate} and the late transaction ids, batch by batch, for events of the
    declared `schema`."""
    global SCHEMA
    SCHEMA = schema
    windows: dict[tuple, list[dict]] = defaultdict(list)
    alerts: dict[tuple[int, int], Fraction] = {}
    late: set[int] = set()
    max_seen = None
    in_force: dict[int, int] = {}  # ruleId -> signature of the ACTIVE incarnation
    for batch, rules in zip(batches, rules_per_batch, strict=True):
        # A rule that stops being ACTIVE, or changes what its windows hold, loses its windows.
        now = {r.rule_id: r.sig for r in rules if r.state == "ACTIVE"}
        for k in [k for k in windows if in_force.get(k[0]) != now.get(k[0])]:
            del windows[k]
        in_force = now
        wm = max_seen - lateness_ms if max_seen is not None else None
        keyed = []
        for pos, tx in enumerate(batch):
            if wm is not None and wm > 0 and tx["eventTime"] < wm:
                late.add(tx["transactionId"])
                continue
            for rule in rules:
                if rule.state == "ACTIVE" and passes(rule, tx):
                    key = tuple(value(tx, n) for n in rule.grouping_key_names)
                    keyed.append((tx["eventTime"], pos, rule, key, tx))
        keyed.sort(key=lambda k: (k[0], k[1]))
        for t, _pos, rule, key, tx in keyed:
            store = windows[(rule.rule_id, key)]
            window = [e for e in store if t - rule.window_ms <= e["eventTime"] <= t] + [tx]
            agg = aggregate(rule, window)
            if OPS[rule.operator](agg, Fraction(rule.limit)):
                alerts[(rule.rule_id, tx["transactionId"])] = agg
                if rule.field == RESET_FIELD:
                    store.clear()
                    continue
            store.append(tx)
        seen = [tx["eventTime"] for tx in batch]
        if seen:
            max_seen = max(seen) if max_seen is None else max(max_seen, *seen)
    return alerts, late
