"""The rules query's sink on Debezium change events (`rules_format="debezium"`): the captured messages of
tests/fixtures/debezium/ as micro-batches of the rules topic, each event one rule_history version, a redelivered,
an older or a replayed event a no-op, an invalid row an error naming its column."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from fraudrules import tables
from fraudrules.config import RULES_QUERY, JobConfig
from fraudrules.engine.rule_changes import RuleChangeSink
from fraudrules.rules import store
from tools.support.rules_db import RULES_COLUMNS

pytestmark = pytest.mark.spark

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "debezium" / "with_schema.jsonl"
TOPIC = "fraudrules.public.fraud_rules-0"
T0 = datetime(2026, 12, 6, tzinfo=timezone.utc)


def _batch(spark, offsets: list[int]):
    """The captured messages at `offsets` as the rules topic's rows (value, source, modified)."""
    messages = {m["offset"]: m for m in map(json.loads, FIXTURE.read_text().splitlines())}
    rows = [(messages[o]["value"] or "", f"{TOPIC}:{o:020d}", T0 + timedelta(seconds=o)) for o in offsets]
    return spark.createDataFrame(rows, "value string, source string, modified timestamp")


def _versions(spark, cfg: JobConfig) -> dict[int, list[tuple[int, str]]]:
    out: dict[int, list[tuple[int, str]]] = {}
    for r in sorted(store.history_rows(spark, cfg), key=lambda r: (r["ruleId"], r["version"])):
        out.setdefault(r["ruleId"], []).append((r["version"], r["ruleState"]))
    return out


def test_each_event_applies_once_in_log_order(spark, tmp_path):
    cfg = JobConfig(data_dir=str(tmp_path), rules_format="debezium", rules_columns=RULES_COLUMNS)
    tables.ensure(spark, cfg)
    checkpoint = Path(cfg.checkpoint(RULES_QUERY))  # rule_errors' transaction is the query's (its id) and batch
    checkpoint.mkdir(parents=True)
    (checkpoint / "metadata").write_text('{"id": "rules-cdc-test"}\n')
    said: list[str] = []
    sink = RuleChangeSink(cfg, said.append)
    sink(_batch(spark, [0, 1, 2, 3, 4]), 0)  # snapshot, insert, limit, disabled, an invalid update
    sink(_batch(spark, [0, 1, 2, 3, 4]), 0)  # the same micro-batch replayed after a crash
    sink(_batch(spark, [6]), 1)  # a tombstone alone
    sink(_batch(spark, [2, 5, 6, 7, 8]), 2)  # a redelivered (older) event, the delete, its tombstone, rule 8
    assert _versions(spark, cfg) == {
        1: [(1, "ACTIVE")],
        7: [(1, "ACTIVE"), (2, "ACTIVE"), (3, "PAUSE"), (4, "DELETE")],
        8: [(1, "ACTIVE"), (2, "ACTIVE")],  # insert and update of one transaction, in LSN order
    }
    assert json.loads(store.current(spark, cfg)[8]["ruleJson"])["limit"] == "200.00"
    assert said == [
        "[rules] Debezium events: 4 applied, 1 rejected",
        "[rules] Debezium events: 4 already applied, 1 rejected",  # the invalid row again: not applied before
        "[rules] Debezium events: 1 already applied, 3 applied, 0 rejected",
    ]
    errors = tables.writer(spark, cfg).arrow("rule_errors").to_pylist()  # once, though its batch ran twice
    assert [(e["ruleId"], e["source"], e["reason"]) for e in errors] == [
        ("7", f"{TOPIC}:{4:020d}", "column window_minutes: windowMinutes must be > 0")
    ]
