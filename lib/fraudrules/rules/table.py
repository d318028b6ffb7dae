"""The admins' rules table: a Delta table with one row per rule in plain columns and its Change Data Feed on, edited
with SQL (INSERT, UPDATE, DELETE, MERGE) by any Spark or SQL client, or through `fraudrules rules` and the notebooks
(`write`). The running job reads its change feed (`sources.table_changes`, `rules/cdc.py`) and applies each row
change to `rule_history`, so the table is where rules are defined and rule_history what the job made of them.

A row's columns are the rule's fields by name (`RULES_TABLE_DDL`, `create`), or a team's own columns named by a
`ColumnMapping`; `disabled = true` pauses a rule; a deleted row deletes its rule.
"""

from __future__ import annotations

import json
import os
import uuid
from decimal import Decimal
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from fraudrules.compat import delta_log
from fraudrules.paths import is_remote
from fraudrules.rules.cdc import DISABLED, FIELDS, ColumnMapping
from fraudrules.rules.model import Rule

# The table `create` makes: every rule field in a column of its own name (filter as JSON text: a condition list
# reads better in SQL as '[{"field": ..., "op": ..., "values": [...]}]' than as an array of structs).
RULES_TABLE_DDL = (
    "ruleId INT NOT NULL, ruleState STRING, ruleType STRING, groupingKeyNames ARRAY<STRING>, "
    "aggregateFieldName STRING, aggregatorFunctionType STRING, limitOperatorType STRING, `limit` DECIMAL(38, 18), "
    "windowMinutes INT, filter STRING, `unique` ARRAY<STRING>, shadowOf INT, minFailures INT, minDistinctIps INT, "
    "disabled BOOLEAN, description STRING"
)
_DELETE = "__delete"  # the source rows' flag: this rule's row goes (MERGE ... WHEN MATCHED AND __delete THEN DELETE)


def is_path(table: str) -> bool:
    """A path (it has a '/'), not a catalog name."""
    return "/" in table


def _sql_name(table: str) -> str:
    """The table in SQL: a path as Delta's path identifier, which must be absolute (a relative one reads as a table
    named `delta`.`...`)."""
    if not is_path(table):
        return table
    return f"delta.`{table if is_remote(table) else os.path.abspath(table)}`"


def create(spark: SparkSession, table: str, rules: list[Rule]) -> bool:
    """Create the table (`RULES_TABLE_DDL`, change feed on) with `rules` as its rows, unless it exists; whether it
    was created."""
    from delta.tables import DeltaTable

    if DeltaTable.isDeltaTable(spark, table) if is_path(table) else spark.catalog.tableExists(table):
        return False
    spark.sql(
        f"CREATE TABLE {_sql_name(table)} ({RULES_TABLE_DDL}) USING delta "
        "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )
    if rules:
        write(spark, table, rules, ColumnMapping())
    return True


def write(spark: SparkSession, table: str, rules: list[Rule], mapping: ColumnMapping) -> None:
    """Put `rules` into the table in one commit (one MERGE: a DELETE-state rule's row is deleted, the others'
    are updated or inserted; columns no rule field maps to are left as they are)."""
    schema = spark.read.format("delta").load(table).schema if is_path(table) else spark.table(table).schema
    columns = [mapping.column(f) for f in FIELDS if mapping.column(f) in schema.names]
    source_schema = T.StructType([schema[c] for c in columns] + [T.StructField(_DELETE, T.BooleanType())])
    view = f"fraudrules_rule_rows_{uuid.uuid4().hex}"
    spark.createDataFrame([_row(r, mapping, source_schema) for r in rules], source_schema).createTempView(view)
    key = mapping.column("ruleId")
    updates = ", ".join(f"t.`{c}` = s.`{c}`" for c in columns)
    names, values = ", ".join(f"`{c}`" for c in columns), ", ".join(f"s.`{c}`" for c in columns)
    try:
        spark.sql(
            f"MERGE INTO {_sql_name(table)} t USING {view} s ON t.`{key}` = s.`{key}` "
            f"WHEN MATCHED AND s.{_DELETE} THEN DELETE WHEN MATCHED THEN UPDATE SET {updates} "
            f"WHEN NOT MATCHED AND NOT s.{_DELETE} THEN INSERT ({names}) VALUES ({values})"
        )
    finally:
        spark.catalog.dropTempView(view)


def _row(rule: Rule, mapping: ColumnMapping, schema: T.StructType) -> tuple:
    """A rule as a source row of `write`, each value as its column's type holds it."""
    fields = rule.to_json() | {DISABLED: False}
    by_column = {mapping.column(f): fields.get(f) for f in FIELDS}
    values = [_as(by_column.get(c.name), c.dataType) for c in schema.fields if c.name != _DELETE]
    return (*values, rule.state == "DELETE")


def _as(value: Any, kind: T.DataType) -> Any:
    """A rule field's JSON value as a column of `kind` holds it (lists and objects as JSON text in a string)."""
    if value is None:
        return None
    if isinstance(kind, T.StringType):
        return value if isinstance(value, str) else json.dumps(value)
    if isinstance(kind, T.DecimalType):
        return Decimal(str(value))
    if isinstance(kind, (T.IntegerType, T.LongType, T.ShortType)):
        return int(value)
    if isinstance(kind, T.BooleanType):
        return bool(value)
    if isinstance(kind, (T.DoubleType, T.FloatType)):
        return float(value)
    return value  # arrays: the rule's lists as they are


def commit_notes(spark: SparkSession, table: str, versions: set[int]) -> dict[int, str]:
    """What the rules table's history says of each commit: its operation and, where recorded, its user
    ("UPDATE by alice@example.com"). A local path table's commits are read from its log (`delta_log.commit_info`):
    Delta's history API would add 0.3-0.8 s to every rule change; a catalog table's, or a remote one's, through it."""
    notes: dict[int, str] = {}
    if is_path(table) and not is_remote(table):
        for version in versions:
            info = delta_log.commit_info(table, version)
            if info is not None and "operation" in info:
                notes[version] = _note(info["operation"], info.get("userName"))
    if not (missing := versions - notes.keys()):
        return notes
    from delta.tables import DeltaTable

    found = DeltaTable.forPath(spark, table) if is_path(table) else DeltaTable.forName(spark, table)
    rows = found.history().where(F.col("version").isin(sorted(missing))).select("version", "operation", "userName")
    return notes | {r.version: _note(r.operation, r.userName) for r in rows.collect()}


def _note(operation: str, user: str | None) -> str:
    return operation + (f" by {user}" if user else "")
