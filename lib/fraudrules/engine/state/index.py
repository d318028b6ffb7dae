"""What answers a window query on a chunk: its per-group `Summary`, its per-event `Detail` (search key, prefix
sums, segment trees), blocks of folded summaries (`Fold`), and the new events as they ask (`Needles`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

from fraudrules.engine.state.catalog import Resets
from fraudrules.engine.state.codec import ipc
from fraudrules.engine.windowing import I64_MAX, I64_MIN, Base, Events, group_starts, per_rule
from fraudrules.rules.model import COUNT_FIELDS, Rule


@dataclass(eq=False)
class Summary:
    """Per group of a chunk (its events are sorted by group, then time): size, time span, sum, minimum and
    maximum. They answer every query whose window holds all of the group's events in the chunk, the common
    case of long windows; one row per group, not per event."""

    g: np.ndarray
    h2: np.ndarray
    size: np.ndarray
    t_first: np.ndarray
    t_last: np.ndarray
    sums: np.ndarray
    low: np.ndarray
    high: np.ndarray

    @staticmethod
    def of(detail: Detail) -> Summary:
        ev, first = detail.ev, detail.first
        empty = np.zeros(0, dtype=np.int64)
        return Summary(
            g=ev.g[first],
            h2=ev.h2[first],
            size=detail.size,  # the detail's own array
            t_first=ev.t[first],
            t_last=ev.t[first + detail.size - 1],
            sums=detail.group_sums(),
            low=np.minimum.reduceat(ev.val, first) if len(ev) else empty,
            high=np.maximum.reduceat(ev.val, first) if len(ev) else empty,
        )

    def encode(self) -> bytes | None:
        """The summary as an Arrow file for the local disk cache; None when a sum is past int64 (python ints)."""
        if self.sums.dtype == object:
            return None
        return ipc(pa.table({name: getattr(self, name) for name in SUMMARY_FIELDS}))

    @staticmethod
    def decode(blob: bytes) -> Summary:
        table = pa.ipc.open_file(pa.py_buffer(blob)).read_all()
        return Summary(**{name: table.column(name).to_numpy() for name in SUMMARY_FIELDS})

    def groups_of(self, g: np.ndarray, h2: np.ndarray) -> np.ndarray:
        """The chunk's group number of each (g, h2), -1 where it has none."""
        at = np.searchsorted(self.g, g)
        found = np.zeros(len(g), dtype=bool)
        pending = np.ones(len(g), dtype=bool)
        while pending.any():  # same g, other h2 (a 64-bit collision): try the next group
            inside = pending & (at < len(self.g))
            same_g = np.zeros(len(g), dtype=bool)
            same_g[inside] = self.g[at[inside]] == g[inside]
            hit = same_g & (self.h2[np.minimum(at, len(self.g) - 1)] == h2) if len(self.g) else same_g
            found |= hit
            pending = same_g & ~hit
            at = np.where(pending, at + 1, at)
        return np.where(found, at, -1)

    def arrays(self) -> list[np.ndarray]:
        return [getattr(self, name) for name in SUMMARY_FIELDS]


SUMMARY_FIELDS = ("g", "h2", "size", "t_first", "t_last", "sums", "low", "high")


@dataclass(eq=False)
class Fold:
    """A block of a shard's consecutive settled chunks (`settled`) with their summaries folded into one, kept by
    the process across micro-batches (not in the state store: it is built again from the chunks). A window that
    holds the block's events of a group whole, or misses them, gets them from one lookup of the block; only where
    the window's start cuts them (or a reset hides some) are its chunks asked one by one. Chunks are in time order,
    so each window's start cuts few blocks, whatever the window holds. A block is dropped when a chunk of it is
    gone (rewritten without stopped rules, dropped or merged); its other chunks are folded again."""

    chunks: frozenset[tuple[int, str]]  # (id, tag) of the folded chunks
    first_id: int  # the lowest of their ids: a reset with a higher horizon hides events in some of them
    summary: Summary


@dataclass(eq=False)
class Needles:
    """New events as `ShardEvents.base` asks chunks about them, in (group, time) order; `at`: their positions in
    its result."""

    at: np.ndarray | None  # None: the needles are the result's rows, in order
    g: np.ndarray
    h2: np.ndarray
    t_from: np.ndarray
    t_to: np.ndarray
    plain: np.ndarray  # a combinable aggregate (not a distinct count)
    horizon: np.ndarray  # a reset's horizon for the group, -1 if none
    extremes: dict[str, np.ndarray]  # "MIN"/"MAX" -> the rule wants it

    @staticmethod
    def of(new: Events, rules: dict[int, Rule], resets: Resets) -> Needles:
        reset = resets.index(new.g, new.h2) if len(resets) else np.full(len(new), -1)
        extremes = {
            name: per_rule(rules, new.rule, lambda r, n=name: r.aggregator == n and r.field not in COUNT_FIELDS, bool)
            for name in ("MIN", "MAX")
        }
        return Needles(
            at=None,
            g=new.g,
            h2=new.h2,
            t_from=new.t - per_rule(rules, new.rule, lambda r: r.window_ms, np.int64),
            t_to=new.t,
            plain=per_rule(rules, new.rule, lambda r: not r.unique, bool),
            horizon=np.where(reset >= 0, resets.horizon[reset], -1) if len(resets) else reset,
            extremes=extremes,
        )

    def take(self, sel: np.ndarray) -> Needles:
        fields = {name: getattr(self, name)[sel] for name in ("g", "h2", "t_from", "t_to", "plain", "horizon")}
        extremes = {name: wanted[sel] for name, wanted in self.extremes.items()}
        return Needles(at=self.rows(sel), **fields, extremes=extremes)

    def __len__(self) -> int:
        return len(self.g)

    def rows(self, sel: np.ndarray) -> np.ndarray:
        """The result's rows of the needles `sel`."""
        return sel if self.at is None else self.at[sel]

    @cached_property
    def runs(self) -> tuple[np.ndarray, np.ndarray]:
        """Each needle's run of equal groups (needles in time order), and where each run starts."""
        run = group_starts(self.g, self.h2)
        return np.cumsum(run) - 1, np.flatnonzero(run)

    def groups_in(self, summary: Summary) -> np.ndarray:
        """Each needle's group number in the summary (-1: none, or a distinct count: not combinable), looked up
        once per run."""
        run, heads = self.runs
        return np.where(self.plain[heads], summary.groups_of(self.g[heads], self.h2[heads]), -1)[run]


class Detail:
    """A chunk's events and what queries that cut a group need: a (group, time) search key, prefix sums and
    min/max segment trees, each built when first asked."""

    def __init__(self, ev: Events):
        self.ev = ev
        self.first = np.flatnonzero(group_starts(ev.g, ev.h2))
        self.size = np.diff(np.r_[self.first, len(ev)])
        self.tmin = int(ev.t.min()) if len(ev) else 0
        self.span = int(ev.t.max()) - self.tmin + 1 if len(ev) else 1
        self._trees: dict[str, tuple[np.ndarray, int]] = {}

    @cached_property
    def key(self) -> np.ndarray:
        """(group number, time) as one sortable int64: the search key of `ranges`."""
        return np.repeat(np.arange(len(self.first)), self.size) * self.span + self.ev.t - self.tmin

    @cached_property
    def cum(self) -> np.ndarray:
        """Prefix sums of the values (python ints where int64 could overflow)."""
        val = self.ev.val
        return np.r_[0, np.cumsum(val if _sums_fit(val) else val.astype(object))]

    def group_sums(self) -> np.ndarray:
        """Sum of the values of each group."""
        if not _sums_fit(self.ev.val):
            return self.cum[self.first + self.size] - self.cum[self.first]
        return np.add.reduceat(self.ev.val, self.first) if len(self.ev) else np.zeros(0, dtype=np.int64)

    def ranges(self, q: np.ndarray, t_from: np.ndarray, t_to: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions [lo, hi) of group q's events with t_from <= t <= t_to (empty where q is -1)."""
        qq = np.maximum(q, 0) * self.span
        lo = np.searchsorted(self.key, qq + np.clip(t_from - self.tmin, 0, self.span), side="left")
        hi = np.searchsorted(self.key, qq + np.clip(t_to - self.tmin, -1, self.span - 1), side="right")
        hi = np.where(q >= 0, np.maximum(hi, lo), lo)
        return lo, hi

    def extreme(self, name: str, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """MIN or MAX of the values in each [lo, hi) (the identity where empty), from a segment tree."""
        op, identity = (np.minimum, I64_MAX) if name == "MIN" else (np.maximum, I64_MIN)
        if name not in self._trees:
            self._trees[name] = _tree(self.ev.val, op, identity)
        tree, size = self._trees[name]
        out = np.full(len(lo), identity, dtype=np.int64)
        left, right = lo + size, hi + size
        while (live := left < right).any():
            odd = live & (left & 1 == 1)
            out[odd] = op(out[odd], tree[left[odd]])
            left = left + odd
            odd = live & (right & 1 == 1)
            right = right - odd
            out[odd] = op(out[odd], tree[right[odd]])
            left, right = left >> 1, right >> 1
        return out

    def arrays(self) -> list[np.ndarray]:
        arrays = [*self.ev.columns().values(), self.first, self.size, *(t for t, _ in self._trees.values())]
        return arrays + [self.__dict__[k] for k in ("key", "cum") if k in self.__dict__]


def _tree(values: np.ndarray, op, identity: int) -> tuple[np.ndarray, int]:
    size = 1 << max(1, (len(values) - 1).bit_length())
    tree = np.full(2 * size, identity, dtype=np.int64)
    tree[size : size + len(values)] = values
    level = size // 2
    while level >= 1:
        at = np.arange(level, 2 * level)
        tree[at] = op(tree[2 * at], tree[2 * at + 1])
        level //= 2
    return tree, size


def fold_summaries(parts: list[Summary]) -> Summary:
    """Summaries of chunks as one, per group over them all: sizes and sums added, the least minimum, first time,
    the greatest maximum and last time."""
    g, h2 = np.concatenate([p.g for p in parts]), np.concatenate([p.h2 for p in parts])
    order = np.lexsort((h2, g))
    starts = np.flatnonzero(group_starts(g[order], h2[order]))
    sums = np.concatenate([p.sums for p in parts])
    if sums.dtype != object and not _sums_fit(sums):
        sums = sums.astype(object)

    def per_group(values: np.ndarray, op: np.ufunc) -> np.ndarray:
        return op.reduceat(values[order], starts) if len(starts) else values[:0]

    def column(name: str, op: np.ufunc) -> np.ndarray:
        return per_group(np.concatenate([getattr(p, name) for p in parts]), op)

    return Summary(
        g=g[order][starts],
        h2=h2[order][starts],
        size=column("size", np.add),
        t_first=column("t_first", np.minimum),
        t_last=column("t_last", np.maximum),
        sums=per_group(sums, np.add),
        low=column("low", np.minimum),
        high=column("high", np.maximum),
    )


def add_to(out: Base, at: np.ndarray, count: np.ndarray, total: np.ndarray) -> None:
    """Add counts and sums of events to the entries `at` of `out`."""
    out.count[at] += count
    added = _sum(out.total[at], total)
    if added.dtype == object and out.total.dtype != object:
        out.total = out.total.astype(object)
    out.total[at] = added


def extreme_into(out: Base, name: str, at: np.ndarray, values: np.ndarray) -> None:
    target, op = (out.low, np.minimum) if name == "MIN" else (out.high, np.maximum)
    target[at] = op(target[at], values)


def add_groups(out: Base, needles: Needles, sel: np.ndarray, summary: Summary, q: np.ndarray) -> None:
    """Add whole groups of a summary (`q`: each needle's group) to the needles `sel`."""
    if len(sel) == 0:
        return
    add_to(out, needles.rows(sel), summary.size[q[sel]], summary.sums[q[sel]])
    for name, wanted in needles.extremes.items():
        pick = sel[wanted[sel]]
        if len(pick):
            per_group = summary.low if name == "MIN" else summary.high
            extreme_into(out, name, needles.rows(pick), per_group[q[pick]])


def ask_fold(out: Base, needles: Needles, fold: Fold) -> np.ndarray:
    """Add the block's groups to the needles whose windows hold them whole (no reset hiding any of its chunks);
    return the needles whose windows cut them, which must ask the block's chunks one by one."""
    q = needles.groups_in(fold.summary)
    at = np.maximum(q, 0)
    first, last = fold.summary.t_first[at], fold.summary.t_last[at]
    inside = (first >= needles.t_from) & (last <= needles.t_to)
    missed = (last < needles.t_from) | (first > needles.t_to)  # in none of the block's chunks either
    whole = (q >= 0) & inside & (needles.horizon <= fold.first_id)
    add_groups(out, needles, np.flatnonzero(whole), fold.summary, q)
    return np.flatnonzero((q >= 0) & ~whole & ~missed)


def _sums_fit(val: np.ndarray) -> bool:
    """No sum of these values can overflow int64."""
    return len(val) == 0 or int(np.abs(val).max()) * len(val) < 2**62


def _sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact elementwise sum: int64 while it cannot overflow, python ints after."""
    if a.dtype == object or b.dtype == object:
        return a.astype(object) + b.astype(object)
    if len(a) and max(int(np.abs(a).max()), 1) + max(int(np.abs(b).max()), 1) >= 2**62:
        return a.astype(object) + b.astype(object)
    return a + b


def concat_ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Concatenation of the index ranges [lo_i, hi_i)."""
    lengths = hi - lo
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(lo - np.r_[0, np.cumsum(lengths)[:-1]], lengths)
    return np.arange(total, dtype=np.int64) + offsets
