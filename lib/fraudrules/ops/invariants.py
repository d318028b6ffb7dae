"""The data-quality invariants that Great Expectations' built-in expectations cannot state directly, computed
into columns (`derive_*`) so that the suites (expectations/*.json) stay declarative. Pure pandas.

- alerts: `satisfies_rule` (aggregate <op> limit), `rule_version_exists` (ruleId, ruleVersion) is in
  rule_history, `matches_rule_version` (the alert's operator, limit, window, aggregator and field are those
  of that version; for login anomalies: failures >= minFailures), `expectedAlertId` (ruleId:transactionId,
  or ruleId:u<userId>:<eventTime> for login anomalies);
- window_state (the evaluate query's retained events, read from its checkpoint): `within_retention`
  (eventTime >= watermark - window of its rule - allowed lateness), `rule_active` (an ACTIVE rule with
  the same signature uses the entry's key);
- rules: `window_consistent`, `version_in_history`, `json_consistent`;
- transactions, quarantine, late_events: epoch-millisecond copies of their timestamps; late_events also
  `lateTransaction` (ruleId:transactionId, unique).

A rule changed after the batch whose state is read (rule_history.updatedAt later than that batch) has its
cleanup pending: its state entries are exempt from `within_retention` and `rule_active` until the next batch.
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation

import pandas as pd

from fraudrules.engine.windowing import OPERATORS
from fraudrules.rules.model import LOGIN_RULE, RuleError, parse_rule


def _ms(series: pd.Series) -> pd.Series:
    """Timestamps (naive UTC) as epoch milliseconds; NaT → -1 (out of every sane range)."""
    values = pd.to_datetime(series)
    out = (values - pd.Timestamp(0)) // pd.Timedelta(milliseconds=1)
    return out.fillna(-1).astype("int64")


def _dec(value) -> Decimal | None:
    if value is None or (isinstance(value, float) and value != value):
        return None
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return None


def _rule_json(text) -> dict:
    try:
        out = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def _int(value) -> int | None:
    try:
        return None if value is None or value != value else int(value)
    except (TypeError, ValueError):
        return None


def derive_alerts(alerts: pd.DataFrame, history: pd.DataFrame) -> pd.DataFrame:
    """Window-rule alerts (kind WINDOW) compare with their rule's operator, limit, aggregator, field and window;
    login-anomaly alerts (kind LOGIN_ANOMALY) count failures against the rule's minFailures (GREATER_EQUAL)."""
    df = alerts.copy()
    if "kind" not in df.columns:
        df["kind"] = "WINDOW"
    versions = {
        (int(r), int(v)): j for r, v, j in zip(history["ruleId"], history["version"], history["ruleJson"], strict=True)
    }

    def satisfies(row) -> bool:
        agg, lim, op = _dec(row.aggregate), _dec(row.limit), OPERATORS.get(row.limitOperatorType)
        return bool(agg is not None and lim is not None and op is not None and op(agg, lim))

    def matches(row) -> bool:
        rule = _rule_json(versions.get((_int(row.ruleId), _int(row.ruleVersion))))
        if not rule:
            return False
        if row.kind == LOGIN_RULE:
            expected = ("GREATER_EQUAL", _dec(rule.get("minFailures")), "COUNT", "failedLogins")
        else:
            expected = (
                rule.get("limitOperatorType"),
                _dec(rule.get("limit")),
                rule.get("aggregatorFunctionType"),
                rule.get("aggregateFieldName"),
            )
        actual = (row.limitOperatorType, _dec(row.limit), row.aggregatorFunctionType, row.aggregateFieldName)
        return expected == actual and _int(rule.get("windowMinutes")) == _int(row.windowMinutes)

    def alert_id(row) -> str:
        if row.kind == LOGIN_RULE:
            return f"{_int(row.ruleId)}:u{_int(row.userId)}:{_int(row.eventTimeMs)}"
        return f"{_int(row.ruleId)}:{_int(row.transactionId)}"

    rows = list(df.itertuples(index=False))
    df["satisfies_rule"] = pd.Series([satisfies(r) for r in rows], index=df.index, dtype=bool)
    df["rule_version_exists"] = pd.Series(
        [(_int(r.ruleId), _int(r.ruleVersion)) in versions for r in rows], index=df.index, dtype=bool
    )
    df["matches_rule_version"] = pd.Series([matches(r) for r in rows], index=df.index, dtype=bool)
    df["expectedAlertId"] = pd.Series([alert_id(r) for r in rows], index=df.index, dtype=object)
    for col in ("aggregate", "limit"):  # exact decimals as text: readable in Data Docs, nothing is lost
        df[col] = df[col].map(lambda v: None if v is None else format(Decimal(v).normalize(), "f"))
    return df.drop(columns=["groupingKeyNames"], errors="ignore")


def derive_window_state(
    entries: pd.DataFrame,
    engine: dict[int, dict[int, tuple[int, int]]],
    rules: pd.DataFrame,
    history: pd.DataFrame,
    watermark_ms: int | None,
    batch_time_ms: int | None,
    lateness_ms: int,
) -> pd.DataFrame:
    """Per retained event: the window it is kept for, and whether it may still be kept.

    `entries`: shard, ruleId, sig, key, eventTime, seq, value (what the engine's windows can still reach, by
    the engine's own rules); `engine`: per shard, the engine's ACTIVE rules as ruleId -> (sig, window ms);
    `rules`: the rules table; `history`: rule_history.
    """
    df = entries.copy()
    active = rules[rules["ruleState"] == "ACTIVE"]
    current = {
        int(r): (int(s), int(w)) for r, s, w in zip(active["ruleId"], active["sig"], active["windowMs"], strict=True)
    }
    changed = history.groupby("ruleId")["updatedAt"].max() if len(history) else pd.Series(dtype="datetime64[ns]")
    changed_ms = {int(r): int(v) for r, v in zip(changed.index, _ms(changed), strict=True)}
    pending = {r for r, t in changed_ms.items() if batch_time_ms is not None and t >= batch_time_ms}

    def window(shard: int, rule: int) -> int:
        if rule in current:
            return current[rule][1]
        return engine.get(shard, {}).get(rule, (0, 0))[1]

    rows = list(df.itertuples(index=False))
    df["watermarkMs"] = int(watermark_ms or 0)
    df["windowMs"] = pd.Series([window(int(r.shard), int(r.ruleId)) for r in rows], index=df.index, dtype="int64")
    df["pending_rule_change"] = df["ruleId"].astype("int64").isin(pending)
    oldest = df["watermarkMs"] - df["windowMs"] - int(lateness_ms)
    df["oldestAllowedMs"] = oldest
    kept_ok = (df["eventTime"] >= oldest) | (df["watermarkMs"] <= 0)
    df["within_retention"] = (kept_ok | df["pending_rule_change"]).astype(bool)
    in_use = pd.Series([current.get(int(r.ruleId), (None,))[0] == int(r.sig) for r in rows], index=df.index, dtype=bool)
    df["rule_active"] = (in_use | df["pending_rule_change"]).astype(bool)
    return df


def derive_rules(rules: pd.DataFrame, history: pd.DataFrame) -> pd.DataFrame:
    df = rules.copy()
    recorded = set(zip(history["ruleId"].astype(int), history["version"].astype(int), strict=True))

    def consistent(row) -> bool:
        try:
            rule = parse_rule(json.loads(row.ruleJson))
        except (RuleError, ValueError, TypeError):
            return False
        rule_type = getattr(rule, "rule_type", "WINDOW")
        same = (
            rule.rule_id == int(row.ruleId)
            and rule.state == row.ruleState
            and rule_type == getattr(row, "ruleType", "WINDOW")
            and rule.window_minutes == int(row.windowMinutes)
        )
        if rule_type == LOGIN_RULE:
            return bool(
                same
                and rule.min_failures == _int(getattr(row, "minFailures", None))
                and rule.min_distinct_ips == _int(getattr(row, "minDistinctIps", None))
            )
        return bool(
            same
            and list(rule.grouping_key_names) == list(row.groupingKeyNames)
            and rule.field == row.aggregateFieldName
            and rule.aggregator == row.aggregatorFunctionType
            and rule.operator == row.limitOperatorType
            and rule.limit == _dec(row.limit)
        )

    rows = list(df.itertuples(index=False))
    df["window_consistent"] = (df["windowMs"] == df["windowMinutes"].astype("int64") * 60_000).astype(bool)
    df["version_in_history"] = pd.Series(
        [(int(r.ruleId), int(r.version)) in recorded for r in rows], index=df.index, dtype=bool
    )
    df["json_consistent"] = pd.Series([consistent(r) for r in rows], index=df.index, dtype=bool)
    df["updatedAtMs"] = _ms(df["updatedAt"])
    return df.drop(columns=["groupingKeyNames", "filter", "unique"], errors="ignore")


def derive_transactions(tx: pd.DataFrame) -> pd.DataFrame:
    df = tx.copy()
    df["ingestedAtMs"] = _ms(df["ingestedAt"])
    return df


def derive_quarantine(q: pd.DataFrame) -> pd.DataFrame:
    df = q.copy()
    df["quarantinedAtMs"] = _ms(df["quarantinedAt"])
    return df


def derive_late_events(late: pd.DataFrame) -> pd.DataFrame:
    df = late.copy()
    df["detectedAtMs"] = _ms(df["detectedAt"])
    # One late row per (rule, transaction); late logins carry no transaction and may repeat.
    tx = df["transactionId"].map(_int)
    df["lateTransaction"] = [None if t is None else f"{_int(r)}:{t}" for r, t in zip(df["ruleId"], tx, strict=True)]
    return df
