"""The two transformWithState processors with PySpark's in-memory TwsTester: no Spark session.

What the pure steps do is tested beside them (test_windowing.py, test_logins.py); here, what the adapters add:
rules held per shard from the rule-change rows, events kept as chunks in map state and read back the next
batch (from the worker's cache or, on a fresh worker, from the state), the coalesced cleanup timer, expiry
through it, and late rows reported. (The Spark tier runs the same processors in real queries.)
"""

from __future__ import annotations

import json
import sys

import pandas as pd
from pyspark.sql.streaming.tws_tester import TwsTester

from fraudrules.engine import state as shard_state
from fraudrules.engine.evaluation import LATE_REASON
from fraudrules.engine.logins import decode_sequences
from fraudrules.engine.processors import LoginProcessor, RulesProcessor
from fraudrules.rules.model import parse_rule
from tests.support.harness import LOGIN_EVENT_COLUMNS, RuleStream, login_frame, login_rule, rule, tx_rows
from tests.support.harness import login_event as login

MIN = 60_000
COALESCE = 10_000
SHARD = 7  # the shard's grouping label (see inputs.shard_labels)


def in_memory(processor) -> TwsTester:
    # The job drops its watermark column right after declaring it (inputs.watermarked), so Spark hands late
    # rows to the processor, which reports them: to the tester, no row is late.
    return TwsTester(processor, timeMode="EventTime", eventTimeExtractor=lambda _row: sys.maxsize)


def rules_processor(namespace: str, **settings) -> RulesProcessor:
    return RulesProcessor(lateness_ms=MIN, labels=[SHARD], namespace=namespace, timer_coalesce_ms=COALESCE, **settings)


def tx(tid: int, t: int, payee: int = 1) -> dict:
    return {
        "transactionId": tid,
        "eventTime": t,
        "payeeId": payee,
        "beneficiaryId": 1,
        "paymentAmount": "10.00",
        "paymentType": "CSH",
    }


def rows(stream: RuleStream, batch: list[dict], batch_no: int, rules=()) -> pd.DataFrame:
    return pd.concat([tx_rows(batch, batch_no), stream.changes(list(rules))], ignore_index=True)


def kinds(out: pd.DataFrame) -> list[str]:
    return sorted(out["kind"]) if len(out) else []


def retained(t: TwsTester) -> list[int]:
    chunks = t.peekMapState("chunks", SHARD)
    return sorted(x for blob in chunks.values() for x in shard_state.decode(bytes(blob[0])).t.tolist())


def meta(t: TwsTester) -> shard_state.Meta:
    return shard_state.Meta.from_json(t.peekValueState("meta", SHARD)[0])


# ------------------------------------------------------------------ RulesProcessor


COUNT = rule(1, field="COUNT_FLINK", op="GREATER_EQUAL", limit="2", window=1)


def test_rules_processor_keeps_a_shards_rules_and_events_between_batches(tmp_path, monkeypatch):
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    t, stream = in_memory(rules_processor("keep")), RuleStream()
    first = t.testInPandas(SHARD, rows(stream, [tx(1, 1_000)], 0, [COUNT]))
    assert kinds(first) == ["rule", "stats"]  # evaluated, no alert yet
    second = t.testInPandas(SHARD, rows(stream, [tx(2, 2_000), tx(3, 2_000, payee=2)], 1))  # no rule rows now
    alerts = second[second["kind"] == "alert"]
    assert list(alerts["transactionId"]) == [2] and list(alerts["aggregate"]) == ["2"]  # tx 1 came from state
    assert json.loads(alerts["rule"].iloc[0]) == COUNT.to_json()

    assert retained(t) == [1_000, 2_000, 2_000]
    m = meta(t)
    assert m.next_seq == 3 and len(m.chunks) == 2  # one chunk appended per micro-batch
    # one coalesced timer: the first multiple of COALESCE at or after newest event + window + 1
    assert m.timer == 70_000 and list(t.handle._timers.listTimers(SHARD)) == [70_000]
    rules = json.loads(t.peekValueState("rules", SHARD)[0])
    assert rules["rules"]["1"][1] == "ACTIVE"


def test_rules_processor_reads_the_state_back_on_a_fresh_worker(tmp_path, monkeypatch):
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path / "one"))
    t, stream = in_memory(rules_processor("fresh")), RuleStream()
    t.testInPandas(SHARD, rows(stream, [tx(1, 1_000)], 0, [COUNT]))
    shard_state._CACHES.clear()  # another process, another machine: no cache of any kind
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path / "two"))
    out = t.testInPandas(SHARD, rows(stream, [tx(2, 2_000)], 1))
    assert list(out[out["kind"] == "alert"]["transactionId"]) == [2]
    stats = json.loads(out[out["kind"] == "stats"]["details"].iloc[0])
    assert stats["chunksFromStore"] == 1 and stats["transactions"] == 1


def test_rules_processor_keeps_no_decoded_events_beyond_its_memory_budget(tmp_path, monkeypatch):
    """A budget of 0 MiB: after each batch no chunk's events stay decoded; windows that cut a key's events, and
    distinct counts, read them again from the local disk cache and find what a worker keeping them all finds."""
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(shard_state.BUDGET, "limit", shard_state.BUDGET.limit)  # restored after the test
    distinct = rule(2, field="COUNT_FLINK", op="GREATER_EQUAL", limit="2", window=1, unique=["transactionId"])
    found = {}
    for memory in (0, 64):
        t, stream = in_memory(rules_processor(f"budget{memory}", state_memory_mb=memory)), RuleStream()
        alerts = []
        for b in range(6):  # 20 s apart: a 1-minute window cuts the retained events of payee 1
            batch = [tx(10 * b + 1, 20_000 * b), tx(10 * b + 2, 20_000 * b)]
            out = t.testInPandas(SHARD, rows(stream, batch, b, [COUNT, distinct] if b == 0 else []))
            fired = out[out["kind"] == "alert"]
            alerts += sorted(zip(fired["ruleId"], fired["transactionId"], fired["aggregate"], strict=True))
            assert shard_state.BUDGET.limit == memory << 20
            assert (shard_state.BUDGET.held_bytes() == 0) == (memory == 0)
        found[memory] = alerts
    assert found[0] == found[64]
    assert {a for a in found[0] if a[1] == 52} == {(1, 52, "8"), (2, 52, "8")}  # 4 batches of 2 in [t − 1 min, t]


def test_rules_processor_timer_drops_expired_chunks_and_leaves_no_events(tmp_path, monkeypatch):
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    t, stream = in_memory(rules_processor("expire")), RuleStream()
    t.testInPandas(SHARD, rows(stream, [tx(1, 1_000)], 0, [COUNT]))
    assert t.setWatermark(69_999).empty  # before the timer: nothing fires
    assert retained(t) == [1_000]
    fired = t.setWatermark(70_000)
    assert list(fired.columns) and fired.empty  # the timer path emits no rows
    assert t.peekMapState("chunks", SHARD) == {} and meta(t).chunks == []
    assert list(t.handle._timers.listTimers(SHARD)) == []
    assert t.peekValueState("rules", SHARD) is not None  # the rules stay: they are not window state


def test_rules_processor_reports_late_rows_and_does_not_evaluate_them(tmp_path, monkeypatch):
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    t, stream = in_memory(rules_processor("late")), RuleStream()
    t.setWatermark(100_000)
    out = t.testInPandas(SHARD, rows(stream, [tx(1, 50_000), tx(2, 150_000), tx(3, 150_000)], 0, [COUNT]))
    late = out[out["kind"] == "late"]
    assert list(late["transactionId"]) == [1] and list(late["watermark"]) == [100_000]
    assert list(late["reason"]) == [LATE_REASON] and list(late["key"]) == ['{"payeeId":"1"}']
    assert list(out[out["kind"] == "alert"]["transactionId"]) == [3]  # 2 and 3 counted, 1 not
    assert retained(t) == [150_000, 150_000]


def test_rules_processor_clear_state_all_starts_the_windows_afresh(tmp_path, monkeypatch):
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    t, stream = in_memory(rules_processor("clear")), RuleStream()
    t.testInPandas(SHARD, rows(stream, [tx(1, 1_000)], 0, [COUNT]))
    clear = parse_rule({"ruleId": 0, "ruleState": "CONTROL", "controlType": "CLEAR_STATE_ALL"})
    out = t.testInPandas(SHARD, rows(stream, [tx(2, 2_000)], 1, [clear]))
    assert "alert" not in kinds(out)
    assert retained(t) == [2_000]
    assert json.loads(t.peekValueState("rules", SHARD)[0])["epoch"] == 1


def test_rules_processor_rule_change_arrives_with_the_events_it_applies_to(tmp_path, monkeypatch):
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    t, stream = in_memory(rules_processor("change")), RuleStream()
    t.testInPandas(SHARD, rows(stream, [tx(1, 1_000)], 0, [COUNT]))
    stricter = rule(1, field="COUNT_FLINK", op="GREATER_EQUAL", limit="3", window=1)
    out = t.testInPandas(SHARD, rows(stream, [tx(2, 2_000)], 1, [stricter]))  # same windows, limit 3
    assert "alert" not in kinds(out)
    out = t.testInPandas(SHARD, rows(stream, [tx(3, 3_000)], 2))
    assert list(out[out["kind"] == "alert"]["ruleVersion"]) == [2]


# ------------------------------------------------------------------ LoginProcessor


W = 10 * MIN


def login_rows(stream: RuleStream, batch: list[dict], batch_no: int, rules=()) -> pd.DataFrame:
    return pd.concat(
        [login_frame(batch, batch_no), stream.changes(list(rules), LOGIN_EVENT_COLUMNS)], ignore_index=True
    )


def test_login_processor_alerts_across_batches_and_closes_the_sequence():
    t, stream = in_memory(LoginProcessor([SHARD], timer_coalesce_ms=COALESCE)), RuleStream()
    t.testInPandas(
        SHARD, login_rows(stream, [login(1, "FAIL", "a", 1_000), login(1, "FAIL", "b", 2_000)], 0, [login_rule()])
    )
    (blob,) = t.peekValueState("sequences", SHARD)
    assert {k: s.ips for k, s in decode_sequences(blob).items()} == {(1, 1): ["a", "b"]}
    assert t.peekValueState("meta", SHARD) == (610_000,)  # start + W + 1, rounded up to COALESCE
    out = t.testInPandas(SHARD, login_rows(stream, [login(1, "FAIL", "c", 3_000), login(1, "SUCCESS", "z", 4_000)], 1))
    assert list(out[out["kind"] == "alert"]["userId"]) == [1]
    assert t.peekValueState("sequences", SHARD) is None and t.peekValueState("meta", SHARD) == (-1,)
    assert list(t.handle._timers.listTimers(SHARD)) == []


def test_login_processor_timer_drops_an_expired_sequence():
    t, stream = in_memory(LoginProcessor([SHARD], timer_coalesce_ms=COALESCE)), RuleStream()
    t.testInPandas(SHARD, login_rows(stream, [login(7, "FAIL", "a", 1_000)], 0, [login_rule()]))
    assert t.setWatermark(609_999).empty and t.peekValueState("sequences", SHARD) is not None
    t.setWatermark(610_000)
    assert t.peekValueState("sequences", SHARD) is None and t.peekValueState("meta", SHARD) == (-1,)


def test_login_processor_reports_late_events():
    t, stream = in_memory(LoginProcessor([SHARD], timer_coalesce_ms=COALESCE)), RuleStream()
    t.setWatermark(100_000)
    batch = [login(1, "FAIL", "a", 5_000), login(2, "FAIL", "b", 200_000)]
    out = t.testInPandas(SHARD, login_rows(stream, batch, 0, [login_rule()]))
    late = out[out["kind"] == "late"]
    assert list(late["userId"]) == [1] and list(late["watermark"]) == [100_000]
    assert {k[1] for k in decode_sequences(t.peekValueState("sequences", SHARD)[0])} == {2}
