"""The evaluate query's transformWithState processor with PySpark's in-memory TwsTester: no Spark session.

What the pure steps do is tested beside them (test_windowing.py, test_logins.py); here, what the adapter adds:
rules held per shard from the rule-change rows, events kept as chunks in map state and read back the next batch
(from the worker's cache or, on a fresh worker, from the state), each detector's own watermark from the event
times it has seen, late rows reported, state pruned to that watermark at every batch, and the two detectors
routed in one processor. (The Spark tier runs the same processor in real queries.)
"""

from __future__ import annotations

import json

import pandas as pd
from pyspark.sql.streaming.tws_tester import TwsTester

from fraudrules.engine import state as shard_state
from fraudrules.engine.evaluation import LATE_REASON
from fraudrules.engine.logins import decode_sequences
from fraudrules.engine.processors import Detectors
from fraudrules.engine.shard_values import LEGACY, VALUE, ShardValues
from fraudrules.engine.state import cache as state_cache
from fraudrules.rules.model import parse_rule
from tests.support.harness import (
    RuleStream,
    detector_columns,
    detector_frame,
    login_frame,
    login_rule,
    rule,
    seed_attack,
    tx_rows,
)
from tests.support.harness import login_event as login

MIN = 60_000
SHARD = 7  # the shard's grouping label (see inputs.shard_labels)


def in_memory(processor: Detectors) -> TwsTester:
    return TwsTester(processor, timeMode="None")


def rules_processor(namespace: str, **settings) -> Detectors:
    return Detectors(lateness_ms=MIN, labels=[SHARD], namespace=namespace, **settings)


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


def values(t: TwsTester, shard: int = SHARD) -> ShardValues:
    return ShardValues.of(t.peekValueState(VALUE, shard))


def meta(t: TwsTester) -> shard_state.Meta:
    return shard_state.Meta.from_json(values(t).meta)


# ------------------------------------------------------------------ the window rules


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
    assert m.clock == 2_000  # the newest transaction time: the next batch's watermark is this minus the lateness
    rules = json.loads(values(t).rules)
    assert rules["rules"]["1"][1] == "ACTIVE"


def test_output_keeps_64_bit_ids_exact_beside_rows_without_them(tmp_path, monkeypatch):
    """An alert's transaction id above 2**53 (a snowflake-style id) reaches the sink as sent, in a micro-batch
    whose output also holds rows without a transaction id (the rule and stats rows)."""
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    t, stream = in_memory(rules_processor("wide")), RuleStream()
    big = 2**60 + 1  # a float64 would make it 2**60
    out = t.testInPandas(SHARD, rows(stream, [tx(big, 1_000), tx(big + 2, 1_000)], 0, [COUNT]))
    assert kinds(out) == ["alert", "rule", "stats"]
    assert list(out.loc[out["kind"] == "alert", "transactionId"]) == [big + 2]
    assert str(out["transactionId"].dtype) == "Int64" and out.loc[out["kind"] != "alert", "transactionId"].isna().all()


def test_the_state_variables_registration_is_a_stage_of_the_first_batch_after_init(tmp_path, monkeypatch):
    """Spark calls init in every task: its time (registering the state variables) counts in the Python time of the
    micro-batch that follows it, once. TwsTester calls init once for both batches here: the second reports none."""
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    t, stream = in_memory(rules_processor("init")), RuleStream()
    stages = []
    for n in range(2):
        out = t.testInPandas(SHARD, rows(stream, [tx(n + 1, 1_000 * (n + 1))], n, [COUNT] if n == 0 else []))
        stages.append(json.loads(out.loc[out["kind"] == "stats", "details"].iloc[0])["ms"])
    assert next(iter(stages[0])) == "init" and stages[0]["init"] > 0
    assert stages[1]["init"] == 0


def test_rules_processor_reads_the_state_back_on_a_fresh_worker(tmp_path, monkeypatch):
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path / "one"))
    t, stream = in_memory(rules_processor("fresh")), RuleStream()
    t.testInPandas(SHARD, rows(stream, [tx(1, 1_000)], 0, [COUNT]))
    state_cache._CACHES.clear()  # another process, another machine: no cache of any kind
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


def test_rules_processor_prunes_at_every_batch_to_its_own_watermark(tmp_path, monkeypatch):
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    t, stream = in_memory(rules_processor("prune")), RuleStream()
    t.testInPandas(SHARD, rows(stream, [tx(1, 1_000)], 0, [COUNT]))
    t.testInPandas(SHARD, rows(stream, [tx(2, 100_000, payee=2)], 1))  # watermark 40,000 next: 1,000 still reachable
    assert retained(t) == [1_000, 100_000]
    t.testInPandas(SHARD, rows(stream, [tx(3, 125_000, payee=3)], 2))  # watermark 65,000 next: 1,000 is gone
    assert retained(t) == [100_000, 125_000] and len(meta(t).chunks) == 2
    assert values(t).rules is not None  # the rules stay: they are not window state


def test_rules_processor_reports_late_rows_and_does_not_evaluate_them(tmp_path, monkeypatch):
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    t, stream = in_memory(rules_processor("late")), RuleStream()
    t.testInPandas(SHARD, rows(stream, [tx(9, 160_000, payee=9)], 0, [COUNT]))  # watermark 100,000 from now on
    out = t.testInPandas(SHARD, rows(stream, [tx(1, 50_000), tx(2, 150_000), tx(3, 150_000)], 1))
    late = out[out["kind"] == "late"]
    assert list(late["transactionId"]) == [1] and list(late["watermark"]) == [100_000]
    assert list(late["reason"]) == [LATE_REASON] and list(late["key"]) == ['{"payeeId":"1"}']
    assert list(out[out["kind"] == "alert"]["transactionId"]) == [3]  # 2 and 3 counted, 1 not
    assert retained(t) == [150_000, 150_000, 160_000]


def test_rules_processor_clear_state_all_starts_the_windows_afresh(tmp_path, monkeypatch):
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    t, stream = in_memory(rules_processor("clear")), RuleStream()
    t.testInPandas(SHARD, rows(stream, [tx(1, 1_000)], 0, [COUNT]))
    clear = parse_rule({"ruleId": 0, "ruleState": "CONTROL", "controlType": "CLEAR_STATE_ALL"})
    out = t.testInPandas(SHARD, rows(stream, [tx(2, 2_000)], 1, [clear]))
    assert "alert" not in kinds(out)
    assert retained(t) == [2_000]
    assert json.loads(values(t).rules)["epoch"] == 1


def test_rules_processor_rule_change_arrives_with_the_events_it_applies_to(tmp_path, monkeypatch):
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    t, stream = in_memory(rules_processor("change")), RuleStream()
    t.testInPandas(SHARD, rows(stream, [tx(1, 1_000)], 0, [COUNT]))
    stricter = rule(1, field="COUNT_FLINK", op="GREATER_EQUAL", limit="3", window=1)
    out = t.testInPandas(SHARD, rows(stream, [tx(2, 2_000)], 1, [stricter]))  # same windows, limit 3
    assert "alert" not in kinds(out)
    out = t.testInPandas(SHARD, rows(stream, [tx(3, 3_000)], 2))
    assert list(out[out["kind"] == "alert"]["ruleVersion"]) == [2]


# ------------------------------------------------------------------ the login detector beside the window rules


W = 10 * MIN
LOGINS_INGESTED = 7_777  # the login events' ingestionTimestamp: the transactions have their own column of that name


def both(namespace: str, labels=(SHARD,)) -> TwsTester:
    return in_memory(Detectors(lateness_ms=MIN, labels=list(labels), namespace=namespace, detect_logins=True))


def login_rows(stream: RuleStream, batch: list[dict], batch_no: int, rules=(), transactions=()) -> pd.DataFrame:
    changes = stream.changes(list(rules), detector_columns())
    logins = login_frame(batch, batch_no, ingested=LOGINS_INGESTED)
    return detector_frame(tx_rows(list(transactions), batch_no), logins, changes)


def sequences(t: TwsTester, shard: int = SHARD) -> dict:
    blob = values(t, shard).login_sequences
    return {k: s.ips for k, s in decode_sequences(blob).items()} if blob else {}


def test_login_detector_alerts_across_batches_and_closes_the_sequence(tmp_path, monkeypatch):
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    t, stream = both("seq"), RuleStream()
    t.testInPandas(
        SHARD, login_rows(stream, [login(1, "FAIL", "a", 1_000), login(1, "FAIL", "b", 2_000)], 0, [login_rule()])
    )
    assert sequences(t) == {(1, 1): ["a", "b"]} and values(t).login_clock == 2_000
    out = t.testInPandas(SHARD, login_rows(stream, [login(1, "FAIL", "c", 3_000), login(1, "SUCCESS", "z", 4_000)], 1))
    alert = out[out["kind"] == "alert"]
    assert list(alert["userId"]) == [1] and list(alert["ingestionTimestamp"]) == [LOGINS_INGESTED]
    assert values(t).login_sequences is None and values(t).login_clock == 4_000
    stats = json.loads(out[out["kind"] == "stats"]["details"].iloc[0])
    assert stats["logins"] == 2 and stats["transactions"] == 0


def test_a_batch_reads_and_writes_the_shard_value_once_and_an_idle_login_detector_leaves_its_fields(
    tmp_path, monkeypatch
):
    """One round trip reads both detectors' small state and one writes it, whatever the batch holds. Without login
    events or rule changes nothing of the login detector can change (its clock, and so what expires, moves with its
    own events): its fields are written back as they were, and the open sequence is there for the events that
    complete it."""
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    t, stream = both("idle-logins"), RuleStream()
    t.testInPandas(
        SHARD, login_rows(stream, [login(1, "FAIL", "a", 1_000), login(1, "FAIL", "b", 2_000)], 0, [login_rule()])
    )
    before, state, calls = values(t), t.processor.state.value, []
    for name in ("get", "update", "clear"):
        call = getattr(state, name)
        monkeypatch.setattr(state, name, lambda *a, call=call, name=name: calls.append(name) or call(*a))
    t.testInPandas(SHARD, detector_frame(tx_rows([tx(1, 3_000)], 1)))  # transactions alone
    assert calls == ["get", "update"]
    after = values(t)
    assert (after.login_rules, after.login_sequences, after.login_clock) == (
        before.login_rules,
        before.login_sequences,
        before.login_clock,
    )
    assert meta(t).clock == 3_000 and sequences(t) == {(1, 1): ["a", "b"]}
    out = t.testInPandas(SHARD, login_rows(stream, [login(1, "FAIL", "c", 3_000), login(1, "SUCCESS", "z", 4_000)], 2))
    assert list(out.loc[out["kind"] == "alert", "userId"]) == [1]


def test_a_shard_of_state_layout_1_goes_on_from_its_six_variables_moved_into_the_value(tmp_path, monkeypatch):
    """A checkpoint of the earlier layout keeps the value's six fields as six variables of their own: with `legacy`
    the shard's first batch reads them once, clears them, and goes on from them (and the chunks) exactly as the
    shard that wrote them does."""
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    stream, count = RuleStream(), rule(5, field="COUNT_FLINK", op="GREATER_EQUAL", limit="2", window=1)
    fails = [login(1, "FAIL", "a", 1_000), login(1, "FAIL", "b", 2_000)]
    first = login_rows(stream, fails, 0, [login_rule(), count], transactions=[tx(1, 1_500)])
    then = login_rows(
        stream, [login(1, "FAIL", "c", 3_000), login(1, "SUCCESS", "z", 4_000)], 1, transactions=[tx(2, 2_500)]
    )
    writer = both("layout-1-writer")
    writer.testInPandas(SHARD, first)
    state_cache._CACHES.clear()  # the chunks come from the map state, as on a restarted cluster
    reader = in_memory(
        Detectors(lateness_ms=MIN, labels=[SHARD], namespace="layout-1-reader", detect_logins=True, legacy=True)
    )
    written = values(writer)
    for name, value in zip(LEGACY, written.row(), strict=True):
        reader.updateValueState(name, SHARD, (value,))
    reader.updateMapState("chunks", SHARD, writer.peekMapState("chunks", SHARD))

    expected, got = (t.testInPandas(SHARD, then) for t in (writer, reader))
    alerts = [
        sorted(map(str, out.loc[out["kind"] == "alert", ["transactionId", "userId"]].to_numpy().tolist()))
        for out in (expected, got)
    ]
    assert alerts[0] == alerts[1] and len(alerts[0]) == 2  # the COUNT rule on transaction 2, the login anomaly
    assert [reader.peekValueState(name, SHARD) for name in LEGACY] == [None] * len(LEGACY)
    moved, kept = values(reader), values(writer)
    catalogs = [shard_state.Meta.from_json(v.meta) for v in (moved, kept)]
    assert [[(c.id, c.n, c.spans) for c in m.chunks] for m in catalogs] == [
        [(c.id, c.n, c.spans) for c in catalogs[1].chunks]
    ] * 2
    assert (moved.rules, moved.resets, moved.login_rules, moved.login_sequences, moved.login_clock) == (
        kept.rules,
        kept.resets,
        kept.login_rules,
        kept.login_sequences,
        kept.login_clock,
    )


def test_login_alerts_keep_64_bit_user_ids_exact(tmp_path, monkeypatch):
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    t, stream, user = both("wide-user"), RuleStream(), 2**60 + 1
    out = t.testInPandas(SHARD, login_rows(stream, seed_attack(user), 0, [login_rule()]))
    assert list(out.loc[out["kind"] == "alert", "userId"]) == [user]


def test_login_detector_drops_a_sequence_no_event_can_join_any_more(tmp_path, monkeypatch):
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    t, stream = both("expire"), RuleStream()
    t.testInPandas(SHARD, login_rows(stream, [login(7, "FAIL", "a", 1_000)], 0, [login_rule()]))
    t.testInPandas(SHARD, login_rows(stream, [login(8, "FAIL", "b", 661_000)], 1))  # next watermark 601,000: open
    assert set(sequences(t)) == {(1, 7), (1, 8)}
    t.testInPandas(SHARD, login_rows(stream, [login(8, "FAIL", "c", 661_001)], 2))  # 601,001: 1,000 + W behind it
    assert sequences(t) == {(1, 8): ["b", "c"]}


def test_login_detector_reports_late_events(tmp_path, monkeypatch):
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    t, stream = both("late-logins"), RuleStream()
    t.testInPandas(SHARD, login_rows(stream, [login(3, "FAIL", "c", 160_000)], 0, [login_rule()]))
    out = t.testInPandas(SHARD, login_rows(stream, [login(1, "FAIL", "a", 5_000), login(2, "FAIL", "b", 200_000)], 1))
    late = out[out["kind"] == "late"]
    assert list(late["userId"]) == [1] and list(late["watermark"]) == [100_000]
    assert {k[1] for k in sequences(t)} == {2, 3}


def test_each_detector_keeps_its_own_watermark(tmp_path, monkeypatch):
    """Login events an hour ahead of the transactions: Spark's one watermark per query would make the
    transactions late; each detector's own keeps them apart."""
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    t, stream = both("apart"), RuleStream()
    hour = 60 * MIN
    first = login_rows(
        stream, [login(1, "FAIL", "a", hour)], 0, [COUNT, login_rule(rule_id=2)], transactions=[tx(1, 1_000)]
    )
    t.testInPandas(SHARD, first)
    out = t.testInPandas(SHARD, login_rows(stream, [login(2, "FAIL", "b", 5_000)], 1, transactions=[tx(2, 2_000)]))
    assert list(out[out["kind"] == "alert"]["transactionId"]) == [2]  # tx 1 and 2 in the window: not late
    late = out[out["kind"] == "late"]
    assert list(late["userId"]) == [2] and list(late["watermark"]) == [hour - MIN]
    assert meta(t).clock == 2_000 and values(t).login_clock == hour


def test_a_shard_keeps_its_own_users_sequences_and_every_logins_time(tmp_path, monkeypatch):
    monkeypatch.setenv(shard_state.CACHE_ENV, str(tmp_path))
    other = SHARD + 1  # shard 1 of 2: users with odd ids
    t, stream = both("owners", labels=(SHARD, other)), RuleStream()
    batch = [login(1, "FAIL", "a", 1_000), login(2, "FAIL", "b", 2_000), login(3, "FAIL", "c", 90_000)]
    t.testInPandas(SHARD, login_rows(stream, batch, 0, [login_rule()]))
    t.testInPandas(other, login_rows(RuleStream(), batch, 0, [login_rule()]))
    assert set(sequences(t, SHARD)) == {(1, 2)} and set(sequences(t, other)) == {(1, 1), (1, 3)}
    assert values(t).login_clock == values(t, other).login_clock == 90_000
