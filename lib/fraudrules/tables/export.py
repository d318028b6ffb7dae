"""A table as JSON lines, decimals as exact JSON numbers."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime, timezone
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from fraudrules.config import JobConfig
from fraudrules.tables.reads import read


def export_jsonl(spark: SparkSession, cfg: JobConfig, name: str, out: str, order_by: list[str] | None = None) -> int:
    """Write a table as JSON lines (decimals as exact JSON numbers); returns the row count."""
    df = read(spark, cfg, name)
    if order_by:
        df = df.orderBy(*order_by)
    n = 0
    with open(out, "w", encoding="utf-8") as fh:
        for row in df.toLocalIterator():
            fh.write(to_json_line(row.asDict(recursive=True)) + "\n")
            n += 1
    return n


_NUM = "\u0000num:"


def to_json_line(record: dict) -> str:
    """JSON with Decimals written as exact JSON numbers (not floats, not strings), timestamps in UTC (`utc_text`)."""

    def conv(v):
        if isinstance(v, Decimal):
            return exact_number(v)
        if isinstance(v, datetime):
            return utc_text(v)
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, list):
            return [conv(x) for x in v]
        return v

    return json_text({k: conv(v) for k, v in record.items()})


def utc_text(t: datetime) -> str:
    """A timestamp as Spark hands it to Python (naive, in this machine's time zone) as ISO text in UTC, with `Z`
    (as `backtest --out` writes an alert's `eventTime`): a reader elsewhere reads the same instant."""
    return t.astimezone(timezone.utc).replace(tzinfo=None).isoformat() + "Z"


def number_text(v: Decimal) -> str:
    """A Decimal as an exact JSON number: no exponent, no trailing zeros."""
    return format(v.normalize(), "f") if v != 0 else "0"


def per_distinct(column: pa.ChunkedArray, f: Callable[[object], object], type_: pa.DataType) -> pa.Array:
    """`f` of each row's value, called once per distinct value, not once per row; nulls stay null."""
    codes = pc.dictionary_encode(column.combine_chunks())
    return pa.array([f(v) for v in codes.dictionary.to_pylist()], type_).take(codes.indices)


def exact_number(v: Decimal) -> str:
    """A Decimal's stand-in in a record for `json_text`, which writes it as an exact JSON number."""
    return _NUM + number_text(v)


_NUMBER = re.compile(r'"\\u0000num:([^"]*)"')


def json_text(record: dict) -> str:
    """A record of plain JSON values and `exact_number`s as one line of JSON."""
    return _NUMBER.sub(r"\1", json.dumps(record, default=str))
