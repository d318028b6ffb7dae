"""The rule codec without Spark: each form read back is what was written.

(That the SQL writer produces the same rule changes as the Python one: tests/integration/test_codec_sql.py.)
"""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

import pytest

from fraudrules.engine.ruleset import RuleSet
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


@pytest.mark.parametrize("original", [*RULES, LOGIN], ids=lambda r: f"rule{r.rule_id}")
def test_rule_change_round_trip_gives_the_shards_the_rule_in_force(original):
    row = {**codec.to_row(original, version=5, active_since=3, epoch=2, now=NOW, author="t"), "change": "update"}
    change = codec.decode_change(codec.encode_change(row))
    assert set(change) == set(codec.RULE_FIELDS)
    rules = RuleSet()
    assert rules.apply([change])
    assert rules.rule(original.rule_id) == original.with_version(5)
    assert (rules.sig(original.rule_id), rules.epoch) == (codec.incarnation_sig(original, 3), 2)
    assert not rules.apply([change])  # the same version again changes nothing
    older = {**change, "version": 4, "ruleState": "DELETE"}
    assert not rules.apply([older]) and rules.rules[original.rule_id].state == "ACTIVE"  # highest version wins


def test_a_control_command_only_raises_the_epoch():
    rules = RuleSet()
    rules.apply(
        [
            codec.decode_change(
                codec.encode_change(
                    {"ruleId": 0, "version": 0, "ruleState": "CONTROL", "ruleJson": "{}", "sig": None, "epoch": 3}
                )
            )
        ]
    )
    assert (rules.rules, rules.epoch) == ({}, 3)
    assert RuleSet.from_json(rules.to_json()) == rules


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
