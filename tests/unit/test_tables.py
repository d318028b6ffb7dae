"""Arrow helpers of `fraudrules.tables` (no Spark)."""

from __future__ import annotations

import pyarrow as pa

from fraudrules.tables import per_distinct
from fraudrules.tables.schemas import arrow_fields


def test_per_distinct_calls_once_per_value_and_keeps_nulls_and_order():
    calls: list[object] = []

    def shout(v: object) -> str:
        calls.append(v)
        return str(v).upper()

    column = pa.chunked_array([["a", "b", None], ["a", "c", "b"]])
    assert per_distinct(column, shout, pa.string()).to_pylist() == ["A", "B", None, "A", "C", "B"]
    assert sorted(calls) == ["a", "b", "c"]


def test_per_distinct_of_no_rows_is_empty():
    assert per_distinct(pa.chunked_array([], pa.string()), str.upper, pa.int32()).to_pylist() == []


def test_the_outbox_rows_are_the_tables_with_times_in_milliseconds_and_decimals_as_text():
    """One definition of each table (`tables.SCHEMAS`): the outbox's rows follow it."""
    from fraudrules.engine.outbox import OUTBOX

    alerts = OUTBOX["alerts"]
    assert alerts.names[:3] == ["alertId", "kind", "ruleId"] and "eventTime" not in alerts.names
    assert alerts.field("aggregate").type == pa.string() and alerts.field("eventTimeMs").type == pa.int64()
    assert OUTBOX["shadow_alerts"].names == [*alerts.names, "shadowOf"]
    assert OUTBOX["batches"].names.index("committedAtMs") == 2  # in the place of `committedAt`
    assert [f.name for f in arrow_fields("a int, b array<struct<c:decimal(38,18),d:string>>")] == ["a", "b"]
