"""The bounded JSON-lines source without Spark: its reader planned and read the way Spark drives it (latestOffset,
partitions, read, commit), against a literal reading of the files."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows

from fraudrules.engine import lines
from tests.support.properties import examples


def reader(path: Path, ledger: Path, **options: str) -> lines.LinesReader:
    return lines.LinesReader({"path": str(path), "ledger": str(ledger), **options})


def drain(r: lines.LinesReader, limit=None, start: dict | None = None) -> list[list[tuple[str, int, bytes]]]:
    """Micro-batches until the source has nothing more: each a list of (file name, line, value)."""
    limit = limit or r.getDefaultReadLimit()
    at, batches = start or r.initialOffset(), []
    while (end := r.latestOffset(at, limit)) != at:
        rows = []
        for segment in r.partitions(at, end):
            for batch in r.read(segment):
                names = [unquote(os.path.basename(n)) for n in batch.column("srcName").to_pylist()]
                columns = (names, batch.column("srcPos").to_pylist(), batch.column("value").to_pylist())
                rows += list(zip(*columns, strict=True))
        r.commit(end)
        batches.append(rows)
        at = end
    return batches


def literal(files: list[Path]) -> list[tuple[str, int, bytes]]:
    """Every line of the files, in order: split at newlines, numbered from 1 as an editor numbers them (a final
    newline ends a line)."""
    out = []
    for path in files:
        data = path.read_bytes()
        parts = data.split(b"\n")
        if data.endswith(b"\n") or not data:
            parts = parts[:-1]
        out += [(path.name, i, line) for i, line in enumerate(parts, start=1)]
    return out


def write(folder: Path, name: str, data: bytes, mtime: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))
    return path


@pytest.fixture
def landing(tmp_path) -> list[Path]:
    folder = tmp_path / "in"
    return [
        write(folder, "b.json", b'{"x":1}\n{"x":2}\n\n{"x":3}\n', 1_000),
        write(folder, "a.json", b'{"x":4}\r\n{"x":5}', 2_000),  # newer, though first by name; no final newline
        write(folder, "c.json", b"", 3_000),
        write(folder, "d.json", b'{"x":6}\n{"y":"' + b"z" * 100 + b'"}\n\n\n{"x":7}\n', 4_000),
    ]


def test_every_line_once_in_modification_time_order_whatever_the_bound(tmp_path, landing):
    (tmp_path / "in" / ".hidden.json").write_bytes(b"{}\n")
    (tmp_path / "in" / "_SUCCESS").write_bytes(b"")
    want = literal(landing)
    for options, sizes in (
        ({}, [len(want)]),
        ({"maxRecordsPerTrigger": "2"}, [2, 2, 2, 2, 2, 1]),
        ({"maxRecordsPerTrigger": "4", "partitionBytes": "9"}, [4, 4, 3]),  # batches span files
    ):
        batches = drain(reader(tmp_path / "in", tmp_path / f"ledger-{len(sizes)}", **options))
        assert [row for batch in batches for row in batch] == want, options
        assert [len(b) for b in batches] == sizes, options


def test_a_byte_bound_admits_whole_lines_and_at_least_one(tmp_path, landing):
    batches = drain(reader(tmp_path / "in", tmp_path / "ledger"), ReadMaxBytes(20))
    assert [row for batch in batches for row in batch] == literal(landing)
    assert all(sum(len(v) + 1 for *_, v in b) <= 20 or len(b) == 1 for b in batches)
    assert any(len(b) == 1 and len(b[0][2]) > 20 for b in batches)  # the 107-byte line came alone


def test_lines_longer_than_a_read_block(tmp_path, monkeypatch):
    monkeypatch.setattr(lines, "BLOCK", 8)
    files = [write(tmp_path / "in", "long.json", b"x" * 30 + b"\n\ny\n" + b"z" * 20, 1_000)]
    for limit in (ReadMaxRows(1), ReadMaxBytes(5), ReadAllAvailable()):
        batches = drain(reader(tmp_path / "in", tmp_path / f"ledger-{limit}", partitionBytes="4"), limit)
        assert [row for batch in batches for row in batch] == literal(files)


@examples(60)
@given(
    texts=st.lists(st.lists(st.sampled_from([b"{}", b"", b" ", b'{"a":1}', b"x" * 40]), max_size=12), max_size=4),
    final_newline=st.lists(st.booleans(), min_size=4, max_size=4),
    bound=st.one_of(st.integers(1, 9).map(ReadMaxRows), st.integers(1, 90).map(ReadMaxBytes)),
    block=st.integers(1, 64),
    partition=st.integers(1, 128),
)
def test_any_files_any_bound_any_block(tmp_path_factory, texts, final_newline, bound, block, partition):
    lines.BLOCK = block
    try:
        root = tmp_path_factory.mktemp("prop")
        files = [
            write(root / "in", f"f{i}.json", b"\n".join(t) + (b"\n" if t and final_newline[i] else b""), 1_000 + i)
            for i, t in enumerate(texts)
        ]
        batches = drain(reader(root / "in", root / "ledger", partitionBytes=str(partition)), bound)
        assert [row for batch in batches for row in batch] == literal(files)
        if isinstance(bound, ReadMaxRows):
            assert all(len(b) <= bound.max_rows for b in batches)
    finally:
        lines.BLOCK = 8 << 20


def test_small_files_are_packed_into_partitions_and_big_ones_split(tmp_path):
    """A continuous job's micro-batch holds the small files that landed since the last one: one partition (one
    Python task) for all of them, as Spark's file source packs them; a file bigger than a partition is split."""
    small = [write(tmp_path / "in", f"s{i}.json", b"{}\n" * 3, 1_000 + i) for i in range(8)]  # 9 bytes each
    big = write(tmp_path / "in", "big.json", b"{}\n" * 30, 2_000)  # 90 bytes
    r = reader(tmp_path / "in", tmp_path / "ledger", partitionBytes="40")
    start = r.initialOffset()
    bundles = r.partitions(start, r.latestOffset(start, ReadAllAvailable()))
    sizes = [[s.end - s.start for s in b.segments] for b in bundles]
    assert sizes[:2] == [[9, 9, 9, 9], [9, 9, 9, 9]]  # 8 small files, 2 partitions of at most 40 bytes
    assert all(len(b) == 1 and 40 <= b[0] <= 42 for b in sizes[2:4]) and sum(map(sum, sizes[2:])) == 90
    assert [name for name, _, _ in drain(reader(tmp_path / "in", tmp_path / "again"))[0]] == [
        name for name, _, _ in literal([*small, big])
    ]


def test_a_big_batch_of_small_files_is_read_in_two_partitions_at_least(tmp_path, monkeypatch):
    monkeypatch.setattr(lines, "MIN_SPLIT", 20)
    for i in range(8):
        write(tmp_path / "in", f"s{i}.json", b"{}\n" * 3, 1_000 + i)  # 72 bytes in all: halves of 36
    r = reader(tmp_path / "in", tmp_path / "ledger")  # partitions of 32 MiB
    start = r.initialOffset()
    bundles = r.partitions(start, r.latestOffset(start, ReadAllAvailable()))
    assert [len(b.segments) for b in bundles] == [4, 4]


def test_a_big_batch_of_one_file_is_read_in_two_partitions(tmp_path, monkeypatch):
    """A backtest of one big file: each micro-batch's range of it is read by both cores, not one."""
    monkeypatch.setattr(lines, "MIN_SPLIT", 20)
    big = write(tmp_path / "in", "big.json", b"".join(b'{"n":%d}\n' % i for i in range(30)), 1_000)
    r = reader(tmp_path / "in", tmp_path / "ledger")  # partitions of 32 MiB
    start = r.initialOffset()
    bundles = r.partitions(start, r.latestOffset(start, ReadMaxRows(20)))
    assert [len(b.segments) for b in bundles] == [1, 1]
    batches = drain(reader(tmp_path / "in", tmp_path / "again"), ReadMaxRows(20))
    assert batches[0] == literal([big])[:20] and batches[1] == literal([big])[20:]


def test_a_file_landing_late_with_an_old_time_is_still_read(tmp_path, landing):
    r = reader(tmp_path / "in", tmp_path / "ledger")
    first = drain(r)
    late = write(tmp_path / "in", "0-late.json", b'{"x":8}\n', 500)  # older than everything read so far
    start = {"file": 4, "byte": 0, "line": 0}
    assert drain(r, start=start) == [literal([late])]
    # a new reader (a restarted query) knows every file by its index: nothing is read twice
    assert drain(reader(tmp_path / "in", tmp_path / "ledger"), start={"file": 5, "byte": 0, "line": 0}) == []
    assert first == [literal(landing)]


def test_available_now_reads_what_was_there_when_it_started(tmp_path, landing):
    r = reader(tmp_path / "in", tmp_path / "ledger", maxRecordsPerTrigger="3")
    r.prepareForTriggerAvailableNow()
    write(tmp_path / "in", "later.json", b'{"x":9}\n', 9_000)
    assert [row for batch in drain(r) for row in batch] == literal(landing)


def test_one_file_or_a_glob(tmp_path, landing):
    one = drain(reader(tmp_path / "in" / "d.json", tmp_path / "l1"))
    assert one == [literal([landing[3]])]
    some = drain(reader(tmp_path / "in" / "{a,d}.json", tmp_path / "l2"))
    assert some == [literal([landing[1], landing[3]])]
    literal_name = write(tmp_path / "odd", "p[1].json", b"{}\n", 1_000)  # a file's own name, not a pattern
    assert drain(reader(literal_name, tmp_path / "l3")) == [literal([literal_name])]


def test_the_ledger_survives_restarts_merges_and_forgets_what_is_read_and_old(tmp_path, monkeypatch):
    monkeypatch.setattr(lines, "COMPACT_AFTER", 3)
    day = 24 * 3600
    folder = tmp_path / "in"
    ledger_dir = tmp_path / "ledger"
    ledger = lines.Ledger(str(ledger_dir), max_age_ms=day * 1000)
    entries = []
    for i in range(5):
        entries.append(lines.FileEntry(str(folder / f"f{i}.json"), 10, i * day * 1000))
        ledger.add([entries[-1]], committed=3)
    # after 3 additions the parts were merged; files 0 (read, 4 days older than the newest) and 1 are forgotten
    again = lines.Ledger(str(ledger_dir), max_age_ms=day * 1000)
    assert (again.base, again.files, again.end) == (ledger.base, ledger.files, 5)
    assert again.base == 1 and again.entry(4) == entries[4]  # merged when file 2 came: newest 2 days, 0 is too old
    assert again.too_old(lines.FileEntry("x", 1, 2 * day * 1000)) and not again.too_old(entries[3])
    assert sorted(p.name for p in ledger_dir.iterdir()) == [
        f"{3:020d}.compact.json",
        f"{3:020d}.json",
        f"{4:020d}.json",
    ]


def test_where_the_last_committed_batch_left_the_source(tmp_path):
    assert lines.committed(str(tmp_path / "nothing")) == lines.Position(0, 0, 0)
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    for batch, offset in ((0, '{"file":0,"byte":7,"line":1}'), (1, '{"file":2,"byte":0,"line":0}')):
        (tmp_path / "offsets" / str(batch)).write_text(
            f'v1\n{{"batchWatermarkMs":0}}\n{{"reservoirVersion":1}}\n{offset}\n'
        )
    (tmp_path / "commits" / "0").write_text("v1\n{}\n")
    (tmp_path / "commits" / ".0.crc").write_text("")
    assert lines.committed(str(tmp_path)) == lines.Position(0, 7, 1)
