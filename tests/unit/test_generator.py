"""The demo generator's paced writer: what `make run` writes into the landing folders."""

from __future__ import annotations

import json
import time

from fraudrules.generator import LoginWorkload, RateWriter


def test_realtime_logins_are_never_identical_events(tmp_path):
    """A tick's events spread over its interval, each at its own millisecond: with 50 logins a tick among 500
    users, stamping them all with the tick's moment made identical login events (user, type, IP, time) in most
    ticks, which the logins suite rightly fails."""
    logins = LoginWorkload(count=10**6, seed=3).events()
    writer = RateWriter(str(tmp_path), logins, 500, realtime=True, time_field="eventTimestamp")
    started = time.time()
    writer.start()
    time.sleep(1.5)
    writer.stop()
    writer.join()
    files = sorted(tmp_path.glob("rt-*.json"))
    events = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert len(files) >= 10 and len(events) >= 500
    keys = [(e["userId"], e["eventType"], e["ipAddress"], e["eventTimestamp"]) for e in events]
    assert len(set(keys)) == len(keys)
    for f in files:  # within a tick: in order, each at its own millisecond, none after the tick's stamp
        rows = [json.loads(line) for line in f.read_text().splitlines()]
        times = [r["eventTimestamp"] for r in rows]
        assert times == sorted(set(times)) and times[-1] == rows[-1]["ingestionTimestamp"]
    assert started * 1000 - 100 <= min(e["eventTimestamp"] for e in events)
