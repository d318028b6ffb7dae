"""The job on a real Kafka broker: transactions and a rule change in, alerts out, bad records quarantined.

Transactions (with bad records of every class) and rule changes are produced with confluent-kafka, the
job reads them with Spark's Kafka source, alerts are compared with the reference evaluator over the same
input (what `fraudrules backtest` computes) both in the Delta table and on the alerts topic.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from fraudrules import tables
from fraudrules.config import JobConfig
from fraudrules.engine import job
from fraudrules.generator import Workload
from fraudrules.rules import store
from fraudrules.rules.model import parse_rule
from tests.support import reference
from tools.support.kafka_broker import (
    DEFAULT_JARS,
    DEFAULT_POM,
    LocalKafka,
    consume_all,
    create_topics,
    produce,
    resolve_jars,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.kafka,
    pytest.mark.skipif(shutil.which("java") is None, reason="needs a JVM"),
]
MIN = 60_000

RULES = [
    {
        "ruleId": 1,
        "ruleState": "ACTIVE",
        "groupingKeyNames": ["payeeId", "beneficiaryId"],
        "aggregateFieldName": "paymentAmount",
        "aggregatorFunctionType": "SUM",
        "limitOperatorType": "GREATER",
        "limit": "20000",
        "windowMinutes": 2,
    },
    {
        "ruleId": 2,
        "ruleState": "ACTIVE",
        "groupingKeyNames": ["beneficiaryId"],
        "aggregateFieldName": "COUNT_FLINK",
        "aggregatorFunctionType": "SUM",
        "limitOperatorType": "GREATER_EQUAL",
        "limit": "4",
        "windowMinutes": 1,
    },
    {
        "ruleId": 3,
        "ruleState": "ACTIVE",
        "groupingKeyNames": ["payeeId"],
        "aggregateFieldName": "paymentAmount",
        "aggregatorFunctionType": "AVG",
        "limitOperatorType": "GREATER",
        "limit": "3000",
        "windowMinutes": 3,
    },
]

# (record, reason): one per bad-input class
BAD = [
    ("{not json", "malformed JSON: truncated (the record does not end with })"),
    ("", "malformed JSON: not a JSON object"),
    (
        '{"transactionId": 9001, "eventTime": 1700000001000, "payeeId": 1, "beneficiaryId": 2, "paymentType": "CSH"}',
        "missing paymentAmount",
    ),
    (
        '{"transactionId": 9002, "eventTime": 1700000001000, "payeeId": "x1", "beneficiaryId": 2, '
        '"paymentAmount": "1.00", "paymentType": "CSH"}',
        "payeeId is not an integer",
    ),
    (
        '{"transactionId": 9003, "eventTime": 1700000001000, "payeeId": 1, "beneficiaryId": 2, '
        '"paymentAmount": "1.00", "paymentType": "BTC"}',
        "unknown paymentType (expected CSH or CRD)",
    ),
    (
        '{"transactionId": 9004, "eventTime": 1700000001000, "payeeId": 1, "beneficiaryId": 2, '
        '"paymentAmount": "lots", "paymentType": "CRD"}',
        "paymentAmount is not a number",
    ),
    (
        '{"transactionId": 9005, "eventTime": 99999999999999999, "payeeId": 1, "beneficiaryId": 2, '
        '"paymentAmount": "1.00", "paymentType": "CRD"}',
        "eventTime out of range",
    ),
]


@pytest.fixture(scope="module")
def kafka(tmp_path_factory):
    jars = resolve_jars(Path(os.environ.get("FRAUDRULES_KAFKA_JARS", DEFAULT_JARS)), DEFAULT_POM)
    with LocalKafka(jars, tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


def _topics(kafka, *names: str, partitions: int = 1) -> list[str]:
    suffix = uuid.uuid4().hex[:6]
    topics = [f"{n}-{suffix}" for n in names]
    create_topics(kafka.bootstrap, topics, partitions=partitions)
    return topics


def _config(tmp_path, kafka, tx_topic: str, max_offsets: int, **topics: str) -> JobConfig:
    """The job on the test broker: transactions from `tx_topic`, at most `max_offsets` records a micro-batch."""
    return JobConfig(
        data_dir=str(tmp_path),
        shards=4,
        source="kafka",
        kafka_bootstrap=kafka.bootstrap,
        kafka_transactions_topic=tx_topic,
        max_records_per_trigger=max_offsets,
        **topics,
    )


def test_kafka_in_and_out_matches_the_reference(spark, kafka, tmp_path):
    tx_topic, rules_topic, alerts_topic = _topics(kafka, "transactions", "rules", "alerts")
    cfg = _config(tmp_path, kafka, tx_topic, 250, kafka_rules_topic=rules_topic, kafka_alerts_topic=alerts_topic)
    good = list(
        Workload(count=700, payees=15, beneficiaries=8, events_per_second=5, seed=3, burst_every=150).transactions()
    )
    records: list[str] = []
    bad_at: dict[int, str] = {}  # offset -> expected reason
    for i, tx in enumerate(good):
        if i % 100 == 50:
            record, reason = BAD[len(bad_at) % len(BAD)]
            bad_at[len(records)] = reason
            records.append(record)
        records.append(json.dumps(tx))

    tables.ensure(spark, cfg)
    running = job.start(spark, cfg, printer=None)
    try:
        produce(kafka.bootstrap, rules_topic, [RULES, "{oops"])  # a change set, then a broken message
        running.rules.processAllAvailable()
        assert sorted(store.current(spark, cfg)) == [1, 2, 3]
        produce(kafka.bootstrap, tx_topic, records)
        running.process_all_available()
        progress = [p for p in running.evaluate.recentProgress if p.numInputRows]
    finally:
        running.stop()

    # alerts: Delta table and topic against the reference over the valid records, in topic order
    expected, late = reference.run([good], [[parse_rule(r) for r in RULES]], MIN)
    assert len(expected) > 50 and not late
    delta = {(r.ruleId, r.transactionId): r for r in tables.read(spark, cfg, "alerts").collect()}
    assert set(delta) == set(expected)
    for k, agg in expected.items():
        assert abs(Fraction(delta[k].aggregate) - agg) <= Fraction(1, 10**18), k
    messages = consume_all(kafka.bootstrap, alerts_topic)
    published = {m.key().decode(): json.loads(m.value(), parse_float=Decimal) for m in messages}  # exact numbers
    assert len(messages) == len(published)  # no crash here, so no re-publication either
    assert set(published) == {f"{rid}:{tid}" for rid, tid in expected}
    one = published[next(iter(published))]
    assert one["alertId"] == f"{one['ruleId']}:{one['transactionId']}" and one["kind"] == "WINDOW"
    for key, value in published.items():
        rid, tid = map(int, key.split(":"))
        assert abs(Fraction(value["aggregate"]) - expected[(rid, tid)]) <= Fraction(1, 10**18), key

    # bad input: every bad record quarantined with its raw text, topic-partition, offset and reason
    quarantine = {r.srcPos: r for r in tables.read(spark, cfg, "quarantine").collect()}
    assert set(quarantine) == set(bad_at)
    for offset, reason in bad_at.items():
        row = quarantine[offset]
        assert (row.kind, row.srcName, row.raw, row.reason) == ("transaction", f"{tx_topic}-0", records[offset], reason)

    # counts reconcile: input = valid + quarantined; valid = evaluated + late
    bronze = tables.read(spark, cfg, "transactions")
    assert bronze.count() + len(quarantine) == len(records)
    assert bronze.select("srcPos").distinct().count() == len(good)
    assert {r.transactionId for r in bronze.select("transactionId").collect()} == {tx["transactionId"] for tx in good}
    assert tables.read(spark, cfg, "late_events").count() == 0
    from_kafka = [s.numInputRows for p in progress for s in p.sources if "Kafka" in s.description]
    assert sum(from_kafka) == len(records)  # the evaluation query read every record once (besides the rule changes)
    # max_records_per_trigger (maxOffsetsPerTrigger) bounds the Kafka source; the rule-change stream's rows may
    # share a micro-batch
    assert max(from_kafka) <= 250 and len(progress) >= 3

    errors = tables.read(spark, cfg, "rule_errors").collect()
    assert [(e.raw, e.source) for e in errors] == [("{oops", f"{rules_topic}-0:{1:020d}")]
    assert "malformed JSON" in errors[0].reason


def test_a_10x_burst_is_absorbed_in_bounded_batches(spark, kafka, tmp_path):
    (tx_topic,) = _topics(kafka, "burst", partitions=2)
    steady, cap = 50, 100  # the bound is 2× the steady rate; the burst is 10× it
    cfg = _config(tmp_path, kafka, tx_topic, cap)
    txs = [json.dumps(t) for t in Workload(count=11 * steady, payees=50, beneficiaries=20, seed=9).transactions()]
    tables.ensure(spark, cfg)
    store.upsert(spark, cfg, [parse_rule(RULES[1])], author="test")
    running = job.start(spark, cfg, printer=None)
    try:
        produce(kafka.bootstrap, tx_topic, txs[:steady])
        running.process_all_available()
        seen = {q.name: len(q.recentProgress) for q in running.queries}
        produce(kafka.bootstrap, tx_topic, txs[steady:])  # a burst of 10× at once
        running.process_all_available()
        burst = {
            q.name: [p.numInputRows for p in q.recentProgress[seen[q.name] :] if p.numInputRows]
            for q in running.queries
        }
    finally:
        running.stop()
    print(f"micro-batch sizes during the burst (cap {cap}): {burst}")
    for name in ("ingest", "evaluate"):
        assert sum(burst[name]) == 10 * steady, (name, burst[name])
        assert max(burst[name]) <= cap and len(burst[name]) >= 5, (name, burst[name])
    assert tables.read(spark, cfg, "transactions").count() == len(txs)
