"""Data quality of the project's tables and streaming state: the committed Great Expectations project, run.

The project is the repository's top-level `expectations/` (shipped in the wheel as `fraudrules.expectations`):
data sources and assets (`gx_sources`: the job's Delta tables and state, read with Spark), suites, validation
definitions and the one checkpoint `fraudrules`, whose action builds Data Docs. A run opens it with two config
variables - the job to read (`fraudrules_job`) and the folder where GX's validation-results store and Data Docs
keep every run (`fraudrules_dq_dir`) - pins what it reads (each table's Delta version, each state's committed
batch), and runs the checkpoint.

A run that cannot find what it is asked to check (a table, a query's state) fails with that reason before
validating anything: it never passes on nothing. `fraudrules quality` exits 1 naming every failed expectation.
Every run's report is kept in `<dq_dir>/reports`; `<dq_dir>/docs/summary.html` shows the newest ones offline.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path

from fraudrules.config import JobConfig
from fraudrules.ops.report import QualityReport, missing, outcomes, summary_page

CHECKPOINT = "fraudrules"
SITE = "fraudrules"
SUMMARY_PAGE = "summary.html"  # beside GX's index.html in <dq_dir>/docs
SUMMARY_RUNS = 200  # the newest runs on it: an hourly check keeps thousands of reports a year
CLOCK_SKEW_MS = 5 * 60_000  # timestamps may be this far ahead of the checking machine's clock
JOB_FIELDS = (
    "data_dir",
    "catalog",
    "schema",
    "checkpoint_root",
    "shards",
    "shuffle_partitions",
    "lateness_ms",
    "event_schema",
)


class QualityError(RuntimeError):
    def __init__(self, report: QualityReport):
        self.report = report
        super().__init__(report.message())


def project_dir() -> Path:
    """The GX project shipped with the package (the repository's expectations/)."""
    return Path(str(resources.files("fraudrules.expectations")))


def context(cfg: JobConfig, dq_dir: str):
    """The committed GX project, reading `cfg`'s tables and state, keeping results and Data Docs in `dq_dir`."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx

    import fraudrules.ops.gx_sources  # noqa: F401 - registers the project's data source types with GX

    job = {f: getattr(cfg, f) for f in JOB_FIELDS}
    job["data_dir"] = os.path.abspath(cfg.data_dir)
    env = {"fraudrules_job": json.dumps(job), "fraudrules_dq_dir": os.path.abspath(dq_dir)}
    return gx.get_context(mode="file", context_root_dir=str(project_dir()), runtime_environment=env)


def checkpoint(ctx):
    return ctx.checkpoints.get(CHECKPOINT)


def missing_inputs(cp) -> dict[str, str]:
    """Per suite of the checkpoint, why its asset cannot be read (nothing for those that can)."""
    out = {}
    for vd in cp.validation_definitions:
        reason = vd.data.data_asset.missing()
        if reason:
            out[vd.suite.name] = reason
    return out


def parameters(cfg: JobConfig, max_age_minutes: float, now_ms: int | None = None) -> dict:
    """The expectation parameters of a run: now (with clock skew), the freshness bound (epoch ms and timestamp),
    the shard range."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    since_ms = now_ms - int(max_age_minutes * 60_000)
    return {
        "now_ms": now_ms + CLOCK_SKEW_MS,
        "fresh_since_ms": since_ms,
        # timestamps (naive UTC, as Spark returns them here): GX parses this to the observed value's type
        "fresh_since": datetime.fromtimestamp(since_ms / 1000, timezone.utc).replace(tzinfo=None).isoformat(),
        "max_shard": cfg.shards - 1,
    }


def run(
    spark, cfg: JobConfig, dq_dir: str, max_age_minutes: float = 60.0, run_name: str | None = None
) -> QualityReport:
    """Pin, validate, publish. Returns the report (check `.success`); see `check` for raising."""
    from great_expectations.core.run_identifier import RunIdentifier

    from fraudrules.ops import gx_sources

    started = time.time()
    ctx = context(cfg, dq_dir)
    cp = checkpoint(ctx)
    run_name = run_name or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    absent = missing_inputs(cp)
    if absent:
        return _saved(QualityReport(run_name, False, [missing(t, r) for t, r in absent.items()], {}), dq_dir)
    snapshot = gx_sources.pin(spark, cfg)
    result = cp.run(
        batch_parameters={gx_sources.SNAPSHOT: snapshot},
        expectation_parameters=parameters(cfg, max_age_minutes),
        run_id=RunIdentifier(run_name=run_name),
    )
    report = QualityReport(run_name, bool(result.success), [], {})
    for validation in result.run_results.values():
        table = validation.suite_name
        report.outcomes += outcomes(table, validation)
        spec = validation.meta.get("batch_spec") or {}
        report.read[table] = gx_sources.describe(spec)
        report.version[table] = gx_sources.pinned(spec)
        report.rows[table] = _rows(validation)
    index = Path(dq_dir) / "docs" / "index.html"
    report.docs_index = str(index) if index.exists() else None
    report.notes += [f"{t}: {what}" for t, what in report.read.items()]
    report.notes.append(
        f"validated {len(report.read)} suites in {time.time() - started:.1f} s (checkpoint {CHECKPOINT})"
    )
    return _saved(report, dq_dir)


def _saved(report: QualityReport, dq_dir: str) -> QualityReport:
    """The report, also written whole as <dq_dir>/reports/<run>.json, and the offline page of every run."""
    path = Path(dq_dir) / "reports" / f"{report.run_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    report.path = str(path)
    report.summary_page = str(Path(dq_dir) / "docs" / SUMMARY_PAGE)
    path.write_text(json.dumps(report.to_json(), indent=2, default=str))
    publish_summary(dq_dir)
    return report


def publish_summary(dq_dir: str) -> Path:
    """`<dq_dir>/docs/summary.html`: the newest `SUMMARY_RUNS` reports, newest first, linked to their GX
    validation pages."""
    docs = Path(dq_dir) / "docs"
    found = sorted((Path(dq_dir) / "reports").glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    saved = found[:SUMMARY_RUNS]
    reports = [QualityReport.from_json(json.loads(p.read_text())) for p in saved]
    pages = {
        (r.run_id, table): str(page.relative_to(docs))
        for r in reports
        for table in r.per_table()
        for page in sorted((docs / "validations" / table / r.run_id).glob("*/*.html"))[:1]
    }
    docs.mkdir(parents=True, exist_ok=True)
    out = docs / SUMMARY_PAGE
    out.write_text(summary_page(reports, pages), encoding="utf-8")
    return out


def _rows(validation) -> int:
    """Rows the suite saw: its row count, else the most any of its column expectations counted."""
    for r in validation.results:
        if r.expectation_config.type == "expect_table_row_count_to_be_between":
            return int(r.result["observed_value"])
    return max((int(r.result.get("element_count") or 0) for r in validation.results), default=0)


def check(spark, cfg: JobConfig, dq_dir: str, **kwargs) -> QualityReport:
    """`run`, raising QualityError (its message names every failed expectation and table) on failure."""
    report = run(spark, cfg, dq_dir, **kwargs)
    if not report.success:
        raise QualityError(report)
    return report
