"""Tables people can read, for the notebooks: the values of the project's tables stay exact, these are only
how they are shown.

Amounts at 2 places with thousands separators, counts as integers with separators, ids as they are, times
(epoch milliseconds and timestamps) as ISO timestamps in UTC, keys as `payeeId=4, beneficiaryId=36`, empty
cells empty (not NaN/None), and no `Decimal('299.000000000000000000')`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd

from fraudrules.rules.model import COUNT_FIELDS, Rule, stored_rule
from fraudrules.rules.text import iso_time, key_label, money, number, rule_text

# Integer columns holding epoch milliseconds (bronze eventTime is one).
EPOCH_MS = frozenset(
    {
        "eventTime",
        "eventTimeMs",
        "eventTimestamp",
        "ingestionTimestamp",
        "producedAtMs",
        "publishedAtMs",
        "watermarkMs",
        "detectedAtMs",
        "committedAtMs",
        "firstMs",
        "oldest",
        "newest",
        "windowStart",
        "windowEnd",
    }
)
MONEY = frozenset({"paymentAmount", "amount", "total", "paymentAmountSum"})
# Per alert row: a value in the unit of its rule's aggregate (a count or an amount).
AGGREGATES = frozenset({"aggregate", "limit", "maxAggregate", "live aggregate", "candidate aggregate"})
PERCENT = frozenset({"share"})


def _is_id(column: str) -> bool:
    return column.lower().endswith(("id", "version", "shard", "srcpos")) or column in ("batch", "version")


def _decimal(value: Any, places: int | None) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    d = Decimal(str(value))
    if places is None:  # unknown unit: integral values as integers, others like amounts
        places = 0 if d == d.to_integral_value() else 2
    return number(d, places)


def _aggregate_places(field: Any) -> int | None:
    if not isinstance(field, str):
        return None
    return 0 if field in COUNT_FIELDS else 2


def _timestamp(value: Any) -> str:
    if value is None or value is pd.NaT or (isinstance(value, float) and np.isnan(value)):
        return ""
    stamp = pd.Timestamp(value)
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
    return iso_time(int(stamp.value // 1_000_000))


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    col = frame[name]
    sample = col.dropna()
    first = sample.iloc[0] if len(sample) else None
    if name == "srcName":  # the file's name: its folder is the landing folder, the same for every row
        return col.map(lambda v: os.path.basename(v) if isinstance(v, str) else "")
    if name == "key" or name.endswith(" key"):
        return col.map(lambda v: key_label(v) if isinstance(v, str) else "")
    if pd.api.types.is_datetime64_any_dtype(col) or isinstance(first, datetime):
        return col.map(_timestamp)
    if name in EPOCH_MS and pd.api.types.is_numeric_dtype(col):
        return col.map(lambda v: "" if pd.isna(v) else iso_time(int(v)))
    if name in AGGREGATES and "aggregateFieldName" in frame:
        places = frame["aggregateFieldName"].map(_aggregate_places)
        return pd.Series([_decimal(v, p) for v, p in zip(col, places, strict=True)], index=col.index)
    if name in MONEY:
        return col.map(lambda v: "" if v is None or pd.isna(v) else money(v))
    if name in PERCENT:
        return col.map(lambda v: "" if pd.isna(v) else f"{float(v):.1%}")
    if isinstance(first, Decimal) or name in AGGREGATES:
        return col.map(lambda v: _decimal(v, None))
    if isinstance(first, list | tuple | np.ndarray):
        return col.map(lambda v: ", ".join(map(str, v)) if v is not None else "")
    if pd.api.types.is_bool_dtype(col):
        return col.map(lambda v: "yes" if v else "no")
    if pd.api.types.is_integer_dtype(col) or (pd.api.types.is_float_dtype(col) and _integral(col)):
        return col.map(lambda v: "" if pd.isna(v) else (str(int(v)) if _is_id(name) else f"{int(v):,}"))
    if pd.api.types.is_float_dtype(col):
        return col.map(lambda v: "" if pd.isna(v) else f"{v:,.2f}")
    return col.map(lambda v: "" if v is None or (isinstance(v, float) and np.isnan(v)) else v)


def _integral(col: pd.Series) -> bool:
    values = col.dropna().to_numpy()
    return len(values) > 0 and bool(np.all(np.mod(values, 1) == 0))


def configure() -> None:
    """Show tables whole in a notebook: cells unabridged (rules and messages are longer than pandas' 50
    characters) and rows unwrapped in the plain-text form too."""
    pd.set_option("display.max_colwidth", None)
    pd.set_option("display.max_columns", None)
    pd.set_option("display.width", 250)


def readable(frame: Any, n: int | None = None) -> pd.DataFrame:
    """A Spark or pandas DataFrame (its first `n` rows) as text people can read; column names kept."""
    pdf = frame.limit(n).toPandas() if hasattr(frame, "toPandas") else frame
    if n is not None:
        pdf = pdf.head(n)
    return pd.DataFrame({name: _column(pdf, name) for name in pdf.columns}, index=pdf.index)


def rules_table(rules: Any) -> pd.DataFrame:
    """Rules (rows of the rules table: Spark, pandas or a list of row dicts) as ruleId, version, state and the
    rule in one line."""
    pdf = rules.toPandas() if hasattr(rules, "toPandas") else pd.DataFrame(rules)
    if pdf.empty:
        return pd.DataFrame(columns=["ruleId", "version", "state", "rule"])
    rows = [
        {
            "ruleId": int(r["ruleId"]),
            "version": int(r["version"]),
            "state": r["ruleState"],
            "rule": rule_text(stored_rule(json.loads(r["ruleJson"]))),
        }
        for _, r in pdf.sort_values("ruleId").iterrows()
    ]
    return pd.DataFrame(rows, columns=["ruleId", "version", "state", "rule"])


def alert_card(alert: Mapping[str, Any], rule: Rule | None = None) -> pd.DataFrame:
    """One alert as a two-column table (what, value): the rule, the key, the transaction, the window."""
    end = int(alert["eventTimeMs"])
    window_ms = int(alert["windowMinutes"] or 0) * 60_000
    places = _aggregate_places(alert.get("aggregateFieldName"))
    rows = [
        ("alert", alert["alertId"]),
        ("rule", f"{alert['ruleId']} v{alert['ruleVersion']}" + (f": {rule_text(rule)}" if rule else "")),
        ("key", key_label(alert["key"])),
        ("transaction", "" if alert.get("transactionId") is None else str(alert["transactionId"])),
        ("event time", iso_time(end)),
        ("window", f"{iso_time(end - window_ms)} to {iso_time(end)} ({alert['windowMinutes']} min)"),
        ("aggregate", _decimal(alert["aggregate"], places)),
        ("limit", f"{alert['limitOperatorType']} {_decimal(alert['limit'], places)}"),
        ("message", alert["message"]),
        ("alerted at", iso_time(alert.get("producedAtMs"))),
    ]
    return pd.DataFrame(rows, columns=["", "value"]).set_index("")


def window_aggregate(window: pd.DataFrame, alert: Mapping[str, Any], rule: Rule | None = None) -> Decimal:
    """The alert's aggregate recomputed from its window's transactions (pandas: paymentAmount and the rule's
    `unique` fields)."""
    field = alert["aggregateFieldName"]
    if rule is not None and rule.unique:
        return Decimal(len(window[list(rule.unique)].drop_duplicates()))
    if field in COUNT_FIELDS:
        return Decimal(len(window))
    amounts = [Decimal(str(v)) for v in window[field]]
    if not amounts:
        return Decimal(0)
    return {
        "SUM": lambda: sum(amounts, Decimal(0)),
        "AVG": lambda: sum(amounts, Decimal(0)) / len(amounts),
        "MIN": lambda: min(amounts),
        "MAX": lambda: max(amounts),
    }[alert["aggregatorFunctionType"]]()


def window_summary(window: pd.DataFrame, alert: Mapping[str, Any], rule: Rule | None = None) -> pd.DataFrame:
    """The drill-down next to the alert: what the alert says and what the window's transactions (pandas, as
    `views.window_transactions` selects them) add up to."""
    places = _aggregate_places(alert["aggregateFieldName"])
    label = rule_text(rule).split(" by ")[0] if rule else str(alert["aggregatorFunctionType"])
    contains = int(alert["transactionId"]) in {int(t) for t in window["transactionId"]}
    rows = [
        (label, _decimal(alert["aggregate"], places), _decimal(window_aggregate(window, alert, rule), places)),
        ("transactions", "", f"{len(window):,}"),
        ("holds the alerting transaction", "", "yes" if contains else "no"),
    ]
    return pd.DataFrame(rows, columns=["", "alert says", "window's transactions"]).set_index("")
