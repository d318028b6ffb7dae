"""The catalog of a shard's state: which chunks hold its events (`Meta`), per (rule, signature) spans, what the
ACTIVE rules still need (`Bounds`) and the groups a COUNT_WITH_RESET emptied (`Resets`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from fraudrules.engine.windowing import Events


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
