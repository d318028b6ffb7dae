"""Dynamic keying (Vol.1): every transaction is keyed once per ACTIVE rule, by that rule's fields.

Flink's DynamicKeyFunction, done vectorised inside the stateful stage: each state shard receives the
micro-batch's transactions and the rules it holds in its own state (Flink's broadcast state), keys the
transactions by every ACTIVE rule and keeps the (rule, key) groups it owns. A rule change therefore
reaches keying and evaluation together, in the same micro-batch, with no per-batch read of a rules table.

A group is identified by two independent hashes of (ruleId, signature, key values): the 64-bit `g`
orders and shards the groups, the 32-bit `h2` tells apart two keys whose `g` collide. Values are exact
integers: amounts in cents, counts as 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import pandas as pd

from fraudrules.rules.model import COUNT_FIELDS, NUMERIC_FIELDS, PAYMENT_TYPES, Condition, Rule

# Transaction columns as the stateful stage receives them: integers only (cheap to move to Python).
TX_COLUMNS = (
    "transactionId",
    "eventTime",
    "payeeId",
    "beneficiaryId",
    "paymentAmount",
    "paymentType",
    "ingestionTimestamp",
    "srcTime",
    "srcId",
    "srcPos",
)
AMOUNT_SCALE = NUMERIC_FIELDS["paymentAmount"]
_I64_MAX = 2**63 - 1
_SEEDS = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F)


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective avalanche of 64-bit words (uint64, wrapping)."""
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def hash64(parts: list[np.ndarray], seed: int) -> np.ndarray:
    """A 64-bit hash of rows of integer columns (same on every machine and process)."""
    n = len(parts[0]) if parts else 0
    h = np.full(n, seed, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for p in parts:
            h = _mix(h ^ _mix(np.asarray(p).astype(np.int64).view(np.uint64) + np.uint64(seed)))
    return h.view(np.int64)


@dataclass(frozen=True)
class Transactions:
    """A micro-batch's transactions as integer columns, in evaluation order (eventTime, then source order)."""

    frame: pd.DataFrame

    @staticmethod
    def of(frame: pd.DataFrame) -> Transactions:
        ordered = frame.sort_values(["eventTime", "srcTime", "srcId", "srcPos"], kind="stable")
        return Transactions(ordered.reset_index(drop=True))

    def __len__(self) -> int:
        return len(self.frame)

    def column(self, name: str) -> np.ndarray:
        return self.frame[name].to_numpy(np.int64)

    def present(self, name: str) -> np.ndarray:
        """Rows where the field has a value (only ingestionTimestamp is optional; -1 means absent)."""
        if name == "ingestionTimestamp":
            return self.column(name) >= 0
        return np.ones(len(self), dtype=bool)


def field_scale(name: str) -> int:
    return NUMERIC_FIELDS.get(name, 0)


def field_text(name: str, value: int) -> str:
    """A field's value as text, the way keys show it: amounts with 2 places, payment types by name."""
    if name == "paymentType":
        return PAYMENT_TYPES[value] if 0 <= value < len(PAYMENT_TYPES) else "?"
    if name == "ingestionTimestamp" and value < 0:
        return "null"
    scale = field_scale(name)
    if scale:
        return str((Decimal(value) / 10**scale).quantize(Decimal(1).scaleb(-scale)))
    return str(value)


def key_text(rule: Rule, values: tuple[int, ...]) -> str:
    """The key as a JSON object of field name → value text (the alerts table's `key`)."""
    parts = (f'"{n}":"{field_text(n, v)}"' for n, v in zip(rule.grouping_key_names, values, strict=True))
    return "{" + ",".join(parts) + "}"


def _bound(value: Decimal, scale: int, op: str) -> int | None:
    """The integer threshold equivalent to `x op value` for integers x at `scale` (None: never equal)."""
    q = value.scaleb(scale)
    floor, ceil = int(q.to_integral_value("ROUND_FLOOR")), int(q.to_integral_value("ROUND_CEILING"))
    if op in ("EQ", "NE", "IN", "NOT_IN"):
        return floor if floor == ceil else None
    return {"GT": floor, "GE": ceil, "LT": ceil, "LE": floor}[op]


_ORDER = {"GT": np.greater, "GE": np.greater_equal, "LT": np.less, "LE": np.less_equal}


def _compare(x: np.ndarray, op: str, bound: int) -> np.ndarray:
    if not -_I64_MAX <= bound <= _I64_MAX:  # beyond any stored value: all rows or none
        return np.full(len(x), (bound > 0) == (op in ("LT", "LE")))
    return _ORDER[op](x, bound)


def _condition(tx: Transactions, c: Condition) -> np.ndarray:
    """Rows passing one filter term; a missing field passes no term (as SQL's NULL would not)."""
    x = tx.column(c.field)
    if c.field == "paymentType":
        hit = np.isin(x, [PAYMENT_TYPES.index(v) for v in c.values if v in PAYMENT_TYPES])
    elif c.op in _ORDER:
        hit = _compare(x, c.op, _bound(Decimal(c.values[0]), field_scale(c.field), c.op))
    else:
        exact = (_bound(Decimal(v), field_scale(c.field), c.op) for v in c.values)
        hit = np.isin(x, [b for b in exact if b is not None and abs(b) <= _I64_MAX])
    if c.op in ("NE", "NOT_IN"):
        hit = ~hit
    return hit & tx.present(c.field)


def passes(tx: Transactions, rule: Rule) -> np.ndarray:
    """Rows the rule keys: its filter passes and the fields it reads are present."""
    mask = np.ones(len(tx), dtype=bool)
    for c in rule.filter:
        mask &= _condition(tx, c)
    for name in (*rule.grouping_key_names, *rule.unique):
        mask &= tx.present(name)
    if rule.field not in COUNT_FIELDS:
        mask &= tx.present(rule.field)
    return mask


@dataclass(frozen=True)
class Keyed:
    """The rows of a batch that one rule keys, with their group and shard."""

    rows: np.ndarray  # positions into the Transactions
    g: np.ndarray
    h2: np.ndarray
    shard: np.ndarray
    val: np.ndarray  # the aggregated field, scaled (0 for counts)
    uniq: np.ndarray  # hash of the rule's `unique` fields (0 when unused)

    def take(self, sel: np.ndarray) -> Keyed:
        return Keyed(self.rows[sel], self.g[sel], self.h2[sel], self.shard[sel], self.val[sel], self.uniq[sel])


def key(tx: Transactions, rule: Rule, sig: int, shards: int) -> Keyed:
    """Key the batch for one ACTIVE rule: every row it keys, its group and the shard owning the group."""
    rows = np.flatnonzero(passes(tx, rule))
    fields = [tx.column(n)[rows] for n in rule.grouping_key_names]
    ident = [np.full(len(rows), rule.rule_id, dtype=np.int64), np.full(len(rows), sig, dtype=np.int64), *fields]
    g, h2 = hash64(ident, _SEEDS[0]), hash64(ident, _SEEDS[1]) >> 32
    val = np.zeros(len(rows), dtype=np.int64) if rule.field in COUNT_FIELDS else tx.column(rule.field)[rows]
    uniq = hash64([tx.column(n)[rows] for n in rule.unique], _SEEDS[0]) if rule.unique else np.zeros_like(val)
    return Keyed(rows, g, h2, shard_of(g, shards), val, uniq)


def shard_of(g: np.ndarray, shards: int) -> np.ndarray:
    return (g.view(np.uint64) % np.uint64(shards)).astype(np.int64)


def key_texts(tx: Transactions, rule: Rule, rows: np.ndarray) -> list[str]:
    """`key_text` of the given transaction rows."""
    columns = [tx.frame[n].to_numpy()[rows].tolist() for n in rule.grouping_key_names]
    return [key_text(rule, values) for values in zip(*columns, strict=True)] if columns else ["{}"] * len(rows)


def fan_out(tx: Transactions, rules: list[tuple[Rule, int]], shards: int) -> pd.DataFrame:
    """Every (transaction, rule) keying makes, with its key and shard: what an analyst previews."""
    parts = []
    for rule, sig in rules:
        k = key(tx, rule, sig, shards)
        parts.append(
            pd.DataFrame(
                {
                    "ruleId": rule.rule_id,
                    "ruleVersion": rule.version,
                    "transactionId": tx.column("transactionId")[k.rows],
                    "eventTime": tx.column("eventTime")[k.rows],
                    "key": key_texts(tx, rule, k.rows),
                    "shard": k.shard,
                }
            )
        )
    columns = ["ruleId", "ruleVersion", "transactionId", "eventTime", "key", "shard"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)
