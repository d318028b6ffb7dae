"""The notebooks' tables as people read them: amounts at 2 places, counts as integers, ISO times, keys as
name=value, empty cells empty; the drill-down's sums recomputed from the window's transactions."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from decimal import Decimal

import pandas as pd

from fraudrules.analyst import display
from tests.unit.test_messages import rule

RULE_5 = rule(ruleId=5)
ALERT = {
    "alertId": "a-1",
    "ruleId": 5,
    "ruleVersion": 1,
    "key": '{"payeeId":"4","beneficiaryId":"36"}',
    "transactionId": 12,
    "eventTimeMs": 1_700_000_000_000,
    "windowMinutes": 1,
    "aggregateFieldName": "paymentAmount",
    "aggregatorFunctionType": "SUM",
    "aggregate": Decimal("45000.120000000000000000"),
    "limitOperatorType": "GREATER",
    "limit": Decimal("40000.000000000000000000"),
    "message": "m",
    "producedAtMs": 1_700_000_001_000,
}


def test_readable_formats_money_counts_times_keys_and_empty_cells():
    frame = pd.DataFrame(
        {
            "transactionId": [123456, 7],
            "eventTime": [1_700_000_000_250, 1_700_000_060_000],
            "paymentAmount": [Decimal("72925.740000000000000000"), Decimal("299.000000000000000000")],
            "key": ['{"payeeId":"4","beneficiaryId":"36"}', None],
            "committed at": [datetime(2024, 1, 31, 12, tzinfo=timezone.utc), None],
            "alerts": [1200, 0],
            "seconds": [1.5, float("nan")],
            "share": [0.25, 0.5],
            "srcName": ["file:/data/landing/transactions/part-000003.json", None],
        }
    )
    out = display.readable(frame)
    assert out.to_dict("list") == {
        "transactionId": ["123456", "7"],
        "eventTime": ["2023-11-14T22:13:20.250Z", "2023-11-14T22:14:20.000Z"],
        "paymentAmount": ["72,925.74", "299.00"],
        "key": ["payeeId=4, beneficiaryId=36", ""],
        "committed at": ["2024-01-31T12:00:00.000Z", ""],
        "alerts": ["1,200", "0"],
        "seconds": ["1.50", ""],
        "share": ["25.0%", "50.0%"],
        "srcName": ["part-000003.json", ""],
    }


def test_aggregates_in_the_unit_of_their_rule():
    frame = pd.DataFrame(
        {
            "aggregateFieldName": ["COUNT_FLINK", "paymentAmount"],
            "aggregate": [Decimal("3.000000000000000000"), Decimal("100000.5")],
            "limit": [Decimal("3"), Decimal("100000")],
        }
    )
    out = display.readable(frame)
    assert out["aggregate"].tolist() == ["3", "100,000.50"]
    assert out["limit"].tolist() == ["3", "100,000.00"]


def test_rules_table_one_line_per_rule_and_nothing_written():
    rows = [{"ruleId": 5, "version": 2, "ruleState": "ACTIVE", "ruleJson": json.dumps(RULE_5.to_json())}]
    assert display.rules_table(rows).values.tolist() == [
        [5, 2, "ACTIVE", "SUM(paymentAmount) by payeeId, beneficiaryId over 1 min > 40,000.00"]
    ]
    assert display.rules_table([]).columns.tolist() == ["ruleId", "version", "state", "rule"]


def test_alert_card_names_rule_key_window_and_amounts():
    card = display.alert_card(ALERT, RULE_5)["value"].to_dict()
    assert card["rule"].startswith("5 v1: SUM(paymentAmount) by payeeId, beneficiaryId")
    assert card["key"] == "payeeId=4, beneficiaryId=36"
    assert card["window"] == "2023-11-14T22:12:20.000Z to 2023-11-14T22:13:20.000Z (1 min)"
    assert (card["aggregate"], card["limit"]) == ("45,000.12", "GREATER 40,000.00")


def test_window_summary_recomputes_the_aggregate_from_the_window():
    window = pd.DataFrame(
        {"transactionId": [10, 12], "paymentAmount": [Decimal("40000.10"), Decimal("5000.02")], "payeeId": [4, 4]}
    )
    summary = display.window_summary(window, ALERT, RULE_5)
    assert summary.values.tolist() == [["45,000.12", "45,000.12"], ["", "2"], ["", "yes"]]
    assert display.window_summary(window.head(1), ALERT, RULE_5).values.tolist()[2] == ["", "no"]
