"""Arrow helpers of `fraudrules.tables` (no Spark)."""

from __future__ import annotations

import pyarrow as pa

from fraudrules.tables import per_distinct


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
