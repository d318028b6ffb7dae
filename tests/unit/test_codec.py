"""The rule codec without Spark: each form read back is what was written, in today's string formats.

(That the SQL writers produce the same strings as the Python ones: tests/integration/test_codec_sql.py.)
"""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

import pytest

from fraudrules.engine.evaluation import Meta
from fraudrules.rules import codec
from fraudrules.rules.model import parse_rule
from tests.support.harness import rule

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
LOGIN = parse_rule({"ruleId": 100, "ruleState": "ACTIVE", "ruleType": "LOGIN_ANOMALY", "windowMinutes": 5})
RULES = [
    rule(1, agg="SUM", op="GREATER", limit="100.5", window=10),
    rule(2, field="COUNT_FLINK", op="GREATER_EQUAL", limit="3", window=1, unique=["beneficiaryId"]),
    rule(3, agg="AVG", op="LESS_EQUAL", limit="-0.25", window=60, keys=("payeeId", "paymentType")),
    rule(
        4,
        field="COUNT_WITH_RESET_FLINK",
        op="EQUAL",
        limit="2",
        filter=[{"field": "payeeId", "op": "IN", "values": [1, 2]}],
    ),
]


def test_spec_format_is_todays():
    assert codec.encode_spec(RULES[0].with_version(3)) == "3|paymentAmount|SUM|GREATER|100.5|600000|0"
    assert codec.encode_spec(RULES[1].with_version(1)) == "1|COUNT_FLINK|SUM|GREATER_EQUAL|3|60000|1"
    assert codec.SPEC_FIELDS[-1] == "distinct" and len(codec.SPEC_FIELDS) == 7


@pytest.mark.parametrize("original", RULES, ids=lambda r: f"rule{r.rule_id}")
def test_spec_round_trip_keeps_the_evaluation_parameters(original):
    versioned = original.with_version(7)
    back = codec.decode_spec(versioned.rule_id, codec.encode_spec(versioned))
    assert (back.rule_id, back.version, back.state) == (versioned.rule_id, 7, "ACTIVE")
    assert (back.field, back.aggregator, back.operator) == (versioned.field, versioned.aggregator, versioned.operator)
    assert back.limit == versioned.limit and back.limit_fraction == versioned.limit_fraction
    assert (back.window_ms, back.scale, bool(back.unique)) == (
        versioned.window_ms,
        versioned.scale,
        bool(versioned.unique),
    )


def test_active_windows_both_directions():
    triples = [(1, 42, 60_000), (2, 4_000_000_000, 3_600_000)]
    text = codec.encode_active_windows(triples)
    assert text == "1:42:60000,2:4000000000:3600000"
    assert codec.decode_active_windows(text) == {1: (42, 60_000), 2: (4_000_000_000, 3_600_000)}
    assert codec.decode_active_windows("") == {} and codec.encode_active_windows([]) == ""
    assert Meta(active=text).active_rules() == codec.decode_active_windows(text)  # what a shard keeps in its meta


def test_active_logins_both_directions():
    windows = {100: 600_000, 7: 60_000}
    assert codec.encode_active_logins(windows) == "100:600000,7:60000"
    assert codec.decode_active_logins(codec.encode_active_logins(windows)) == windows
    assert codec.decode_active_logins("") == {}


@pytest.mark.parametrize("original", [*RULES, LOGIN], ids=lambda r: f"rule{r.rule_id}")
def test_table_row_round_trip(original):
    row = codec.to_row(original, version=4, active_since=2, epoch=1, now=NOW, author="test")
    assert codec.from_row(row) == original.with_version(4)
    assert (row["windowMs"], row["scale"], row["ruleType"]) == (original.window_ms, original.scale, original.rule_type)
    assert row["sig"] == codec.incarnation_sig(original, 2)
    assert [f["values"] for f in row["filter"]] == [list(c.values) for c in original.filter]


def test_incarnation_sig_follows_what_windows_hold():
    base = RULES[0]
    same = codec.incarnation_sig(base, 1)
    assert codec.incarnation_sig(rule(1, agg="SUM", op="GREATER", limit="999", window=30), 1) == same  # limit, window
    assert codec.incarnation_sig(base, 2) != same  # re-activated at another version
    assert codec.incarnation_sig(rule(1, keys=("beneficiaryId",)), 1) != same  # other grouping
    assert Decimal(codec.to_row(base, 1, 1, 0, NOW, "t")["limit"]) == base.limit
