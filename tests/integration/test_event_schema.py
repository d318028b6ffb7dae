"""The declared event schema on real Spark and Delta: records typed or quarantined naming the field, a rich
backtest against the reference, and a restart with a changed schema (evolution kept, removals refused)."""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from fraudrules import backtest, event_schema, tables
from fraudrules.config import JobConfig
from fraudrules.engine import ingest, inputs, keying
from fraudrules.event_schema import SchemaError
from fraudrules.generator import RichWorkload, write_jsonl
from fraudrules.rules.model import parse_rule, parse_rules_text
from tests.support import reference
from tests.support.harness import tx_rows
from tests.support.streams import FileStream

pytestmark = pytest.mark.spark

CHECKED = (
    "transactionId BIGINT, eventTime BIGINT, n INT, amount DECIMAL(8,2), ok BOOLEAN, "
    "kind STRING COMMENT 'values: A, B', m STRUCT<id: STRING NOT NULL, deep: STRUCT<x: SMALLINT>>"
)
GOOD = {"transactionId": 1, "eventTime": 1_700_000_000_000}


def raw_lines(spark, records: list):
    """Records (or raw text) as the source's rows, one file."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    return spark.createDataFrame(
        [(line, 0, "f", i) for i, line in enumerate(lines)], "value string, srcTime long, srcName string, srcPos long"
    )


def parsed(spark, schema: str, records: list) -> list[dict]:
    rows = ingest.parse(raw_lines(spark, records), event_schema.parse(schema)).orderBy("srcPos").collect()
    return [r.asDict(recursive=True) for r in rows]


def test_null_masks_beyond_one_column_are_those_keying_reads(spark):
    """70 nullable fields: bits 0-62 in `_nulls0`, 63-69 in `_nulls1`; the engine input's masks as the harness
    (which stands for the input in unit tests) sets them, so keying reads each field's own bit."""
    schema = event_schema.parse("transactionId BIGINT, eventTime BIGINT, " + ", ".join(f"f{i} INT" for i in range(70)))
    every = (2, 3, 7, 62, 63, 64)  # record k leaves out the fields whose number is a multiple of k
    records = [{**GOOD, **{f"f{i}": i for i in range(70) if i % k}} for k in every]
    engine = inputs.numeric(ingest.parse(raw_lines(spark, records), schema), schema).orderBy("srcPos").toPandas()
    expected = tx_rows(records, 0, schema)
    assert schema.mask_columns == ("_nulls0", "_nulls1")
    for name in schema.mask_columns:
        assert engine[name].tolist() == expected[name].tolist()
    tx = keying.Transactions.of(expected, schema)
    absent = np.array([~tx.present(f"f{i}") for i in range(70)]).T
    assert [np.flatnonzero(row).tolist() for row in absent] == [list(range(0, 70, k)) for k in every]


def test_records_are_typed_or_quarantined_naming_the_field(spark):
    rows = parsed(
        spark,
        CHECKED,
        [
            {**GOOD, "n": " 7 ", "amount": 12.5, "ok": "true", "kind": "B", "m": {"id": 5, "deep": {"x": "-3"}}},
            GOOD,  # every optional field absent: null
            {**GOOD, "m": {"deep": {"x": 1}}},
            {**GOOD, "m": "FR"},
            {**GOOD, "m": "{not an object"},
            {**GOOD, "m": {"id": "a", "deep": [1]}},
            {**GOOD, "m": {"id": "a", "deep": {"x": 40_000}}},
            {**GOOD, "n": 3_000_000_000},
            {**GOOD, "n": "seven"},
            {**GOOD, "amount": "1.234"},
            {**GOOD, "amount": "1000000"},
            {**GOOD, "ok": "maybe"},
            {**GOOD, "kind": "C"},
            {"eventTime": 1},
            "[1]",
        ],
    )
    first = rows[0]
    assert (first["n"], first["amount"], first["ok"], first["kind"]) == (7, Decimal("12.50"), True, "B")
    assert first["m"] == {"id": "5", "deep": {"x": -3}} and first["error"] is None
    assert rows[1]["m"] is None and rows[1]["n"] is None and rows[1]["error"] is None
    assert [r["error"] for r in rows[2:]] == [
        "missing m.id",  # NOT NULL inside a struct that is there
        "m is not an object",
        "m is not an object",
        "m.deep is not an object",
        "m.deep.x out of range (SMALLINT)",
        "n out of range (INT)",
        "n is not an integer",
        "amount has more than 2 decimal places",
        "amount out of range",  # DECIMAL(8,2): below 10^6
        "ok is not a boolean",
        "unknown kind (expected A or B)",
        "missing transactionId",
        "malformed JSON: not a JSON object",
    ]


RICH_RULES = [
    {  # more than 40 payments from one device in 2 minutes on web or app
        "ruleId": 1,
        "groupingKeyNames": ["deviceId"],
        "aggregateFieldName": "COUNT_FLINK",
        "limitOperatorType": "GREATER",
        "limit": 40,
        "windowMinutes": 2,
        "filter": [{"field": "channel", "op": "IN", "values": ["web", "app"]}],
    },
    {  # sum per (merchant country, channel) over 1 minute of gambling payments or payments >= 500
        "ruleId": 2,
        "groupingKeyNames": ["merchant.country", "channel"],
        "aggregateFieldName": "paymentAmount",
        "limitOperatorType": "GREATER",
        "limit": "20000",
        "windowMinutes": 1,
        "filter": [
            {
                "any": [
                    {"field": "merchant.category", "op": "EQ", "value": "gambling"},
                    {"field": "paymentAmount", "op": "GE", "value": "500"},
                ]
            }
        ],
    },
    {  # distinct devices per card, cards only, not at an ATM
        "ruleId": 3,
        "groupingKeyNames": ["card.bin"],
        "aggregateFieldName": "COUNT_FLINK",
        "limitOperatorType": "GREATER_EQUAL",
        "limit": 3,
        "windowMinutes": 5,
        "unique": ["deviceId"],
        "filter": [{"not": {"field": "channel", "op": "EQ", "value": "atm"}}],
    },
    {  # the smallest basket per merchant and payment type, where the category is unknown or not fuel
        "ruleId": 4,
        "groupingKeyNames": ["merchant.id", "paymentType"],
        "aggregateFieldName": "basket.items",
        "aggregatorFunctionType": "MIN",
        "limitOperatorType": "LESS_EQUAL",
        "limit": 1,
        "windowMinutes": 3,
        "filter": [
            {
                "any": [
                    {"field": "merchant.category", "op": "IS_NULL"},
                    {"field": "merchant.category", "op": "NE", "value": "fuel"},
                ]
            }
        ],
    },
]


def test_a_rich_backtest_equals_the_reference(spark, tmp_path):
    schema_file = str(event_schema.builtin_path("rich"))
    schema = event_schema.load(schema_file)
    txs = list(RichWorkload(count=6_000, device_burst_every=1_500, gambling_burst_every=1_000).transactions())
    write_jsonl(str(tmp_path / "in"), iter(txs), per_file=2_000)
    rules = [parse_rule({"ruleState": "ACTIVE", "aggregatorFunctionType": "SUM", **r}, schema) for r in RICH_RULES]
    cfg = JobConfig(data_dir=str(tmp_path / "work"), event_schema=schema_file, max_records_per_trigger=2_000)
    result = backtest.run(spark, cfg, str(tmp_path / "in"), rules)
    got = {
        (r["ruleId"], r["transactionId"]): Fraction(r["aggregate"])
        for r in tables.writer(spark, cfg).arrow("alerts", ["ruleId", "transactionId", "aggregate"]).to_pylist()
    }
    expected, _ = reference.run([txs], [rules], cfg.lateness_ms, schema)
    assert got == expected
    assert set(result.per_rule) == {1, 2, 3, 4} and result.quarantined == 0
    bronze = tables.read(spark, cfg, "transactions")
    assert bronze.schema["merchant"].dataType.simpleString() == "struct<id:string,category:string,country:string>"


V1 = "transactionId BIGINT, eventTime BIGINT, amount DECIMAL(20,2), merchant STRUCT<country: STRING>"
V2 = (
    "transactionId BIGINT, eventTime BIGINT, amount DECIMAL(20,2), merchant STRUCT<country: STRING, mcc: STRING>, "
    "channel STRING"
)


def tx(i: int, **fields) -> dict:
    return {"transactionId": i, "eventTime": 1_700_000_000_000 + i * 1_000, "amount": "1.00", **fields}


def test_a_restart_with_added_fields_keeps_state_and_rules_and_refuses_removals(spark, tmp_path):
    data = str(tmp_path / "data")
    (tmp_path / "v1.ddl").write_text(V1)
    (tmp_path / "v2.ddl").write_text(V2)
    (tmp_path / "v3.ddl").write_text(V2.replace("country: STRING, ", ""))  # drops merchant.country
    (tmp_path / "v4.ddl").write_text(V2.replace("channel STRING", "channel INT"))
    by_country = parse_rule(
        {
            "ruleId": 1,
            "ruleState": "ACTIVE",
            "groupingKeyNames": ["merchant.country"],
            "aggregateFieldName": "COUNT_FLINK",
            "aggregatorFunctionType": "SUM",
            "limitOperatorType": "GREATER_EQUAL",
            "limit": 1,
            "windowMinutes": 10,
        },
        event_schema.parse(V1),
    )
    stream = FileStream(spark, data, [by_country], shards=2, event_schema=str(tmp_path / "v1.ddl")).start()
    try:
        stream.feed([tx(1, merchant={"country": "FR"}), tx(2, merchant={"country": "FR"})])
    finally:
        stream.stop()
    assert stream.alerts() == {(1, 1): Decimal(1), (1, 2): Decimal(2)}

    stream = FileStream(spark, data, [], shards=2, event_schema=str(tmp_path / "v2.ddl"))
    stream.files = 100  # new file names: the source has seen the first run's
    stream.start()
    try:
        bronze = tables.read(spark, stream.cfg, "transactions").schema
        assert bronze["merchant"].dataType.simpleString() == "struct<country:string,mcc:string>"
        assert "channel" in bronze.fieldNames()
        by_mcc = {**json.loads(json.dumps(by_country.to_json())), "ruleId": 2, "groupingKeyNames": ["merchant.mcc"]}
        stream.change_rules([by_mcc, {**by_mcc, "ruleId": 3, "groupingKeyNames": ["merchant.mccc"]}])
        stream.feed([tx(3, merchant={"country": "FR", "mcc": "7995"}, channel="web")])
        errors = tables.read(spark, stream.cfg, "rule_errors").collect()
    finally:
        stream.stop()
    # the window of rule 1 went on across the restart; rule 2 on the added field keys the new event
    assert stream.alerts() == {(1, 1): Decimal(1), (1, 2): Decimal(2), (1, 3): Decimal(3), (2, 3): Decimal(1)}
    assert [(e.ruleId, e.reason) for e in errors] == [
        ("3", "groupingKeyNames: 'merchant.mccc' is not in the event schema (closest: merchant.mcc, merchant.country)")
    ]
    assert event_schema.recorded(stream.cfg).ddl == V2
    ok, _ = parse_rules_text(json.dumps(by_mcc), event_schema.for_job(stream.cfg.with_(event_schema=None)))
    assert [r.rule_id for r in ok] == [2]  # `rules put` without --event-schema: the job's schema

    with pytest.raises(SchemaError, match=r"ACTIVE rule 1: groupingKeyNames: 'merchant.country' is not in the event"):
        FileStream(spark, data, [], shards=2, event_schema=str(tmp_path / "v3.ddl")).start()
    with pytest.raises(SchemaError, match=r"a field cannot change its type \(channel: STRING -> INT\)"):
        FileStream(spark, data, [], shards=2, event_schema=str(tmp_path / "v4.ddl")).start()
    (tmp_path / "v5.ddl").write_text(V2.replace("merchant", "Merchant").replace("mcc", "MCC"))
    (tmp_path / "v6.ddl").write_text(V2.replace("channel STRING", "CHANNEL INT"))
    with pytest.raises(SchemaError, match=r"a field cannot change its type \(CHANNEL: STRING -> INT\)"):
        FileStream(spark, data, [], shards=2, event_schema=str(tmp_path / "v6.ddl")).start()
    # Delta matches column names whatever their case: a name changed only in case adds no column
    assert tables.evolve(spark, stream.cfg.with_(event_schema=str(tmp_path / "v5.ddl")), "transactions") == []
    assert event_schema.recorded(stream.cfg).ddl == V2  # refused: nothing changed
