"""What a Python worker keeps of the chunks it served: in memory within a byte budget (`Budget`), and their stored
bytes and summaries in a local disk cache shared by the machine's workers (`Cache`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable
from itertools import count
from typing import TypeVar

import pyarrow as pa

from fraudrules.config import JobConfig
from fraudrules.engine.state.catalog import Chunk
from fraudrules.engine.state.codec import decode
from fraudrules.engine.state.index import Detail, Fold, Summary
from fraudrules.engine.windowing import Events

CACHE_ENV = "FRAUDRULES_STATE_CACHE"


SUMMARY_PART = ".summary"  # a chunk's summary file in the local disk cache, beside its events' file


STATE_MEMORY_MB = JobConfig.state_memory_mb  # chunk summaries and events a Python worker keeps in memory (`Budget`)


_BORN = count()  # the order in which this process came to hold chunks


T = TypeVar("T")


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
