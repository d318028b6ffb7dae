"""Text people can read: money with 2 places, counts as integers, keys as name=value, times as ISO timestamps.

Used for the alerts' `message` column, the console, the rules CLI and the notebooks; stored values stay exact.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import TypeVar

from fraudrules.rules.model import COUNT_FIELDS, LOGIN_RULE, NULL_OPS, RESET_FIELD, AnyOf, Condition, Not, Rule, Term

V = TypeVar("V")
R = TypeVar("R")

SYMBOLS = {"EQUAL": "=", "NOT_EQUAL": "!=", "GREATER": ">", "GREATER_EQUAL": ">=", "LESS": "<", "LESS_EQUAL": "<="}
FILTER_SYMBOLS = {"EQ": "=", "NE": "!=", "GT": ">", "GE": ">=", "LT": "<", "LE": "<="}
AVG_PLACES = 2  # an average of counts is shown with this many decimals (an average of amounts: at their scale)
MONEY_PLACES = 2


def once_each(values: Iterable[V], fn: Callable[[V], R]) -> list[R]:
    """`fn` of each value, computed once per distinct value: alerts repeat their counts and keys."""
    values = list(values)
    done = {v: fn(v) for v in set(values)}
    return [done[v] for v in values]


def plural(n: int, noun: str) -> str:
    """`1 alert`, `2 alerts`."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def key_label(key_json: str) -> str:
    """`{"payeeId":"4","beneficiaryId":"36"}` as `payeeId=4, beneficiaryId=36`."""
    try:
        return ", ".join(f"{k}={v}" for k, v in json.loads(key_json).items())
    except (ValueError, AttributeError, TypeError):
        return str(key_json)


def number(value: Decimal | int | float | str, places: int | None) -> str:
    """A value with thousands separators, at `places` decimals (None: as exact as it is, no exponent)."""
    try:
        value = Decimal(str(value))
    except InvalidOperation:
        return str(value)
    if not value.is_finite():
        return str(value)
    if places is not None:
        value = value.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_EVEN)
        return f"{value:,.{places}f}"
    if value == value.to_integral_value():
        return f"{int(value):,}"
    whole, _, frac = format(value.normalize(), "f").partition(".")
    sign = "-" if whole.startswith("-") else ""
    return f"{sign}{int(whole.lstrip('-') or 0):,}.{frac}"


def money(value: Decimal | int | float | str) -> str:
    """An amount at 2 places: `72,925.74`."""
    return number(value, MONEY_PLACES)


def iso_time(ms: int | float | None) -> str:
    """Epoch milliseconds as an ISO timestamp in UTC with milliseconds: `2024-01-31T12:00:00.250Z`."""
    if ms is None:
        return "-"
    moment = datetime.fromtimestamp(int(ms) / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(ms) % 1000:03d}Z"


def duration_text(ms: float | None) -> str:
    """A duration for people: `850 ms`, `1.2 s`, `2 min 5 s`, `3 h 20 min` (`-` for none)."""
    if ms is None or ms != ms:  # None or NaN
        return "-"
    if ms < 1_000:
        return f"{ms:,.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:,.1f} s"
    if ms < 3_600_000:
        minutes, rest = divmod(round(ms / 1000), 60)
        return f"{minutes} min {rest} s"
    hours, rest = divmod(round(ms / 60_000), 60)
    return f"{hours:,} h {rest} min"


def aggregate_places(rule: Rule) -> int:
    """Decimals an aggregate is shown with: counts as integers, amounts at their scale, averages of counts at 2."""
    if rule.field in COUNT_FIELDS or rule.unique:
        return AVG_PLACES if rule.aggregator == "AVG" and not rule.unique else 0
    return rule.scale


def limit_places(rule: Rule) -> int | None:
    """Decimals a limit is shown with: amounts at their scale (unless it has more), counts as given."""
    if rule.field in COUNT_FIELDS or rule.unique:
        return None
    places = rule.scale
    exponent = rule.limit.normalize().as_tuple().exponent
    return places if isinstance(exponent, int) and -exponent <= places else None


def term_text(term: Term) -> str:
    """A filter term: `paymentAmount >= 5,000.00`, `(channel = web or channel = app)`, `not (x is null)`."""
    if isinstance(term, AnyOf):
        return "(" + " or ".join(term_text(t) for t in term.terms) + ")"
    if isinstance(term, Not):
        return f"not ({term_text(term.term)})"
    return condition_text(term)


def condition_text(c: Condition) -> str:
    """A filter comparison: `paymentAmount >= 5,000.00`, `paymentType in (CSH, CRD)`, `deviceId is null`."""
    if c.op in NULL_OPS:
        return f"{c.field} is {'null' if c.op == 'IS_NULL' else 'not null'}"
    values = [number(v, c.scale) if c.scale is not None else v for v in c.values]
    if c.op in ("IN", "NOT_IN"):
        return f"{c.field} {'in' if c.op == 'IN' else 'not in'} ({', '.join(values)})"
    return f"{c.field} {FILTER_SYMBOLS[c.op]} {values[0]}"


def aggregate_text(rule: Rule) -> str:
    """What a window rule aggregates: `SUM(paymentAmount)`, `COUNT`, `COUNT(distinct beneficiaryId)`, with its
    filter: `COUNT where paymentAmount >= 5,000.00`."""
    if rule.unique:
        what = "COUNT(distinct " + ", ".join(rule.unique) + ")"
    elif rule.field in COUNT_FIELDS:
        what = "COUNT since the last alert" if rule.field == RESET_FIELD else "COUNT"
    else:
        what = f"{rule.aggregator}({rule.field})"
    if rule.filter:
        what += " where " + " and ".join(term_text(t) for t in rule.filter)
    return what


def window_message(rule: Rule, key_json: str, aggregate: str) -> str:
    """An alert's message: `SUM(paymentAmount) over 1 min for payeeId=4, beneficiaryId=36 = 72,999.92, limit >
    40,000.00`; a value rounded for display says so (`AVG(...) = 3,012.35 (rounded)`: the stored aggregate is
    exact)."""
    return window_messages(rule, [key_json], [aggregate])[0]


def window_messages(rule: Rule, keys: list[str], aggregates: list[str]) -> list[str]:
    """`window_message` of one rule's alerts, the rule's own text built once."""
    head = f"{aggregate_text(rule)} over {rule.window_minutes} min for "
    tail = f", limit {SYMBOLS[rule.operator]} {number(rule.limit, limit_places(rule))}"
    places = aggregate_places(rule)

    def shown(aggregate: str) -> str:
        value = Decimal(aggregate)
        text = number(value, places)
        return f"{text} (rounded)" if value != Decimal(text.replace(",", "")) else text

    labels, values = once_each(keys, key_label), once_each(aggregates, shown)
    return [f"{head}{label} = {value}{tail}" for label, value in zip(labels, values, strict=True)]


def rule_text(rule: Rule) -> str:
    """A rule in one line: `SUM(paymentAmount) by payeeId, beneficiaryId over 1 min > 40,000.00`."""
    if rule.state == "CONTROL":
        return f"control command {rule.control_type}"
    if rule.rule_type == LOGIN_RULE:
        return (
            f"{LOGIN_RULE}: >= {rule.min_failures} failed logins from >= {rule.min_distinct_ips} IPs, then a "
            f"success from a new IP, within {rule.window_minutes} min (by userId)"
        )
    by = ", ".join(rule.grouping_key_names) or "everything"
    return (
        f"{aggregate_text(rule)} by {by} over {rule.window_minutes} min "
        f"{SYMBOLS[rule.operator]} {number(rule.limit, limit_places(rule))}"
    )
