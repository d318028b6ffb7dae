"""State of the stateful stages: a window shard's retained events as append-only chunks, so that per-batch
state work follows the batch, not the window.

Each micro-batch appends one chunk (its new events, sorted by group and time) instead of re-encoding
everything the shard retains. Chunks are merged size-tiered (like an LSM tree: each event is rewritten
O(log n) times in all) and dropped whole once every event in them has left its rule's window; a
chunk whose rules stopped or changed is rewritten without them. The chunk catalog (`Meta`) says
which chunks make up the shard, with per (rule, signature) spans for those decisions.

The state store is the truth. A Python worker also keeps each chunk's per-group summary and decoded
events within a memory budget (`Budget`, `STATE_MEMORY_MB`), and its stored bytes in a local cache
directory (shared by all Python workers of the machine) with its summary beside them, all keyed by the chunk's
id and tag, so a batch reads from the state store only what no cache holds, and a summary dropped from memory is
read again without the chunk's events. A tag names the write that made a chunk; a catalog
never refers to a chunk by id alone, so a cache can be stale but never wrong. Chunks that no merge will take again
are folded in blocks of consecutive ones, each into one summary (`Fold`), so that a batch's lookups follow the
blocks and the chunks of the few blocks its windows' starts cut, not every chunk the window holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from itertools import count
from typing import Protocol, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa

from fraudrules.config import JobConfig
from fraudrules.engine.windowing import FIELDS, I64_MAX, I64_MIN, Base, Events, base_at, group_starts, per_rule
from fraudrules.rules.model import COUNT_FIELDS, Rule

MERGE_FANIN = 4  # this many similar-sized newest chunks are merged into one (each event is rewritten log4 n times)
SIMILAR = 2  # sizes within this factor of the smallest are similar
# events: bounds the merge work in one micro-batch (merging 500,000 cost up to ~1 s, which set the job's p99 latency);
# chunks no merge takes again are only dropped or rewritten, and folded (`Fold`)
MAX_MERGED = 150_000
FOLD_MIN = 3  # settled chunks that start a block (`Fold`): each folding sorts the block's groups again
# chunks a block holds at most: a window whose start cuts a block asks its chunks one by one, and a block is folded
# again when one of its chunks goes (rewritten or dropped)
FOLD_BLOCK = 8
CACHE_ENV = "FRAUDRULES_STATE_CACHE"
SUMMARY_PART = ".summary"  # a chunk's summary file in the local disk cache, beside its events' file
STATE_MEMORY_MB = JobConfig.state_memory_mb  # chunk summaries and events a Python worker keeps in memory (`Budget`)
_STORED = pa.ipc.IpcWriteOptions(compression="lz4")  # state store bytes cost ~30 ms/MB to write
_NARROW = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
_BORN = count()  # the order in which this process came to hold chunks
T = TypeVar("T")


@dataclass
class Span:
    """The events of one (rule, signature) in a chunk."""

    rule: int
    sig: int
    n: int
    max_t: int


@dataclass
class Chunk:
    id: int
    tag: str
    n: int
    spans: list[Span]

    def dead_events(self, bounds: Bounds) -> int:
        return sum(s.n for s in self.spans if not bounds.alive(s))


@dataclass
class Meta:
    """The shard's catalog: which chunks hold its events, its counters and its clock (the newest transaction time
    it has seen, -1 before any: the window rules' watermark)."""

    token: str = ""
    next_seq: int = 0
    next_chunk: int = 0
    clock: int = -1
    chunks: list[Chunk] = field(default_factory=list)

    def to_json(self) -> str:
        """As `asdict` would give it, built by hand: `asdict` copied each of a long window's thousands of spans
        through its generic recursion (14 ms a micro-batch for 530 chunks)."""
        chunks = [{"id": c.id, "tag": c.tag, "n": c.n, "spans": [vars(s) for s in c.spans]} for c in self.chunks]
        fields = {"token": self.token, "next_seq": self.next_seq, "next_chunk": self.next_chunk, "clock": self.clock}
        return json.dumps({**fields, "chunks": chunks}, separators=(",", ":"))

    @staticmethod
    def from_json(text: str | None) -> Meta:
        if not text:
            return Meta()
        raw = json.loads(text)
        chunks = [Chunk(c["id"], c["tag"], c["n"], [Span(**s) for s in c["spans"]]) for c in raw.pop("chunks")]
        return Meta(**{k: raw[k] for k in ("token", "next_seq", "next_chunk", "clock") if k in raw}, chunks=chunks)


@dataclass(frozen=True)
class Bounds:
    """What the ACTIVE rules still need: per ruleId its signature and the oldest event time a future
    window can reach (`horizon` − window, `horizon` a lower bound of every future watermark)."""

    keep_from: dict[int, tuple[int, int]]  # ruleId -> (sig, events with t >= this are needed)

    @staticmethod
    def of(windows: dict[int, tuple[int, int]], horizon: int) -> Bounds:
        """`windows`: ruleId -> (sig, window ms) of the ACTIVE rules."""
        return Bounds({r: (sig, horizon - w) for r, (sig, w) in windows.items()})

    def alive(self, span: Span) -> bool:
        need = self.keep_from.get(span.rule)
        return need is not None and need[0] == span.sig and span.max_t >= need[1]

    def mask(self, ev: Events) -> np.ndarray:
        keep = np.zeros(len(ev), dtype=bool)
        for rule, (sig, since) in self.keep_from.items():
            keep |= (ev.rule == rule) & (ev.sig == sig) & (ev.t >= since)
        return keep


def rule_pairs(ev: Events) -> tuple[np.ndarray, np.ndarray]:
    """(code per event, the distinct (rule, sig) pairs as rows): a chunk has few of them."""
    rules, rule_values = pd.factorize(ev.rule)
    sigs, sig_values = pd.factorize(ev.sig)
    codes, combos = pd.factorize(rules.astype(np.int64) * max(len(sig_values), 1) + sigs)
    width = max(len(sig_values), 1)
    pairs = (
        np.stack([rule_values[combos // width], sig_values[combos % width]], axis=1)
        if len(ev)
        else np.zeros((0, 2), dtype=np.int64)
    )
    return codes.astype(np.int64), pairs.astype(np.int64)


def spans_of(ev: Events) -> list[Span]:
    if len(ev) == 0:
        return []
    codes, pairs = rule_pairs(ev)
    counts = np.bincount(codes, minlength=len(pairs))
    max_t = pd.Series(ev.t).groupby(codes).max().to_numpy()
    return [Span(int(r), int(s), int(n), int(t)) for (r, s), n, t in zip(pairs, counts, max_t, strict=True)]


def encode(ev: Events) -> bytes:
    """A chunk as the state store keeps it, compact: (rule, sig) as an index into the chunk's pairs, every
    other column as offsets from its minimum in the narrowest integer type, LZ4-compressed."""
    span, pairs = rule_pairs(ev)
    columns = {"span": span, **{f: getattr(ev, f) for f in FIELDS if f not in ("rule", "sig")}}
    arrays, bases = {}, {}
    for name, values in columns.items():
        low, high = (int(values.min()), int(values.max())) if len(values) else (0, 0)
        kind = next((t for t in _NARROW if high - low <= np.iinfo(t.to_pandas_dtype()).max), None)
        base = low if kind is not None else 0  # a range wider than int64 (hashes): stored as it is
        kind = kind or pa.int64()
        arrays[name], bases[name] = pa.array((values - base).astype(kind.to_pandas_dtype()), type=kind), base
    meta = {"bases": json.dumps(bases), "pairs": json.dumps(pairs.tolist())}
    return _ipc(pa.table(arrays).replace_schema_metadata(meta))


def decode(blob: bytes) -> Events:
    table = pa.ipc.open_file(pa.py_buffer(blob)).read_all()
    meta = table.schema.metadata
    bases = json.loads(meta[b"bases"])
    col = {n: table.column(n).to_numpy().astype(np.int64) + bases[n] for n in table.column_names}
    pairs = np.array(json.loads(meta[b"pairs"]), dtype=np.int64).reshape(-1, 2)
    return Events(
        rule=pairs[col["span"], 0], sig=pairs[col["span"], 1], **{f: col[f] for f in FIELDS if f not in ("rule", "sig")}
    )


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema, options=_STORED) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


@dataclass
class Resets:
    """Groups COUNT_WITH_RESET emptied: a group's events up to `seq` are gone from every chunk whose id
    is below `horizon` (chunks written since then were written without them)."""

    g: np.ndarray
    h2: np.ndarray
    seq: np.ndarray
    horizon: np.ndarray

    @staticmethod
    def empty() -> Resets:
        return Resets(*(np.zeros(0, dtype=np.int64) for _ in range(4)))

    def __len__(self) -> int:
        return len(self.g)

    def take(self, idx: np.ndarray) -> Resets:
        return Resets(self.g[idx], self.h2[idx], self.seq[idx], self.horizon[idx])

    def index(self, g: np.ndarray, h2: np.ndarray) -> np.ndarray:
        """Position of each (g, h2) among the entries, or -1."""
        entries = pd.MultiIndex.from_arrays([self.g, self.h2])
        return entries.get_indexer(pd.MultiIndex.from_arrays([g, h2]))

    def hidden(self, ev: Events) -> np.ndarray:
        """Events a reset removed."""
        out = np.zeros(len(ev), dtype=bool)
        if len(self) and len(ev):
            at = self.index(ev.g, ev.h2)
            hit = at >= 0
            out[hit] = ev.seq[hit] <= self.seq[at[hit]]
        return out

    def record(self, fired: Events, horizon: int) -> Resets:
        """These entries replaced or joined by the groups `fired` emptied (their last firing each)."""
        if len(fired) == 0:
            return self
        new = Resets(fired.g, fired.h2, fired.seq, np.full(len(fired), horizon, dtype=np.int64))
        stale = new.index(self.g, self.h2) >= 0
        old = self.take(np.flatnonzero(~stale))
        return Resets(*(np.concatenate([getattr(old, f), getattr(new, f)]) for f in ("g", "h2", "seq", "horizon")))

    def encode(self) -> bytes:
        table = pa.table({f: getattr(self, f) for f in ("g", "h2", "seq", "horizon")})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes()

    @staticmethod
    def decode(blob: bytes | None) -> Resets:
        if not blob:
            return Resets.empty()
        table = pa.ipc.open_file(pa.py_buffer(blob)).read_all()
        return Resets(*(table.column(f).to_numpy() for f in ("g", "h2", "seq", "horizon")))


class Indexed:
    """A live chunk as this process holds it: its per-group `summary` and its per-event `detail`, each in memory
    within the process's `Budget`; one dropped is built again from the chunk's events when a query needs it."""

    def __init__(self, ev: Events):
        self.born = next(_BORN)
        self.summary: Summary | None = None
        self.detail: Detail | None = None
        self.folded = False  # in one of its shard's blocks (`Fold`), which answers for it: its parts go first
        self.asked = False  # a micro-batch used its detail (a window cut it, a distinct count or a merge read it)
        self.grown = True  # parts built or read since the budget measured it (a detail builds search arrays lazily)
        self.restore(ev)

    def restore(self, ev: Events) -> None:
        """What was dropped, built again from the chunk's events."""
        self.detail = self.detail or Detail(ev)
        self.summary = self.summary or Summary.of(self.detail)
        self.grown = True

    def nbytes(self) -> int:
        """Bytes of the parts held, each array once (a summary built from the detail shares its group sizes)."""
        parts = (self.summary, self.detail)
        arrays = {id(a): a for part in parts if part is not None for a in part.arrays()}
        return sum(a.nbytes for a in arrays.values())


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
        return _ipc(pa.table({name: getattr(self, name) for name in SUMMARY_FIELDS}))

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
    """A block of a shard's consecutive settled chunks (`_settled`) with their summaries folded into one, kept by
    the process across micro-batches (not in the state store: it is built again from the chunks). A window that
    holds the block's events of a group whole, or misses them, gets them from one lookup of the block; only where
    the window's start cuts them (or a reset hides some) are its chunks asked one by one. Chunks are in time order,
    so each window's start cuts few blocks, whatever the window holds. A block is dropped when a chunk of it is
    gone (rewritten without stopped rules, dropped or merged); its other chunks are folded again."""

    chunks: frozenset[tuple[int, str]]  # (id, tag) of the folded chunks
    first_id: int  # the lowest of their ids: a reset with a higher horizon hides events in some of them
    summary: Summary


@dataclass(eq=False)
class _Needles:
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
    def of(new: Events, rules: dict[int, Rule], resets: Resets) -> _Needles:
        reset = resets.index(new.g, new.h2) if len(resets) else np.full(len(new), -1)
        extremes = {
            name: per_rule(rules, new.rule, lambda r, n=name: r.aggregator == n and r.field not in COUNT_FIELDS, bool)
            for name in ("MIN", "MAX")
        }
        return _Needles(
            at=None,
            g=new.g,
            h2=new.h2,
            t_from=new.t - per_rule(rules, new.rule, lambda r: r.window_ms, np.int64),
            t_to=new.t,
            plain=per_rule(rules, new.rule, lambda r: not r.unique, bool),
            horizon=np.where(reset >= 0, resets.horizon[reset], -1) if len(resets) else reset,
            extremes=extremes,
        )

    def take(self, sel: np.ndarray) -> _Needles:
        fields = {name: getattr(self, name)[sel] for name in ("g", "h2", "t_from", "t_to", "plain", "horizon")}
        extremes = {name: wanted[sel] for name, wanted in self.extremes.items()}
        return _Needles(at=self.rows(sel), **fields, extremes=extremes)

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


class Backend(Protocol):
    """Where a shard's chunks and catalog are kept: the transformWithState state, or memory in tests."""

    def put_chunk(self, chunk_id: int, blob: bytes) -> None: ...
    def remove_chunk(self, chunk_id: int) -> None: ...
    def chunks(self) -> Iterator[tuple[int, bytes]]: ...


def cache_root() -> str:
    """Where the local chunk caches of this machine are (one folder per checkpoint's namespace)."""
    return os.environ.get(CACHE_ENV) or os.path.join(tempfile.gettempdir(), "fraudrules-state-cache")


def drop_cache(namespace: str) -> None:
    """Remove the local chunk cache of a checkpoint that is gone (a backtest's temporary one)."""
    shutil.rmtree(os.path.join(cache_root(), namespace), ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(cache_root())  # only when no other checkpoint's cache is left in it


class Budget:
    """How many bytes of chunks this process keeps in memory, for all its shards. Beyond it, the parts of folded
    chunks go first (their block answers for them), then the per-event details no query has used (long windows hold
    the chunk's groups whole: only a merge may want them), then the other details, then per-group summaries, each
    time those read again before those held since their chunk was written, and the oldest first; a query that
    needs one again reads the chunk from the local disk cache. A chunk read again displaces only those first two
    kinds, never a part in use held since its chunk was written: every micro-batch visits a shard's chunks in the
    same order, where dropping the least recently used would drop each just before it is needed again."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held: dict[int, tuple[Indexed, bool]] = {}  # born -> (chunk, held since written or first read)
        # born -> bytes, as last measured: measuring every chunk at each trim cost more than the queries once a
        # shard held hundreds of chunks
        self.sizes: dict[int, int] = {}

    def hold(self, chunk: Indexed, resident: bool) -> None:
        self.held[chunk.born] = (chunk, resident)
        chunk.grown = True
        self.trim(keep=chunk.born, displace=resident)

    def forget(self, chunk: Indexed) -> None:
        self.held.pop(chunk.born, None)
        self.sizes.pop(chunk.born, None)

    def trim(self, keep: int = -1, displace: bool = True) -> None:
        """Drop parts of chunks until within the limit (`keep`: the chunk in use stays whole)."""
        sizes = self._sizes()
        total = sum(sizes.values())
        if total <= self.limit:
            return
        order = sorted(self.held.items(), key=lambda kv: (kv[1][1], kv[0]))
        folded = [entry for entry in order if entry[1][0].folded]
        idle = [entry for entry in order if not entry[1][0].asked]
        spare = (("detail", folded), ("summary", folded), ("detail", idle))  # a chunk read again may displace them
        for part, entries in (*spare, ("detail", order), ("summary", order)):
            for born, (chunk, resident) in entries:
                if total <= self.limit or (resident and not displace and entries is order):
                    break
                if born != keep and getattr(chunk, part) is not None:
                    setattr(chunk, part, None)
                    before, sizes[born] = sizes[born], chunk.nbytes()
                    total -= before - sizes[born]
        self.held = {born: entry for born, entry in self.held.items() if sizes[born]}
        self.sizes = {born: sizes[born] for born in self.held}

    def held_bytes(self) -> int:
        return sum(self._sizes().values())

    def _sizes(self) -> dict[int, int]:
        """Each held chunk's bytes, measured again where its parts may have grown since."""
        for born, (chunk, _) in self.held.items():
            if chunk.grown or born not in self.sizes:
                self.sizes[born], chunk.grown = chunk.nbytes(), False
        return self.sizes


BUDGET = Budget(STATE_MEMORY_MB << 20)


class Cache:
    """Chunks of the shards this process served (in memory within `BUDGET`), and their stored bytes on local
    disk."""

    def __init__(self, namespace: str, shard: int, root: str | None = None):
        self.dir = os.path.join(root or cache_root(), namespace, str(shard))
        self.loaded: dict[int, tuple[str, Indexed]] = {}
        self._blocks: list[Fold] = []
        self._folded: frozenset[tuple[int, str]] = frozenset()

    @property
    def blocks(self) -> list[Fold]:
        return self._blocks

    @blocks.setter
    def blocks(self, blocks: list[Fold]) -> None:
        """The shard's folded blocks; the chunks held say whether they are in one (`Indexed.folded`, for the
        budget)."""
        self._blocks = blocks
        self._folded = frozenset().union(*(b.chunks for b in blocks))
        for i, (tag, chunk) in self.loaded.items():
            chunk.folded = (i, tag) in self._folded

    @property
    def folded(self) -> frozenset[tuple[int, str]]:
        """(id, tag) of the chunks in a block."""
        return self._folded

    def keep_blocks_of(self, live: set[tuple[int, str]]) -> set[tuple[int, str]]:
        """Drop the blocks holding a chunk that is not among `live` (the shard's (id, tag)); returns `live`."""
        if not self._folded <= live:
            self.blocks = [b for b in self._blocks if b.chunks <= live]
        return live

    def _path(self, c: Chunk, part: str = "") -> str:
        return os.path.join(self.dir, _file_name(c.id, c.tag, part))

    def get(self, c: Chunk) -> Indexed | None:
        hit = self.loaded.get(c.id)
        if hit and hit[0] == c.tag:
            return hit[1]
        ev = self.read(c)
        return None if ev is None else self._hold(c, ev)

    def read(self, c: Chunk) -> Events | None:
        """The chunk's events from the local disk cache (None when it does not have them)."""
        return self._load(c, "", decode)

    def read_summary(self, c: Chunk) -> Summary | None:
        """The chunk's summary from the local disk cache (None when it does not have it): a fraction of the
        chunk's bytes, and nothing to compute."""
        return self._load(c, SUMMARY_PART, Summary.decode)

    def _load(self, c: Chunk, part: str, parse: Callable[[bytes], T]) -> T | None:
        try:
            with open(self._path(c, part), "rb") as fh:
                return parse(fh.read())
        except (FileNotFoundError, pa.ArrowInvalid):
            return None

    def put(self, c: Chunk, ev: Events, blob: bytes) -> Indexed:
        """Keep the chunk, and its stored bytes on disk for the next process serving the shard."""
        self.write(c, blob)
        return self._hold(c, ev)

    def write(self, c: Chunk, blob: bytes, part: str = "") -> None:
        os.makedirs(self.dir, exist_ok=True)
        tmp = self._path(c, part) + f".{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(blob)
        os.replace(tmp, self._path(c, part))

    def write_summary(self, c: Chunk, summary: Summary) -> None:
        """The chunk's summary on local disk (once), so that one dropped for the memory budget is read again
        instead of being built again from all the chunk's events."""
        if not os.path.exists(self._path(c, SUMMARY_PART)) and (blob := summary.encode()) is not None:
            self.write(c, blob, SUMMARY_PART)

    def _hold(self, c: Chunk, ev: Events) -> Indexed:
        chunk = Indexed(ev)
        chunk.folded = (c.id, c.tag) in self._folded
        self.write_summary(c, chunk.summary)
        if (old := self.loaded.get(c.id)) is not None:
            BUDGET.forget(old[1])
        self.loaded[c.id] = (c.tag, chunk)
        BUDGET.hold(chunk, resident=True)
        return chunk

    def retain(self, chunks: Iterable[Chunk]) -> None:
        """Forget chunks that are no longer part of the shard."""
        live = self.keep_blocks_of({(c.id, c.tag) for c in chunks})
        for i, (tag, chunk) in list(self.loaded.items()):
            if (i, tag) not in live:
                BUDGET.forget(chunk)
                del self.loaded[i]
        BUDGET.trim()
        names = {_file_name(i, tag, part) for i, tag in live for part in ("", SUMMARY_PART)}
        for name in os.listdir(self.dir) if os.path.isdir(self.dir) else ():
            if name not in names and name.endswith(".arrow"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self.dir, name))


def _file_name(chunk_id: int, tag: str, part: str) -> str:
    return f"{chunk_id}-{tag}{part}.arrow"


_CACHES: dict[tuple[str, int], Cache] = {}


def cache_for(namespace: str, shard: int) -> Cache:
    """One cache per (state namespace, shard) per process: it outlives the micro-batch."""
    key = (namespace, shard)
    if key not in _CACHES:
        _CACHES[key] = Cache(namespace, shard)
    return _CACHES[key]


class ShardEvents:
    """The retained events of one shard for the duration of one micro-batch."""

    def __init__(self, meta: Meta, resets: Resets, backend: Backend, cache: Cache):
        self.meta, self.resets, self.backend, self.cache = meta, resets, backend, cache
        self.parts: dict[int, Indexed] = {}
        self.read_from_store = 0  # chunks no cache had

    def load(self) -> None:
        missing = {}
        for c in self.meta.chunks:
            chunk = self.cache.get(c)
            if chunk is None:
                missing[c.id] = c
            else:
                self.parts[c.id] = chunk
        if missing:
            for chunk_id, blob in self.backend.chunks():
                if chunk_id in missing:
                    self.parts[chunk_id] = self.cache.put(missing[chunk_id], decode(blob), blob)
            self.read_from_store = len(missing)
        if len(self.parts) != len(self.meta.chunks):
            raise RuntimeError(f"the shard's state lacks chunks {sorted(set(missing) - set(self.parts))}")

    def _chunk(self, c: Chunk) -> Indexed:
        """The chunk with its summary and detail in memory: from the local disk cache, else the state store,
        when the budget dropped them."""
        chunk = self.parts[c.id]
        if chunk.summary is None or chunk.detail is None:
            ev = self.cache.read(c)
            if ev is None:  # the local file is gone (a cleaned temporary folder): the state store has the chunk
                blob = next(b for i, b in self.backend.chunks() if i == c.id)
                self.cache.write(c, blob)
                ev = decode(blob)
                self.read_from_store += 1
            chunk.restore(ev)
            self.cache.write_summary(c, chunk.summary)
            BUDGET.hold(chunk, resident=False)
        return chunk

    def _summary(self, c: Chunk) -> Summary:
        """The chunk's summary: in memory, else from its local file, else built again with the chunk."""
        chunk = self.parts[c.id]
        if chunk.summary is None:
            chunk.summary = self.cache.read_summary(c)
            if chunk.summary is not None:
                BUDGET.hold(chunk, resident=False)
        return chunk.summary or self._chunk(c).summary

    def _detail(self, c: Chunk) -> Detail:
        chunk = self.parts[c.id]
        detail = chunk.detail or self._chunk(c).detail
        # after the budget measured a detail read again (`_chunk`): the caller builds its search arrays next
        chunk.asked = chunk.grown = True
        return detail

    def clear(self) -> None:
        """Forget every retained event (CLEAR_STATE_ALL)."""
        for c in self.meta.chunks:
            self._remove(c)
        self.meta.chunks, self.resets = [], Resets.empty()

    def base(self, new: Events, rules: dict[int, Rule]) -> Base:
        """What the retained events contribute to each new event's window: range queries per block (`Fold`) of
        settled chunks, per chunk of the blocks a window's start cuts, and per chunk outside blocks, each
        O(new events × log n) whatever the windows hold. Distinct counts are not combinable: their new events get
        nothing here (see `gather`). The queries run in (group, time) order: sorted needles make the binary
        searches cache-friendly."""
        order = np.lexsort((new.t, new.g))
        back = np.empty_like(order)
        back[order] = np.arange(len(order))
        return base_at(self._base(_Needles.of(new.take(order), rules, self.resets)), back)

    def _base(self, needles: _Needles) -> Base:
        out = Base.zeros(len(needles))
        blocks = self._blocks()
        by_key = {(c.id, c.tag): c for c in self.meta.chunks}
        for block in blocks:
            rest = needles.take(_ask_fold(out, needles, block))
            for key in block.chunks if len(rest) else ():  # windows that cut the block ask its chunks one by one
                self._ask(out, rest, by_key[key])
        folded = self.cache.folded
        for c in self.meta.chunks:
            if (c.id, c.tag) not in folded:
                self._ask(out, needles, c)
        self.cache.blocks = self._grown(blocks)
        return out

    def _blocks(self) -> list[Fold]:
        """The process's blocks of this shard's chunks whose chunks are all still the shard's."""
        self.cache.keep_blocks_of({(c.id, c.tag) for c in self.meta.chunks})
        return self.cache.blocks

    def _grown(self, blocks: list[Fold]) -> list[Fold]:
        """`blocks` with the settled chunks outside them folded in: a run of consecutive ones joins the block
        right before it while that holds fewer than FOLD_BLOCK chunks, else starts blocks of FOLD_BLOCK (of at
        least FOLD_MIN: fewer wait for more)."""
        settled = _settled(self.meta.chunks)
        owner = {key: b for b in blocks for key in b.chunks}
        runs: list[tuple[Fold | None, list[Chunk]]] = []  # (block or None, the chunks that join it), in order
        for c in self.meta.chunks:
            key = (c.id, c.tag)
            if key in owner:  # a block's chunks are consecutive: chunks keep their order, merges take the newest
                if not any(block is owner[key] for block, _ in runs):
                    runs.append((owner[key], []))
            elif c.id not in settled:
                runs.append((None, []))  # a chunk that stays loose ends the run
            elif runs and len(runs[-1][0].chunks if runs[-1][0] else ()) + len(runs[-1][1]) < FOLD_BLOCK:
                runs[-1][1].append(c)
            else:
                runs.append((None, [c]))
        grown = []
        for block, chunks in runs:
            if chunks and (block is not None or len(chunks) >= FOLD_MIN):
                grown.append(self._folded(block, chunks))
            elif block is not None:
                grown.append(block)
        return grown

    def _folded(self, fold: Fold | None, chunks: list[Chunk]) -> Fold:
        """`fold` (if any) with `chunks` folded in."""
        parts = ([fold.summary] if fold else []) + [self._summary(c) for c in chunks]
        keys = (fold.chunks if fold else frozenset()) | {(c.id, c.tag) for c in chunks}
        first = min([c.id for c in chunks] + ([fold.first_id] if fold else []))
        return Fold(keys, first, fold_summaries(parts))

    def _ask(self, out: Base, needles: _Needles, c: Chunk) -> None:
        """Add what chunk `c` holds of each needle's window to `out`."""
        chunk = self._summary(c)
        q = np.where(needles.horizon <= c.id, needles.groups_in(chunk), -1)
        at = np.maximum(q, 0)
        first, last = chunk.t_first[at], chunk.t_last[at]
        inside = (first >= needles.t_from) & (last <= needles.t_to)  # the window holds the group's events
        whole = np.flatnonzero((q >= 0) & inside)
        cut = np.flatnonzero((q >= 0) & ~inside & (last >= needles.t_from) & (first <= needles.t_to))
        _add_groups(out, needles, whole, chunk, q)
        if len(cut):
            detail = self._detail(c)
            lo, hi = detail.ranges(q[cut], needles.t_from[cut], needles.t_to[cut])
            _add_to(out, needles.rows(cut), hi - lo, detail.cum[hi] - detail.cum[lo])
            for name, wanted in needles.extremes.items():
                sel = np.flatnonzero(wanted[cut] & (hi > lo))
                if len(sel):
                    _extreme_into(out, name, needles.rows(cut[sel]), detail.extreme(name, lo[sel], hi[sel]))

    def gather(self, g: np.ndarray) -> Events:
        """Every retained event of the groups whose hash `g` is among the given ones."""
        wanted = np.unique(g)
        out = []
        for c in self.meta.chunks:
            if not np.isin(wanted, self._summary(c).g).any():  # the summary says: none here
                continue
            ev = self._detail(c).ev
            lo = np.searchsorted(ev.g, wanted, side="left")
            hi = np.searchsorted(ev.g, wanted, side="right")
            sel = hi > lo
            if sel.any():
                out.append(ev.take(_ranges(lo[sel], hi[sel])))
        found = Events.concat(out)
        return found.take(np.flatnonzero(~self.resets.hidden(found)))

    def add_resets(self, fired: Events) -> None:
        """Record groups emptied by this batch (its own chunk is written without their events)."""
        self.resets = self.resets.record(fired, horizon=self.meta.next_chunk)

    def append(self, ev: Events, bounds: Bounds) -> None:
        """Add the batch's chunk, then drop, rewrite and merge chunks as the policy says."""
        chunks = []
        for c in self.meta.chunks:
            dead = c.dead_events(bounds)
            if dead == c.n:
                self._remove(c)
            elif 2 * dead >= c.n:  # its rules stopped or changed: rewrite it without them
                live = self._live(c, bounds)
                self._remove(c)
                if len(live):
                    chunks.append(self._write(live))
            else:
                chunks.append(c)
        if len(ev):
            chunks.append(self._write(ev.sorted()))
        while (run := _similar_tail(chunks)) >= MERGE_FANIN:
            merged = self._merged(chunks[-run:], bounds)
            for c in chunks[-run:]:
                self._remove(c)
            chunks[-run:] = [self._write(merged)] if len(merged) else []
        self.meta.chunks = chunks
        oldest = min((c.id for c in chunks), default=self.meta.next_chunk)
        self.resets = self.resets.take(np.flatnonzero(self.resets.horizon > oldest))  # still hide something

    def _merged(self, chunks: list[Chunk], bounds: Bounds) -> Events:
        """The live events of sorted chunks as one sorted chunk. Each chunk is a sorted run, so a stable sort
        by group (timsort merges the runs) is the whole sort unless a group's times interleave across chunks
        (late arrivals) or hashes collide; then a full sort."""
        ev = Events.concat([self._detail(c).ev for c in chunks])
        live = self._alive(ev, bounds)
        order = live[np.argsort(ev.g[live], kind="stable")]
        g, h2, t = ev.g[order], ev.h2[order], ev.t[order]
        same = g[1:] == g[:-1]
        ordered = ~same | (h2[1:] > h2[:-1]) | ((h2[1:] == h2[:-1]) & (t[1:] >= t[:-1]))
        return ev.take(order) if ordered.all() else ev.take(live).sorted()

    def _live(self, c: Chunk, bounds: Bounds) -> Events:
        ev = self._detail(c).ev
        return ev.take(self._alive(ev, bounds))

    def _alive(self, ev: Events, bounds: Bounds) -> np.ndarray:
        """Positions of the events still in their rule's window and not emptied by a reset."""
        return np.flatnonzero(bounds.mask(ev) & ~self.resets.hidden(ev))

    def _write(self, ev: Events) -> Chunk:
        c = Chunk(self.meta.next_chunk, uuid.uuid4().hex[:12], len(ev), spans_of(ev))
        self.meta.next_chunk += 1
        blob = encode(ev)
        self.backend.put_chunk(c.id, blob)
        self.parts[c.id] = self.cache.put(c, ev, blob)
        return c

    def _remove(self, c: Chunk) -> None:
        self.backend.remove_chunk(c.id)
        self.parts.pop(c.id, None)


def _sums_fit(val: np.ndarray) -> bool:
    """No sum of these values can overflow int64."""
    return len(val) == 0 or int(np.abs(val).max()) * len(val) < 2**62


def _add_to(out: Base, at: np.ndarray, count: np.ndarray, total: np.ndarray) -> None:
    """Add counts and sums of events to the entries `at` of `out`."""
    out.count[at] += count
    added = _sum(out.total[at], total)
    if added.dtype == object and out.total.dtype != object:
        out.total = out.total.astype(object)
    out.total[at] = added


def _extreme_into(out: Base, name: str, at: np.ndarray, values: np.ndarray) -> None:
    target, op = (out.low, np.minimum) if name == "MIN" else (out.high, np.maximum)
    target[at] = op(target[at], values)


def _add_groups(out: Base, needles: _Needles, sel: np.ndarray, summary: Summary, q: np.ndarray) -> None:
    """Add whole groups of a summary (`q`: each needle's group) to the needles `sel`."""
    if len(sel) == 0:
        return
    _add_to(out, needles.rows(sel), summary.size[q[sel]], summary.sums[q[sel]])
    for name, wanted in needles.extremes.items():
        pick = sel[wanted[sel]]
        if len(pick):
            per_group = summary.low if name == "MIN" else summary.high
            _extreme_into(out, name, needles.rows(pick), per_group[q[pick]])


def _ask_fold(out: Base, needles: _Needles, fold: Fold) -> np.ndarray:
    """Add the block's groups to the needles whose windows hold them whole (no reset hiding any of its chunks);
    return the needles whose windows cut them, which must ask the block's chunks one by one."""
    q = needles.groups_in(fold.summary)
    at = np.maximum(q, 0)
    first, last = fold.summary.t_first[at], fold.summary.t_last[at]
    inside = (first >= needles.t_from) & (last <= needles.t_to)
    missed = (last < needles.t_from) | (first > needles.t_to)  # in none of the block's chunks either
    whole = (q >= 0) & inside & (needles.horizon <= fold.first_id)
    _add_groups(out, needles, np.flatnonzero(whole), fold.summary, q)
    return np.flatnonzero((q >= 0) & ~whole & ~missed)


def _settled(chunks: list[Chunk]) -> set[int]:
    """Ids of the chunks that no merge takes while the newer chunks keep their events (a merge drops the block
    holding one: slower, never wrong). A merge takes a run of the newest chunks (`_similar_tail`: MERGE_FANIN of
    them, each within SIMILAR of the smallest newer one, at most MAX_MERGED events in all), so neither a chunk
    that the newer chunks after it outweigh, nor one too big for any such run: in the smallest run holding a chunk
    of n events, each newer member may be a SIMILAR-th of the one before, n × (1 + 1/2 + 1/4 + 1/8) in all. Newer
    chunks lose events only when their rules' windows pass them or rules change."""
    smallest_run = sum(SIMILAR**-k for k in range(MERGE_FANIN))
    settled, newer = set(), 0
    for c in reversed(chunks):
        newer += c.n
        if newer > MAX_MERGED or c.n * smallest_run > MAX_MERGED:
            settled.add(c.id)
    return settled


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


def _sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact elementwise sum: int64 while it cannot overflow, python ints after."""
    if a.dtype == object or b.dtype == object:
        return a.astype(object) + b.astype(object)
    if len(a) and max(int(np.abs(a).max()), 1) + max(int(np.abs(b).max()), 1) >= 2**62:
        return a.astype(object) + b.astype(object)
    return a + b


def _similar_tail(chunks: list[Chunk]) -> int:
    """How many of the newest chunks are of similar size (and small enough to merge)."""
    run, smallest, total = 0, None, 0
    for c in reversed(chunks):
        low = c.n if smallest is None else min(smallest, c.n)
        if total + c.n > MAX_MERGED or (smallest is not None and max(c.n, smallest) > SIMILAR * max(low, 1)):
            break
        run, smallest, total = run + 1, low, total + c.n
    return run


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Concatenation of the index ranges [lo_i, hi_i)."""
    lengths = hi - lo
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(lo - np.r_[0, np.cumsum(lengths)[:-1]], lengths)
    return np.arange(total, dtype=np.int64) + offsets
