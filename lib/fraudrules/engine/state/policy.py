"""When chunks are merged (size-tiered, bounded per micro-batch) and which ones no merge takes again (settled:
folded in blocks)."""

from __future__ import annotations

from fraudrules.engine.state.catalog import Chunk

MERGE_FANIN = 4  # this many similar-sized newest chunks are merged into one (each event is rewritten log4 n times)


SIMILAR = 2  # sizes within this factor of the smallest are similar


# events: bounds the merge work in one micro-batch (merging 500,000 cost up to ~1 s, which set the job's p99 latency);
# chunks no merge takes again are only dropped or rewritten, and folded (`Fold`)
MAX_MERGED = 150_000


FOLD_MIN = 3  # settled chunks that start a block (`Fold`): each folding sorts the block's groups again


# chunks a block holds at most: a window whose start cuts a block asks its chunks one by one, and a block is folded
# again when one of its chunks goes (rewritten or dropped)
FOLD_BLOCK = 8


def settled(chunks: list[Chunk]) -> set[int]:
    """Ids of the chunks that no merge takes while the newer chunks keep their events (a merge drops the block
    holding one: slower, never wrong). A merge takes a run of the newest chunks (`similar_tail`: MERGE_FANIN of
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


def similar_tail(chunks: list[Chunk]) -> int:
    """How many of the newest chunks are of similar size (and small enough to merge)."""
    run, smallest, total = 0, None, 0
    for c in reversed(chunks):
        low = c.n if smallest is None else min(smallest, c.n)
        if total + c.n > MAX_MERGED or (smallest is not None and max(c.n, smallest) > SIMILAR * max(low, 1)):
            break
        run, smallest, total = run + 1, low, total + c.n
    return run
