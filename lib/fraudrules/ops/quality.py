"""Data quality of the project's tables: read them, derive the invariants, validate the suites, publish.

One suite per checked table (`SUITES`); the derived columns are `invariants.py`, the Great Expectations
side `suites.py`. Local Delta tables are read from their transaction log and parquet files (no Spark job);
the window state needs Spark's state data source, and Unity Catalog tables are read with Spark.

A suite whose table, or whose state (the evaluate query's checkpoint), cannot be found fails with that
reason: a run never passes on nothing. Results go to Data Docs (HTML) and to the `dq_results` Delta table
(one row per expectation); `fraudrules quality` exits 1 naming every failed expectation and table.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from fraudrules import tables
from fraudrules.config import EVALUATE_QUERY, RESULTS_TABLE, JobConfig
from fraudrules.ops import invariants, state_reader
from fraudrules.ops.delta_log import read_delta
from fraudrules.ops.suites import Outcome, QualityReport, validate

SUITES = ("transactions", "quarantine", "rules", "alerts", "window_state", "late_events")
MISSING_INVARIANT = "a suite that cannot find what it checks fails, it never passes on nothing"


class QualityError(RuntimeError):
    def __init__(self, report: QualityReport):
        self.report = report
        super().__init__(report.message())


class MissingInput(LookupError):
    """A table, or the state, that a suite was asked to check does not exist."""


# ------------------------------------------------------------------------------------------ reading


def read_table(spark, cfg: JobConfig, name: str, columns: list[str] | None = None) -> pd.DataFrame:
    """A project table as pandas: local Delta tables straight from their log and parquet files (no Spark
    job), falling back to Spark for what that reader refuses (deletion vectors, V2 checkpoints) and for
    Unity Catalog tables. Raises MissingInput when the table does not exist."""
    if not cfg.uses_catalog:
        try:
            return read_delta(cfg.table(name), columns)
        except FileNotFoundError:
            raise MissingInput(f"no table {name} at {cfg.table(name)}") from None
        except NotImplementedError:
            pass
    elif not tables.exists(spark, cfg, name):
        raise MissingInput(f"no table {cfg.table(name)}")
    spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
    df = tables.read(spark, cfg, name)
    return (df.select(*columns) if columns else df).toPandas()


def read_state(spark, cfg: JobConfig) -> tuple[pd.DataFrame, dict, state_reader.CommittedBatch]:
    """Retained events the engine can still use (with their rule signature) and the engine's ACTIVE rules per
    shard, as of the newest committed evaluate batch; raises MissingInput when there is none."""
    batch = state_reader.last_committed(cfg, EVALUATE_QUERY)
    if batch is None:
        raise MissingInput(f"the {EVALUATE_QUERY} query has no committed batch under {cfg.checkpoint(EVALUATE_QUERY)}")
    entries = state_reader.entries(spark, cfg, batch.batch_id)
    return entries, state_reader.engine_rules(spark, cfg, batch.batch_id), batch


def read_frames(
    spark, cfg: JobConfig, suites: tuple[str, ...] = SUITES
) -> tuple[dict[str, pd.DataFrame], dict[str, str], list[str]]:
    """The checked tables as pandas frames with their derived columns; the suites whose input is missing, with
    the reason; notes on what was read."""
    started = time.time()
    notes: list[str] = []
    cache: dict[str, pd.DataFrame] = {}

    def table(name: str) -> pd.DataFrame:
        if name not in cache:
            cache[name] = read_table(spark, cfg, name)
        return cache[name]

    def window_state() -> pd.DataFrame:
        entries, meta, batch = read_state(spark, cfg)
        notes.append(
            f"window_state: state of {EVALUATE_QUERY} batch {batch.batch_id} (watermark {batch.watermark_ms} ms), "
            f"{len(entries)} retained events"
        )
        rules, history = table("rules"), table("rule_history")
        return invariants.derive_window_state(
            entries, meta, rules, history, batch.watermark_ms, batch.timestamp_ms, cfg.lateness_ms
        )

    readers: dict[str, Callable[[], pd.DataFrame]] = {
        "transactions": lambda: invariants.derive_transactions(_transactions(spark, cfg)),
        "quarantine": lambda: invariants.derive_quarantine(table("quarantine")),
        "rules": lambda: invariants.derive_rules(table("rules"), table("rule_history")),
        "alerts": lambda: invariants.derive_alerts(table("alerts"), table("rule_history")),
        "window_state": window_state,
        "late_events": lambda: invariants.derive_late_events(table("late_events")),
    }
    frames: dict[str, pd.DataFrame] = {}
    missing: dict[str, str] = {}
    for suite in suites:
        try:
            frames[suite] = readers[suite]()
        except MissingInput as err:
            missing[suite] = str(err)
    notes.append(f"read and derived {len(frames)} tables in {time.time() - started:.1f} s")
    return frames, missing, notes


def _transactions(spark, cfg: JobConfig) -> pd.DataFrame:
    cols = "transactionId eventTime payeeId beneficiaryId paymentAmount paymentType ingestionTimestamp srcName"
    tx = read_table(spark, cfg, "transactions", [*cols.split(), "ingestedAt"])
    tx["paymentAmount"] = tx["paymentAmount"].astype("float64")  # range checks only; exact text not needed
    return tx


def missing_outcome(suite: str, reason: str) -> Outcome:
    return Outcome(suite, "input_found", "", False, observed=reason, invariant=MISSING_INVARIANT)


# ------------------------------------------------------------------------------------------ results table


def write_results(spark, cfg: JobConfig, report: QualityReport) -> str:
    """Append one row per expectation outcome to the `dq_results` Delta table; returns its location."""
    now = datetime.now(timezone.utc)
    rows = [
        (
            report.run_id,
            now,
            o.table,
            o.table,
            o.expectation,
            o.columns,
            o.success,
            o.element_count,
            o.unexpected_count,
            None if o.unexpected_percent is None else float(o.unexpected_percent),
            o.observed,
            o.sample,
            o.invariant,
            report.docs_index,
        )
        for o in report.outcomes
    ]
    tables.ensure(spark, cfg, RESULTS_TABLE)
    tables.append(spark.createDataFrame(rows, tables.SCHEMAS[RESULTS_TABLE]), cfg, RESULTS_TABLE)
    return cfg.table(RESULTS_TABLE)


# ------------------------------------------------------------------------------------------ entry points


def run(
    spark,
    cfg: JobConfig,
    docs_dir: str | None,
    expectations_dir: str | Path | None = None,
    suites: tuple[str, ...] = SUITES,
    results: bool = True,
) -> QualityReport:
    """Read, derive, validate, publish. Returns the report (check `.success`); see `check` for raising."""
    frames, missing, notes = read_frames(spark, cfg, suites)
    report = validate(frames, expectations_dir, docs_dir, {"max_shard": cfg.shards - 1})
    report.outcomes += [missing_outcome(suite, reason) for suite, reason in missing.items()]
    report.success = report.success and not missing
    report.notes += notes
    if results:
        report.results_table = write_results(spark, cfg, report)
    return report


def check(spark, cfg: JobConfig, docs_dir: str | None, **kwargs) -> QualityReport:
    """`run`, raising QualityError (its message names every failed expectation and table) on failure."""
    report = run(spark, cfg, docs_dir, **kwargs)
    if not report.success:
        raise QualityError(report)
    return report
