"""The real streaming job (files → keying → transformWithState → Delta) against the reference evaluator."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import pytest

from fraudrules.generator import Workload
from fraudrules.ops import state_reader
from fraudrules.rules import store
from tests.conftest import CATALOG_SCHEMA
from tests.support import reference
from tests.support.harness import rule
from tests.support.streams import FileStream

pytestmark = pytest.mark.spark
MIN = 60_000


RULES = [
    rule(1, agg="SUM", op="GREATER", limit="20000", window=2, keys=("payeeId", "beneficiaryId")),
    rule(2, field="COUNT_FLINK", op="GREATER_EQUAL", limit="4", window=1, keys=("beneficiaryId",)),
    rule(3, agg="AVG", op="GREATER", limit="3000", window=3),
    rule(4, agg="MAX", op="GREATER_EQUAL", limit="9000", window=1),
    rule(5, agg="MIN", op="LESS", limit="20", window=2, keys=("beneficiaryId", "paymentType")),
    rule(6, field="COUNT_WITH_RESET_FLINK", op="GREATER_EQUAL", limit="3", window=1, keys=("payeeId",)),
]


def txn(i, t, payee=1, amount="10.00"):
    return {
        "transactionId": i,
        "eventTime": t,
        "payeeId": payee,
        "beneficiaryId": 1,
        "paymentAmount": amount,
        "paymentType": "CSH",
    }


def workload(n=1200, seed=3):
    return list(
        Workload(count=n, payees=15, beneficiaries=8, events_per_second=5, seed=seed, burst_every=150).transactions()
    )


def cut(txs, sizes):
    out, i = [], 0
    for s in sizes:
        out.append(txs[i : i + s])
        i += s
    out.append(txs[i:])
    return [b for b in out if b]


def assert_matches(got, ref):
    assert set(got) == set(ref), (sorted(set(got) - set(ref))[:5], sorted(set(ref) - set(got))[:5])
    for k, v in ref.items():
        assert abs(Fraction(got[k]) - v) <= Fraction(1, 10**18), k


def test_stream_matches_reference_batch_by_batch(spark, tmp_path):
    txs = workload()
    batches = cut(txs, [1, 150, 300, 7, 400])
    ref_alerts, _ = reference.run(batches, [RULES] * len(batches), lateness_ms=MIN)
    stream = FileStream(spark, str(tmp_path), RULES).start()
    try:
        for b in batches:
            stream.feed(b)
    finally:
        stream.stop()
    assert len(ref_alerts) > 100
    assert_matches(stream.alerts(), ref_alerts)
    rows = stream.alert_rows()
    assert len({r.alertId for r in rows}) == len(rows)
    one = next(r for r in rows if r.ruleId == 1)
    assert one.limitOperatorType == "GREATER" and one.windowMinutes == 2 and one.key.startswith('{"payeeId"')


def test_restart_from_checkpoint_has_no_loss_and_no_duplicates(spark, tmp_path):
    txs = workload(n=800, seed=11)
    batches = cut(txs, [200, 200, 200])
    ref_alerts, _ = reference.run(batches, [RULES] * len(batches), lateness_ms=MIN)
    stream = FileStream(spark, str(tmp_path), RULES).start()
    stream.feed(batches[0])
    stream.feed(batches[1])
    stream.stop()
    again = FileStream(spark, str(tmp_path), []).start()  # same checkpoints and tables
    again.files = stream.files
    try:
        for b in batches[2:]:
            again.feed(b)
    finally:
        again.stop()
    rows = again.alert_rows()
    assert len(rows) == len({(r.ruleId, r.transactionId) for r in rows})
    assert_matches(again.alerts(), ref_alerts)


def test_rule_changes_apply_at_the_next_batch_without_restart(spark, tmp_path):
    count = rule(1, field="COUNT_FLINK", op="GREATER_EQUAL", limit="2", window=10)
    stream = FileStream(spark, str(tmp_path), [count]).start()
    try:
        stream.feed([txn(1, 1000), txn(2, 2000)])
        store.upsert(spark, stream.cfg, [rule(1, field="COUNT_FLINK", op="GREATER_EQUAL", limit="4", window=10)])
        stream.feed([txn(3, 3000)])
        store.upsert(
            spark, stream.cfg, [rule(1, field="COUNT_FLINK", op="GREATER_EQUAL", limit="4", window=10, state="PAUSE")]
        )
        stream.feed([txn(4, 4000)])
    finally:
        stream.stop()
    alerts = stream.alert_rows()
    assert {(a.transactionId, a.ruleVersion) for a in alerts} == {(2, 1)}


@pytest.fixture(params=["delta-rs", "spark-catalog"])
def tables_of(request, tmp_path) -> dict:
    """Both ways the job commits: delta-rs on local path tables, Spark's Delta writer on catalog tables."""
    if request.param == "delta-rs":
        return {}
    return {"catalog": "spark_catalog", "schema": f"{CATALOG_SCHEMA}_{abs(hash(str(tmp_path))) % 10**8}"}


def test_malformed_records_are_quarantined_and_the_job_keeps_going(spark, tmp_path, tables_of):
    count = rule(1, field="COUNT_FLINK", op="GREATER", limit="0")
    stream = FileStream(spark, str(tmp_path), [count], **tables_of).start()
    good = {
        "transactionId": 1,
        "eventTime": 1000,
        "payeeId": 1,
        "beneficiaryId": 2,
        "paymentAmount": "1.50",
        "paymentType": "CRD",
        "extra": {"x": 1},
    }
    bad = [
        "{not json",
        '{"transactionId": 2, "eventTime": 1000, "payeeId": 1, "beneficiaryId": 2, "paymentType": "CSH"}',
        '{"transactionId": 3, "eventTime": 1000, "payeeId": 1, "beneficiaryId": 2, "paymentAmount": "abc", '
        '"paymentType": "CSH"}',
        '{"transactionId": 4, "eventTime": 1000, "payeeId": 1, "beneficiaryId": 2, "paymentAmount": "1.5", '
        '"paymentType": "BTC"}',
        '{"transactionId": 5, "eventTime": -7, "payeeId": 1, "beneficiaryId": 2, "paymentAmount": 1, '
        '"paymentType": "CSH"}',
        '{"transactionId": 6, "eventTime": 1000, "payeeId": "x1", "beneficiaryId": 2, "paymentAmount": 1, '
        '"paymentType": "CSH"}',
        '{"transactionId": 7, "eventTime": 1000, "payeeId": 1, "beneficiaryId": 2, "paymentAmount": "1.234", '
        '"paymentType": "CSH"}',
    ]
    try:
        stream.feed([good, *bad])
        stream.feed([{**good, "transactionId": 8, "eventTime": "2000", "paymentAmount": 3}])
    finally:
        stream.stop()
    quarantined = stream.table("quarantine").collect()
    q = {r.srcPos: r.reason for r in quarantined}  # the line of the file, from 1: `good` is line 1
    assert q == {
        2: "malformed JSON: truncated (the record does not end with })",
        3: "missing paymentAmount",
        4: "paymentAmount is not a number",
        5: "unknown paymentType (expected CSH or CRD)",
        6: "eventTime out of range",
        7: "payeeId is not an integer",
        8: "paymentAmount has more than 2 decimal places",
    }
    bronze = {r.transactionId: r for r in stream.table("transactions").collect()}
    assert set(bronze) == {1, 8}
    assert bronze[8].eventTime == 2000 and bronze[8].paymentAmount == Decimal("3.00")
    assert bronze[8].ingestionTimestamp == -1 and json.loads(bronze[8].raw)["eventTime"] == "2000"  # as sent
    assert json.loads(bronze[1].raw)["extra"] == {"x": 1} and bronze[1].srcPos == 1
    stamps = [r.ingestedAt for r in bronze.values()] + [r.quarantinedAt for r in quarantined]
    assert all(abs(datetime.now() - t) < timedelta(minutes=10) for t in stamps)  # Spark shows them in local time
    assert {r.kind for r in quarantined} == {"transaction"}
    assert set(stream.alerts()) == {(1, 1), (1, 8)}


def test_late_events_go_to_the_late_table_and_idle_keys_leave_no_state(spark, tmp_path):
    r = rule(1, field="COUNT_FLINK", op="GREATER", limit="0", window=1, keys=("payeeId",))
    stream = FileStream(spark, str(tmp_path), [r], lateness_ms=5_000, shards=8).start()
    try:
        stream.feed([txn(i, 1_000 * i, p, amount="1.00") for i, p in enumerate(range(1, 30), start=1)])  # 29 keys
        assert set(state_reader.keys(spark, stream.cfg)["key"]) == {f'{{"payeeId":"{p}"}}' for p in range(1, 30)}
        far = 30 * 1_000 + MIN + 10_000
        stream.feed([txn(100, far, 99)])  # watermark moves past every key's newest event + window
        stream.feed([txn(101, far + 1, 99), txn(102, 500, 1)])  # 102 is late
        stream.feed([txn(103, far + 2, 99)])  # every shard pruned its keys at each of these batches
    finally:
        stream.stop()
    late = stream.table("late_events").collect()
    assert [(x.transactionId, x.watermarkMs) for x in late] == [(102, far - 5_000)]
    assert "watermark" in late[0].reason
    assert set(state_reader.keys(spark, stream.cfg)["key"]) == {'{"payeeId":"99"}'}


def test_same_input_cut_differently_gives_same_alerts(spark, tmp_path):
    txs = workload(n=600, seed=5)
    rnd = random.Random(1)
    sizes = [rnd.randint(1, 120) for _ in range(4)]
    results = []
    for i, batches in enumerate([[txs], cut(txs, sizes)]):
        stream = FileStream(spark, str(tmp_path / str(i)), RULES).start()
        try:
            for b in batches:
                stream.feed(b)
        finally:
            stream.stop()
        results.append(stream.alerts())
    assert results[0] == results[1] and results[0]


def test_the_state_reader_keys_each_live_event_in_spark(spark, tmp_path):
    """`state_reader.entries` (what the window_state suite checks, decoded, joined and keyed by Spark's tasks): one
    row per retained event a window can still reach, per rule, keyed as the engine keys it; an event whose
    transaction bronze lacks has a null key."""
    from delta.tables import DeltaTable

    rules = [
        rule(1, window=1, keys=("payeeId",)),
        rule(2, field="COUNT_FLINK", op="GREATER_EQUAL", limit="99", window=10, keys=("beneficiaryId", "paymentType")),
    ]
    stream = FileStream(spark, str(tmp_path), rules, lateness_ms=5_000, shards=4).start()
    try:
        stream.feed([txn(i, 10_000 * i, payee=i % 3 + 1) for i in range(1, 13)])  # watermark 120 − 5 s
    finally:
        stream.stop()
    entries = state_reader.entries(spark, stream.cfg).toPandas()
    assert tuple(entries.columns) == state_reader.STATE_COLUMNS
    rows = {r: part.sort_values("transactionId") for r, part in entries.groupby("ruleId")}
    assert list(rows[1]["transactionId"]) == list(range(6, 13))  # 1 minute back from 115 s: from 55 s on
    assert list(rows[1]["key"]) == [f'{{"payeeId":"{i % 3 + 1}"}}' for i in range(6, 13)]
    assert list(rows[2]["transactionId"]) == list(range(1, 13))
    assert set(rows[2]["key"]) == {'{"beneficiaryId":"1","paymentType":"CSH"}'}
    assert list(rows[1]["eventTime"]) == [10_000 * i for i in range(6, 13)]
    assert len(state_reader.events(spark, stream.cfg, live=False)) >= len(entries) == 19

    DeltaTable.forPath(spark, stream.cfg.table("transactions")).delete("transactionId = 12")
    unkeyed = state_reader.entries(spark, stream.cfg).where("key IS NULL").toPandas()
    assert sorted(unkeyed["ruleId"]) == [1, 2] and set(unkeyed["transactionId"]) == {12}
