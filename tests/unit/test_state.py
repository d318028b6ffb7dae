"""A shard's retained chunks answer each new event's window exactly as a scan of all its events would."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict

import numpy as np
import pytest

from fraudrules.engine import state
from fraudrules.engine.state import Bounds, Budget, Cache, Chunk, Indexed, Meta, Resets, ShardEvents, Span, policy
from fraudrules.engine.windowing import I64_MAX, I64_MIN, Events
from tests.support.harness import MemoryBackend, rule

MIN = 60_000


def _events(rng, n, rule_ids, t_range, seq0, values):
    groups = rng.integers(0, 6, n)
    return Events(
        rule=rng.choice(rule_ids, n),
        sig=np.zeros(n, dtype=np.int64),
        g=groups * 1_000_003,
        h2=groups % 2,
        t=rng.integers(*t_range, n),
        seq=seq0 + np.arange(n),
        val=rng.choice(values, n),
        uniq=np.zeros(n, dtype=np.int64),
        tx=np.arange(n),
    )


WINDOWS = {1: 1 * MIN, 2: 10 * MIN, 3: 24 * 60 * MIN}
AGGREGATORS = {1: "MIN", 2: "SUM", 3: "MAX"}
RULES = {rid: rule(rid, agg=AGGREGATORS[rid], window=w // MIN) for rid, w in WINDOWS.items()}
KEEP_ALL = Bounds.of({r: (0, w) for r, w in WINDOWS.items()}, 0)


def _ruled(rng, n, rule_ids, t_range, seq0, huge) -> Events:
    """Events of the three RULES whose group belongs to one rule (its hash says so in the engine); `huge`: values
    whose sums pass int64."""
    values = np.array([2**61, 2**61 - 1, -(2**60)]) if huge else np.arange(-50, 500)
    ev = _events(rng, n, rule_ids, t_range, seq0, values)
    ev.g = ev.g + ev.rule
    return ev


def _scan(old: Events, new: Events, windows: dict[int, int] = WINDOWS) -> list[tuple]:
    """Per new event: count, sum, min, max of the retained events of its group in [t − window, t]."""
    out = []
    for i in range(len(new)):
        w = windows[int(new.rule[i])]
        sel = ((old.g == new.g[i]) & (old.h2 == new.h2[i]) & (old.t >= new.t[i] - w) & (old.t <= new.t[i])) & (
            old.rule == new.rule[i]
        )
        vals = [int(v) for v in old.val[sel]]
        out.append((len(vals), sum(vals), min(vals, default=I64_MAX), max(vals, default=I64_MIN)))
    return out


@pytest.mark.parametrize(
    ("huge", "memory", "files"),
    [(False, 1 << 30, True), (True, 1 << 30, True), (False, 0, True), (False, 0, False)],
    ids=["in-memory", "sums-past-int64", "chunks-read-again-from-disk", "local-files-gone"],
)
def test_base_over_chunks_equals_a_scan_of_every_retained_event(tmp_path, monkeypatch, huge, memory, files):
    """Windows that hold a group's events in a chunk whole, cut them, or miss them; sums past int64; chunk
    summaries and events dropped for the memory budget and read again from the local disk cache, or from the state
    store."""
    monkeypatch.setattr(state.BUDGET, "limit", memory)
    rng = np.random.default_rng(7)
    store = ShardEvents(Meta(), Resets.empty(), MemoryBackend(), Cache("test", 0, root=str(tmp_path)))
    old = []
    for b in range(6):  # six chunks, each a few minutes of event time, overlapping a little
        old.append(_ruled(rng, 300, [1, 2, 3], (b * 4 * MIN, (b + 1) * 4 * MIN + MIN), b * 300, huge))
        store.append(old[-1], KEEP_ALL)
    assert len(store.meta.chunks) > 1
    held = [store.parts[c.id].nbytes() > 0 for c in store.meta.chunks]
    assert sum(held) == (len(held) if memory else 1)  # a budget of 0 keeps only the chunk written last
    if not files:
        shutil.rmtree(store.cache.dir)
    new = _ruled(rng, 400, [1, 2, 3], (0, 30 * MIN), 10_000, huge)
    got = store.base(new, RULES)
    assert (store.read_from_store > 0) == (not files)
    _check(got, _scan(Events.concat(old), new), new)


def _check(got, want: list[tuple], new: Events) -> None:
    for i, (count, total, low, high) in enumerate(want):
        aggregator = AGGREGATORS[int(new.rule[i])]
        assert (got.count[i], got.total[i]) == (count, total), i
        assert got.low[i] == (low if aggregator == "MIN" else I64_MAX), i  # MIN/MAX only where a rule asks
        assert got.high[i] == (high if aggregator == "MAX" else I64_MIN), i


@pytest.mark.parametrize(("huge", "reset"), [(False, False), (True, False), (False, True)])
def test_a_fold_of_chunks_answers_as_the_chunks_do_whatever_the_windows_cut(tmp_path, monkeypatch, huge, reset):
    """A batch folds six settled chunks into a block; a seventh chunk comes; the next batch's windows, of a minute,
    ten minutes and a day, hold the block's groups whole, cut them or miss them, and a reset hides the folded
    chunks' events of one group: every new event gets what a scan of the retained events it can see gives."""
    monkeypatch.setattr(policy, "MAX_MERGED", 100)  # chunks of 300 events count as settled (never merged again)
    rng = np.random.default_rng(17)
    store = ShardEvents(Meta(), Resets.empty(), MemoryBackend(), Cache("test", 0, root=str(tmp_path)))
    old = []
    for b in range(7):
        old.append(_ruled(rng, 300, [1, 2, 3], (b * 4 * MIN, (b + 1) * 4 * MIN + MIN), b * 300, huge))
        store.append(old[-1], KEEP_ALL)
        if b == 5:
            day = _ruled(rng, 200, [3], (40 * MIN, 41 * MIN), 20_000, huge)
            _check(store.base(day, RULES), _scan(Events.concat(old), day), day)
            assert [len(b.chunks) for b in store.cache.blocks] == [6]
        if reset and b == 5:  # group 3 of rule 3 emptied: the folded chunks' events of it are hidden
            every = Events.concat(old)
            store.add_resets(every.take(np.flatnonzero(every.g == 3 * 1_000_003 + 3)[-1:]))
            old = [o.take(np.flatnonzero(~store.resets.hidden(o))) for o in old]
    new = _ruled(rng, 400, [1, 2, 3], (0, 30 * MIN), 10_000, huge)
    _check(store.base(new, RULES), _scan(Events.concat(old), new), new)
    assert [len(b.chunks) for b in store.cache.blocks] == [7]  # the seventh joined the block


def test_a_window_start_asks_the_chunks_of_the_block_it_cuts_only(tmp_path, monkeypatch):
    """Twenty settled chunks of four minutes each fold into blocks of eight, eight and four. Ten-minute windows
    start in the last block: only its chunks are asked one by one, and the answers are a scan's. The oldest chunk
    goes: its block is dropped and its seven other chunks fold again."""
    monkeypatch.setattr(policy, "MAX_MERGED", 100)  # chunks of 300 events count as settled
    rng = np.random.default_rng(19)
    store = ShardEvents(Meta(), Resets.empty(), MemoryBackend(), Cache("test", 0, root=str(tmp_path)))
    old = [_events(rng, 300, [2], (b * 4 * MIN, (b + 1) * 4 * MIN), b * 300, np.arange(9)) for b in range(20)]
    for ev in old:
        store.append(ev, KEEP_ALL)
    rules = {2: rule(2, window=10)}
    store.base(_events(rng, 10, [2], (80 * MIN, 80 * MIN + 1), 9_000, np.arange(9)), rules)
    ids = [c.id for c in store.meta.chunks]
    assert [sorted(i for i, _ in b.chunks) for b in store.cache.blocks] == [ids[:8], ids[8:16], ids[16:]]
    asked, ask = [], ShardEvents._ask

    def spy(self, out, needles, c):
        asked.append(c.id)
        ask(self, out, needles, c)

    monkeypatch.setattr(ShardEvents, "_ask", spy)
    new = _events(rng, 100, [2], (80 * MIN, 81 * MIN), 10_000, np.arange(9))
    _check(store.base(new, rules), _scan(Events.concat(old), new, {2: 10 * MIN}), new)
    assert asked and set(asked) <= set(ids[16:])
    nothing = _events(rng, 0, [2], (0, 1), 0, np.arange(9))
    store.append(nothing, Bounds.of({2: (0, 10 * MIN)}, 14 * MIN))  # the oldest chunk (minutes 0-4) is out
    store.cache.retain(store.meta.chunks)
    assert [sorted(i for i, _ in b.chunks) for b in store.cache.blocks] == [ids[8:16], ids[16:]]
    store.base(new, rules)
    assert [sorted(i for i, _ in b.chunks) for b in store.cache.blocks] == [ids[1:8], ids[8:16], ids[16:]]


def test_the_catalog_is_stored_as_asdict_gives_it():
    """Checkpoints of earlier releases hold the catalog as `dataclasses.asdict` wrote it: the hand-built JSON is
    the same text, and reads back the same."""
    meta = Meta(
        "t", 7, 3, 99, [Chunk(i, f"tag{i}", 10 * i, [Span(1, 2, 5, 50 + i), Span(3, 4, 5, 60)]) for i in range(3)]
    )
    assert meta.to_json() == json.dumps(asdict(meta), separators=(",", ":"))
    assert Meta.from_json(meta.to_json()) == meta


def test_settled_chunks_are_those_no_merge_takes_again():
    """A merge takes a run of the newest chunks of at most MAX_MERGED events: a chunk that the newer chunks after
    it outweigh, or too big for any run, stays: the soak's chunks of 40,000 (four of them pass 150,000) once newer
    ones outweigh them."""
    sizes = [40_000, 40_000, 40_000, 40_000, 10_000, 2_500]
    assert policy.settled([Chunk(i, "t", n, []) for i, n in enumerate(sizes)]) == {0}
    assert policy.settled([Chunk(i, "t", n, []) for i, n in enumerate([40_000] * 6)]) == {0, 1, 2}
    assert policy.settled([Chunk(0, "t", 90_000, []), Chunk(1, "t", 100, [])]) == {0}  # too big for any run
    # 70,000 + 40,000 + 20,000 + 10,000 newer ones would be a run (each within twice the smallest newer one)
    assert policy.settled([Chunk(0, "t", 70_000, []), Chunk(1, "t", 100, [])]) == set()


def test_no_merge_ever_takes_a_chunk_called_settled():
    """Chunk sizes as batches append them and merges combine them (no event leaving a window): whatever comes
    next, no merge run holds a chunk that `_settled` named before."""
    rng = np.random.default_rng(29)
    for _ in range(200):
        chunks = [Chunk(i, "t", int(n), []) for i, n in enumerate(rng.integers(1, 90_000, rng.integers(1, 8)))]
        settled, next_id = policy.settled(chunks), len(chunks)
        for n in rng.integers(1, 50_000, 40):
            chunks.append(Chunk(next_id, "t", int(n), []))
            next_id += 1
            while (run := policy.similar_tail(chunks)) >= policy.MERGE_FANIN:
                assert not {c.id for c in chunks[-run:]} & settled, [c.n for c in chunks]
                chunks[-run:] = [Chunk(next_id, "t", sum(c.n for c in chunks[-run:]), [])]
                next_id += 1


def test_the_budget_counts_the_search_arrays_a_detail_read_again_builds(tmp_path, monkeypatch):
    """The budget measures a chunk again only when its parts may have grown: a detail dropped, read again for a
    window that cuts it, then given its search arrays (keys, prefix sums, segment trees) is measured with them."""
    monkeypatch.setattr(state.BUDGET, "limit", 1 << 30)
    rng = np.random.default_rng(31)
    store = ShardEvents(Meta(), Resets.empty(), MemoryBackend(), Cache("test", 0, root=str(tmp_path)))
    for b in range(3):
        store.append(_ruled(rng, 300, [1, 2, 3], (b * 4 * MIN, (b + 1) * 4 * MIN), b * 300, False), KEEP_ALL)
    for c in store.meta.chunks:  # dropped, and measured without them, as the budget does
        store.parts[c.id].detail, store.parts[c.id].grown = None, True
    store.base(_ruled(rng, 100, [1, 2], (12 * MIN, 13 * MIN), 5_000, False), RULES)  # one- and ten-minute windows
    state.BUDGET.trim()
    held = [store.parts[c.id] for c in store.meta.chunks]
    assert any(chunk.detail is not None and "key" in chunk.detail.__dict__ for chunk in held)
    assert [state.BUDGET.sizes[chunk.born] for chunk in held] == [chunk.nbytes() for chunk in held]


def test_a_chunk_counts_the_group_sizes_its_summary_shares_with_its_detail_once():
    chunk = Indexed(_events(np.random.default_rng(5), 200, [1, 2], (0, MIN), 0, np.arange(9)).sorted())
    detail, summary = (sum(a.nbytes for a in part.arrays()) for part in (chunk.detail, chunk.summary))
    assert chunk.summary.size is chunk.detail.size
    assert chunk.nbytes() == detail + summary - chunk.detail.size.nbytes
    chunk.detail = None
    assert chunk.nbytes() == summary


def test_a_detail_read_again_never_displaces_one_in_use_held_since_its_chunk_was_written():
    rng = np.random.default_rng(3)
    events = [_events(rng, 100, [1], (0, MIN), 0, np.arange(9)).sorted() for _ in range(3)]
    a, b, c = (Indexed(ev) for ev in events)
    a.asked = b.asked = c.asked = True  # windows cut them all: queries use their details
    budget = Budget(limit=a.nbytes() * 5 // 2)
    for chunk in (a, b, c):
        budget.hold(chunk, resident=True)
    assert [x.detail is not None for x in (a, b, c)] == [False, True, True]  # the oldest made room
    a.restore(events[0])
    budget.hold(a, resident=False)
    assert [x.detail is not None for x in (a, b, c)] == [True, True, True]  # over the limit while a is used
    budget.trim()
    assert [x.detail is not None for x in (a, b, c)] == [False, True, True]
    assert budget.held_bytes() <= budget.limit


def test_details_no_query_used_make_room_for_one_that_windows_cut():
    """Day-long windows hold the newest chunks' groups whole: their details wait only for a merge. The oldest chunk,
    which the window's start cuts, is read again in every micro-batch unless it displaces them."""
    rng = np.random.default_rng(6)
    events = [_events(rng, 100, [1], (0, MIN), 0, np.arange(9)).sorted() for _ in range(3)]
    old, b, c = (Indexed(ev) for ev in events)
    budget = Budget(limit=old.nbytes() * 3 // 2)
    for chunk in (b, c):
        budget.hold(chunk, resident=True)
    old.asked = True
    budget.hold(old, resident=False)
    budget.trim()
    assert old.detail is not None and b.detail is None and c.detail is None  # both idle ones went
    assert budget.held_bytes() <= budget.limit


def test_the_parts_of_folded_chunks_go_before_any_other_chunk_is_cut():
    """A fold answers for its chunks: their summaries make room before the details of the others (a chunk that
    windows cut, read again, would otherwise be dropped and decoded again in every micro-batch)."""
    rng = np.random.default_rng(4)
    events = [_events(rng, 100, [1], (0, MIN), 0, np.arange(9)).sorted() for _ in range(3)]
    a, b, c = (Indexed(ev) for ev in events)
    a.detail = b.detail = None  # folded chunks: their windows hold them whole
    a.folded = b.folded = True
    budget = Budget(limit=c.nbytes() + a.nbytes() * 3 // 2)
    for chunk in (a, b, c):
        budget.hold(chunk, resident=True)
    assert [x.summary is not None for x in (a, b)] == [False, True] and c.detail is not None
    c.detail = None
    c.restore(events[2])  # c read again (not resident) as the budget shrinks: b's summary goes, not c's detail
    budget.hold(c, resident=False)
    budget.limit = c.nbytes()
    budget.trim()
    assert [x.summary is not None for x in (a, b)] == [False, False] and c.detail is not None


def test_a_fold_that_answers_every_new_event_reads_none_of_its_chunks(tmp_path, monkeypatch):
    """Day-long windows hold the folded chunks whole: a batch asks the fold, and no folded chunk's summary is
    read again (the budget dropped them all)."""
    monkeypatch.setattr(policy, "MAX_MERGED", 100)  # chunks of 300 events count as settled (never merged again)
    rng = np.random.default_rng(23)
    store = ShardEvents(Meta(), Resets.empty(), MemoryBackend(), Cache("test", 0, root=str(tmp_path)))
    old = []
    for b in range(6):
        old.append(_ruled(rng, 300, [3], (b * 4 * MIN, (b + 1) * 4 * MIN), b * 300, False))
        store.append(old[-1], KEEP_ALL)
    day = _ruled(rng, 200, [3], (40 * MIN, 41 * MIN), 20_000, False)
    store.base(day, RULES)
    assert [len(b.chunks) for b in store.cache.blocks] == [6]
    assert all(store.parts[c.id].folded for c in store.meta.chunks)  # the budget drops their parts first
    monkeypatch.setattr(state.BUDGET, "limit", 0)
    state.BUDGET.trim()
    assert all(store.parts[c.id].summary is None for c in store.meta.chunks)
    later = _ruled(rng, 200, [3], (42 * MIN, 43 * MIN), 30_000, False)
    _check(store.base(later, RULES), _scan(Events.concat(old), later), later)
    assert all(store.parts[c.id].summary is None for c in store.meta.chunks)
    store.cache.retain(store.meta.chunks[1:])  # a folded chunk gone: no block, and no chunk counts as folded
    assert store.cache.blocks == [] and not any(store.parts[c.id].folded for c in store.meta.chunks[1:])


def test_a_summary_dropped_for_the_budget_is_read_again_from_its_file_not_built_from_the_events(tmp_path, monkeypatch):
    """Long windows hold whole groups: a batch needs every chunk's summary and no chunk's events. Summaries the
    budget dropped come back from their small local files, without reading or decoding the chunks' events."""
    monkeypatch.setattr(state.BUDGET, "limit", 0)
    rng = np.random.default_rng(11)
    windows = {1: 24 * 60 * MIN, 2: 24 * 60 * MIN}
    rules = {1: rule(1, agg="SUM", window=24 * 60), 2: rule(2, agg="MAX", window=24 * 60)}
    store = ShardEvents(Meta(), Resets.empty(), MemoryBackend(), Cache("test", 0, root=str(tmp_path)))
    old = []
    for b in range(5):
        ev = _events(rng, 200, [1, 2], (b * 2 * MIN, (b + 1) * 2 * MIN), b * 200, np.arange(-50, 500))
        ev.g = ev.g + ev.rule
        old.append(ev)
        store.append(ev, Bounds.of({r: (0, w) for r, w in windows.items()}, 0))
    assert sum(store.parts[c.id].summary is None for c in store.meta.chunks) == len(store.meta.chunks) - 1
    store.cache.retain(store.meta.chunks)
    files = sorted(p.name for p in (tmp_path / "test" / "0").iterdir())
    assert files == sorted(f"{c.id}-{c.tag}{part}.arrow" for c in store.meta.chunks for part in ("", ".summary"))

    def unread(*_):
        raise AssertionError("a chunk's events were read")

    monkeypatch.setattr(store.cache, "read", unread)
    monkeypatch.setattr(store.backend, "chunks", unread)
    new = _events(rng, 300, [1, 2], (10 * MIN, 20 * MIN), 5_000, np.arange(-50, 500))
    new.g = new.g + new.rule
    got = store.base(new, rules)
    for i, (count, total, _, high) in enumerate(_scan(Events.concat(old), new, windows)):
        assert (got.count[i], got.total[i]) == (count, total), i
        assert got.high[i] == (high if new.rule[i] == 2 else I64_MIN), i
