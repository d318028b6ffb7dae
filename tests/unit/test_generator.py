"""The demo generator's paced writer: what `make run` writes into the landing folders."""

from __future__ import annotations

import itertools
import json

from fraudrules.generator import LoginWorkload, RateWriter, Workload, write_jsonl


def test_realtime_logins_are_never_identical_events(tmp_path):
    """Each event at its own millisecond, times rising, never after the moment it was written, also when the
    writer falls behind: with 50 logins a tick among 500 users, stamping a tick's events with one moment made
    identical login events (user, type, IP, time), which the logins suite rightly fails. On a clock of the test's:
    the writer's thread stalls for a second after its fifth tick (as on a busy machine), then catches up."""
    clock = _Clock(stall_after=5, stall_s=1.0)
    logins = LoginWorkload(count=10**6, seed=3).events()
    writer = RateWriter(
        str(tmp_path),
        logins,
        500,
        realtime=True,
        time_field="eventTimestamp",
        limit=1_000,
        clock=clock,
        pause=clock.pause,
    )
    writer.run()  # in this thread, to its limit: 20 ticks of 50 events
    files = sorted(tmp_path.glob("rt-*.json"), key=lambda f: int(f.stem.rsplit("-", 1)[1]))  # in tick order
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert (len(files), len(rows)) == (20, 1_000)
    assert clock.caught_up >= 9  # ticks written at once after the stall, at one moment
    times = [r["eventTimestamp"] for r in rows]
    assert all(a < b for a, b in itertools.pairwise(times))
    assert all(r["eventTimestamp"] <= r["ingestionTimestamp"] for r in rows)


class _Clock:
    """A wall clock that moves only when the writer pauses, and once by `stall_s` more (a stall)."""

    def __init__(self, stall_after: int, stall_s: float):
        self.now, self.pauses, self.caught_up = 1_800_000_000.0, 0, 0
        self.stall_after, self.stall_s = stall_after, stall_s

    def __call__(self) -> float:
        return self.now

    def pause(self, seconds: float) -> bool:
        self.pauses += 1
        self.caught_up += seconds == 0
        self.now += seconds + (self.stall_s if self.pauses == self.stall_after else 0.0)
        return False


def test_files_are_modified_in_the_order_written(tmp_path):
    """The file source takes files in modification-time order: 50 files written within a few milliseconds each get
    their own, rising millisecond, so a replay one file per micro-batch never takes a later file first."""
    write_jsonl(str(tmp_path), Workload(count=500).transactions(), per_file=10)
    files = sorted(tmp_path.glob("part-*.json"))
    modified = [f.stat().st_mtime_ns // 1_000_000 for f in files]
    assert len(files) == 50 and all(a < b for a, b in itertools.pairwise(modified))


def test_no_user_logs_in_twice_in_one_millisecond():
    """The soak's 100 logins a second among 500 users drew one user twice within a millisecond: two identical events
    (user, type, IP, time). Each user's times rise strictly."""
    events = list(LoginWorkload(count=100_000, seed=99, events_per_second=100.0, attack_every=200).events())
    per_user: dict[int, list[int]] = {}
    for e in events:
        per_user.setdefault(e["userId"], []).append(e["eventTimestamp"])
    assert all(a < b for times in per_user.values() for a, b in itertools.pairwise(times))
