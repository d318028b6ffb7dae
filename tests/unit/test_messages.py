"""Text people read: alert messages, rules in one line, numbers and times."""

from __future__ import annotations

from decimal import Decimal

import pytest

from fraudrules.backtest import BacktestResult
from fraudrules.rules.model import parse_rule
from fraudrules.rules.text import iso_time, key_label, money, number, plural, rule_text, window_message

PAIR = '{"payeeId":"4","beneficiaryId":"36"}'


def rule(**fields) -> object:
    base = {
        "ruleId": 1,
        "ruleState": "ACTIVE",
        "groupingKeyNames": ["payeeId", "beneficiaryId"],
        "aggregateFieldName": "paymentAmount",
        "aggregatorFunctionType": "SUM",
        "limitOperatorType": "GREATER",
        "limit": "40000",
        "windowMinutes": 1,
    }
    return parse_rule({**base, **fields})


def test_amounts_at_two_places_counts_as_integers():
    assert window_message(rule(), PAIR, "72925.740000000000000000") == (
        "SUM(paymentAmount) over 1 min for payeeId=4, beneficiaryId=36 = 72,925.74, limit > 40,000.00"
    )
    count = rule(aggregateFieldName="COUNT_FLINK", limit="1E+2", limitOperatorType="GREATER_EQUAL")
    assert window_message(count, PAIR, "1E+2") == "COUNT over 1 min for payeeId=4, beneficiaryId=36 = 100, limit >= 100"


def test_averages_are_rounded_and_say_so():
    avg = rule(aggregatorFunctionType="AVG", limit="3000", groupingKeyNames=["payeeId"])
    assert window_message(avg, '{"payeeId":"5"}', "3012.346000000000000000").endswith(
        "= 3,012.35 (rounded), limit > 3,000.00"
    )
    assert window_message(avg, '{"payeeId":"5"}', "3012.5").endswith("= 3,012.50, limit > 3,000.00")


def test_filters_and_distinct_counts_are_part_of_the_aggregate():
    large = rule(
        aggregateFieldName="COUNT_FLINK",
        limitOperatorType="GREATER_EQUAL",
        limit=3,
        filter=[{"field": "paymentAmount", "op": "GE", "value": "5000"}],
    )
    assert window_message(large, PAIR, "3").startswith("COUNT where paymentAmount >= 5,000.00 over 1 min for payeeId=4")
    distinct = rule(
        aggregateFieldName="COUNT_FLINK",
        groupingKeyNames=["payeeId"],
        unique=["beneficiaryId"],
        limit=4,
        filter=[{"field": "paymentType", "op": "IN", "values": ["CSH", "CRD"]}],
    )
    assert rule_text(distinct) == (
        "COUNT(distinct beneficiaryId) where paymentType in (CSH, CRD) by payeeId over 1 min > 4"
    )


def test_rules_in_one_line():
    assert rule_text(rule()) == "SUM(paymentAmount) by payeeId, beneficiaryId over 1 min > 40,000.00"
    login = parse_rule({"ruleId": 100, "ruleState": "ACTIVE", "ruleType": "LOGIN_ANOMALY", "windowMinutes": 10})
    assert rule_text(login).startswith("LOGIN_ANOMALY: >= 3 failed logins from >= 2 IPs")
    assert rule_text(rule(limit="0.005")).endswith("> 0.005")  # a limit finer than cents is shown as it is


@pytest.mark.parametrize(
    ("value", "places", "text"),
    [
        (Decimal("299.000000000000000000"), 2, "299.00"),
        (Decimal("1E+2"), None, "100"),
        (Decimal("-1234.50"), None, "-1,234.5"),
        (Decimal("0.125"), 2, "0.12"),  # half to even
        ("n/a", 2, "n/a"),
    ],
)
def test_numbers(value, places, text):
    assert number(value, places) == text


def test_money_keys_and_times():
    assert money("72925.74") == "72,925.74"
    assert key_label(PAIR) == "payeeId=4, beneficiaryId=36"
    assert key_label("not json") == "not json"
    assert iso_time(1_700_000_000_250) == "2023-11-14T22:13:20.250Z"
    assert iso_time(None) == "-"


def test_counts_of_one_are_singular_in_a_backtest_summary():
    result = BacktestResult(
        transactions=1,
        logins=0,
        quarantined=0,
        late=0,
        alerts=3,
        seconds=2.0,
        per_rule={1: 1, 2: 2},
        shadow_per_rule={9: 1},
    )
    assert result.summary().splitlines()[2:] == [
        "  rule 1: 1 alert",
        "  rule 2: 2 alerts",
        "  shadow rule 9: 1 hit (shadow_alerts)",
    ]
    assert (plural(1, "more key"), plural(1_000, "file")) == ("1 more key", "1,000 files")
