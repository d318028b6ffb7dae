"""The backtest's alerts file: each alert as the line `json.dumps` writes for it, built column by column."""

from __future__ import annotations

import json
from decimal import Decimal

import pyarrow as pa

from fraudrules.backtest import ALERT_FIELDS, _newline_ended, alert_lines
from fraudrules.rules.text import iso_time
from fraudrules.tables import exact_number, json_text

TYPES = {
    "ruleId": pa.int32(),
    "ruleVersion": pa.int64(),
    "transactionId": pa.int64(),
    "userId": pa.int64(),
    "aggregate": pa.decimal128(38, 18),
    "limit": pa.decimal128(38, 18),
    "windowMinutes": pa.int32(),
    "eventTimeMs": pa.int64(),
    "producedAtMs": pa.int64(),
}
ALERT = {
    "alertId": "1:17",
    "kind": "WINDOW",
    "ruleId": 1,
    "ruleVersion": 3,
    "transactionId": 17,
    "userId": None,
    "key": '{"payeeId":"4","beneficiaryId":"36"}',
    "aggregate": Decimal("400175.31"),
    "aggregatorFunctionType": "SUM",
    "aggregateFieldName": "paymentAmount",
    "limitOperatorType": "GREATER",
    "limit": Decimal("400000"),
    "windowMinutes": 1440,
    "eventTimeMs": 1_700_000_457_294,
    "producedAtMs": 1_795_909_916_251,
    "message": "SUM(paymentAmount) over 1440 min for payeeId=4, beneficiaryId=36 = 400,175.31",
    "details": None,
}
ODD = [  # values json.dumps escapes or rewrites, decimals with and without places, nulls
    {"key": '{"merchant": {"name": "Café \\"Zoë\\"\\n"}, "n": 1.50}', "message": "tab\there, back\\slash, ☃, \u0001"},
    {"aggregate": Decimal("0E-18"), "limit": Decimal("-0.000"), "details": ""},
    {"aggregate": Decimal("-12.500"), "limit": Decimal("1E-18"), "eventTimeMs": 0},
    {"aggregate": Decimal("12345678901234567890.123456789012345678"), "eventTimeMs": None, "message": None},
    {
        "alertId": "9:u42:1700000000001",
        "kind": "LOGIN_ANOMALY",
        "transactionId": None,
        "userId": 42,
        "key": '{"userId":"42"}',
        "details": '{"failedIps": ["10.0.0.1", "10.0.0.2"], "newIp": "10.9.9.9", "failures": 3}',
        "eventTimeMs": 1_700_000_000_001,
    },
]


def expected(record: dict) -> str:
    """The line as written one record at a time: the JSON values parsed, decimals exact, the ISO time added."""
    record = dict(record)
    record["key"] = json.loads(record["key"])
    record["details"] = json.loads(record["details"]) if record["details"] else None
    for name in ("aggregate", "limit"):
        if record[name] is not None:
            record[name] = exact_number(record[name])
    record["eventTime"] = iso_time(record["eventTimeMs"])
    return json_text(record)


def table(records: list[dict]) -> pa.Table:
    return pa.table({f: pa.array([r[f] for r in records], TYPES.get(f, pa.string())) for f in ALERT_FIELDS})


def test_each_line_is_what_json_dumps_writes_for_the_alert():
    records = [ALERT, *({**ALERT, **odd} for odd in ODD)]
    lines = alert_lines(table(records)).to_pylist()
    assert lines == [expected(r) for r in records]
    assert json.loads(lines[0], parse_float=Decimal) == {
        **ALERT,
        "key": {"payeeId": "4", "beneficiaryId": "36"},
        "aggregate": Decimal("400175.31"),
        "limit": 400000,
        "eventTime": "2023-11-14T22:20:57.294Z",
    }
    assert '"limit": 0,' in lines[2] and '"limit": 0.000000000000000001,' in lines[3]  # exact, no exponent


def test_repeated_values_are_written_alike_and_an_empty_table_has_no_lines():
    lines = alert_lines(table([ALERT, {**ALERT, "alertId": "1:18"}, ALERT])).to_pylist()
    assert lines[0] == lines[2] == expected(ALERT) and lines[1] == expected({**ALERT, "alertId": "1:18"})
    assert alert_lines(table([])).to_pylist() == []


def test_lines_are_written_from_arrow_each_with_its_newline():
    lines = alert_lines(table([ALERT, {**ALERT, "alertId": "1:18"}, ALERT]))
    assert bytes(_newline_ended(lines)).decode() == "".join(f"{line}\n" for line in lines.to_pylist())
    assert bytes(_newline_ended(pa.array(["a", "bc", "d"]).slice(1))) == b"bc\nd\n"  # a slice: its own lines
