"""The declared event schema: DDL as Spark writes it, what the engine and bronze make of it, what is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fraudrules import event_schema
from fraudrules.config import JobConfig, config_from
from fraudrules.engine import ingest
from fraudrules.engine.ingest import RAW_COLUMNS
from fraudrules.engine.inputs import LOGIN_COLUMNS
from fraudrules.event_schema import (
    BRONZE_COLUMNS,
    DEFAULT,
    ENGINE_COLUMNS,
    RESERVED_PREFIXES,
    SOURCE_COLUMNS,
    SchemaError,
    mask_column,
    parse,
)
from fraudrules.rules.codec import RULE_CHANGE
from fraudrules.tables import BRONZE_TAIL

RICH = (
    "transactionId BIGINT, eventTime BIGINT, payeeId BIGINT, beneficiaryId BIGINT, paymentAmount DECIMAL(18,2), "
    "paymentType STRING, channel STRING, deviceId STRING, merchant STRUCT<id: STRING, category: STRING, "
    "country: STRING>, basket STRUCT<items: INT>, card STRUCT<bin: STRING>"
)


def test_the_issues_example_declares_every_leaf_by_dotted_path():
    s = parse(RICH)
    assert list(s.fields) == [
        "transactionId",
        "eventTime",
        "payeeId",
        "beneficiaryId",
        "paymentAmount",
        "paymentType",
        "channel",
        "deviceId",
        "merchant.id",
        "merchant.category",
        "merchant.country",
        "basket.items",
        "card.bin",
        "ingestionTimestamp",  # declared implicitly: the latency measurement
    ]
    amount, items, country = s.fields["paymentAmount"], s.fields["basket.items"], s.fields["merchant.country"]
    assert (amount.kind, amount.scale, amount.limit) == ("decimal", 2, 10**16)
    assert (items.kind, items.bits, items.numeric) == ("integer", 32, True)
    assert (country.kind, country.numeric, country.column) == ("string", False, "merchant__country")
    assert s.spark_ddl.endswith("basket struct<items:int>, card struct<bin:string>, ingestionTimestamp bigint")


def test_the_default_schema_is_todays_transaction():
    assert DEFAULT.spark_ddl == (
        "transactionId bigint, eventTime bigint, payeeId bigint, beneficiaryId bigint, paymentAmount decimal(20,2), "
        "paymentType string, ingestionTimestamp bigint"
    )
    assert DEFAULT.fields["paymentType"].values == ("CSH", "CRD")
    assert [f.path for f in DEFAULT.fields.values() if f.nullable] == []  # system fields and NOT NULL ones
    assert list(DEFAULT.engine_columns()) == [
        "transactionId",
        "eventTime",
        "payeeId",
        "beneficiaryId",
        "paymentAmount",
        "paymentType",
        "ingestionTimestamp",
        "srcTime",
        "srcId",
        "srcPos",
    ]
    assert set(DEFAULT.engine_columns().values()) == {"long"}


def test_nullability_null_masks_and_engine_columns():
    s = parse(
        "transactionId BIGINT, eventTime BIGINT, a INT NOT NULL, b DECIMAL(10,3), c STRING, ok BOOLEAN, "
        "m STRUCT<x: BIGINT NOT NULL, y STRING NOT NULL> NOT NULL, n STRUCT<z: BIGINT NOT NULL>"
    )
    nullable = {p: (f.nullable, f.null_bit) for p, f in s.fields.items()}
    assert nullable == {
        "transactionId": (False, -1),
        "eventTime": (False, -1),
        "a": (False, -1),
        "b": (True, 0),
        "c": (True, -1),  # text: null travels as null
        "ok": (True, 1),
        "m.x": (False, -1),
        "m.y": (False, -1),
        "n.z": (True, 2),  # NOT NULL inside a struct that may be absent
        "ingestionTimestamp": (False, -1),  # carried as -1 when absent
    }
    columns = s.engine_columns()
    assert columns["c"] == columns["m__y"] == "string" and columns["b"] == columns["_nulls0"] == "long"


def test_ddl_spellings_comments_quotes_and_declared_values():
    s = parse(
        """-- a comment line
        `transactionId` LONG NOT NULL, eventTime bigint,  -- trailing comment
        kind VARCHAR(8) COMMENT 'values: A, B, C', note STRING COMMENT 'free text -- not a comment',
        amount NUMERIC(12, 4), flag BOOL, s STRUCT<inner STRUCT<deep: TINYINT>>,"""
    )
    assert s.fields["kind"].values == ("A", "B", "C") and s.fields["note"].values == ()
    assert (s.fields["amount"].precision, s.fields["amount"].scale) == (12, 4)
    assert s.fields["s.inner.deep"].bits == 8 and s.fields["flag"].kind == "boolean"


@pytest.mark.parametrize(
    ("ddl", "problem"),
    [
        ("transactionId BIGINT, eventTime BIGINT, x DOUBLE", "x: type DOUBLE is not supported"),
        ("transactionId BIGINT, eventTime BIGINT, t TIMESTAMP", "t: type TIMESTAMP is not supported"),
        ("transactionId BIGINT", "must declare eventTime BIGINT"),
        ("transactionId INT, eventTime BIGINT", "must declare transactionId BIGINT"),
        ("transactionId BIGINT, eventTime BIGINT, x INT, x STRING", "declares a field twice"),
        ("transactionId BIGINT, eventTime BIGINT, m STRUCT<a: INT", "closing STRUCT of m"),
        ("transactionId BIGINT, eventTime BIGINT, d DECIMAL(20,19)", "d: DECIMAL(20,19) needs"),
        ("transactionId BIGINT, eventTime BIGINT, `a.b` INT", "a dot separates a struct's fields"),
        ("transactionId BIGINT, eventTime BIGINT, a INT NOT", "NOT must be followed by NULL"),
        ("transactionId BIGINT, eventTime BIGINT, srcPos BIGINT", "srcPos: the engine's input names its own column"),
        ("transactionId BIGINT, eventTime BIGINT, shard STRING", "shard: the engine's input names its own column"),
        ("transactionId BIGINT, eventTime BIGINT, `_nulls0` INT", "_nulls0: the engine's input names its own column"),
        ("transactionId BIGINT, eventTime BIGINT, SHARD INT", "SHARD: the engine's input names its own column"),
        ("transactionId BIGINT, eventTime BIGINT, raw STRING", "raw: bronze and ingest keep that name"),
        ("transactionId BIGINT, eventTime BIGINT, Value DECIMAL(9,2)", "Value: bronze and ingest keep that name"),
        ("transactionId BIGINT, eventTime BIGINT, error STRING", "error: bronze and ingest keep that name"),
        ("transactionId BIGINT, eventTime BIGINT, login_ip STRING", "login_ip: bronze and ingest keep that name"),
        ("transactionId BIGINT, eventTime BIGINT, a INT, A STRING", "a and A, names that differ only in case"),
        ("transactionId BIGINT, eventTime BIGINT, m STRUCT<id: INT, ID: INT>", "m declares a field twice: id and ID"),
        ("transactionId BIGINT, eventTime BIGINT, a__b INT, A STRUCT<b: INT>", "A.b and a__b would share the column"),
    ],
)
def test_unusable_schemas_are_refused_naming_why(ddl, problem):
    with pytest.raises(SchemaError, match=re.escape(problem)):
        parse(ddl)


def test_the_reserved_columns_are_those_the_engine_adds():
    assert RULE_CHANGE in ENGINE_COLUMNS and set(SOURCE_COLUMNS) <= set(DEFAULT.engine_columns())
    nullable = parse("transactionId BIGINT, eventTime BIGINT, a INT")
    assert nullable.mask_columns == (mask_column(nullable.fields["a"].null_bit),) == ("_nulls0",)


def test_the_names_kept_from_fields_are_the_columns_bronze_and_ingest_add():
    bronze = [c.split()[0] for c in BRONZE_TAIL.split(", ")]
    assert set(RAW_COLUMNS) | {"j", "error"} | set(bronze) == set(BRONZE_COLUMNS)
    assert ingest._cast_column(DEFAULT.fields["payeeId"]).startswith(RESERVED_PREFIXES)
    assert all(c.startswith(RESERVED_PREFIXES) for c in LOGIN_COLUMNS)
    nested = parse("transactionId BIGINT, eventTime BIGINT, m STRUCT<raw: STRING, value: INT>, valueDate STRING")
    assert {"m.raw", "m.value", "valueDate"} <= set(nested.fields)


def test_closest_names_for_a_misspelt_or_unprefixed_field():
    s = parse(RICH)
    assert s.closest("merchant.contry")[0] == "merchant.country"
    assert s.closest("country") == ["merchant.country"]
    assert s.closest("zzz") == []


def test_changed_fields_between_two_schemas():
    old = parse("transactionId BIGINT, eventTime BIGINT, a INT, k STRING COMMENT 'values: X, Y'")
    new = parse("transactionId BIGINT, eventTime BIGINT, a BIGINT, k STRING, m STRUCT<b: STRING>")
    assert new.changed_from(old) == ["a: INT -> BIGINT", "k: STRING (values X, Y) -> STRING"]


def test_a_field_whose_name_changes_only_in_case_is_the_same_field():
    old = parse("transactionId BIGINT, eventTime BIGINT, a INT, m STRUCT<b: STRING>")
    assert parse("transactionId BIGINT, eventTime BIGINT, A INT, M STRUCT<B: STRING>").changed_from(old) == []
    new = parse("transactionId BIGINT, eventTime BIGINT, A BIGINT, m STRUCT<B: INT>")
    assert new.changed_from(old) == ["A: INT -> BIGINT", "m.B: STRING -> INT"]


def test_files_the_job_config_and_the_recorded_schema(tmp_path):
    path = tmp_path / "rich.ddl"
    path.write_text(RICH)
    assert event_schema.load(str(path)).fields["card.bin"].kind == "string"
    assert "no such file" in event_schema.file_problem(str(tmp_path / "none.ddl"))
    (tmp_path / "bad.ddl").write_text("transactionId BIGINT")
    assert event_schema.file_problem(str(tmp_path / "bad.ddl")).startswith(f"event schema {tmp_path}/bad.ddl:")
    cfg = JobConfig(data_dir=str(tmp_path / "data"))
    assert event_schema.for_job(cfg) is DEFAULT  # never started: the default schema
    event_schema.record(cfg, event_schema.load(str(path)))
    assert "card.bin" in event_schema.for_job(cfg).fields  # a restart without --event-schema keeps it
    (tmp_path / "default.ddl").write_text(DEFAULT.ddl)
    assert "card.bin" not in event_schema.for_job(cfg.with_(event_schema=str(tmp_path / "default.ddl"))).fields


def test_an_entry_point_resolves_the_event_schema_once_and_every_layer_gets_it(tmp_path, monkeypatch):
    """`resolved` reads the DDL once; `for_job` then returns it without reading a file, until a setting it came
    from changes; `config_from` takes no `events` parameter."""
    ddl = tmp_path / "events.ddl"
    ddl.write_text(Path(event_schema.builtin_path("rich")).read_text())
    cfg = event_schema.resolved(JobConfig(data_dir=str(tmp_path), event_schema=str(ddl)))
    assert cfg.events == event_schema.load(str(ddl)) and cfg == JobConfig(data_dir=str(tmp_path), event_schema=str(ddl))
    monkeypatch.setattr(event_schema, "load", lambda path: pytest.fail(f"{path} read again"))
    assert event_schema.for_job(cfg) is cfg.events
    assert event_schema.for_job(cfg.with_(max_records_per_trigger=5)) is cfg.events
    assert event_schema.for_job(cfg.with_(event_schema=None)) is event_schema.DEFAULT  # resolved again: no file
    assert config_from({"data_dir": "d", "events": "rich"}).events is None
