"""The data-quality DAG fraud_data_quality (target local) on the tables and state of a real backtest: run as `make dq`
runs it (tools/dq_local.py: `airflow dags test`, then the run's short summary) it passes; run with `dag.test()` on a
copy corrupted one way per suite it fails naming each broken expectation (and the failure notifier records it); Data
Docs keep both runs, each validation page naming its table and Delta version, and the offline page lists them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fraudrules.compat.delta_log import read_newest
from fraudrules.engine import ingest
from tests.support.airflow_support import JOB_PYTHON, REPO, alerts, dag_test, last_json, needs_airflow
from tools.support.real_tables import job_env

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.spark,
    needs_airflow,
    pytest.mark.skipif(shutil.which("java") is None, reason="needs a JVM"),
]
CONF = {"target": "local", "max_age_minutes": 24 * 60}  # the backtest ran in this session: fresh
SUITES = {
    "transactions",
    "logins",
    "quarantine",
    "rules",
    "alerts",
    "shadow_alerts",
    "late_events",
    "window_state",
    "login_state",
}


def test_quarantine_suite_knows_every_reason(backtest_data):
    """The reasons the quarantine suite accepts (`ingest.reasons`, for the default schema) are exactly what
    ingest.parse() produces: the backtest hit every one."""
    quarantine = read_newest(backtest_data / "tables" / "quarantine", ["kind", "reason"], max_files=1000)
    assert set(quarantine["kind"]) == {"transaction"}
    assert set(quarantine["reason"]) == set(ingest.reasons())


def _page_text(path: Path) -> str:
    html = re.sub(r"<(script|style).*?</\1>", " ", path.read_text(), flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_quality_dag_passes_then_fails_naming_each_broken_expectation_and_data_docs_keep_every_run(
    backtest_data, tmp_path
):
    """Two runs: as `make dq` runs it (`airflow dags test`, then the summary) on the backtest's tables, which pass;
    then `dag.test()` on a copy corrupted one way per suite, which holds the first run's Data Docs and fails."""
    passed = subprocess.run(
        [str(JOB_PYTHON), "-m", "tools.dq_local", "--data-dir", str(backtest_data), "--conf", json.dumps(CONF)],
        cwd=str(REPO),
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert passed.returncode == 0, passed.stdout[-3000:] + passed.stderr[-3000:]
    lines = passed.stdout.splitlines()
    assert re.fullmatch(r"data quality passed: \d+ expectations on 9 tables and states \(run \w+\)", lines[1]), lines
    read = {line.split()[0]: line.split(maxsplit=1)[1] for line in lines[2:11]}
    assert set(read) == SUITES and re.match(r"Delta version \d+ +\d+ passed$", read["alerts"]), read
    assert re.match(r"batch \d+ +\d+ passed$", read["window_state"]), read
    docs = backtest_data / "dq" / "docs"
    assert f"recent runs, readable offline: {docs / 'summary.html'}" in lines and len(lines) == 14, lines
    assert passed.stderr == "" and "Traceback" not in passed.stdout and "\x1b[" not in passed.stdout
    result = json.loads(Path(lines[-1].removeprefix("report: ")).read_text())  # what the verdict task returned
    assert set(result["rows"]) == SUITES
    assert (
        result["rows"]["alerts"] > 0
        and result["rows"]["shadow_alerts"] > 0
        and result["rows"]["window_state"] > 0
        and result["rows"]["logins"] == 603
    )
    assert result["rows"]["quarantine"] == 19
    tables = backtest_data / "tables"
    assert re.fullmatch(rf"{tables}/alerts @ Delta version \d+", result["read"]["alerts"])
    assert re.fullmatch(
        rf"{backtest_data}/checkpoints/evaluate @ batch \d+ \(watermark \d+ ms\)", result["read"]["login_state"]
    )
    assert result["docs_index"] == str(docs / "index.html")
    log = Path(re.search(r"\(log: (.+)\)$", lines[0]).group(1)).read_text()  # Airflow's own output of the run
    assert re.search(r"^ +window_state +batch \d+ +\d+ passed$", log, re.M)  # the job environment's summary
    assert "Traceback" not in log and "pendulum" not in log

    corrupted = tmp_path / "corrupted"
    done = last_json(
        [str(JOB_PYTHON), "-m", "tests.support.dq_corrupt", str(backtest_data), str(corrupted)],
        cwd=str(REPO),
        env=job_env(),
    )
    shutil.copytree(backtest_data / "dq", corrupted / "dq")  # the first run's results and Data Docs
    before = len(alerts())
    out, log = dag_test("fraud_data_quality", {**CONF, "data_dir": str(corrupted)})
    assert out["state"] == "failed"
    assert out["tasks"] == {  # failed, not up_for_retry; the local target's route
        "route": "success",
        "locate": "success",
        "validate": "success",
        "verdict": "failed",
        "run_on_databricks": "skipped",
    }
    expected = {  # every suite, each for the invariant its corruption breaks (tests/support/dq_corrupt.py)
        "transactions: expect_column_values_to_be_unique(transactionId)",
        "logins: expect_compound_columns_to_be_unique(srcName, srcPos)",
        "logins: expect_compound_columns_to_be_unique(userId, eventType, ipAddress, eventTimestamp)",
        "logins: expect_column_values_to_match_regex(ipAddress)",
        "transactions: unexpected_rows_expectation(declared_schema)",
        "quarantine: unexpected_rows_expectation(known_reason)",
        "rules: unexpected_rows_expectation(newest_version)",
        "alerts: unexpected_rows_expectation(satisfies_rule)",
        "shadow_alerts: unexpected_rows_expectation(satisfies_rule)",
        "late_events: expect_column_pair_values_a_to_be_greater_than_b(watermarkMs, eventTimeMs)",
        "window_state: unexpected_rows_expectation(within_retention)",
        "window_state: unexpected_rows_expectation(keyed)",
        "window_state: unexpected_rows_expectation(rule_active)",
        "login_state: unexpected_rows_expectation(rule_active)",
    }
    report = json.loads(Path(out["xcom"]["validate.return_value"]["report"]).read_text())
    assert set(report["failed"]) == expected
    assert set(report["failed_tables"]) == SUITES
    for label in expected:  # the task's failure names each one
        assert label in log, f"{label} not in the DAG's output"
    failures = {o["label"]: o for o in report["outcomes"] if not o["success"]}
    assert failures["alerts: unexpected_rows_expectation(satisfies_rule)"]["unexpected_count"] == 1
    assert failures["transactions: expect_column_values_to_be_unique(transactionId)"]["unexpected_count"] == 2
    assert failures["login_state: unexpected_rows_expectation(rule_active)"]["unexpected_count"] > 0
    # the old event bronze lost fails; those of the seconds bronze's ingest is behind (a clean stop) do not
    assert done["notYetInBronze"] > 0
    assert failures["window_state: unexpected_rows_expectation(keyed)"]["unexpected_count"] == done["unkeyedEntries"]
    recorded = alerts()[before:]
    assert [(a["dag_id"], a["task_id"]) for a in recorded] == [("fraud_data_quality", "verdict")]
    assert "data quality FAILED" in recorded[0]["error"]

    docs = corrupted / "dq" / "docs"  # every run kept: the passed one and the failed one
    offline = (docs / "summary.html").read_text()
    assert "<script" not in offline and "http" not in offline and offline.count("<h2>run ") == 2
    links = re.findall(r'href="([^"]+)"', offline)
    assert len(links) == 2 * len(SUITES) and all((docs / link).is_file() for link in links)
    for suite in SUITES:  # one validation page per run, named by what it read
        pages = sorted((docs / "validations" / suite).glob("*/*/*.html"))
        assert len(pages) == 2, (suite, pages)
    pages = {page: _page_text(page) for page in (docs / "validations" / "alerts").glob("*/*/*.html")}
    for folder in (backtest_data, corrupted):  # each run's page names the table it read and its Delta version
        ((page, text),) = [(page, text) for page, text in pages.items() if f"{folder}/tables/alerts" in text]
        version = re.search(r"delta_version_(\d+)\.html$", page.name).group(1)
        assert "Data asset: alerts" in text and f"delta_version {version}" in text, text[:500]
    assert len(list((corrupted / "dq" / "validations" / "alerts").rglob("*.json"))) == 2  # GX's results store
