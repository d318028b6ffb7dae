"""Rules as validated data: every problem is named, valid rules round-trip."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from fraudrules import event_schema
from fraudrules.rules.model import AnyOf, Condition, Not, RuleError, parse_rule, parse_rules_text, stored_rule, validate

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


def test_a_misspelt_count_or_a_field_of_the_rich_schema_gets_a_hint():
    with pytest.raises(RuleError) as err:
        parse_rule({**BASE, "aggregateFieldName": "COUNT_FLINKK"})
    assert (
        "aggregateFieldName: 'COUNT_FLINKK' is not in the event schema (closest: COUNT_FLINK" in err.value.problems[0]
    )
    with pytest.raises(RuleError) as err:
        parse_rule({**BASE, "groupingKeyNames": ["deviceId"]})
    rich = event_schema.builtin_path("rich")
    assert f"; {rich} declares it: give that file as --event-schema" in err.value.problems[0]
    assert event_schema.builtin("rich").field("deviceId") is not None


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


RICH = event_schema.builtin("rich")
DEVICE_RULE = {  # "more than 40 payments from one device in 2 minutes on web or app"
    "ruleId": 11,
    "ruleState": "ACTIVE",
    "groupingKeyNames": ["deviceId"],
    "aggregateFieldName": "COUNT_FLINK",
    "aggregatorFunctionType": "SUM",
    "limitOperatorType": "GREATER",
    "limit": 40,
    "windowMinutes": 2,
    "filter": [{"field": "channel", "op": "IN", "values": ["web", "app"]}],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"groupingKeyNames": ["merchant.contry"]},
            "rule 11: groupingKeyNames: 'merchant.contry' is not in the event schema (closest: merchant.country,",
        ),
        (
            {"aggregateFieldName": "merchant.country"},
            "rule 11: aggregateFieldName 'merchant.country' is non-numeric (STRING): aggregate an integer or decimal "
            "field, or count with COUNT_FLINK",
        ),
        (
            {"filter": [{"field": "merchant.country", "op": "GT", "value": "FR"}]},
            "rule 11: filter: GT on 'merchant.country' needs a numeric field, merchant.country is STRING",
        ),
        (
            {"filter": [{"not": {"field": "basket.items", "op": "EQ", "value": "ten"}}]},
            "rule 11: filter: EQ on 'basket.items': 'ten' is not a number (basket.items is INT)",
        ),
        (
            {"unique": ["card"]},
            "rule 11: unique: 'card' is not in the event schema (closest: card.bin)",
        ),
        ({"filter": [{"any": []}]}, "rule 11: filter: any needs a non-empty list of terms"),
        ({"filter": [{"field": "channel", "any": []}]}, "must be an object with one of field, any, not"),
        ({"filter": [{"field": "channel", "op": "EQ"}]}, "filter: EQ on 'channel' needs a 'value'"),
    ],
)
def test_a_rule_is_checked_against_the_event_schema(change, message):
    with pytest.raises(RuleError) as err:
        parse_rule({**DEVICE_RULE, **change}, RICH)
    assert message in str(err.value)


def test_filters_nest_and_round_trip_with_their_resolved_types():
    rule = parse_rule(
        {
            **DEVICE_RULE,
            "aggregateFieldName": "paymentAmount",
            "filter": [
                {"any": [{"field": "merchant.category", "op": "EQ", "value": "gambling"}]},
                {"not": {"field": "paymentAmount", "op": "LT", "value": 500}},
                {"field": "deviceId", "op": "NOT_NULL"},
            ],
        },
        RICH,
    )
    gambling, amount, device = rule.filter
    assert isinstance(gambling, AnyOf) and isinstance(amount, Not) and device == Condition("deviceId", "NOT_NULL", ())
    assert (rule.scale, amount.term.scale, gambling.terms[0].scale) == (2, 2, None)
    assert rule.fields() == {"deviceId", "paymentAmount", "merchant.category"}
    assert parse_rule(rule.to_json(), RICH) == rule
    assert rule.to_json()["filter"][2] == {"field": "deviceId", "op": "NOT_NULL"}


def test_a_stored_rule_reads_back_without_its_fields_and_is_checked_when_evaluated():
    rule = parse_rule(DEVICE_RULE, RICH)
    with pytest.raises(RuleError, match="'deviceId' is not in the event schema"):
        parse_rule(DEVICE_RULE)  # the default schema has no device
    assert stored_rule(rule.to_json()) == rule  # display, history: read back as stored
    with pytest.raises(RuleError):
        validate(rule, event_schema.DEFAULT)


def test_each_rule_of_a_file_is_checked_against_the_schema_given():
    text = json.dumps([DEVICE_RULE, {**DEVICE_RULE, "ruleId": 12, "groupingKeyNames": ["device"]}])
    rules, errors = parse_rules_text(text, RICH)
    assert [r.rule_id for r in rules] == [11]
    assert [(e.rule_id, e.problems) for e in errors] == [
        (12, ["groupingKeyNames: 'device' is not in the event schema (closest: deviceId)"])
    ]
