"""A shard's retained events for one micro-batch (`ShardEvents`): what they add to each new event's window, and
the batch's chunk appended, merged and dropped as the policy says."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Protocol

import numpy as np

import fraudrules.engine.state.policy as policy
from fraudrules.engine.state.cache import BUDGET, Cache, Indexed
from fraudrules.engine.state.catalog import Bounds, Chunk, Meta, Resets, spans_of
from fraudrules.engine.state.codec import decode, encode
from fraudrules.engine.state.index import (
    Detail,
    Fold,
    Needles,
    Summary,
    add_groups,
    add_to,
    ask_fold,
    concat_ranges,
    extreme_into,
    fold_summaries,
)
from fraudrules.engine.windowing import Base, Events, base_at
from fraudrules.rules.model import Rule


class Backend(Protocol):
    """Where a shard's chunks and catalog are kept: the transformWithState state, or memory in tests."""

    def put_chunk(self, chunk_id: int, blob: bytes) -> None: ...
    def remove_chunk(self, chunk_id: int) -> None: ...
    def chunks(self) -> Iterator[tuple[int, bytes]]: ...


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
        return base_at(self._base(Needles.of(new.take(order), rules, self.resets)), back)

    def _base(self, needles: Needles) -> Base:
        out = Base.zeros(len(needles))
        blocks = self._blocks()
        by_key = {(c.id, c.tag): c for c in self.meta.chunks}
        for block in blocks:
            rest = needles.take(ask_fold(out, needles, block))
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
        right before it while that holds fewer than FOLD_BLOCK chunks, else starts blocks of FOLD_BLOCK (of at least
        FOLD_MIN: fewer wait for more; `policy`)."""
        settled = policy.settled(self.meta.chunks)
        owner = {key: b for b in blocks for key in b.chunks}
        runs: list[tuple[Fold | None, list[Chunk]]] = []  # (block or None, the chunks that join it), in order
        for c in self.meta.chunks:
            key = (c.id, c.tag)
            if key in owner:  # a block's chunks are consecutive: chunks keep their order, merges take the newest
                if not any(block is owner[key] for block, _ in runs):
                    runs.append((owner[key], []))
            elif c.id not in settled:
                runs.append((None, []))  # a chunk that stays loose ends the run
            elif runs and len(runs[-1][0].chunks if runs[-1][0] else ()) + len(runs[-1][1]) < policy.FOLD_BLOCK:
                runs[-1][1].append(c)
            else:
                runs.append((None, [c]))
        grown = []
        for block, chunks in runs:
            if chunks and (block is not None or len(chunks) >= policy.FOLD_MIN):
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

    def _ask(self, out: Base, needles: Needles, c: Chunk) -> None:
        """Add what chunk `c` holds of each needle's window to `out`."""
        chunk = self._summary(c)
        q = np.where(needles.horizon <= c.id, needles.groups_in(chunk), -1)
        at = np.maximum(q, 0)
        first, last = chunk.t_first[at], chunk.t_last[at]
        inside = (first >= needles.t_from) & (last <= needles.t_to)  # the window holds the group's events
        whole = np.flatnonzero((q >= 0) & inside)
        cut = np.flatnonzero((q >= 0) & ~inside & (last >= needles.t_from) & (first <= needles.t_to))
        add_groups(out, needles, whole, chunk, q)
        if len(cut):
            detail = self._detail(c)
            lo, hi = detail.ranges(q[cut], needles.t_from[cut], needles.t_to[cut])
            add_to(out, needles.rows(cut), hi - lo, detail.cum[hi] - detail.cum[lo])
            for name, wanted in needles.extremes.items():
                sel = np.flatnonzero(wanted[cut] & (hi > lo))
                if len(sel):
                    extreme_into(out, name, needles.rows(cut[sel]), detail.extreme(name, lo[sel], hi[sel]))

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
                out.append(ev.take(concat_ranges(lo[sel], hi[sel])))
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
        while (run := policy.similar_tail(chunks)) >= policy.MERGE_FANIN:
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
