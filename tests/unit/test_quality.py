"""Data quality without Spark: the derived invariant columns, the real suites over small frames, and a run
that cannot find what it checks."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("great_expectations")

from fraudrules.ops import invariants, quality, suites

NOW = datetime.now(timezone.utc).replace(tzinfo=None)
RULE = {
    "ruleId": 1,
    "ruleState": "ACTIVE",
    "groupingKeyNames": ["payeeId"],
    "aggregateFieldName": "paymentAmount",
    "aggregatorFunctionType": "SUM",
    "limitOperatorType": "GREATER",
    "limit": "100",
    "windowMinutes": 10,
}


def _history(**changes) -> pd.DataFrame:
    rule = RULE | changes
    return pd.DataFrame(
        [{"ruleId": 1, "version": 1, "ruleState": rule["ruleState"], "ruleJson": json.dumps(rule), "updatedAt": NOW}]
    )


def _rules(**changes) -> pd.DataFrame:
    rule = RULE | changes
    return pd.DataFrame(
        [
            {
                "ruleId": 1,
                "version": 1,
                "ruleState": rule["ruleState"],
                "groupingKeyNames": rule["groupingKeyNames"],
                "aggregateFieldName": rule["aggregateFieldName"],
                "aggregatorFunctionType": rule["aggregatorFunctionType"],
                "limitOperatorType": rule["limitOperatorType"],
                "limit": rule["limit"],
                "windowMinutes": rule["windowMinutes"],
                "windowMs": rule["windowMinutes"] * 60_000,
                "ruleType": "WINDOW",
                "minFailures": 3,
                "minDistinctIps": 2,
                "sig": 42,
                "activeSince": 1,
                "ruleJson": json.dumps(rule),
                "updatedAt": NOW,
            }
        ]
    )


def _alerts(aggregates: list[str], **overrides) -> pd.DataFrame:
    rows = []
    for i, agg in enumerate(aggregates):
        row = {
            "alertId": f"1:{i}",
            "ruleId": 1,
            "ruleVersion": 1,
            "transactionId": i,
            "aggregate": Decimal(agg),
            "aggregateFieldName": "paymentAmount",
            "aggregatorFunctionType": "SUM",
            "limitOperatorType": "GREATER",
            "limit": Decimal("100"),
            "windowMinutes": 10,
            "eventTimeMs": 1_700_000_000_000 + i,
            "ingestionTimestamp": -1,
            "producedAtMs": int(NOW.timestamp() * 1000) - 1000,
            "watermarkMs": 1_699_999_000_000,
        }
        rows.append(row | overrides)
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("op", "agg", "ok"),
    [
        ("GREATER", "100.01", True),
        ("GREATER", "100", False),
        ("GREATER_EQUAL", "100", True),
        ("LESS", "99.999999999999999999", True),
        ("LESS_EQUAL", "100.000000000000000001", False),
        ("EQUAL", "100.0", True),
        ("NOT_EQUAL", "100", False),
    ],
)
def test_satisfies_rule_is_exact(op, agg, ok):
    df = invariants.derive_alerts(_alerts([agg], limitOperatorType=op), _history(limitOperatorType=op))
    assert bool(df["satisfies_rule"].iloc[0]) is ok
    assert df["rule_version_exists"].iloc[0] and df["matches_rule_version"].iloc[0]


def test_alert_of_an_unknown_version_or_other_parameters():
    df = invariants.derive_alerts(_alerts(["200", "300"]), _history(limit="150"))
    assert not df["matches_rule_version"].any()
    df = invariants.derive_alerts(_alerts(["200"], ruleVersion=2), _history())
    assert not df["rule_version_exists"].iloc[0] and not df["matches_rule_version"].iloc[0]


def _state(times: list[int], rule_id: int = 1, sig: int = 42) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "shard": [0] * len(times),
            "ruleId": [rule_id] * len(times),
            "sig": [sig] * len(times),
            "key": ['{"payeeId":"1"}'] * len(times),
            "eventTime": times,
            "seq": list(range(len(times))),
            "value": [1] * len(times),
        }
    )


def test_window_state_retention_and_active_rules():
    wm, window, lateness = 10_000_000, 600_000, 60_000
    meta: dict = {0: {}}
    batch_time = int(NOW.timestamp() * 1000) + 60_000  # the rule changed before this batch
    oldest_ok = wm - window - lateness
    df = invariants.derive_window_state(
        _state([oldest_ok, oldest_ok - 1, wm]), meta, _rules(), _history(), wm, batch_time, lateness
    )
    assert df["within_retention"].tolist() == [True, False, True]
    assert df["rule_active"].all()
    other_sig = invariants.derive_window_state(
        _state([wm], sig=7), meta, _rules(), _history(), wm, batch_time, lateness
    )
    assert not other_sig["rule_active"].iloc[0]
    paused = invariants.derive_window_state(
        _state([wm]), meta, _rules(ruleState="PAUSE"), _history(), wm, batch_time, lateness
    )
    assert not paused["rule_active"].iloc[0]
    # A change recorded after the state's batch: cleanup is pending until the next batch.
    pending = invariants.derive_window_state(
        _state([0]), meta, _rules(ruleState="PAUSE"), _history(), wm, batch_time - 120_000, lateness
    )
    assert pending["rule_active"].iloc[0] and pending["within_retention"].iloc[0]


def test_rules_consistency():
    good = invariants.derive_rules(_rules(), _history())
    assert good[["window_consistent", "version_in_history", "json_consistent"]].all().all()
    bad = _rules()
    bad.loc[0, "windowMs"] = 1
    bad.loc[0, "version"] = 3
    bad.loc[0, "limit"] = "101"
    df = invariants.derive_rules(bad, _history())
    assert not df["window_consistent"].iloc[0]
    assert not df["version_in_history"].iloc[0]
    assert not df["json_consistent"].iloc[0]


def test_every_suite_is_valid_gx_json():
    for table in quality.SUITES:
        path = suites.shipped_suites() / f"{table}.json"
        data = suites.load_suite_json(path)
        suite = suites._suite(data, Path(path))
        assert len(suite.expectations) == len(data["expectations"]) > 0
        assert all((e.get("meta") or {}).get("invariant") for e in data["expectations"]), table


def test_validate_names_each_failed_expectation(tmp_path):
    history = _history()
    alerts = invariants.derive_alerts(_alerts(["150", "90", "150"]), history)
    alerts.loc[2, "alertId"] = "1:0"  # duplicate id
    frames = {"alerts": alerts, "rules": invariants.derive_rules(_rules(), history)}
    report = suites.validate(frames, docs_dir=str(tmp_path / "docs"))
    assert not report.success
    assert report.failed_tables == ["alerts"]
    assert {o.label for o in report.failures} == {
        "alerts: expect_column_values_to_be_in_set(satisfies_rule)",
        "alerts: expect_column_values_to_be_unique(alertId)",
        "alerts: expect_column_pair_values_to_be_equal(alertId, expectedAlertId)",
    }
    message = report.message()
    assert message.startswith("data quality FAILED on alerts: 3 expectation(s)")
    assert "1 of 3 rows unexpected" in message and "aggregate satisfies its rule" in message
    assert Path(report.docs_index).is_file()
    err = quality.QualityError(report)
    assert "satisfies_rule" in str(err)
    ok = suites.validate({"alerts": invariants.derive_alerts(_alerts(["150"]), history)})
    assert ok.success and ok.failures == [] and ok.docs_index is None


def test_a_run_that_cannot_find_what_it_checks_fails_naming_it(tmp_path):
    """No tables and no checkpoint under the data dir: every suite asked for fails with its reason."""
    from fraudrules.config import JobConfig

    cfg = JobConfig(data_dir=str(tmp_path), checkpoint_root=str(tmp_path / "nowhere"))
    report = quality.run(None, cfg, docs_dir=None, suites=("window_state", "alerts"), results=False)
    assert not report.success and report.failed_tables == ["alerts", "window_state"]
    observed = {o.table: o.observed for o in report.failures}
    assert observed["window_state"] == f"the evaluate query has no committed batch under {tmp_path}/nowhere/evaluate"
    assert observed["alerts"] == f"no table alerts at {tmp_path}/tables/alerts"
    assert "window_state: input_found()" in report.message() and report.rows == {}
