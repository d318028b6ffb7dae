"""JSON-lines files as a stream of records, split into micro-batches by records or bytes, not by files.

Spark's own file source admits whole files: one 1 GB file is one micro-batch, parsed, keyed and evaluated at once
(a 1,000,000-record file took 6.5 GiB). This source (a Python data source, `spark.readStream.format(NAME)`) admits
at most `maxRecordsPerTrigger` lines or `maxBytesPerTrigger` bytes per micro-batch, ending a batch inside a file
when the bound says so; a micro-batch's range is cut into partitions of half the micro-batch, at least MIN_SPLIT
and at most `partitionBytes` (big files split, small ones packed together), read in parallel.

Rows: `value` (the line's bytes), `srcTime` (the file's modification time, ms), `srcName` (the file's URI) and
`srcPos` (the line's number in its file, from 1 as an editor counts; blank lines keep their number and are dropped
downstream). Offsets count lines from 0, as checkpoints of every release do.

Which files exist is kept in a ledger (`ledger` option: a folder in the query's checkpoint): every file is given
the next index the first time a listing sees it, in (modification time, path) order, and the index is written
before any offset refers to it. An offset is the position of the next unread byte: (file index, byte, line), so a
replayed micro-batch reads exactly the same records, and a file that lands later with an older modification time
is still read (after the ones seen before it). Files are immutable once they land (written elsewhere and renamed
in); names starting with `.` or `_` are skipped. Local paths (Unity Catalog volumes included) and URIs that
`pyarrow.fs` opens (`s3://`, `gs://`, `abfss://`, `hdfs://`) are read the same way.
"""

from __future__ import annotations

import fnmatch
import json
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from fraudrules.compat import spark_checkpoint, spark_jvm

NAME = "fraudrules_lines"
SCHEMA = "value binary, srcTime long, srcName string, srcPos long"
START = {"file": 0, "byte": 0, "line": 0}
BLOCK = 8 << 20  # bytes read at a time when counting lines, and per Arrow batch a partition yields
PARTITION_BYTES = 32 << 20
MIN_SPLIT = 4 << 20  # a micro-batch of twice this or more is read in two partitions at least (Spark's openCostInBytes)
COMPACT_AFTER = 64  # ledger files before they are merged into one
MAX_FILE_AGE_MS = 7 * 24 * 3600 * 1000  # Spark's file source default (`maxFileAge`)
NEWLINE = 10


@dataclass(frozen=True)
class FileEntry:
    path: str  # as the file system names it (a local absolute path, or bucket/key for a URI's file system)
    size: int
    mtime_ms: int


@dataclass(frozen=True)
class Position:
    """The next unread byte: file `file` (ledger index), at `byte`, which starts line `line`."""

    file: int
    byte: int
    line: int

    @staticmethod
    def of(offset: dict) -> Position:
        return Position(int(offset["file"]), int(offset["byte"]), int(offset["line"]))

    def offset(self) -> dict:
        return {"file": self.file, "byte": self.byte, "line": self.line}


@dataclass(frozen=True)
class Segment:
    """Lines of one file in [start, end) bytes, the first being line `line`."""

    uri: str
    path: str
    mtime_ms: int
    start: int
    end: int
    line: int


@dataclass(frozen=True)
class Bundle(InputPartition):
    """One partition: consecutive segments of about `partitionBytes` in all. Small files are packed together, as
    Spark's file source packs them: one task per file would cost a Python task each (a continuous job's
    micro-batch holds the few small files that landed since the last one)."""

    segments: tuple[Segment, ...]


def open_fs(location: str) -> tuple[pafs.FileSystem, str]:
    """The file system of a local path or URI, and the path within it (`dbfs:/x` is the `/dbfs/x` mount)."""
    if location.startswith("dbfs:"):
        location = "/dbfs/" + location.removeprefix("dbfs:").lstrip("/")
    if "://" in location:
        return pafs.FileSystem.from_uri(location)
    return pafs.LocalFileSystem(), os.path.abspath(location)


def uri_of(location: str, path: str) -> str:
    """The name records are stamped with: `file:/...` for local files (as Spark names them), else the URI."""
    if "://" in location:
        return f"{location.split('://', 1)[0]}://{path}"
    return "file:" + quote(path)


def visible(name: str) -> bool:
    return not name.startswith((".", "_"))


class Ledger:
    """The files a query's source has seen, by index (discovery order), kept in `folder`:

    - `<first>.json`: a JSON list of [path, size, mtime_ms], the files from index `first` on, written when a listing
      finds them (before any offset can name them);
    - `<end>.compact.json`: {"base": b, "files": [...]}, the files from b up to `end`, merged from the files above
      every COMPACT_AFTER additions. A merge leaves out files that are read (before the committed position) and
      `max_age_ms` older than the newest file: they are no longer needed to replay a micro-batch, and a file that
      old is ignored when a listing first sees it (as Spark's file source does with `maxFileAge`)."""

    def __init__(self, location: str, max_age_ms: int = MAX_FILE_AGE_MS):
        self.fs, self.folder = open_fs(location)
        self.max_age_ms = max_age_ms
        self.base = 0  # index of files[0]
        self.files: list[FileEntry] = []
        self.known: set[str] = set()
        self.newest = 0  # modification time of the newest file seen (ms)
        names = [i.base_name for i in self.fs.get_file_info(pafs.FileSelector(self.folder, allow_not_found=True))]
        compacts = sorted(int(n.split(".")[0]) for n in names if n.endswith(".compact.json"))
        if compacts:
            merged = self._read(f"{compacts[-1]:020d}.compact.json")
            self.base = merged["base"]
            self._extend(merged["files"])
        parts = sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())
        for first in (f for f in parts if f >= self.end):  # older parts are in the merged file
            self._extend(self._read(f"{first:020d}.json"))
        self._parts = len([f for f in parts if f >= self.base])

    @property
    def end(self) -> int:
        """The index the next new file gets."""
        return self.base + len(self.files)

    def entry(self, index: int) -> FileEntry:
        return self.files[index - self.base]

    def too_old(self, entry: FileEntry) -> bool:
        return bool(self.files) and entry.mtime_ms < self.newest - self.max_age_ms

    def _read(self, name: str):
        with self.fs.open_input_stream(f"{self.folder}/{name}") as fh:
            data = json.loads(fh.read())
        if isinstance(data, dict):
            return {"base": data["base"], "files": [FileEntry(*e) for e in data["files"]]}
        return [FileEntry(*e) for e in data]

    def _extend(self, entries: list[FileEntry]) -> None:
        self.files.extend(entries)
        self.known.update(e.path for e in entries)
        self.newest = max([self.newest, *(e.mtime_ms for e in entries)])

    def add(self, entries: list[FileEntry], committed: int) -> None:
        """Record new files (durably, before any offset can name them); `committed`: the first file not read."""
        if not entries:
            return
        self._write(f"{self.end:020d}.json", [[e.path, e.size, e.mtime_ms] for e in entries])
        self._extend(entries)
        self._parts += 1
        if self._parts >= COMPACT_AFTER:
            self.compact(committed)

    def compact(self, committed: int) -> None:
        drop = 0
        while drop < len(self.files) and self.base + drop < committed and self.too_old(self.files[drop]):
            drop += 1
        kept = self.files[drop:]
        name = f"{self.end:020d}.compact.json"
        self._write(name, {"base": self.base + drop, "files": [[e.path, e.size, e.mtime_ms] for e in kept]})
        for info in self.fs.get_file_info(pafs.FileSelector(self.folder)):
            if info.base_name.endswith(".json") and info.base_name != name:
                self.fs.delete_file(info.path)
        self.base, self.files = self.base + drop, kept
        self.known = {e.path for e in kept}
        self._parts = 0

    def _write(self, name: str, data: object) -> None:
        self.fs.create_dir(self.folder, recursive=True)
        tmp = f"{self.folder}/.{uuid.uuid4().hex}.tmp"
        with self.fs.open_output_stream(tmp) as fh:
            fh.write(json.dumps(data).encode())
        self.fs.move(tmp, f"{self.folder}/{name}")  # atomic on a local disk, one object on an object store


def list_files(fs: pafs.FileSystem, path: str) -> list[FileEntry]:
    """The visible files a folder, one file or a glob (in its last part) names now."""
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        infos = [info]
    elif info.type == pafs.FileType.Directory:
        infos = fs.get_file_info(pafs.FileSelector(path))
    elif any(c in os.path.basename(path) for c in "*?[{"):
        folder = fs.get_file_info(os.path.dirname(path))
        listed = fs.get_file_info(pafs.FileSelector(folder.path)) if folder.type == pafs.FileType.Directory else []
        patterns = _alternatives(os.path.basename(path))
        infos = [i for i in listed if any(fnmatch.fnmatchcase(i.base_name, p) for p in patterns)]
    else:
        return []
    return [
        FileEntry(i.path, i.size, int(i.mtime_ns // 1_000_000) if i.mtime_ns else 0)
        for i in infos
        if i.type == pafs.FileType.File and visible(i.base_name)
    ]


def _alternatives(pattern: str) -> list[str]:
    """A Hadoop glob's `{a,b}` alternatives as plain fnmatch patterns."""
    start = pattern.find("{")
    end = pattern.find("}", start)
    if start < 0 or end < 0:
        return [pattern]
    head, tail = pattern[:start], pattern[end + 1 :]
    return [p for option in pattern[start + 1 : end].split(",") for p in _alternatives(head + option + tail)]


def newline_ends(data: bytes) -> np.ndarray:
    """Positions just after each newline in `data`."""
    return np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == NEWLINE) + 1


class LinesReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches over the ledger's files (on the driver) and reads their byte ranges (on executors)."""

    def __init__(self, options: Mapping[str, str]):  # case-insensitive keys (Spark's data source options)
        self.location = options["path"]
        self.fs, self.path = open_fs(self.location)
        self.ledger_location = options["ledger"]
        self.max_records = int(options.get("maxRecordsPerTrigger") or 0)
        self.max_bytes = int(options.get("maxBytesPerTrigger") or 0)
        self.partition_bytes = int(options.get("partitionBytes") or PARTITION_BYTES)
        self._ledger: Ledger | None = None
        self.target: int | None = None  # available-now: files known when the query started
        self.committed = 0  # the first file not completely read by a committed micro-batch

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:  # on the driver only: executors never plan
            self._ledger = Ledger(self.ledger_location)
        return self._ledger

    def initialOffset(self) -> dict:
        return dict(START)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_records:
            return ReadMaxRows(self.max_records)
        if self.max_bytes:
            return ReadMaxBytes(self.max_bytes)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.discover()
        self.target = self.ledger.end

    def discover(self) -> None:
        """Give the files a listing sees for the first time their indices, oldest first."""
        ledger = self.ledger
        new = [e for e in list_files(self.fs, self.path) if e.path not in ledger.known and not ledger.too_old(e)]
        ledger.add(sorted(new, key=lambda e: (e.mtime_ms, e.path)), self.committed)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if self.target is None:
            self.discover()
        end = self.ledger.end if self.target is None else self.target
        records = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        size = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        return self.advance(Position.of(start), end, records, size).offset()

    def advance(self, at: Position, end: int, records: int | None, size: int | None) -> Position:
        """The position after at most `records` lines or `size` bytes from `at` (whole lines, at least one), not
        beyond file `end`; without a bound, the end of file `end - 1`."""
        admitted = False
        while at.file < end:
            entry = self.ledger.entry(at.file)
            if at.byte >= entry.size or (records is None and size is None):
                at = Position(at.file + 1, 0, 0)
                continue
            at, (lines, used) = self._within(entry, at, records, size, must=not admitted)
            if lines == 0:  # the next line does not fit in what is left
                break
            admitted = True
            records = None if records is None else records - lines
            size = None if size is None else size - used
            if (records is not None and records <= 0) or (size is not None and size <= 0):
                break
        return at

    def _within(
        self, entry: FileEntry, at: Position, records: int | None, size: int | None, must: bool
    ) -> tuple[Position, tuple[int, int]]:
        """How far into one file the budget reaches (`must`: at least one line): the new position and the lines
        and bytes it admits."""
        lines, done, scan = 0, at.byte, at.byte
        with self.fs.open_input_file(entry.path) as fh:
            while scan < entry.size:
                data = fh.read_at(min(BLOCK, entry.size - scan), scan)
                ends = scan + newline_ends(data)  # absolute positions after each line
                scan += len(data)
                if scan == entry.size and (not len(ends) or ends[-1] != scan):
                    ends = np.r_[ends, scan]  # the last line has no newline
                if not len(ends):  # inside one long line
                    continue
                allowed = len(ends)
                if records is not None:
                    allowed = min(allowed, records - lines)
                if size is not None:
                    allowed = min(allowed, int(np.searchsorted(ends - at.byte, size, side="right")))
                if must and lines == 0:
                    allowed = max(allowed, 1)
                if allowed > 0:
                    done, lines = int(ends[allowed - 1]), lines + allowed
                if allowed < len(ends):
                    break
        position = Position(at.file + 1, 0, 0) if done >= entry.size else Position(at.file, done, at.line + lines)
        return position, (lines, done - at.byte)

    def partitions(self, start: dict, end: dict) -> list[Bundle]:
        first, last = Position.of(start), Position.of(end)
        ranges = []  # (entry, lo, hi, line) of each file in the micro-batch
        for index in range(first.file, min(last.file, self.ledger.end - 1) + 1):
            entry = self.ledger.entry(index)
            lo = first.byte if index == first.file else 0
            hi = last.byte if index == last.file else entry.size
            if hi > lo:
                ranges.append((entry, lo, hi, first.line if index == first.file else 0))
        target = self._target(sum(hi - lo for _, lo, hi, _ in ranges))
        return self._packed([seg for r in ranges for seg in self._split(*r, target)], target)

    def _target(self, total: int) -> int:
        """Partition size of a micro-batch of `total` bytes: at most `partition_bytes`, and half the micro-batch
        when that is smaller but not below MIN_SPLIT: two cores read a big batch, of one file or of many."""
        return min(self.partition_bytes, max(MIN_SPLIT, -(-total // 2)))

    @staticmethod
    def _packed(segments: list[Segment], target: int) -> list[Bundle]:
        """Consecutive segments in bundles of at most `target` bytes (a bigger segment alone)."""
        bundles: list[list[Segment]] = []
        size = 0
        for seg in segments:
            if not bundles or size + seg.end - seg.start > target:
                bundles.append([])
                size = 0
            bundles[-1].append(seg)
            size += seg.end - seg.start
        return [Bundle(tuple(b)) for b in bundles]

    def _split(self, entry: FileEntry, lo: int, hi: int, line: int, target: int) -> list[Segment]:
        """[lo, hi) of a file as segments of about `target` bytes, each cut after a newline."""
        uri = uri_of(self.location, entry.path)
        out = []
        with self.fs.open_input_file(entry.path) as fh:
            while hi - lo > target:
                probe = lo + target
                cut = fh.read_at(min(BLOCK, hi - probe), probe).find(b"\n")
                if cut < 0 or probe + cut + 1 >= hi:
                    break
                out.append(Segment(uri, entry.path, entry.mtime_ms, lo, probe + cut + 1, line))
                line += fh.read_at(probe + cut + 1 - lo, lo).count(b"\n")
                lo = probe + cut + 1
        out.append(Segment(uri, entry.path, entry.mtime_ms, lo, hi, line))
        return out

    def commit(self, end: dict) -> None:
        self.committed = Position.of(end).file

    def read(self, partition: Bundle) -> Iterator[pa.RecordBatch]:
        fs, _ = open_fs(self.location)
        for segment in partition.segments:
            yield from self._read(fs, segment)

    @classmethod
    def _read(cls, fs: pafs.FileSystem, partition: Segment) -> Iterator[pa.RecordBatch]:
        with fs.open_input_file(partition.path) as fh:
            at, line = partition.start, partition.line
            while at < partition.end:
                data = fh.read_at(min(BLOCK, partition.end - at), at)
                ends = newline_ends(data)
                if at + len(data) < partition.end:  # not the last block: it ends after its last newline
                    if len(ends):
                        data = data[: int(ends[-1])]
                    else:  # a line longer than a block: the rest of the segment at once
                        data = fh.read_at(partition.end - at, at)
                        ends = newline_ends(data)
                if not len(ends) or ends[-1] != len(data):
                    ends = np.r_[ends, len(data)]
                yield cls._batch(data, ends, partition, line)
                at, line = at + len(data), line + len(ends)

    @staticmethod
    def _batch(data: bytes, ends: np.ndarray, partition: Segment, line: int) -> pa.RecordBatch:
        """The lines of `data` (each ending at `ends`) as rows, their newlines dropped."""
        n = len(ends)
        starts = np.r_[0, ends[:-1]].astype(np.int32)
        stops = (ends - (np.frombuffer(data, np.uint8)[ends - 1] == NEWLINE)).astype(np.int32)
        # value i is data[starts[i]:stops[i]]: the bytes without the newlines, and offsets over them
        keep = np.ones(len(data), dtype=bool)
        keep[(ends - 1)[stops != ends]] = False
        body = np.frombuffer(data, np.uint8)[keep]
        offsets = np.r_[0, np.cumsum(stops - starts)].astype(np.int32)
        values = pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(body)])
        return pa.RecordBatch.from_arrays(
            [
                values,
                pa.array(np.full(n, partition.mtime_ms, dtype=np.int64)),
                pa.array([partition.uri] * n, pa.string()),
                pa.array(line + 1 + np.arange(n, dtype=np.int64)),  # `line` counts from 0, srcPos from 1
            ],
            names=["value", "srcTime", "srcName", "srcPos"],
        )


def committed(checkpoint: str) -> Position:
    """Where a query's last committed micro-batch left this source (the start when it committed none): its end
    offset in the checkpoint's offset log. The query's first source of this kind: the evaluation reads the
    transactions before the login events."""
    fs, root = open_fs(checkpoint)
    batch = spark_checkpoint.newest_committed(fs, root)
    for line in spark_checkpoint.planned(fs, root, batch)[1] if batch is not None else ():
        offset = json.loads(line) if line.startswith("{") else None
        if isinstance(offset, dict) and set(offset) == set(START):
            return Position.of(offset)
    return Position.of(START)


def logged_sources(checkpoint: str) -> int | None:
    """How many sources the query of `checkpoint` read in its newest planned micro-batch; None before any."""
    fs, root = open_fs(checkpoint)
    batches = spark_checkpoint.logged_batches(fs, root, "offsets")
    return len(spark_checkpoint.planned(fs, root, batches[0])[1]) if batches else None


def unread(path: str, checkpoint: str) -> list[FileEntry]:
    """The files `path` names now that the query of `checkpoint` has not read to the end in a committed batch."""
    fs, location = open_fs(path)
    ledger, at = Ledger(ledger_of(checkpoint)), committed(checkpoint)
    index = {e.path: ledger.base + i for i, e in enumerate(ledger.files)}
    pending = []
    for entry in list_files(fs, location):
        i = index.get(entry.path)
        if i is None or i >= at.file:  # a position is always before the end of its file
            pending.append(entry)
    return pending


def ledger_of(checkpoint: str, name: str = "lines") -> str:
    """Where a query reading this source keeps its ledger: beside Spark's own logs in its checkpoint (`name`: one
    per source of a query that reads two)."""
    return checkpoint.rstrip("/") + "/" + name


_registering = threading.Lock()


def register(spark: SparkSession) -> None:
    """Make the source known to the session (`spark.readStream.format(NAME)`); registering again is harmless, but
    not from two threads at once: Spark checks that the name is free, then registers (`job.warm_up` registers in a
    thread while the queries are built). Its environment gets the keys its streaming runners put
    (`spark_jvm.settle_source_env`): their puts would otherwise race the serialization of another query's tasks."""
    with _registering:
        spark.dataSource.register(LinesSource)
        spark_jvm.settle_source_env(spark, NAME)


class LinesSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema) -> LinesReader:
        return LinesReader(self.options)
