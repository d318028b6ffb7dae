"""Data quality without Spark: the committed GX project (what it holds, that opening it writes nothing into it),
the run's parameters, the report, and a run that cannot find what it checks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("great_expectations")

from fraudrules.config import JobConfig
from fraudrules.ops import quality
from fraudrules.ops.report import Outcome, QualityReport, summary_page

SUITES = {
    "transactions": "transactions",
    "logins": "logins",
    "quarantine": "quarantine",
    "rules": "rules",
    "alerts": "alerts",
    "shadow_alerts": "shadow_alerts",
    "late_events": "late_events",
    "window_state": "window",
    "login_state": "login",
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The committed project, opened as a run opens it; the files of the project before and after."""
    root = quality.project_dir()
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    data = tmp_path_factory.mktemp("data")
    ctx = quality.context(JobConfig(data_dir=str(data)), str(data / "dq"))
    cp = quality.checkpoint(ctx)
    after = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    return cp, before, after


def test_the_project_is_the_repositorys_expectations_folder():
    assert quality.project_dir().resolve() == (Path(__file__).parents[2] / "expectations").resolve()


def test_one_checkpoint_validates_every_suite_on_an_asset_named_after_what_it_reads(project):
    cp, _, _ = project
    assert cp.name == "fraudrules"
    found = {}
    for vd in cp.validation_definitions:
        asset = vd.data.data_asset
        found[vd.suite.name] = getattr(asset, "table", None) or asset.detector
        assert asset.name == vd.suite.name == vd.name
    assert found == SUITES
    assert [type(a).__name__ for a in cp.actions] == ["UpdateDataDocsAction"]


def test_every_expectation_states_its_invariant_and_cross_table_checks_are_queries(project):
    cp, _, _ = project
    queries = []
    for vd in cp.validation_definitions:
        for exp in vd.suite.expectations:
            assert (exp.meta or {}).get("invariant"), f"{vd.suite.name}: {exp.expectation_type} says nothing"
            words = f"{exp.description or ''} {exp.meta['invariant']}"
            tag = re.search(r"<[A-Za-z/!?]", words)  # what an HTML parser takes for a tag (`a < b` is text)
            assert tag is None, f"{vd.suite.name}: Data Docs renders {words!r} with an HTML tag"
            if exp.expectation_type == "unexpected_rows_expectation":
                queries.append((vd.suite.name, exp.meta["check"], exp.unexpected_rows_query))
        kinds = {e.expectation_type for e in vd.suite.expectations}
        if vd.suite.name not in ("quarantine", "late_events", "login_state", "shadow_alerts"):  # empty: healthy
            assert "expect_table_row_count_to_be_between" in kinds, f"{vd.suite.name} passes on zero rows"
    checks = {(suite, check) for suite, check, _ in queries}
    assert {
        ("alerts", "satisfies_rule"),
        ("alerts", "matches_rule_version"),
        ("alerts", "transaction_in_bronze"),
        ("alerts", "not_shadow"),
        ("shadow_alerts", "rule_was_shadow"),
        ("shadow_alerts", "shadow_of_matches"),
        ("shadow_alerts", "satisfies_rule"),
        ("rules", "newest_version"),
        ("window_state", "rule_active"),
        ("window_state", "keyed"),
        ("login_state", "within_window"),
        ("login_state", "started_by_failure"),
    } <= checks
    assert all("{batch}" in query for _, _, query in queries)
    # no boolean column derived beforehand is what a suite checks any more
    for vd in cp.validation_definitions:
        for exp in vd.suite.expectations:
            assert getattr(exp, "value_set", None) != [True], f"{vd.suite.name}: {exp}"


def test_opening_the_project_writes_nothing_into_it(project):
    _, before, after = project
    assert after == before


def test_freshness_and_clock_parameters():
    now_ms = 1_800_000_000_000
    params = quality.parameters(JobConfig(shards=4), max_age_minutes=30, now_ms=now_ms)
    assert params["fresh_since_ms"] == now_ms - 30 * 60_000
    assert params["fresh_since"] == "2027-01-15T07:30:00"  # the same bound as a (naive UTC) timestamp
    assert params["now_ms"] == now_ms + quality.CLOCK_SKEW_MS and params["max_shard"] == 3


def test_the_report_names_each_failure_and_its_query_rows():
    failed = Outcome(
        "alerts",
        "unexpected_rows_expectation",
        "satisfies_rule",
        False,
        unexpected_count=2,
        sample='[{"alertId": "1:5"}]',
        invariant="aggregate <op> limit",
    )
    counted = Outcome("transactions", "expect_column_values_to_be_unique", "transactionId", False, 3001, 2)
    report = QualityReport("r1", False, [failed, counted, Outcome("rules", "x", "", True)], {"alerts": 9})
    assert report.failed_tables == ["alerts", "transactions"]
    message = report.message()
    assert message.splitlines()[0] == "data quality FAILED on alerts, transactions: 2 expectation(s)"
    assert "alerts: unexpected_rows_expectation(satisfies_rule) - 2 unexpected rows" in message
    assert "transactions: expect_column_values_to_be_unique(transactionId) - 2 of 3001 rows unexpected" in message
    assert json.loads(json.dumps(report.to_json()))["failed"] == [failed.label, counted.label]


def test_a_run_that_cannot_find_what_it_checks_fails_naming_it(tmp_path):
    """No tables and no checkpoint under the data dir: every suite fails with its reason, nothing is validated."""
    cfg = JobConfig(data_dir=str(tmp_path), checkpoint_root=str(tmp_path / "nowhere"))
    report = quality.run(None, cfg, str(tmp_path / "dq"))
    assert not report.success and report.failed_tables == sorted(SUITES)
    observed = {o.table: o.observed for o in report.failures}
    assert observed["window_state"] == f"the evaluate query has no committed batch under {tmp_path}/nowhere/evaluate"
    assert observed["login_state"] == observed["window_state"]
    assert observed["alerts"] == f"no table alerts at {tmp_path}/tables/alerts"
    assert "window_state: input_found()" in report.message() and report.rows == {}
    assert json.loads(Path(report.path).read_text())["failed_tables"] == sorted(SUITES)


def test_the_summary_says_per_table_what_was_read_and_its_checks_and_reads_back_from_its_json():
    outcomes = [
        Outcome("transactions", "expect_column_values_to_be_unique", "transactionId", False, 3001, 2),
        Outcome("transactions", "expect_table_row_count_to_be_between", "", True),
        Outcome("window_state", "unexpected_rows_expectation", "keyed", True),
    ]
    report = QualityReport("r2", False, outcomes, {"transactions": 3001, "window_state": 40})
    report.version = {"transactions": "Delta version 12", "window_state": "batch 7"}
    report.read = {"transactions": "/d/tables/transactions @ Delta version 12"}
    report.summary_page, report.path = "/d/dq/docs/summary.html", "/d/dq/reports/r2.json"
    assert report.summary_lines() == [
        "data quality FAILED on transactions: 1 expectation(s) (run r2)",
        "  transactions  Delta version 12    1 passed, 1 FAILED",
        "  window_state  batch 7             1 passed",
        "failed checks:",
        "  transactions: expect_column_values_to_be_unique(transactionId) - 2 of 3001 rows unexpected",
        "recent runs, readable offline: /d/dq/docs/summary.html",
        "report: /d/dq/reports/r2.json",
    ]
    again = QualityReport.from_json(json.loads(json.dumps(report.to_json(), default=str)))
    assert again.summary_lines() == report.summary_lines() and again.outcomes == report.outcomes


def test_the_offline_page_holds_every_run_and_nothing_from_the_internet():
    passed = QualityReport("r1", True, [Outcome("rules", "x", "", True)], {"rules": 3}, read={"rules": "rules @ 1"})
    failed = QualityReport("r2", False, [Outcome("rules", "x", "<y>", False, observed="bad & worse")], {})
    page = summary_page([failed, passed], {("r1", "rules"): "validations/rules/r1/t/p.html"})
    assert page.index("run r2") < page.index("run r1") and page.count("<h2>") == 2
    assert '<a href="validations/rules/r1/t/p.html">validation page</a>' in page
    assert "rules: x(&lt;y&gt;) - observed bad &amp; worse" in page  # escaped
    assert "<script" not in page and "http" not in page
