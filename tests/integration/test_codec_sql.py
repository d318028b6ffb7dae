"""The rule codec's SQL writer (what the job puts beside the events for every rule change) writes what its Python
writer writes, so the shards read back the rule_history rows as they are."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from fraudrules import tables
from fraudrules.rules import codec
from fraudrules.rules.model import parse_rule
from tests.support.harness import rule

pytestmark = pytest.mark.spark

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
RULES = [
    rule(1, agg="SUM", op="GREATER", limit="100.5", window=10),
    rule(2, field="COUNT_FLINK", op="GREATER_EQUAL", limit="3", window=1, unique=["beneficiaryId"]),
    rule(3, agg="AVG", op="LESS_EQUAL", limit="-0.25", window=60),
    parse_rule({"ruleId": 100, "ruleState": "ACTIVE", "ruleType": "LOGIN_ANOMALY", "windowMinutes": 5}),
    parse_rule({"ruleId": 101, "ruleState": "ACTIVE", "ruleType": "LOGIN_ANOMALY", "windowMinutes": 10}),
]


def test_sql_writer_matches_the_python_writer(spark):
    rows = [
        {**codec.to_row(r, version=r.rule_id + 1, active_since=1, epoch=0, now=NOW, author="t"), "change": "create"}
        for r in RULES
    ]
    history = spark.createDataFrame(rows, tables.SCHEMAS["rule_history"])  # rows as rule_history holds them
    written = {r.ruleId: r[codec.RULE_CHANGE] for r in history.select("ruleId", codec.change_column()).collect()}
    for row in rows:
        assert codec.decode_change(written[row["ruleId"]]) == codec.decode_change(codec.encode_change(row))
