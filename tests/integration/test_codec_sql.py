"""The rule codec's SQL writers (what keying puts on every keyed row) write what its Python writers write, so
the processors' Python readers read back the rules table as it is."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from pyspark.sql import functions as F

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


def test_sql_writers_match_the_python_writers(spark):
    rows = {
        r.rule_id: codec.to_row(r, version=r.rule_id + 1, active_since=1, epoch=0, now=NOW, author="t") for r in RULES
    }
    table = spark.createDataFrame(list(rows.values()), tables.SCHEMAS["rules"])  # rows as the rules table holds them
    windows = table.where("ruleType = 'WINDOW'")
    logins = table.where("ruleType = 'LOGIN_ANOMALY'")

    for r in windows.select("ruleId", codec.spec_column().alias("spec")).collect():
        assert r.spec == codec.encode_spec(codec.from_row(rows[r.ruleId]))

    (active,) = windows.agg(codec.active_windows_column()).first()
    expected = {rid: (rows[rid]["sig"], rows[rid]["windowMs"]) for rid in (1, 2, 3)}
    assert codec.decode_active_windows(active) == expected
    assert sorted(active.split(",")) == sorted(
        codec.encode_active_windows((r, *v) for r, v in expected.items()).split(",")
    )

    (active_logins,) = logins.agg(codec.active_logins_column()).first()
    assert codec.decode_active_logins(active_logins) == {100: 300_000, 101: 600_000}
    assert sorted(active_logins.split(",")) == sorted(
        codec.encode_active_logins({100: 300_000, 101: 600_000}).split(",")
    )
    assert table.where(F.col("ruleId") == 1).select(codec.spec_column()).first()[0].startswith("2|")  # its version
