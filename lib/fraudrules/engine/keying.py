"""Dynamic keying (Vol.1): every transaction is keyed once per ACTIVE rule, by that rule's fields.

Flink's DynamicKeyFunction, done vectorised inside the stateful stage: each state shard receives the
micro-batch's transactions and the rules it holds in its own state (Flink's broadcast state), keys the
transactions by every ACTIVE rule and keeps the (rule, key) groups it owns. A rule change therefore
reaches keying and evaluation together, in the same micro-batch, with no per-batch read of a rules table.

The transactions arrive with every field of the declared event schema as a flat column (`inputs.numeric`):
numbers, booleans and strings with declared values as exact 64-bit integers (decimals scaled by their
declared scale, 0 where null, nulls in bit masks), other strings as text. A group is identified by two
independent hashes of (ruleId, signature, key values): the 64-bit `g` orders and shards the groups, the
32-bit `h2` tells apart two keys whose `g` collide. A number enters both as itself; a string enters each as
its own 64-bit hash (two different keys), so two strings that collide in one still differ in the other.

Filters are evaluated with SQL's three-valued logic (`truth`): a comparison with a null field is UNKNOWN
(`NE` and `NOT_IN` included), NOT UNKNOWN is UNKNOWN, `any` is TRUE when one term is TRUE and FALSE when all
are FALSE, the filter's list is TRUE when all are TRUE; `IS_NULL` and `NOT_NULL` are never UNKNOWN. A rule
keys an event only when its filter is TRUE, every grouping field is non-null and (unless it counts) the
aggregated field is non-null.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal

import numpy as np
import pandas as pd

from fraudrules.engine.windowing import NULL_UNIQ
from fraudrules.event_schema import DEFAULT, INGESTED, EventSchema, Field, mask_bit, mask_column
from fraudrules.rules.model import COUNT_FIELDS, NULL_OPS, AnyOf, Condition, Not, Rule, Term
from fraudrules.rules.text import once_each

_I64_MAX = 2**63 - 1
_SEEDS = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F)
_STRING_KEYS = ("fraudrules:key:1", "fraudrules:key:2")  # siphash keys of string values (16 bytes each)


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


def string_hashes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two independent 64-bit hashes of each string (siphash under two keys; the same in every process)."""
    h1, h2 = (pd.util.hash_array(values, hash_key=k, categorize=False).view(np.int64) for k in _STRING_KEYS)
    return h1, h2


@dataclass(frozen=True)
class Text:
    """A text field of the batch, factorized once: `codes` (-1 where null) into its distinct `values`. Hashes,
    filters and key texts work on the few distinct values and take by code."""

    codes: np.ndarray
    values: np.ndarray  # object: the distinct strings

    def per_row(self, per_value: np.ndarray, null: object) -> np.ndarray:
        """A value computed per distinct string, for every row (`null` where the field is null)."""
        return np.append(per_value, np.array([null], dtype=per_value.dtype))[self.codes]


@dataclass(frozen=True)
class Transactions:
    """A micro-batch's transactions as the engine's input columns, in evaluation order (eventTime, then source
    order: row i is `frame` row `order[i]`), read by event field path; per-field arrays are computed once per
    batch, text fields factorized once (`Text`)."""

    frame: pd.DataFrame
    schema: EventSchema = DEFAULT
    order: np.ndarray | None = None
    _memo: dict = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def of(frame: pd.DataFrame, schema: EventSchema = DEFAULT) -> Transactions:
        keys = [frame[c].to_numpy(np.int64) for c in ("srcPos", "srcId", "srcTime", "eventTime")]
        return Transactions(frame, schema, np.lexsort(keys))  # a stable sort: ties keep their input order

    def __len__(self) -> int:
        return len(self.frame)

    def _field(self, name: str) -> Field:
        return self.schema.fields[name]

    def _memoised(self, what: str, name: str, compute):
        key = (what, name)
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def _ordered(self, values: np.ndarray) -> np.ndarray:
        return values if self.order is None else values[self.order]

    def column(self, name: str) -> np.ndarray:
        """A field carried as integers (or an input column such as srcTime), as int64."""
        column = self.schema.input_column(name)
        return self._memoised("column", column, lambda: self._ordered(self.frame[column].to_numpy(np.int64)))

    def text(self, name: str) -> Text:
        """A text field, factorized."""

        def factorize() -> Text:
            codes, values = pd.factorize(self.frame[self._field(name).column].to_numpy(object))
            return Text(self._ordered(codes.astype(np.int64)), np.asarray(values, dtype=object))

        return self._memoised("text", name, factorize)

    def present(self, name: str) -> np.ndarray:
        """Rows where the field has a value."""
        return self._memoised("present", name, lambda: self._present(self._field(name)))

    def _present(self, f: Field) -> np.ndarray:
        if f.path == INGESTED:  # carried as -1 when absent
            return self.column(f.path) >= 0
        if not f.nullable:
            return np.ones(len(self), dtype=bool)
        if not f.coded:
            return self.text(f.path).codes >= 0
        mask = self.column(mask_column(f.null_bit))
        return (mask & np.int64(mask_bit(f.null_bit))) == 0

    def parts(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """What the two group hashes take of a field: an integer field itself in both, a string field each of its
        two hashes."""
        if self._field(name).coded:
            x = self.column(name)
            return x, x

        def hashes() -> tuple[np.ndarray, np.ndarray]:
            text = self.text(name)
            h1, h2 = string_hashes(text.values)
            return text.per_row(h1, 0), text.per_row(h2, 0)

        return self._memoised("hashes", name, hashes)

    def texts(self, name: str, rows: np.ndarray) -> list[str]:
        """A field's values at `rows` as keys show them: numbers at their scale, strings as they are."""
        f = self._field(name)
        if not f.coded:
            text = self.text(name)
            return [str(v) for v in text.per_row(text.values, None)[rows]]
        values = self.column(name)[rows]
        if f.values:
            return [f.values[v] if 0 <= v < len(f.values) else "?" for v in values.tolist()]
        if f.kind == "boolean":
            return ["true" if v else "false" for v in values.tolist()]
        if f.path == INGESTED:
            return [str(v) if v >= 0 else "null" for v in values.tolist()]
        if f.scale:
            unit = Decimal(1).scaleb(-f.scale)
            return [str((Decimal(v) / 10**f.scale).quantize(unit)) for v in values.tolist()]
        return [str(v) for v in values.tolist()]


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


def _hit(tx: Transactions, c: Condition) -> np.ndarray:
    """Rows where `field op value(s)` holds, as if every value were present (nulls are masked by the caller)."""
    f = tx.schema.fields[c.field]
    if not f.coded:
        text = tx.text(c.field)
        hit = text.per_row(pd.Series(text.values, dtype=object).isin(c.values).to_numpy(), False)
    elif f.values:  # strings carried as their position among the declared values
        hit = np.isin(tx.column(c.field), [f.values.index(v) for v in c.values if v in f.values])
    elif f.kind == "boolean":
        hit = np.isin(tx.column(c.field), [int(v == "true") for v in c.values])
    elif c.op in _ORDER:
        hit = _compare(tx.column(c.field), c.op, _bound(Decimal(c.values[0]), f.scale, c.op))
    else:
        exact = (_bound(Decimal(v), f.scale, c.op) for v in c.values)
        hit = np.isin(tx.column(c.field), [b for b in exact if b is not None and abs(b) <= _I64_MAX])
    return ~hit if c.op in ("NE", "NOT_IN") else hit


def truth(tx: Transactions, term: Term) -> tuple[np.ndarray, np.ndarray]:
    """The rows where a filter term is TRUE and where it is FALSE (elsewhere it is UNKNOWN)."""
    if isinstance(term, Not):
        true, false = truth(tx, term.term)
        return false, true
    if isinstance(term, AnyOf):
        parts = [truth(tx, t) for t in term.terms]
        return np.logical_or.reduce([p[0] for p in parts]), np.logical_and.reduce([p[1] for p in parts])
    present = tx.present(term.field)
    if term.op in NULL_OPS:
        return (~present, present) if term.op == "IS_NULL" else (present, ~present)
    hit = _hit(tx, term)
    return hit & present, ~hit & present


def passes(tx: Transactions, rule: Rule) -> np.ndarray:
    """Rows the rule keys: its filter is TRUE, its grouping fields and (unless it counts) its aggregated field
    are non-null."""
    mask = np.ones(len(tx), dtype=bool)
    for term in rule.filter:
        mask &= truth(tx, term)[0]
    for name in rule.grouping_key_names:
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
    uniq: np.ndarray  # hash of the rule's `unique` fields (0 when unused, NULL_UNIQ where one is null)

    def take(self, sel: np.ndarray) -> Keyed:
        return Keyed(self.rows[sel], self.g[sel], self.h2[sel], self.shard[sel], self.val[sel], self.uniq[sel])


def _distinct_values(tx: Transactions, rule: Rule, rows: np.ndarray) -> np.ndarray:
    """Hash of the `unique` fields at `rows`; NULL_UNIQ where one of them is null (SQL's COUNT(DISTINCT))."""
    uniq = hash64([tx.parts(n)[0][rows] for n in rule.unique], _SEEDS[0])
    uniq[uniq == NULL_UNIQ] += 1
    null = ~np.logical_and.reduce([tx.present(n)[rows] for n in rule.unique])
    uniq[null] = NULL_UNIQ
    return uniq


def key(tx: Transactions, rule: Rule, sig: int, shards: int) -> Keyed:
    """Key the batch for one ACTIVE rule: every row it keys, its group and the shard owning the group."""
    rows = np.flatnonzero(passes(tx, rule))
    ident = [np.full(len(rows), rule.rule_id, dtype=np.int64), np.full(len(rows), sig, dtype=np.int64)]
    fields = [tx.parts(n) for n in rule.grouping_key_names]
    g = hash64([*ident, *(p[0][rows] for p in fields)], _SEEDS[0])
    h2 = hash64([*ident, *(p[1][rows] for p in fields)], _SEEDS[1]) >> 32
    val = np.zeros(len(rows), dtype=np.int64) if rule.field in COUNT_FIELDS else tx.column(rule.field)[rows]
    uniq = _distinct_values(tx, rule, rows) if rule.unique else np.zeros_like(val)
    return Keyed(rows, g, h2, shard_of(g, shards), val, uniq)


def shard_of(g: np.ndarray, shards: int) -> np.ndarray:
    return (g.view(np.uint64) % np.uint64(shards)).astype(np.int64)


def key_texts(tx: Transactions, rule: Rule, rows: np.ndarray) -> list[str]:
    """The key of each given row as a JSON object of field name → value text (the alerts table's `key`)."""
    names = [json.dumps(n) for n in rule.grouping_key_names]
    columns = [once_each(tx.texts(n, rows), json.dumps) for n in rule.grouping_key_names]
    if not columns:
        return ["{}"] * len(rows)
    return [
        "{" + ",".join(f"{n}:{v}" for n, v in zip(names, values, strict=True)) + "}"
        for values in zip(*columns, strict=True)
    ]


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
