"""Debezium change events of a PostgreSQL rules table as rule changes (rules/cdc.py), on real captured messages.

tests/fixtures/debezium/ holds what Debezium 3.6.1.Final's PostgreSQL connector (pgoutput) published for
tools/support/rules_db.py's `fraud_rules` table, with the JSON converter's `schema` part (with_schema.jsonl) and
without it (without_schema.jsonl), one message a line (offset, key, value; a null value is the tombstone):
    0  r  rule 1 (a row there before the connector started: the snapshot)
    1  c  INSERT rule 7: COUNT_FLINK by payee and beneficiary >= 3 in 1 min, filter (jsonb) paymentType = CRD
    2  u  UPDATE its limit_amount to 5
    3  u  UPDATE disabled = true
    4  u  UPDATE window_minutes = 0 (not a valid rule)
    5  d  DELETE it
    6     its tombstone
    7  c  INSERT rule 8 \\ in one transaction
    8  u  UPDATE its limit /
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest

from fraudrules.cli import parser
from fraudrules.config import JobConfig, config_from
from fraudrules.event_schema import DEFAULT
from fraudrules.rules.cdc import ChangeError, ColumnMapping, Position, applied_positions, decode, to_rule
from fraudrules.rules.model import RuleError, parse_rule
from tools.support.rules_db import RULES_COLUMNS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "debezium"
MAPPING = ColumnMapping(RULES_COLUMNS)
TOPIC = "fraudrules.public.fraud_rules-0"


def _messages(name: str) -> list[tuple[str, str]]:
    """(value, source) of each captured message, the tombstone's value empty as the rules topic reads it."""
    lines = (FIXTURES / name).read_text().splitlines()
    return [(m["value"] or "", f"{TOPIC}:{m['offset']:020d}") for m in map(json.loads, lines)]


WITH_SCHEMA = _messages("with_schema.jsonl")
WITHOUT_SCHEMA = _messages("without_schema.jsonl")


def _change(i: int, messages: list[tuple[str, str]] = WITHOUT_SCHEMA):
    return decode(*messages[i], MAPPING)


@pytest.mark.parametrize("messages", [WITH_SCHEMA, WITHOUT_SCHEMA], ids=["with schema", "without schema"])
def test_every_op_decodes_with_and_without_the_schema_part(messages):
    changes = [decode(value, source, MAPPING) for value, source in messages]
    assert [(c.op, c.rule_id) if c else None for c in changes] == [
        ("r", 1),
        ("c", 7),
        ("u", 7),
        ("u", 7),
        ("u", 7),
        ("d", 7),
        None,  # the tombstone is skipped
        ("c", 8),
        ("u", 8),
    ]
    positions = [c.position for c in changes if c]
    assert all(p.kind == "lsn" for p in positions)  # from source.sequence
    # in log order, within a transaction too
    assert all(b.after(a) and not a.after(b) for a, b in itertools.pairwise(positions))
    assert positions[-1].major == positions[-2].major  # rule 8's insert and update: one transaction, one commit LSN


def test_rows_become_rules_through_the_column_mapping():
    snapshot = to_rule(_change(0), MAPPING, DEFAULT, None)
    assert snapshot == parse_rule(
        {
            "ruleId": 1,
            "ruleState": "ACTIVE",
            "groupingKeyNames": ["payeeId"],
            "aggregateFieldName": "paymentAmount",
            "aggregatorFunctionType": "SUM",
            "limitOperatorType": "GREATER",
            "limit": "20000",
            "windowMinutes": 2,
        }
    )
    inserted = to_rule(_change(1), MAPPING, DEFAULT, None)
    assert (inserted.grouping_key_names, inserted.operator, inserted.limit) == (
        ("payeeId", "beneficiaryId"),
        "GREATER_EQUAL",
        Decimal("3.00"),
    )
    assert [c.to_json() for c in inserted.filter] == [{"field": "paymentType", "op": "EQ", "value": "CRD"}]  # jsonb
    assert to_rule(_change(2), MAPPING, DEFAULT, inserted).limit == 5
    assert to_rule(_change(0, WITH_SCHEMA), MAPPING, DEFAULT, None) == snapshot


def test_disabled_pauses_and_delete_deletes_the_stored_rule():
    assert to_rule(_change(3), MAPPING, DEFAULT, None).state == "PAUSE"
    stored = to_rule(_change(2), MAPPING, DEFAULT, None).with_version(3)
    deleted = to_rule(_change(5), MAPPING, DEFAULT, stored)
    assert deleted == replace(stored, state="DELETE")  # the before image holds only the key: the stored definition
    with pytest.raises(RuleError, match="no such rule"):
        to_rule(_change(5), MAPPING, DEFAULT, None)


def test_an_invalid_row_names_its_columns():
    with pytest.raises(RuleError) as err:
        to_rule(_change(4), MAPPING, DEFAULT, None)
    assert err.value.rule_id == 7 and err.value.problems == ["column window_minutes: windowMinutes must be > 0"]
    row = {**_change(1).row, "grouping_keys": ["payee"], "limit_amount": "lots", "operator": "MORE"}
    with pytest.raises(RuleError) as err:
        to_rule(replace(_change(1), row=row), MAPPING, DEFAULT, None)
    problems = "; ".join(err.value.problems)
    assert "column grouping_keys: groupingKeyNames: 'payee' is not in the event schema" in problems
    assert "column operator: limitOperatorType 'MORE' is not one of" in problems
    assert "column limit_amount: limit 'lots' is not a number" in problems
    with pytest.raises(RuleError, match="column state: ruleState CONTROL"):
        to_rule(replace(_change(1), row={**row, "state": "CONTROL"}), MAPPING, DEFAULT, None)


def test_a_redelivered_or_older_event_is_not_after_the_applied_one():
    changes = [_change(i) for i in (1, 2, 3)]
    history = [{"ruleId": 7, "version": v, "changeId": c.change_id} for v, c in enumerate(changes[:2], start=1)] + [
        {"ruleId": 7, "version": 3, "changeId": "cli"},
        {"ruleId": 9, "version": 1, "changeId": None},
    ]
    applied = applied_positions(history)
    assert applied == {7: changes[1].position}
    assert changes[1].change_id == f"debezium:7:lsn:{changes[1].position.major}:{changes[1].position.minor}"
    assert not changes[1].position.after(applied[7])  # redelivered
    assert not changes[0].position.after(applied[7])  # older
    assert changes[2].position.after(applied[7]) and changes[2].position.after(applied.get(9))
    assert _change(2, WITH_SCHEMA).change_id == changes[1].change_id  # the same event with the schema part


def test_without_an_lsn_the_timestamp_and_the_offset_order():
    payload = json.loads(WITHOUT_SCHEMA[1][0])
    del payload["source"]
    early, late = (decode(json.dumps(payload), f"{TOPIC}:{o:020d}", MAPPING).position for o in (4, 5))
    assert early == Position("ts", payload["ts_ms"], 4) and late.after(early) and not early.after(late)
    assert Position("lsn", 1, 1).after(Position("ts", 5, 5))  # kinds do not compare: applied


def test_the_identity_mapping_reads_columns_named_as_the_fields():
    row = {
        "ruleId": 3,
        "groupingKeyNames": '["payeeId"]',
        "aggregateFieldName": "COUNT_FLINK",
        "aggregatorFunctionType": "SUM",
        "limitOperatorType": "GREATER",
        "limit": 10,
        "windowMinutes": 1,
        "disabled": False,
        "note": "ignored",
    }
    payload = {"op": "c", "after": row, "source": {"lsn": 42}, "ts_ms": 1}
    change = decode(json.dumps({"schema": {}, "payload": payload}), "folder/x.json", ColumnMapping())
    assert change.position == Position("lsn", 42, 42)
    rule = to_rule(change, ColumnMapping(), DEFAULT, None)
    assert (rule.rule_id, rule.state, rule.grouping_key_names, rule.limit) == (3, "ACTIVE", ("payeeId",), 10)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("{oops", "malformed JSON"),
        ('{"schema": {}, "payload": {"after": {}}}', "not a Debezium change event: no op"),
        ("[1, 2]", "not a Debezium change event: no op"),
        ('{"op": "t", "after": null}', "unknown op 't' (expected c, u, r or d)"),
        ('{"op": "d", "before": null}', "op d without the row's before image"),
        ('{"op": "c", "after": {"state": "ACTIVE"}}', "column id: None is not a rule id"),
    ],
)
def test_bad_messages_are_errors_with_their_reason(value, reason):
    with pytest.raises(ChangeError, match=re.escape(reason)):
        decode(value, f"{TOPIC}:{0:020d}", MAPPING)


def test_the_rules_format_and_column_mapping_in_the_config():
    argv = ["run", "--rules-format", "debezium", "--rules-column", "limit=limit_amount", "--rules-column", "ruleId=id"]
    cfg = config_from(vars(parser().parse_args(argv)))
    assert (cfg.rules_format, cfg.rules_columns) == ("debezium", {"limit": "limit_amount", "ruleId": "id"})
    assert config_from({}).rules_format == "fraudrules"
    with pytest.raises(ValueError, match="rules_columns: lmit not a rule field"):
        ColumnMapping({"lmit": "limit_amount"})
    with pytest.raises(ValueError, match="rules_format must be one of fraudrules, debezium"):
        JobConfig(rules_format="avro")
