"""A table as JSON lines (`fraudrules export`): exact decimals, timestamps as instants in UTC."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal

from fraudrules.tables.export import to_json_line, utc_text


def test_timestamps_are_written_in_utc_whatever_the_machines_zone():
    """Spark hands a timestamp to Python naive, in this machine's zone: written with its zone, `Z`, as the
    backtest writes an alert's eventTime (`fraudrules export rules` wrote local times without a zone)."""
    local = datetime.fromtimestamp(1_700_000_000.25)  # naive, local: what toLocalIterator returns
    assert utc_text(local) == "2023-11-14T22:13:20.250000Z"
    assert utc_text(datetime.fromtimestamp(0)) == "1970-01-01T00:00:00Z"


def test_a_record_keeps_exact_numbers_and_nested_values():
    record = {"amount": Decimal("10.50"), "at": datetime.fromtimestamp(0), "keys": ["a"], "n": {"x": Decimal("1E+2")}}
    assert json.loads(to_json_line(record)) == {
        "amount": 10.5,
        "at": "1970-01-01T00:00:00Z",
        "keys": ["a"],
        "n": {"x": 100},
    }
    assert '"amount": 10.5,' in to_json_line(record) and '"x": 100}' in to_json_line(record)
