"""The command line as users run it: backtest on fixtures against the reference, rule validation errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from fraudrules.rules.model import load_rules_file
from tests.support import reference

FIXTURES = Path(__file__).parents[1] / "fixtures"
CLI = [sys.executable, "-m", "fraudrules.cli"]


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=600,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )


@pytest.mark.e2e
def test_backtest_cli_matches_the_reference(tmp_path):
    out = tmp_path / "alerts.jsonl"
    res = run(
        "backtest",
        "--transactions",
        str(FIXTURES / "transactions.jsonl"),
        "--rules",
        str(FIXTURES / "rules.json"),
        "--out",
        str(out),
        "--data-dir",
        str(tmp_path / "work"),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "transactions: 2000 valid, logins: 0 valid, 0 quarantined, 0 late" in res.stdout
    lines = out.read_text().splitlines()
    alerts = {(a["ruleId"], a["transactionId"]): a for a in (json.loads(x, parse_float=Decimal) for x in lines)}
    txs = [json.loads(line) for line in (FIXTURES / "transactions.jsonl").read_text().splitlines()]
    expected, _ = reference.run([txs], [load_rules_file(str(FIXTURES / "rules.json"))], 60_000)
    assert set(alerts) == set(expected) and len(expected) > 50
    for k, agg in expected.items():
        assert abs(Fraction(str(alerts[k]["aggregate"])) - agg) <= Fraction(1, 10**18)
    assert {a["ruleId"] for a in alerts.values()} >= {1, 2, 3, 4, 6, 7}
    assert all(isinstance(a["key"], dict) for a in alerts.values())


@pytest.mark.e2e
def test_rules_put_rejects_invalid_rules_naming_rule_and_problem(tmp_path):
    bad = [
        {
            "ruleId": 9,
            "ruleState": "ACTIVE",
            "groupingKeyNames": ["payeeId"],
            "aggregateFieldName": "colour",
            "aggregatorFunctionType": "SUM",
            "limitOperatorType": "GREATER",
            "limit": 1,
            "windowMinutes": 0,
        }
    ]
    res = run("rules", "put", "-", "--data-dir", str(tmp_path), stdin=json.dumps(bad))
    assert res.returncode == 2
    assert "invalid rule 9" in res.stderr and "windowMinutes must be > 0" in res.stderr
    assert "aggregateFieldName 'colour' is unknown" in res.stderr
    res = run("rules", "put", "-", "--data-dir", str(tmp_path), stdin="{oops")
    assert res.returncode == 2 and "malformed JSON" in res.stderr


@pytest.mark.e2e
def test_rules_cli_lifecycle(tmp_path):
    rule = json.loads((FIXTURES / "rules.json").read_text())[0]
    d = str(tmp_path)
    assert run("rules", "put", "-", "--data-dir", d, stdin=json.dumps(rule)).stdout.strip() == "rule 1 v1 ACTIVE"
    assert run("rules", "pause", "1", "--data-dir", d).stdout.strip() == "rule 1 v2 PAUSE"
    assert run("rules", "activate", "1", "--data-dir", d).stdout.strip() == "rule 1 v3 ACTIVE"
    missing = run("rules", "delete", "42", "--data-dir", d)
    assert missing.returncode == 2 and "rule 42: no such rule" in missing.stderr
    history = run("rules", "history", "1", "--data-dir", d).stdout.splitlines()
    assert [line.split()[0] for line in history] == ["v1", "v2", "v3"]
