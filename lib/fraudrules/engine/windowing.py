"""Vectorised low-latency windows: every event aggregates its key's events in [T − W, T].

This is Vol.3's "ProcessFunction as a window", done once per micro-batch for many keys at a time
instead of once per event: the retained events of the touched keys and the batch's new events are
sorted by (group, eventTime, arrival), every new event's window is a contiguous range of that order,
and aggregates come from prefix sums (SUM/COUNT/AVG), a sparse table (MIN/MAX) and a
previous-occurrence count (distinct). Cost per event is O(log n), independent of window length.

Only the groups a batch touches are looked at: the caller gathers their retained events. A *group*
is (ruleId, rule signature, key), identified by the hash pair (g, h2) from `keying`. Values are
integers scaled by the rule's decimal scale, so all arithmetic is exact. Nothing here knows about Spark.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, localcontext

import numpy as np

from fraudrules.rules.model import COUNT_FIELDS, RESET_FIELD, Rule
from fraudrules.rules.text import once_each

NULL_UNIQ = np.iinfo(np.int64).min  # `uniq` of an event whose distinct field is null (set by keying)

ALERT_SCALE = 18  # decimal places of a rendered AVG aggregate (alerts table column is DECIMAL(38, 18))
_I64_SAFE = 2**62


@dataclass
class Events:
    """Columnar retained or incoming events. `seq` is the arrival order within the shard."""

    rule: np.ndarray  # int64 ruleId
    sig: np.ndarray  # int64 signature of the rule's ACTIVE incarnation
    g: np.ndarray  # int64 group hash (orders and shards groups)
    h2: np.ndarray  # int64 holding a 32-bit second group hash (tells colliding `g` apart)
    t: np.ndarray  # int64 eventTime ms
    seq: np.ndarray  # int64 arrival sequence
    val: np.ndarray  # int64 aggregated value, scaled
    uniq: np.ndarray  # int64 hash of the rule's `unique` fields (0 when unused)
    tx: np.ndarray  # int64 transactionId (what a window holds, for people looking at the state)

    @staticmethod
    def empty() -> Events:
        return Events(*(np.zeros(0, dtype=np.int64) for _ in FIELDS))

    def __len__(self) -> int:
        return len(self.t)

    def take(self, idx: np.ndarray) -> Events:
        return Events(*(getattr(self, f)[idx] for f in FIELDS))

    @staticmethod
    def concat(parts: list[Events]) -> Events:
        parts = [p for p in parts if len(p)] or [Events.empty()]
        return Events(*(np.concatenate([getattr(p, f) for p in parts]) for f in FIELDS))

    def columns(self) -> dict[str, np.ndarray]:
        return {f: getattr(self, f) for f in FIELDS}

    def sorted(self) -> Events:
        """By group, then time: the layout of stored chunks (a group's events are one run, in time order)."""
        return self.take(np.lexsort((self.t, self.h2, self.g)))


FIELDS = ("rule", "sig", "g", "h2", "t", "seq", "val", "uniq", "tx")


@dataclass
class Fired:
    """Alerts of one evaluation: positions into the batch plus the exact aggregate N / D."""

    index: np.ndarray  # int64 positions into the `new` Events
    num: np.ndarray  # object (python int) numerator
    den: np.ndarray  # object (python int) denominator, > 0

    def aggregate_texts(self) -> list[str]:
        """Each alert's aggregate as exact decimal text (`render`)."""
        return once_each(zip(self.num, self.den, strict=True), lambda nd: str(render(*nd)))


@dataclass
class Evaluation:
    fired: Fired
    keep: np.ndarray  # bool per `new` event: still in its group's window afterwards (not emptied by a reset)
    resets: Events  # one event per group emptied by COUNT_WITH_RESET: its events up to `seq` are gone


I64_MAX = np.iinfo(np.int64).max
I64_MIN = np.iinfo(np.int64).min


@dataclass
class Base:
    """Per new event, what the retained events of its group inside its window contribute (they all arrived
    earlier): count, sum, minimum and maximum of their values (identities where there are none)."""

    count: np.ndarray
    total: np.ndarray  # int64, or object (python ints) where int64 could overflow
    low: np.ndarray
    high: np.ndarray

    @staticmethod
    def zeros(n: int) -> Base:
        return Base(
            np.zeros(n, dtype=np.int64),
            np.zeros(n, dtype=np.int64),
            np.full(n, I64_MAX, dtype=np.int64),
            np.full(n, I64_MIN, dtype=np.int64),
        )


def render(num: int, den: int) -> Decimal:
    """Exact value of num/den, rounded half-even to ALERT_SCALE places only if it does not terminate."""
    with localcontext() as ctx:
        ctx.prec = 80
        q = Decimal(num) / Decimal(den)
        if den == 1 or _terminates(den):
            return q.normalize() if q != 0 else Decimal(0)
        return q.quantize(Decimal(1).scaleb(-ALERT_SCALE)).normalize()


def _terminates(den: int) -> bool:
    for p in (2, 5):
        while den % p == 0:
            den //= p
    return den == 1


def per_rule(rules: dict[int, Rule], ids: np.ndarray, value: Callable[[Rule], object], dtype: type) -> np.ndarray:
    """`value(rule)` for each event's rule id, computed once per distinct rule."""
    if len(ids) == 0:
        return np.zeros(0, dtype=dtype)
    distinct, at = np.unique(ids, return_inverse=True)
    return np.array([value(rules[int(r)]) for r in distinct], dtype=dtype)[at]


def group_codes(g: np.ndarray, h2: np.ndarray) -> np.ndarray:
    """Dense group ids for rows of (g, h2), numbered in (g, h2) order."""
    if len(g) == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((h2, g))
    codes = np.empty(len(g), dtype=np.int64)
    codes[order] = np.cumsum(group_starts(g[order], h2[order])) - 1
    return codes


def group_starts(g: np.ndarray, h2: np.ndarray) -> np.ndarray:
    """True where a run of equal (g, h2) begins, in rows sorted by group."""
    return np.r_[True, (g[1:] != g[:-1]) | (h2[1:] != h2[:-1])] if len(g) else np.zeros(0, dtype=bool)


def evaluate(old: Events, new: Events, rules: dict[int, Rule], base: Base | None = None) -> Evaluation:
    """Evaluate `new` (non-late arrivals) against what the retained events contribute, return the alerts and
    what of `new` stays in the windows.

    Retained events come in as `base` (their range aggregates, per new event) or as `old` (the events
    themselves, for distinct counts, which do not combine). `rules` holds the rule in force for every
    ruleId present in `new`.
    """
    base = base or Base.zeros(len(new))
    work = Events.concat([old, new])
    is_new = np.r_[np.zeros(len(old), dtype=bool), np.ones(len(new), dtype=bool)]
    new_pos = np.r_[np.full(len(old), -1), np.arange(len(new))]
    g = group_codes(work.g, work.h2)
    order = np.lexsort((work.seq, work.t, g))
    work, g, is_new, new_pos = work.take(order), g[order], is_new[order], new_pos[order]

    window = per_rule(rules, work.rule, lambda r: r.window_ms, np.int64)
    lo = _window_starts(g, work.t, window)
    hi = np.arange(len(work))

    q = np.flatnonzero(is_new)  # sorted positions of the events to evaluate
    fired_pos: list[np.ndarray] = []
    fired_num: list[np.ndarray] = []
    fired_den: list[np.ndarray] = []
    last_fire: dict[int, int] = {}  # group code -> sorted position of its last COUNT_WITH_RESET firing
    rule_of_q = work.rule[q]
    for rule_id in np.unique(rule_of_q):
        rule = rules[int(rule_id)]
        rq = q[rule_of_q == rule_id]
        b = base_at(base, new_pos[rq])
        if rule.field == RESET_FIELD:
            pos, num, den = _count_with_reset(rule, rq, lo, g, is_new, last_fire, b.count)
        else:
            num, den = _aggregate(rule, work, g, lo[rq], hi[rq], b)
            hit = compare(num, den, rule)
            pos, num, den = rq[hit], num[hit], den[hit]
        fired_pos.append(pos)
        fired_num.append(np.asarray(num, dtype=object))
        fired_den.append(np.asarray(den, dtype=object))

    pos = np.concatenate(fired_pos) if fired_pos else np.zeros(0, dtype=np.int64)
    fired = Fired(
        index=new_pos[pos].astype(np.int64),
        num=np.concatenate(fired_num) if fired_num else np.zeros(0, dtype=object),
        den=np.concatenate(fired_den) if fired_den else np.zeros(0, dtype=object),
    )
    resets = work.take(np.array(sorted(last_fire.values()), dtype=np.int64))
    keep = np.ones(len(new), dtype=bool)
    if last_fire:  # a firing empties its group: the new events up to it leave the window too
        reset_seq = np.full(int(g.max()) + 1, -1, dtype=np.int64)
        for grp, f in last_fire.items():
            reset_seq[grp] = work.seq[f]
        dropped = is_new & (work.seq <= reset_seq[g])
        keep[new_pos[dropped]] = False
    return Evaluation(fired=fired, keep=keep, resets=resets)


def _window_starts(g: np.ndarray, t: np.ndarray, window: np.ndarray) -> np.ndarray:
    """First sorted position of each row's group with eventTime ≥ t − window (rows sorted by g, t)."""
    n = len(t)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    first = np.r_[0, np.flatnonzero(g[1:] != g[:-1]) + 1]
    sizes = np.diff(np.r_[first, n])
    group_start = np.repeat(first, sizes)
    tmin = int(t.min())
    span = int(t.max()) - tmin + int(window.max()) + 2
    if (int(g.max()) + 1) * span < _I64_SAFE:
        comp = g * span + (t - tmin)
        lo = np.searchsorted(comp, g * span + (t - window - tmin), side="left")
    else:  # time span too wide for one composite key: search group by group
        lo = np.empty(n, dtype=np.int64)
        for start, size in zip(first, sizes, strict=True):
            seg = slice(start, start + size)
            lo[seg] = start + np.searchsorted(t[seg], t[seg] - window[seg], side="left")
    return np.maximum(lo, group_start)


def base_at(base: Base, pos: np.ndarray) -> Base:
    return Base(base.count[pos], base.total[pos], base.low[pos], base.high[pos])


def _aggregate(rule: Rule, work: Events, g: np.ndarray, lo: np.ndarray, hi: np.ndarray, base: Base):
    """Exact aggregate over sorted ranges [lo, hi] plus the retained events' `base`, as numerator/denominator."""
    count = (hi - lo + 1).astype(np.int64) + base.count
    scale = 10**rule.scale
    if rule.unique:
        return _distinct(work.uniq, g, lo, hi), np.ones(len(lo), dtype=np.int64)
    if rule.field in COUNT_FIELDS:
        return count, np.ones(len(lo), dtype=np.int64)
    if rule.aggregator in ("SUM", "AVG"):
        num = _add(_range_sums(work.val, lo, hi), base.total)
        return num, (count * scale if rule.aggregator == "AVG" else np.full(len(lo), scale, dtype=np.int64))
    op = np.minimum if rule.aggregator == "MIN" else np.maximum
    num = op(_range_extreme(work.val, lo, hi, op), base.low if rule.aggregator == "MIN" else base.high)
    return num, np.full(len(lo), scale, dtype=np.int64)


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact elementwise sum: int64 where it cannot overflow, python ints otherwise."""
    if a.dtype == object or b.dtype == object or _overflows(a, b):
        return a.astype(object) + b.astype(object)
    return a + b


def _overflows(a: np.ndarray, b: np.ndarray) -> bool:
    if len(a) == 0:
        return False
    return max(abs(int(a.max())), abs(int(a.min()))) + max(abs(int(b.max())), abs(int(b.min()))) >= _I64_SAFE


def _range_sums(vals: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    if len(vals) and int(np.abs(vals).max()) * len(vals) >= _I64_SAFE:
        prefix = np.concatenate([[0], np.cumsum(vals.astype(object))])
    else:
        prefix = np.concatenate([[0], np.cumsum(vals)])
    return prefix[hi + 1] - prefix[lo]


def _range_extreme(vals: np.ndarray, lo: np.ndarray, hi: np.ndarray, op) -> np.ndarray:
    """Sparse-table range min/max: O(n log n) build over the touched rows, O(1) per query."""
    if len(lo) == 0:
        return np.zeros(0, dtype=np.int64)
    length = hi - lo + 1
    levels = [vals]
    k_max = int(np.log2(int(length.max())))
    for k in range(1, k_max + 1):
        prev, half = levels[-1], 1 << (k - 1)
        levels.append(op(prev[:-half], prev[half:]))
    k = np.floor(np.log2(length)).astype(np.int64)
    out = np.empty(len(lo), dtype=np.int64)
    for level in np.unique(k):
        sel = k == level
        table = levels[level]
        out[sel] = op(table[lo[sel]], table[hi[sel] - (1 << level) + 1])
    return out


def _distinct(uniq: np.ndarray, g: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Distinct `uniq` values in each range: rows whose previous equal value lies before `lo`, rows with a null
    distinct field (`NULL_UNIQ`) not counted (SQL's COUNT(DISTINCT)).

    Counted offline with a Fenwick tree over positions, queries swept by their `hi`.
    """
    n = len(uniq)
    prev = np.full(n, -1, dtype=np.int64)
    order = np.lexsort((np.arange(n), uniq, g))
    same = (g[order][1:] == g[order][:-1]) & (uniq[order][1:] == uniq[order][:-1])
    prev[order[1:][same]] = order[:-1][same]
    # distinct(lo, hi) = #{j in [lo, hi] : prev[j] < lo}; sweep j in increasing order, add 1 at j and
    # move the mark from prev[j] to j, so that the tree counts last occurrences up to the sweep point.
    tree = np.zeros(n + 1, dtype=np.int64)
    out = np.zeros(len(lo), dtype=np.int64)
    by_hi = np.argsort(hi, kind="stable")
    j = 0
    for qi in by_hi:
        h = int(hi[qi])
        while j <= h:
            if uniq[j] != NULL_UNIQ:  # a null's chain of previous nulls is never marked
                if prev[j] >= 0:
                    _fenwick_add(tree, int(prev[j]), -1)
                _fenwick_add(tree, j, 1)
            j += 1
        out[qi] = _fenwick_sum(tree, h) - _fenwick_sum(tree, int(lo[qi]) - 1)
    return out


def _fenwick_add(tree: np.ndarray, i: int, v: int) -> None:
    i += 1
    n = len(tree)
    while i < n:
        tree[i] += v
        i += i & -i


def _fenwick_sum(tree: np.ndarray, i: int) -> int:
    i += 1
    s = 0
    while i > 0:
        s += int(tree[i])
        i -= i & -i
    return s


def _count_with_reset(
    rule: Rule,
    rq: np.ndarray,
    lo: np.ndarray,
    g: np.ndarray,
    is_new: np.ndarray,
    last_fire: dict[int, int],
    retained: np.ndarray,
):
    """COUNT_WITH_RESET_FLINK: sequential per key, since a firing empties that key's window.

    Retained events from before the last reset do not count (not in `retained`, the retained events'
    count per evaluated event), so until the first firing in this batch the count is that plus the range
    length; after a firing at sorted position f only new arrivals after f (which are exactly the later
    rows of this group) can count. `last_fire` gets each group's last firing position.
    """
    new_prefix = np.concatenate([[0], np.cumsum(is_new)])
    pos, num = [], []
    for k, i in enumerate(rq.tolist()):
        grp = int(g[i])
        f = last_fire.get(grp)
        if f is None:
            count = i - int(lo[i]) + 1 + int(retained[k])
        else:
            start = max(int(lo[i]), f + 1)
            count = int(new_prefix[i + 1] - new_prefix[start])
        if compare(np.array([count], dtype=np.int64), np.array([1], dtype=np.int64), rule)[0]:
            pos.append(i)
            num.append(count)
            last_fire[grp] = i
    return np.array(pos, dtype=np.int64), np.array(num, dtype=object), np.ones(len(pos), dtype=object)


OPERATORS = {  # elementwise, on arrays and on scalars alike (Decimal included)
    "EQUAL": np.equal,
    "NOT_EQUAL": np.not_equal,
    "GREATER": np.greater,
    "GREATER_EQUAL": np.greater_equal,
    "LESS": np.less,
    "LESS_EQUAL": np.less_equal,
}


def compare(num: np.ndarray, den: np.ndarray, rule: Rule) -> np.ndarray:
    """Exact `num/den <op> limit` with den > 0: cross-multiplied in integers, int64 when it cannot overflow."""
    lim_num, lim_exp = rule.limit_fraction
    scale = 10**lim_exp
    lhs_bound = (int(np.abs(num).max()) if len(num) else 0) * scale
    rhs_bound = abs(lim_num) * (int(np.abs(den).max()) if len(den) else 0)
    if max(lhs_bound, rhs_bound) < _I64_SAFE:
        lhs = np.asarray(num, dtype=np.int64) * scale
        rhs = lim_num * np.asarray(den, dtype=np.int64)
    else:
        lhs = np.asarray(num, dtype=object) * scale
        rhs = lim_num * np.asarray(den, dtype=object)
    return np.asarray(OPERATORS[rule.operator](lhs, rhs), dtype=bool)
