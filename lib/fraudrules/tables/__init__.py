"""Delta tables of the project, one module per job: `schemas` (DDL and properties), `catalog` (existence, creation,
schema evolution), `reads`, `arrow` (rows conformed to a table's types), `writers` (idempotent appends, compaction),
`export` (JSON lines). The names the rest of the package uses are here."""

from __future__ import annotations

from fraudrules.tables.arrow import Rows
from fraudrules.tables.catalog import ensure, evolve, exists
from fraudrules.tables.export import exact_number, export_jsonl, json_text, number_text, per_distinct
from fraudrules.tables.reads import delta, read, read_stream
from fraudrules.tables.schemas import BRONZE_TAIL, LINES_FROM_1, PROPERTIES, SCHEMAS, ddl, schema
from fraudrules.tables.writers import (
    DeltaRsWriter,
    SparkWriter,
    TableWriter,
    Txn,
    compact_rs,
    delta_conflicts,
    due_for_compaction,
    file_sizes,
    rs_conflicts,
    uses_delta_rs,
    writer,
)

__all__ = [
    "BRONZE_TAIL",
    "LINES_FROM_1",
    "PROPERTIES",
    "SCHEMAS",
    "DeltaRsWriter",
    "Rows",
    "SparkWriter",
    "TableWriter",
    "Txn",
    "compact_rs",
    "ddl",
    "delta",
    "delta_conflicts",
    "due_for_compaction",
    "ensure",
    "evolve",
    "exact_number",
    "exists",
    "export_jsonl",
    "file_sizes",
    "json_text",
    "number_text",
    "per_distinct",
    "read",
    "read_stream",
    "rs_conflicts",
    "schema",
    "uses_delta_rs",
    "writer",
]
