"""Rules change at runtime through the rules change stream; the running job applies them at the next batch."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import pytest

from fraudrules.rules import store
from tests.support.streams import FileStream

pytestmark = pytest.mark.spark


def count_rule(rid=1, limit=2, state="ACTIVE", **kw):
    return {
        "ruleId": rid,
        "ruleState": state,
        "groupingKeyNames": ["payeeId"],
        "aggregateFieldName": "COUNT_FLINK",
        "aggregatorFunctionType": "SUM",
        "limitOperatorType": "GREATER_EQUAL",
        "limit": limit,
        "windowMinutes": 60,
        **kw,
    }


def txn(i, payee=1, ptype="CSH"):
    return {
        "transactionId": i,
        "eventTime": 1_000 * i,
        "payeeId": payee,
        "beneficiaryId": 1,
        "paymentAmount": "5.00",
        "paymentType": ptype,
    }


def alerted(stream):
    return {(r.ruleId, r.transactionId, r.ruleVersion) for r in stream.alert_rows()}


def test_add_pause_activate_change_delete_mid_stream(spark, tmp_path):
    stream = FileStream(spark, str(tmp_path), []).start()
    try:
        stream.feed([txn(1)])  # no rule yet: nothing keyed
        stream.change_rules([count_rule()])  # v1
        stream.feed([txn(2)])  # window holds only what was keyed for the rule: {2}
        stream.feed([txn(3)])  # {2, 3} -> alert under v1
        stream.change_rules(count_rule(state="PAUSE"))  # v2
        stream.feed([txn(4)])  # paused: not keyed
        stream.change_rules(count_rule())  # v3: a new ACTIVE incarnation starts with empty windows
        stream.feed([txn(5)])
        stream.feed([txn(6)])  # {5, 6} -> alert under v3
        stream.change_rules(count_rule(limit=3))  # v4: same windows, new limit
        stream.feed([txn(7)])  # {5, 6, 7} -> alert under v4
        stream.change_rules(count_rule(limit=3, state="DELETE"))  # v5
        stream.feed([txn(8)])
        applied = {(r.ruleId, r.version) for r in stream.table("rule_applied").collect()}
    finally:
        stream.stop()
    assert alerted(stream) == {(1, 3, 1), (1, 6, 3), (1, 7, 4)}
    assert [h["change"] for h in store.history(spark, stream.cfg, 1)] == ["create", "state", "state", "update", "state"]
    assert {(1, 1), (1, 3), (1, 4)} <= applied
    delays = [r.delayMs for r in stream.table("rule_applied").collect()]
    assert all(d is not None and d >= 0 for d in delays)


def test_rules_survive_restart_and_control_commands_work_on_a_running_job(spark, tmp_path):
    stream = FileStream(spark, str(tmp_path), []).start()
    stream.change_rules([count_rule(1), count_rule(2, groupingKeyNames=["beneficiaryId"])])
    stream.feed([txn(1)])
    stream.stop()
    again = FileStream(spark, str(tmp_path), []).start()  # same tables and checkpoints
    again.files, again.changes = stream.files, stream.changes
    try:
        again.feed([txn(2)])  # rules and windows survived: both rules alert
        again.change_rules({"ruleId": 0, "ruleState": "CONTROL", "controlType": "CLEAR_STATE_ALL"})
        again.feed([txn(3)])  # windows emptied: count 1
        again.feed([txn(4)])  # count 2 again
        again.change_rules({"ruleId": 0, "ruleState": "CONTROL", "controlType": "EXPORT_RULES_CURRENT"})
        again.change_rules({"ruleId": 0, "ruleState": "CONTROL", "controlType": "DELETE_RULES_ALL"})
        again.feed([txn(5)])
        states = {rid: row["ruleState"] for rid, row in store.current(spark, again.cfg).items()}
        exported = again.table("rules_export").collect()
    finally:
        again.stop()
    assert {(r, t) for r, t, _v in alerted(again)} == {(1, 2), (2, 2), (1, 4), (2, 4)}
    assert states == {1: "DELETE", 2: "DELETE"}
    assert sorted(r.ruleId for r in exported) == [1, 2]
    files = glob.glob(os.path.join(again.cfg.data_dir, "exports", "rules-*.json"))
    assert [r["ruleId"] for r in json.loads(Path(files[0]).read_text())] == [1, 2]


def test_invalid_rules_in_the_stream_go_to_rule_errors_and_valid_ones_apply(spark, tmp_path):
    stream = FileStream(spark, str(tmp_path), []).start()
    try:
        stream.change_rules(
            [
                count_rule(1),
                count_rule(2, windowMinutes=0),
                count_rule(3, aggregateFieldName="paymentType"),
                count_rule(4, filter=[{"field": "colour", "op": "EQ", "value": "red"}]),
                count_rule(5, groupingKeyNames=["shoeSize"]),
                count_rule(6, aggregatorFunctionType="MEDIAN"),
                {k: v for k, v in count_rule(7).items() if k != "limit"},
            ]
        )
        stream.change_rules("{this is not json")
        stream.feed([txn(1), txn(2)])
        errors = {r.ruleId: r.reason for r in stream.table("rule_errors").collect()}
    finally:
        stream.stop()
    assert set(store.current(spark, stream.cfg)) == {1}
    assert "windowMinutes must be > 0" in errors["2"]
    assert "non-numeric" in errors["3"]
    assert "filter: 'colour' is not in the event schema" in errors["4"]
    assert "groupingKeyNames: 'shoeSize' is not in the event schema" in errors["5"]
    assert "MEDIAN" in errors["6"]
    assert "missing limit" in errors["7"]
    assert "malformed JSON" in errors[None]
    assert {(r, t) for r, t, _v in alerted(stream)} == {(1, 2)}


def test_filters_and_distinct_counts_in_the_stream(spark, tmp_path):
    distinct = count_rule(
        1, limit=3, unique=["beneficiaryId"], filter=[{"field": "paymentType", "op": "EQ", "value": "CSH"}]
    )
    stream = FileStream(spark, str(tmp_path), []).start()
    try:
        stream.change_rules([distinct])
        rows = [txn(1), txn(2), txn(3), txn(4, ptype="CRD"), txn(5), txn(6)]
        for row, ben in zip(rows, [1, 2, 2, 9, 3, 1], strict=True):
            row["beneficiaryId"] = ben
        stream.feed(rows)
    finally:
        stream.stop()
    assert {(t, float(a)) for (_r, t), a in stream.alerts().items()} == {(5, 3.0), (6, 3.0)}
