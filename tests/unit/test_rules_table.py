"""The admins' rules table without Spark: its change feed rows as changes (`cdc.table_change`), changes of one commit
as one change set, rules as its rows (`rules/table.py`), and the job's configuration of it."""

from __future__ import annotations

import json
import os
from decimal import Decimal

import pytest
from pyspark.sql import types as T

from fraudrules.cli import parser
from fraudrules.config import RULES_QUERY, JobConfig, config_from
from fraudrules.event_schema import DEFAULT
from fraudrules.rules import table as rules_table
from fraudrules.rules.cdc import (
    DELTA,
    ChangeError,
    ColumnMapping,
    Position,
    applied_positions,
    change_set_id,
    table_change,
    to_rule,
)
from fraudrules.rules.model import RuleError, parse_rule

ROW = {
    "ruleId": 3,
    "ruleState": "ACTIVE",
    "groupingKeyNames": ["payeeId"],
    "aggregateFieldName": "paymentAmount",
    "aggregatorFunctionType": "SUM",
    "limitOperatorType": "GREATER",
    "limit": 500.000000000000000000,  # what Spark's to_json makes of DECIMAL(38, 18)
    "windowMinutes": 10,
    "filter": '[{"field": "paymentType", "op": "EQ", "value": "CRD"}]',
    "description": "big card payments to one payee",
}


def _feed(row: dict, change_type: str = "insert", version: int = 4) -> str:
    """A change feed row as `sources.table_changes` sends it (its numbers as Spark writes them)."""
    text = json.dumps({**row, "_change_type": change_type, "_commit_version": version, "_commit_timestamp": "t"})
    return text.replace('"limit": 500.0', '"limit": 500.000000000000000000')


def test_inserts_and_updates_put_the_row_and_a_delete_deletes_its_rule():
    inserted = table_change(_feed(ROW), ColumnMapping())
    assert (inserted.op, inserted.rule_id, inserted.origin, inserted.position) == (
        "c",
        3,
        DELTA,
        Position("version", 4, 0),
    )
    rule = to_rule(inserted, ColumnMapping(), DEFAULT, None)
    assert (rule.limit, rule.window_minutes, rule.state) == (Decimal("500"), 10, "ACTIVE")  # exact, no float on the way
    assert [c.field for c in rule.filter[0].leaves()] == ["paymentType"]  # JSON text in a string column
    updated = table_change(_feed({**ROW, "disabled": True}, "update_postimage", 5), ColumnMapping())
    assert (updated.op, to_rule(updated, ColumnMapping(), DEFAULT, rule).state) == ("u", "PAUSE")
    deleted = table_change(_feed(ROW, "delete", 6), ColumnMapping())
    assert to_rule(deleted, ColumnMapping(), DEFAULT, rule).state == "DELETE"
    with pytest.raises(RuleError, match="no such rule"):
        to_rule(deleted, ColumnMapping(), DEFAULT, None)


def test_a_team_table_is_read_through_the_column_mapping():
    mapping = ColumnMapping({"ruleId": "id", "limit": "max_amount"})
    row = {k: v for k, v in ROW.items() if k not in ("ruleId", "limit")} | {"id": 9, "max_amount": "42.50"}
    change = table_change(_feed(row), mapping)
    assert (change.rule_id, to_rule(change, mapping, DEFAULT, None).limit) == (9, Decimal("42.50"))


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (_feed(ROW, "update_preimage"), "not a change feed row: change type 'update_preimage'"),
        (json.dumps({**ROW, "_change_type": "insert"}), "version None"),
        (_feed({**ROW, "ruleId": None}), "column ruleId: None is not a rule id"),
    ],
)
def test_rows_that_are_no_usable_change_are_errors(value, reason):
    with pytest.raises(ChangeError) as err:
        table_change(value, ColumnMapping())
    assert reason in str(err.value)


def test_the_changes_of_one_commit_are_one_change_set_and_each_rule_knows_its_position():
    changes = [table_change(_feed({**ROW, "ruleId": r}, version=12), ColumnMapping()) for r in (3, 7)]
    assert change_set_id(changes) == "delta:3,7:version:12:0"
    assert change_set_id(changes[:1]) == changes[0].change_id == "delta:3:version:12:0"
    history = [
        {"ruleId": 3, "version": 1, "changeId": "delta:3:version:4:0"},
        {"ruleId": 3, "version": 2, "changeId": "delta:3,7:version:12:0"},
        {"ruleId": 7, "version": 1, "changeId": "delta:3,7:version:12:0"},
        {"ruleId": 9, "version": 1, "changeId": "cli-change"},
    ]
    assert applied_positions(history) == {3: Position("version", 12, 0), 7: Position("version", 12, 0)}
    assert not Position("version", 12, 0).after(applied_positions(history)[3])  # a replayed commit: a no-op
    assert Position("version", 13, 0).after(applied_positions(history)[3])


def test_rules_become_rows_of_the_columns_types():
    """`rules/table.write`'s source rows: each field as its column's type holds it, a DELETE a row to delete, a
    disabled flag cleared (the state says it all)."""
    rule = parse_rule({**ROW, "limit": "500.25", "filter": json.loads(ROW["filter"])}, DEFAULT)
    columns = {
        "ruleId": T.IntegerType(),
        "ruleState": T.StringType(),
        "groupingKeyNames": T.ArrayType(T.StringType()),
        "limit": T.DecimalType(38, 18),
        "windowMinutes": T.IntegerType(),
        "filter": T.StringType(),
        "disabled": T.BooleanType(),
        "__delete": T.BooleanType(),
    }  # some of RULES_TABLE_DDL's columns (a DDL parser needs a JVM), and the delete flag
    schema = T.StructType([T.StructField(name, kind) for name, kind in columns.items()])
    row = dict(zip(schema.names, rules_table._row(rule, ColumnMapping(), schema), strict=True))
    assert row["limit"] == Decimal("500.25") and row["groupingKeyNames"] == ["payeeId"]
    assert json.loads(row["filter"])[0]["field"] == "paymentType"
    assert (row["disabled"], row["__delete"], row["ruleState"]) == (False, False, "ACTIVE")
    gone = dict(zip(schema.names, rules_table._row(rule.__class__(3, "DELETE"), ColumnMapping(), schema), strict=True))
    assert gone["__delete"] is True


def test_the_rules_table_in_the_config_and_on_the_command_line(tmp_path):
    args = parser().parse_args(["run", "--data-dir", str(tmp_path), "--rules-table", "main.fraud.rules_admin"])
    cfg = config_from(vars(args))
    assert cfg.rules_table == "main.fraud.rules_admin"
    other = cfg.with_(rules_table="main.fraud.other")
    folders = {c.checkpoint(RULES_QUERY) for c in (cfg, other, JobConfig(data_dir=str(tmp_path)))}
    assert len(folders) == 3  # each rules source keeps its own positions
    assert cfg.checkpoint("evaluate") == JobConfig(data_dir=str(tmp_path)).checkpoint("evaluate")
    with pytest.raises(ValueError, match="rules_format is what messages"):
        JobConfig(data_dir=str(tmp_path), rules_table="t/x", rules_format="debezium")
    with pytest.raises(ValueError, match="rules_table must name"):
        JobConfig(data_dir=str(tmp_path), rules_table=" ")
    assert config_from({"rules_table": ""}).rules_table is None  # the bundle's empty variable: no table


def test_a_relative_path_is_the_table_at_that_path():
    """Delta reads `delta.`rel/x`` as a table named so in a schema `delta`: a relative path is made absolute."""
    assert rules_table._sql_name("data/rules_admin") == f"delta.`{os.path.abspath('data/rules_admin')}`"
    assert rules_table._sql_name("s3://bucket/rules") == "delta.`s3://bucket/rules`"
    assert rules_table._sql_name("main.fraud.rules_admin") == "main.fraud.rules_admin"
