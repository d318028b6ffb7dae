"""The demo generator's paced writer: what `make run` writes into the landing folders."""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
import time
from collections.abc import Iterator

from fraudrules.generator import LoginWorkload, RateWriter, Workload, write_jsonl


def test_realtime_logins_are_never_identical_events(tmp_path):
    """Each event at its own millisecond, times rising, never after the moment it was written, also when the
    writer falls behind: with 50 logins a tick among 500 users, stamping a tick's events with one moment made
    identical login events (user, type, IP, time), which the logins suite rightly fails."""
    logins = LoginWorkload(count=10**6, seed=3).events()
    writer = RateWriter(str(tmp_path), logins, 500, realtime=True, time_field="eventTimestamp")
    writer.start()
    time.sleep(0.5)
    with _stalled():  # the writer's thread waits for the GIL, as on a busy machine, then catches up
        time.sleep(1.0)
    time.sleep(0.5)
    writer.stop()
    writer.join()
    files = sorted(tmp_path.glob("rt-*.json"), key=lambda f: int(f.stem.rsplit("-", 1)[1]))  # in tick order
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert len(files) >= 15 and len(rows) >= 900
    times = [r["eventTimestamp"] for r in rows]
    assert all(a < b for a, b in itertools.pairwise(times))
    assert all(r["eventTimestamp"] <= r["ingestionTimestamp"] for r in rows)


@contextlib.contextmanager
def _stalled() -> Iterator[None]:
    """Hold the GIL (no thread switch for 1 s): the writer's ticks fall due meanwhile."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    try:
        end = time.time() + 1.0
        while time.time() < end:
            pass
        yield
    finally:
        sys.setswitchinterval(interval)


def test_files_are_modified_in_the_order_written(tmp_path):
    """The file source takes files in modification-time order: 50 files written within a few milliseconds each get
    their own, rising millisecond, so a replay one file per micro-batch never takes a later file first."""
    write_jsonl(str(tmp_path), Workload(count=500).transactions(), per_file=10)
    files = sorted(tmp_path.glob("part-*.json"))
    modified = [f.stat().st_mtime_ns // 1_000_000 for f in files]
    assert len(files) == 50 and all(a < b for a, b in itertools.pairwise(modified))
