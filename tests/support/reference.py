"""Brute-force reference evaluator: the spec (shared/spec/semantics.md) read literally, O(n²).

Independent of the engine's vectorised code: it keeps every keyed event in a list per (rule, key)
and rescans the list for every event, with Fractions for exact arithmetic.
"""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from fractions import Fraction

from fraudrules.rules.model import COUNT_FIELDS, RESET_FIELD, Rule

OPS = {
    "EQUAL": lambda a, b: a == b,
    "NOT_EQUAL": lambda a, b: a != b,
    "GREATER": lambda a, b: a > b,
    "GREATER_EQUAL": lambda a, b: a >= b,
    "LESS": lambda a, b: a < b,
    "LESS_EQUAL": lambda a, b: a <= b,
}


def passes(rule: Rule, tx: dict) -> bool:
    for c in rule.filter:
        v = tx.get(c.field)
        if v is None:
            return False
        numeric = c.field != "paymentType"
        val = Decimal(str(v)) if numeric else str(v)
        refs = [Decimal(x) if numeric else x for x in c.values]
        ok = _check(c.op, val, refs)
        if not ok:
            return False
    return True


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
    if rule.unique:
        return Fraction(len({tuple(str(e[f]) for f in rule.unique) for e in window}))
    if rule.field in COUNT_FIELDS:
        return Fraction(len(window))
    vals = [Fraction(Decimal(str(e[rule.field]))) for e in window]
    return {
        "SUM": lambda: sum(vals, Fraction(0)),
        "AVG": lambda: sum(vals, Fraction(0)) / len(vals),
        "MIN": lambda: min(vals),
        "MAX": lambda: max(vals),
    }[rule.aggregator]()


def run(batches: list[list[dict]], rules_per_batch: list[list[Rule]], lateness_ms: int):
    """Alerts {(ruleId, transactionId): aggregate} and the late transaction ids, batch by batch."""
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
                    key = tuple(str(tx.get(n)) for n in rule.grouping_key_names)
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
