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

from fraudrules.engine.state.cache import (
    BUDGET,
    CACHE_ENV,
    STATE_MEMORY_MB,
    Budget,
    Cache,
    Indexed,
    cache_for,
    drop_cache,
)
from fraudrules.engine.state.catalog import Bounds, Chunk, Meta, Resets, Span
from fraudrules.engine.state.codec import decode, encode
from fraudrules.engine.state.shard import Backend, ShardEvents

__all__ = [
    "BUDGET",
    "CACHE_ENV",
    "STATE_MEMORY_MB",
    "Backend",
    "Bounds",
    "Budget",
    "Cache",
    "Chunk",
    "Indexed",
    "Meta",
    "Resets",
    "ShardEvents",
    "Span",
    "cache_for",
    "decode",
    "drop_cache",
    "encode",
]
