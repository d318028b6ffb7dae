"""The two transformWithState processors with PySpark's in-memory TwsTester: no Spark session.

What the pure steps do is tested beside them (test_windowing.py, test_logins.py); here, what the adapters add:
state kept per shard in one Arrow value and read back the next batch, the coalesced cleanup timer, expiry
through it, and late rows reported. (The Spark tier runs the same processors in real queries.)
"""

from __future__ import annotations

import sys

import pandas as pd
from pyspark.sql.streaming.tws_tester import TwsTester

from fraudrules.engine.evaluation import LATE_REASON
from fraudrules.engine.processors import LoginProcessor, RulesProcessor
from fraudrules.engine.state import decode_events, decode_sequences
from fraudrules.rules.codec import decode_active_logins, decode_active_windows
from tests.support.harness import keyed_frame, login_frame, rule
from tests.support.harness import login_event as login

MIN = 60_000
COALESCE = 10_000
SHARD = 0


def in_memory(processor) -> TwsTester:
    # The job drops its watermark column right after declaring it (engine/job.py `watermarked`), so Spark hands
    # late rows to the processor, which reports them: to the tester, no row is late.
    return TwsTester(processor, timeMode="EventTime", eventTimeExtractor=lambda _row: sys.maxsize)


def tx(tid: int, t: int, payee: int = 1) -> dict:
    return {
        "transactionId": tid,
        "eventTime": t,
        "payeeId": payee,
        "beneficiaryId": 1,
        "paymentAmount": "10.00",
        "paymentType": "CSH",
    }


def kinds(out: pd.DataFrame) -> list[str]:
    return sorted(out["kind"]) if len(out) else []


# ------------------------------------------------------------------ RulesProcessor


COUNT = rule(1, field="COUNT_FLINK", op="GREATER_EQUAL", limit="2", window=1)


def test_rules_processor_keeps_a_shards_events_between_batches():
    t = in_memory(RulesProcessor(lateness_ms=MIN, timer_coalesce_ms=COALESCE))
    first = t.testInPandas(SHARD, keyed_frame([tx(1, 1_000)], [COUNT], 0))
    assert kinds(first) == ["rule"]  # evaluated, no alert yet
    second = t.testInPandas(SHARD, keyed_frame([tx(2, 2_000), tx(3, 2_000, payee=2)], [COUNT], 1))
    alerts = second[second["kind"] == "alert"]
    assert list(alerts["transactionId"]) == [2] and list(alerts["aggregate"]) == ["2"]  # tx 1 came from state

    (blob,) = t.peekValueState("events", SHARD)
    retained = decode_events(blob)
    assert sorted(retained.t.tolist()) == [1_000, 2_000, 2_000] and sorted(retained.seq.tolist()) == [0, 1, 2]
    next_seq, epoch, active, timer = t.peekValueState("meta", SHARD)
    assert (next_seq, epoch) == (3, 0)
    assert decode_active_windows(active) == {1: (COUNT.sig, MIN)}
    # one coalesced timer: the first multiple of COALESCE at or after newest event + window + 1
    assert timer == 70_000 and list(t.handle._timers.listTimers(SHARD)) == [70_000]


def test_rules_processor_timer_expires_the_state_and_leaves_nothing_behind():
    t = in_memory(RulesProcessor(lateness_ms=MIN, timer_coalesce_ms=COALESCE))
    t.testInPandas(SHARD, keyed_frame([tx(1, 1_000)], [COUNT], 0))
    assert t.setWatermark(69_999).empty  # before the timer: nothing fires
    assert t.peekValueState("events", SHARD) is not None
    fired = t.setWatermark(70_000)
    assert list(fired.columns) and fired.empty  # the timer path emits no rows
    assert t.peekValueState("events", SHARD) is None and t.peekValueState("meta", SHARD) is None
    assert list(t.handle._timers.listTimers(SHARD)) == []


def test_rules_processor_reports_late_rows_and_does_not_evaluate_them():
    t = in_memory(RulesProcessor(lateness_ms=MIN, timer_coalesce_ms=COALESCE))
    t.setWatermark(100_000)
    out = t.testInPandas(SHARD, keyed_frame([tx(1, 50_000), tx(2, 150_000), tx(3, 150_000)], [COUNT], 0))
    late = out[out["kind"] == "late"]
    assert list(late["transactionId"]) == [1] and list(late["watermark"]) == [100_000]
    assert list(late["reason"]) == [LATE_REASON]
    assert list(out[out["kind"] == "alert"]["transactionId"]) == [3]  # 2 and 3 counted, 1 not
    assert sorted(decode_events(t.peekValueState("events", SHARD)[0]).t.tolist()) == [150_000, 150_000]


def test_rules_processor_clear_state_all_starts_the_windows_afresh():
    t = in_memory(RulesProcessor(lateness_ms=MIN, timer_coalesce_ms=COALESCE))
    t.testInPandas(SHARD, keyed_frame([tx(1, 1_000)], [COUNT], 0))
    cleared = keyed_frame([tx(2, 2_000)], [COUNT], 1).assign(epoch=1)  # CLEAR_STATE_ALL was issued
    out = t.testInPandas(SHARD, cleared)
    assert "alert" not in kinds(out)
    assert decode_events(t.peekValueState("events", SHARD)[0]).t.tolist() == [2_000]
    assert t.peekValueState("meta", SHARD)[1] == 1


# ------------------------------------------------------------------ LoginProcessor


W = 10 * MIN


def test_login_processor_alerts_across_batches_and_closes_the_sequence():
    t = in_memory(LoginProcessor(timer_coalesce_ms=COALESCE))
    t.testInPandas(SHARD, login_frame([login(1, "FAIL", "a", 1_000), login(1, "FAIL", "b", 2_000)], 0))
    (blob, active) = t.peekValueState("sequences", SHARD)
    assert {k: s.ips for k, s in decode_sequences(blob).items()} == {(1, 1): ["a", "b"]}
    assert decode_active_logins(bytes(active).decode()) == {1: W}
    assert t.peekValueState("meta", SHARD) == (610_000,)  # start + W + 1, rounded up to COALESCE
    out = t.testInPandas(SHARD, login_frame([login(1, "FAIL", "c", 3_000), login(1, "SUCCESS", "z", 4_000)], 1))
    assert list(out[out["kind"] == "alert"]["userId"]) == [1]
    assert t.peekValueState("sequences", SHARD) is None and t.peekValueState("meta", SHARD) is None
    assert list(t.handle._timers.listTimers(SHARD)) == []


def test_login_processor_timer_drops_an_expired_sequence():
    t = in_memory(LoginProcessor(timer_coalesce_ms=COALESCE))
    t.testInPandas(SHARD, login_frame([login(7, "FAIL", "a", 1_000)], 0))
    assert t.setWatermark(609_999).empty and t.peekValueState("sequences", SHARD) is not None
    t.setWatermark(610_000)
    assert t.peekValueState("sequences", SHARD) is None and t.peekValueState("meta", SHARD) is None


def test_login_processor_reports_late_events():
    t = in_memory(LoginProcessor(timer_coalesce_ms=COALESCE))
    t.setWatermark(100_000)
    out = t.testInPandas(SHARD, login_frame([login(1, "FAIL", "a", 5_000), login(2, "FAIL", "b", 200_000)], 0))
    late = out[out["kind"] == "late"]
    assert list(late["userId"]) == [1] and list(late["watermark"]) == [100_000]
    assert {k[1] for k in decode_sequences(t.peekValueState("sequences", SHARD)[0])} == {2}
