"""Rules as validated data: every problem is named, valid rules round-trip."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from fraudrules.rules.model import RuleError, parse_rule, parse_rules_text

BASE = {
    "ruleId": 7,
    "ruleState": "ACTIVE",
    "groupingKeyNames": ["payeeId"],
    "aggregateFieldName": "paymentAmount",
    "aggregatorFunctionType": "SUM",
    "limitOperatorType": "GREATER",
    "limit": "100.5",
    "windowMinutes": 10,
}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"aggregateFieldName": "nope"}, "aggregateFieldName: 'nope' is not in the event schema"),
        ({"aggregateFieldName": "paymentType"}, "aggregateFieldName 'paymentType' is non-numeric"),
        ({"groupingKeyNames": ["payeeId", "colour"]}, "groupingKeyNames: 'colour' is not in the event schema"),
        ({"aggregatorFunctionType": "MEDIAN"}, "aggregatorFunctionType 'MEDIAN' is not one of"),
        ({"limitOperatorType": "ABOUT"}, "limitOperatorType 'ABOUT' is not one of"),
        ({"ruleState": "SLEEPING"}, "ruleState 'SLEEPING' is not one of"),
        ({"windowMinutes": 0}, "windowMinutes must be > 0"),
        ({"windowMinutes": -5}, "windowMinutes must be > 0"),
        ({"windowMinutes": "ten"}, "windowMinutes 'ten' is not a whole number"),
        ({"limit": None}, "missing limit"),
        ({"limit": "lots"}, "limit 'lots' is not a number"),
        ({"filter": [{"field": "colour", "op": "EQ", "value": "red"}]}, "filter: 'colour' is not in the event schema"),
        ({"filter": [{"field": "paymentType", "op": "GT", "value": "1"}]}, "needs a numeric field"),
        ({"filter": [{"field": "payeeId", "op": "IN", "values": []}]}, "needs a non-empty list"),
        ({"unique": ["nothing"]}, "unique: 'nothing' is not in the event schema"),
    ],
)
def test_each_validation_error_is_named(change, problem):
    with pytest.raises(RuleError) as err:
        parse_rule({**BASE, **change})
    assert err.value.rule_id == 7
    assert any(problem in p for p in err.value.problems), err.value.problems


def test_numbers_may_be_strings_and_rules_round_trip():
    rule = parse_rule({**BASE, "ruleId": "7", "windowMinutes": "10", "limit": 100.5})
    assert (rule.rule_id, rule.window_ms, rule.limit) == (7, 600_000, Decimal("100.5"))
    assert parse_rule(rule.to_json()) == rule


def test_malformed_json_and_partial_validity():
    rules, errors = parse_rules_text("[not json")
    assert not rules and "malformed JSON" in errors[0].problems[0]
    rules, errors = parse_rules_text(json.dumps([BASE, {**BASE, "ruleId": 8, "windowMinutes": 0}]))
    assert [r.rule_id for r in rules] == [7] and [e.rule_id for e in errors] == [8]


def test_control_commands_and_filters_parse():
    control = parse_rule({"ruleId": 0, "ruleState": "CONTROL", "controlType": "CLEAR_STATE_ALL"})
    assert control.control_type == "CLEAR_STATE_ALL"
    rule = parse_rule(
        {
            **BASE,
            "filter": [
                {"field": "paymentType", "op": "IN", "values": ["CSH"]},
                {"field": "paymentAmount", "op": "GE", "value": 10},
            ],
            "unique": ["beneficiaryId"],
        }
    )
    assert [c.op for c in rule.filter] == ["IN", "GE"] and rule.unique == ("beneficiaryId",)
