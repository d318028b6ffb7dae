"""The login anomaly detector as a streaming query: seed scenarios, late events, state cleanup, reference, its own
watermark beside the window rules."""

from __future__ import annotations

import json
import random

import pytest

from fraudrules.ops import state_reader
from fraudrules.rules.model import parse_rule
from tests.support import reference_logins
from tests.support.harness import login_event as ev
from tests.support.harness import rule, seed_attack
from tests.support.streams import FileStream

pytestmark = pytest.mark.spark
W = 10 * 60_000
DETECTOR = parse_rule({"ruleId": 100, "ruleState": "ACTIVE", "ruleType": "LOGIN_ANOMALY"})
TX = {"payeeId": 1, "beneficiaryId": 1, "paymentAmount": "10.00", "paymentType": "CSH"}


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
        stream.feed_logins([ev(9, "SUCCESS", "4.4.4.4", 6_000 + W + 10_002)])
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
        "malformed JSON: truncated",
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


def test_transactions_and_logins_an_hour_apart_each_keep_their_own_watermark(spark, tmp_path):
    """One query evaluates both: Spark's one watermark would make the older stream's events late. Here the
    transactions an hour behind the logins are evaluated, and a login event behind the logins' own watermark is
    late."""
    hour = 3_600_000
    count = rule(1, field="COUNT_FLINK", op="GREATER_EQUAL", limit="2", window=1)
    stream = FileStream(spark, str(tmp_path), [DETECTOR, count], shards=2, logins=True).start()
    attack = [ev(u["userId"], u["eventType"], u["ipAddress"], hour + u["eventTimestamp"]) for u in seed_attack(user=3)]
    try:
        stream.feed_logins(attack)
        stream.feed([{**TX, "transactionId": 1, "eventTime": 1_000}])
        stream.feed([{**TX, "transactionId": 2, "eventTime": 2_000}])
        stream.feed_logins([ev(4, "FAIL", "8.8.8.8", 5_000)])
    finally:
        stream.stop()
    alerts = sorted((a.kind, a.ruleId, a.transactionId, a.userId) for a in stream.alert_rows())
    assert alerts == [("LOGIN_ANOMALY", 100, None, 3), ("WINDOW", 1, 2, None)]
    late = stream.table("late_events").collect()
    assert [(x.kind, x.userId, x.watermarkMs) for x in late] == [("login", 4, hour + 4_000 - 60_000)]
    batch = state_reader.last_committed(stream.cfg).batch_id  # what the data-quality suites compare with
    assert state_reader.watermarks(spark, stream.cfg, batch, "login") == {0: hour + 4_000 - 60_000, 1: hour - 56_000}
    assert state_reader.watermarks(spark, stream.cfg, batch, "window") == {0: 0, 1: 0}  # 2,000 − 60,000: none yet
