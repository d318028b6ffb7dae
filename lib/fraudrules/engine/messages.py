"""Alert messages people can read: money with 2 places, counts as integers, keys as name=value."""

from __future__ import annotations

import json
from decimal import ROUND_HALF_EVEN, Decimal

from fraudrules.rules.model import COUNT_FIELDS, NUMERIC_FIELDS, Rule

SYMBOLS = {"EQUAL": "=", "NOT_EQUAL": "!=", "GREATER": ">", "GREATER_EQUAL": ">=", "LESS": "<", "LESS_EQUAL": "<="}


def key_label(key_json: str) -> str:
    """`{"payeeId":"4","beneficiaryId":"36"}` as `payeeId=4, beneficiaryId=36`."""
    try:
        return ", ".join(f"{k}={v}" for k, v in json.loads(key_json).items())
    except (ValueError, AttributeError):
        return key_json


def number(value: Decimal, places: int | None) -> str:
    """A value with thousands separators, at `places` decimals (None: as exact as it is)."""
    if places is not None:
        value = value.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_EVEN)
        return f"{value:,.{places}f}"
    text = format(value.normalize(), "f") if value != value.to_integral_value() else str(int(value))
    whole, _, frac = text.partition(".")
    return f"{int(whole):,}" + (f".{frac}" if frac else "") if whole.lstrip("-").isdigit() else text


def aggregate_places(rule: Rule) -> int | None:
    """Decimals an aggregate is shown with: counts as integers, amounts (also averages) at their scale."""
    if rule.field in COUNT_FIELDS or rule.unique:
        return 0
    return NUMERIC_FIELDS.get(rule.field, 0)


def window_message(rule: Rule, key_json: str, aggregate: str) -> str:
    what = (
        "COUNT(distinct " + ", ".join(rule.unique) + ")"
        if rule.unique
        else ("COUNT" if rule.field in COUNT_FIELDS else f"{rule.aggregator}({rule.field})")
    )
    places = aggregate_places(rule)
    value = Decimal(aggregate)
    shown = number(value, places)
    approx = "~" if places is not None and value != Decimal(shown.replace(",", "")) else ""
    return (
        f"{what} over {rule.window_minutes} min for {key_label(key_json)} = {approx}{shown}, "
        f"limit {SYMBOLS[rule.operator]} {number(rule.limit, None)}"
    )
