"""Rows as the table writers take them: Arrow tables or lists of dicts, conformed to a table's Arrow schema."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from fraudrules.config import JobConfig
from fraudrules.tables.schemas import ddl, schema

Rows = pa.Table | list[dict]


_ARROW_SCHEMAS: dict[str, pa.Schema] = {}


def arrow_schema(name: str, cfg: JobConfig) -> pa.Schema:
    """A table's columns as Arrow types (timestamps in UTC microseconds, as Delta stores them)."""
    text = ddl(name, cfg)
    if text not in _ARROW_SCHEMAS:
        from pyspark.sql.pandas.types import to_arrow_schema

        _ARROW_SCHEMAS[text] = to_arrow_schema(schema(name, cfg), timezone="UTC")
    return _ARROW_SCHEMAS[text]


def conform_arrow(rows: Rows, target: pa.Schema) -> pa.Table:
    """Rows with the table's columns, in order, cast to its types: decimals rounded half up to the column's scale
    (as Spark's cast rounds), no other rounding or overflow."""
    if not isinstance(rows, pa.Table):
        rows = pa.Table.from_pylist(rows, schema=pa.schema([_widest(f) for f in target]))
    missing = pa.nulls(rows.num_rows)  # bronze keeps the column of a field the event schema no longer declares
    columns = [rows.column(f.name) if f.name in rows.column_names else missing for f in target]
    return pa.table([_cast(c, f.type) for c, f in zip(columns, target, strict=True)], schema=target)


WIDE_DECIMAL = pa.decimal256(76, 38)  # takes any value of the tables' decimal columns, and more digits


def _widest(field: pa.Field) -> pa.Field:
    """A field that takes the column's Python values without loss."""
    return pa.field(field.name, WIDE_DECIMAL) if pa.types.is_decimal(field.type) else field


def _cast(column: pa.ChunkedArray | pa.Array, kind: pa.DataType) -> pa.ChunkedArray | pa.Array:
    if pa.types.is_decimal(kind):
        if not pa.types.is_decimal(column.type):  # text (the outbox's exact aggregates) or integers
            column = column.cast(WIDE_DECIMAL)
        if column.type.scale > kind.scale:  # Spark's cast rounds half up: ties away from zero
            column = pc.round(column, ndigits=kind.scale, round_mode="half_towards_infinity")
    return column.cast(kind)
