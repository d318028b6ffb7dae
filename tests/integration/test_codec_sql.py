"""The rule codec's SQL writers (what keying puts on every keyed row) write what its Python writers write, so
the processors' Python readers read back the rules table as it is."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from fraudrules import tables
from fraudrules.config import JobConfig
from fraudrules.engine import keying
from fraudrules.rules import codec, store
from fraudrules.rules.model import parse_rule
from tests.support.harness import rule

pytestmark = pytest.mark.spark

RULES = [
    rule(1, agg="SUM", op="GREATER", limit="100.5", window=10),
    rule(2, field="COUNT_FLINK", op="GREATER_EQUAL", limit="3", window=1, unique=["beneficiaryId"]),
    rule(3, agg="AVG", op="LESS_EQUAL", limit="-0.25", window=60, state="PAUSE"),
    parse_rule({"ruleId": 100, "ruleState": "ACTIVE", "ruleType": "LOGIN_ANOMALY", "windowMinutes": 5}),
]


def test_sql_writers_match_the_python_writers(spark, tmp_path):
    cfg = JobConfig(data_dir=str(tmp_path))
    tables.ensure(spark, cfg, "rules", "rule_history", "rules_export")
    store.upsert(spark, cfg, RULES, author="test")
    store.upsert(spark, cfg, [rule(1, agg="SUM", op="GREATER", limit="200", window=10)], author="test")  # v2
    rows = store.current(spark, cfg)

    windows = keying.active_rules(spark, cfg).select("ruleId", codec.spec_column().alias("spec"), "active").collect()
    assert {r.ruleId for r in windows} == {1, 2}  # ACTIVE window rules only
    for r in windows:
        assert r.spec == codec.encode_spec(codec.from_row(rows[r.ruleId]))
        assert codec.decode_spec(r.ruleId, r.spec).limit == codec.from_row(rows[r.ruleId]).limit
    (active,) = {r.active for r in windows}
    expected = {rid: (rows[rid]["sig"], rows[rid]["windowMs"]) for rid in (1, 2)}
    assert codec.decode_active_windows(active) == expected
    assert sorted(active.split(",")) == sorted(
        codec.encode_active_windows((r, *v) for r, v in expected.items()).split(",")
    )

    (logins,) = keying.active_login_rules(spark, cfg).select("active").distinct().collect()
    assert logins.active == codec.encode_active_logins({100: 300_000})

    spec_of_table = tables.read(spark, cfg, "rules").where(F.col("ruleId") == 1).select(codec.spec_column()).first()[0]
    assert spec_of_table.startswith("2|")  # the version that is in force
