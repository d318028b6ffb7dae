"""The login anomaly detector as a streaming query: seed scenarios, late events, state cleanup, reference."""

from __future__ import annotations

import json
import random

import pytest

from fraudrules.ops import state_reader
from fraudrules.rules.model import parse_rule
from tests.support import reference_logins
from tests.support.harness import login_event as ev
from tests.support.harness import seed_attack
from tests.support.streams import FileStream

pytestmark = pytest.mark.spark
W = 10 * 60_000
DETECTOR = parse_rule({"ruleId": 100, "ruleState": "ACTIVE", "ruleType": "LOGIN_ANOMALY"})


def test_seed_scenarios_late_events_and_cleanup(spark, tmp_path):
    stream = FileStream(spark, str(tmp_path), [DETECTOR], lateness_ms=5_000, logins=True).start()
    try:
        stream.feed_logins(
            [
                *seed_attack(user=1),
                ev(2, "FAIL", "1.1.1.1", 5_000),
                ev(2, "FAIL", "2.2.2.2", 6_000),
                "{broken",
                '{"userId": 3, "eventType": "MAYBE", "ipAddress": "x", "eventTimestamp": 1}',
            ]
        )
        assert set(state_reader.login_sequences(spark, stream.cfg)["userId"]) == {2}
        stream.feed_logins([ev(9, "SUCCESS", "4.4.4.4", 6_000 + W + 10_000)])  # watermark passes user 2's expiry
        stream.feed_logins([ev(1, "FAIL", "5.5.5.5", 500), ev(9, "SUCCESS", "4.4.4.4", 6_000 + W + 10_001)])
        stream.feed_logins([ev(9, "SUCCESS", "4.4.4.4", 6_000 + W + 10_002)])  # idle shards' timers fire
        sequences = state_reader.login_sequences(spark, stream.cfg)
    finally:
        stream.stop()
    alerts = stream.alert_rows()
    assert [(a.kind, a.userId, a.eventTimeMs) for a in alerts] == [("LOGIN_ANOMALY", 1, 4_000)]
    details = json.loads(alerts[0].details)
    assert details["failedIps"] == ["1.1.1.1", "2.2.2.2", "3.3.3.3"] and details["successIp"] == "9.9.9.9"
    assert "3 failed logins from 3 IPs" in alerts[0].message
    late = stream.table("late_events").collect()
    assert [(x.kind, x.userId, x.eventTimeMs) for x in late] == [("login", 1, 500)]
    assert sorted(r.reason.split(" (")[0] for r in stream.table("quarantine").collect()) == [
        "malformed JSON: not a JSON object",
        "unknown eventType",
    ]
    assert sequences.empty
    assert stream.table("logins").count() == 10  # every valid record is in bronze, late ones included


def test_random_streams_match_the_reference(spark, tmp_path):
    rnd = random.Random(4)
    t, events = 0, []
    for _ in range(400):
        t += rnd.randint(0, 40_000)
        events.append(ev(rnd.randint(1, 6), rnd.choice(["FAIL", "FAIL", "SUCCESS"]), rnd.choice("abcde"), t))
    batches = [events[:120], events[120:121], events[121:300], events[300:]]
    expected, _ = reference_logins.run(batches, 3, 2, W, 60_000)
    stream = FileStream(spark, str(tmp_path), [DETECTOR], logins=True).start()
    try:
        for b in batches:
            stream.feed_logins(b)
    finally:
        stream.stop()
    got = {
        (a.userId, a.eventTimeMs): (int(a.aggregate), json.loads(a.details)["failedIps"]) for a in stream.alert_rows()
    }
    assert got == expected and len(expected) >= 3
