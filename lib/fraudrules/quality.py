"""Data quality of the project's tables: Great Expectations 1.x suites (expectations/*.json) over them.

One suite per checked table. Invariants that GX's built-in expectations cannot state directly are
computed into columns first (`derive_*`), so the suite JSON stays declarative:

- alerts: `satisfies_rule` (aggregate <op> limit), `rule_version_exists` (ruleId, ruleVersion) is in
  rule_history, `matches_rule_version` (the alert's operator, limit, window, aggregator and field are those
  of that version; for login anomalies: failures >= minFailures), `expectedAlertId` (ruleId:transactionId,
  or ruleId:u<userId>:<eventTime> for login anomalies);
- window_state (the evaluate query's retained events, read from its checkpoint): `within_retention`
  (eventTime >= watermark - window of its rule - allowed lateness), `rule_active` (an ACTIVE rule with
  the same signature uses the entry's key);
- rules: `window_consistent`, `version_in_history`, `json_consistent`;
- transactions, quarantine, late_events: epoch-millisecond copies of their timestamps; late_events also
  `lateTransaction` (ruleId:transactionId, unique).

Local Delta tables are read from their transaction log and parquet files (no Spark job); the window state
needs Spark's state data source, and Unity Catalog tables are read with Spark.

A rule changed after the batch whose state is read (rule_history.updatedAt later than that batch) has its
cleanup pending: its state entries are exempt from `within_retention` and `rule_active` until the next batch.

Results go to Data Docs (HTML) and to a Delta table of one row per expectation (`dq_results`).
`python -m fraudrules.quality --data-dir D --docs-dir X` exits 1 naming every failed expectation and table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path

import pandas as pd

from fraudrules.config import JobConfig
from fraudrules.windowing import OPERATORS

SUITES = ("transactions", "quarantine", "rules", "alerts", "window_state", "late_events")


def _default_expectations() -> Path:
    """FRAUDRULES_EXPECTATIONS, else the repository's expectations/ (editable install), else suites shipped
    inside the package (fraudrules/expectations/, for a wheel)."""
    if os.environ.get("FRAUDRULES_EXPECTATIONS"):
        return Path(os.environ["FRAUDRULES_EXPECTATIONS"])
    repo = Path(__file__).resolve().parents[2] / "expectations"
    return repo if repo.is_dir() else Path(__file__).resolve().parent / "expectations"


DEFAULT_EXPECTATIONS = _default_expectations()
RESULTS_TABLE = "dq_results"
CLOCK_SKEW_MS = 5 * 60_000  # timestamps may be this far ahead of the checking machine's clock
RESULTS_SCHEMA = (
    "runId string, runAt timestamp, suite string, tableName string, expectation string, columns string, "
    "success boolean, elementCount long, unexpectedCount long, unexpectedPercent double, observed string, "
    "sample string, invariant string, dataDocs string"
)


# ------------------------------------------------------------------------------------------ results


@dataclass(frozen=True)
class Outcome:
    """One expectation's result on one table."""

    table: str
    expectation: str
    columns: str
    success: bool
    element_count: int | None = None
    unexpected_count: int | None = None
    unexpected_percent: float | None = None
    observed: str | None = None
    sample: str | None = None
    invariant: str | None = None

    @property
    def label(self) -> str:
        return f"{self.table}: {self.expectation}({self.columns})"

    def describe(self) -> str:
        text = self.label
        if self.unexpected_count:
            text += f" - {self.unexpected_count} of {self.element_count} rows unexpected"
        elif self.observed is not None:
            text += f" - observed {self.observed}"
        if self.sample:
            text += f", e.g. {self.sample}"
        if self.invariant:
            text += f" [{self.invariant}]"
        return text


@dataclass
class QualityReport:
    run_id: str
    success: bool
    outcomes: list[Outcome]
    rows: dict[str, int]
    docs_index: str | None = None
    results_table: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.success]

    @property
    def failed_tables(self) -> list[str]:
        return sorted({o.table for o in self.failures})

    def message(self) -> str:
        if self.success:
            return f"data quality passed: {len(self.outcomes)} expectations on {', '.join(sorted(self.rows))}"
        lines = [f"data quality FAILED on {', '.join(self.failed_tables)}: {len(self.failures)} expectation(s)"]
        lines += [f"  {o.describe()}" for o in self.failures]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "run_id": self.run_id,
            "success": self.success,
            "failed_tables": self.failed_tables,
            "failed": [o.label for o in self.failures],
            "message": self.message(),
            "rows": self.rows,
            "docs_index": self.docs_index,
            "results_table": self.results_table,
            "notes": self.notes,
            "outcomes": [asdict(o) | {"label": o.label} for o in self.outcomes],
        }


class QualityError(RuntimeError):
    def __init__(self, report: QualityReport):
        self.report = report
        super().__init__(report.message())


# -------------------------------------------------------------------------------- derived columns


def _ms(series: pd.Series) -> pd.Series:
    """Timestamps (naive UTC) as epoch milliseconds; NaT → -1 (out of every sane range)."""
    values = pd.to_datetime(series)
    out = (values - pd.Timestamp(0)) // pd.Timedelta(milliseconds=1)
    return out.fillna(-1).astype("int64")


def _dec(value) -> Decimal | None:
    if value is None or (isinstance(value, float) and value != value):
        return None
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return None


def _rule_json(text) -> dict:
    try:
        out = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


LOGIN_ANOMALY = "LOGIN_ANOMALY"  # fraudrules.rules.LOGIN_RULE: login-anomaly alerts (seed 000's detector)


def _int(value) -> int | None:
    try:
        return None if value is None or value != value else int(value)
    except (TypeError, ValueError):
        return None


def derive_alerts(alerts: pd.DataFrame, history: pd.DataFrame) -> pd.DataFrame:
    """Window-rule alerts (kind WINDOW) compare with their rule's operator, limit, aggregator, field and window;
    login-anomaly alerts (kind LOGIN_ANOMALY) count failures against the rule's minFailures (GREATER_EQUAL)."""
    df = alerts.copy()
    if "kind" not in df.columns:
        df["kind"] = "WINDOW"
    versions = {
        (int(r), int(v)): j for r, v, j in zip(history["ruleId"], history["version"], history["ruleJson"], strict=True)
    }

    def satisfies(row) -> bool:
        agg, lim, op = _dec(row.aggregate), _dec(row.limit), OPERATORS.get(row.limitOperatorType)
        return bool(agg is not None and lim is not None and op is not None and op(agg, lim))

    def matches(row) -> bool:
        rule = _rule_json(versions.get((_int(row.ruleId), _int(row.ruleVersion))))
        if not rule:
            return False
        if row.kind == LOGIN_ANOMALY:
            expected = ("GREATER_EQUAL", _dec(rule.get("minFailures")), "COUNT", "failedLogins")
        else:
            expected = (
                rule.get("limitOperatorType"),
                _dec(rule.get("limit")),
                rule.get("aggregatorFunctionType"),
                rule.get("aggregateFieldName"),
            )
        actual = (row.limitOperatorType, _dec(row.limit), row.aggregatorFunctionType, row.aggregateFieldName)
        return expected == actual and _int(rule.get("windowMinutes")) == _int(row.windowMinutes)

    def alert_id(row) -> str:
        if row.kind == LOGIN_ANOMALY:
            return f"{_int(row.ruleId)}:u{_int(row.userId)}:{_int(row.eventTimeMs)}"
        return f"{_int(row.ruleId)}:{_int(row.transactionId)}"

    rows = list(df.itertuples(index=False))
    df["satisfies_rule"] = pd.Series([satisfies(r) for r in rows], index=df.index, dtype=bool)
    df["rule_version_exists"] = pd.Series(
        [(_int(r.ruleId), _int(r.ruleVersion)) in versions for r in rows], index=df.index, dtype=bool
    )
    df["matches_rule_version"] = pd.Series([matches(r) for r in rows], index=df.index, dtype=bool)
    df["expectedAlertId"] = pd.Series([alert_id(r) for r in rows], index=df.index, dtype=object)
    for col in ("aggregate", "limit"):  # exact decimals as text: readable in Data Docs, nothing is lost
        df[col] = df[col].map(lambda v: None if v is None else format(Decimal(v).normalize(), "f"))
    return df.drop(columns=["groupingKeyNames"], errors="ignore")


def derive_window_state(
    entries: pd.DataFrame,
    meta: pd.DataFrame,
    rules: pd.DataFrame,
    history: pd.DataFrame,
    watermark_ms: int | None,
    batch_time_ms: int | None,
    lateness_ms: int,
) -> pd.DataFrame:
    """Per retained event: the window it is kept for, and whether it may still be kept.

    `entries`: shard, ruleId, sig, key, eventTime, seq, value; `meta`: shard, active (the ACTIVE rules as last
    seen by that shard, in evaluation.Meta's encoding); `rules`: the rules table; `history`: rule_history.
    """
    from fraudrules.evaluation import Meta

    df = entries.copy()
    active = rules[rules["ruleState"] == "ACTIVE"]
    current = {
        int(r): (int(s), int(w)) for r, s, w in zip(active["ruleId"], active["sig"], active["windowMs"], strict=True)
    }
    empty = Meta().active
    seen = {int(s): Meta(active=t or empty).active_rules() for s, t in zip(meta["shard"], meta["active"], strict=True)}
    changed = history.groupby("ruleId")["updatedAt"].max() if len(history) else pd.Series(dtype="datetime64[ns]")
    changed_ms = {int(r): int(v) for r, v in zip(changed.index, _ms(changed), strict=True)}
    pending = {r for r, t in changed_ms.items() if batch_time_ms is not None and t >= batch_time_ms}

    def window(shard: int, rule: int) -> int:
        if rule in current:
            return current[rule][1]
        return seen.get(shard, {}).get(rule, (0, 0))[1]

    rows = list(df.itertuples(index=False))
    df["watermarkMs"] = int(watermark_ms or 0)
    df["windowMs"] = pd.Series([window(int(r.shard), int(r.ruleId)) for r in rows], index=df.index, dtype="int64")
    df["pending_rule_change"] = df["ruleId"].astype("int64").isin(pending)
    oldest = df["watermarkMs"] - df["windowMs"] - int(lateness_ms)
    df["oldestAllowedMs"] = oldest
    kept_ok = (df["eventTime"] >= oldest) | (df["watermarkMs"] <= 0)
    df["within_retention"] = (kept_ok | df["pending_rule_change"]).astype(bool)
    in_use = pd.Series([current.get(int(r.ruleId), (None,))[0] == int(r.sig) for r in rows], index=df.index, dtype=bool)
    df["rule_active"] = (in_use | df["pending_rule_change"]).astype(bool)
    return df


def derive_rules(rules: pd.DataFrame, history: pd.DataFrame) -> pd.DataFrame:
    from fraudrules.rules import RuleError, parse_rule

    df = rules.copy()
    recorded = set(zip(history["ruleId"].astype(int), history["version"].astype(int), strict=True))

    def consistent(row) -> bool:
        try:
            rule = parse_rule(json.loads(row.ruleJson))
        except (RuleError, ValueError, TypeError):
            return False
        rule_type = getattr(rule, "rule_type", "WINDOW")
        same = (
            rule.rule_id == int(row.ruleId)
            and rule.state == row.ruleState
            and rule_type == getattr(row, "ruleType", "WINDOW")
            and rule.window_minutes == int(row.windowMinutes)
        )
        if rule_type == LOGIN_ANOMALY:
            return bool(
                same
                and rule.min_failures == _int(getattr(row, "minFailures", None))
                and rule.min_distinct_ips == _int(getattr(row, "minDistinctIps", None))
            )
        return bool(
            same
            and list(rule.grouping_key_names) == list(row.groupingKeyNames)
            and rule.field == row.aggregateFieldName
            and rule.aggregator == row.aggregatorFunctionType
            and rule.operator == row.limitOperatorType
            and rule.limit == _dec(row.limit)
        )

    rows = list(df.itertuples(index=False))
    df["window_consistent"] = (df["windowMs"] == df["windowMinutes"].astype("int64") * 60_000).astype(bool)
    df["version_in_history"] = pd.Series(
        [(int(r.ruleId), int(r.version)) in recorded for r in rows], index=df.index, dtype=bool
    )
    df["json_consistent"] = pd.Series([consistent(r) for r in rows], index=df.index, dtype=bool)
    df["updatedAtMs"] = _ms(df["updatedAt"])
    return df.drop(columns=["groupingKeyNames", "filter", "unique"], errors="ignore")


def derive_transactions(tx: pd.DataFrame) -> pd.DataFrame:
    df = tx.copy()
    df["ingestedAtMs"] = _ms(df["ingestedAt"])
    return df


def derive_quarantine(q: pd.DataFrame) -> pd.DataFrame:
    df = q.copy()
    df["quarantinedAtMs"] = _ms(df["quarantinedAt"])
    return df


def derive_late_events(late: pd.DataFrame) -> pd.DataFrame:
    df = late.copy()
    df["detectedAtMs"] = _ms(df["detectedAt"])
    # One late row per (rule, transaction); late logins carry no transaction and may repeat.
    tx = df["transactionId"].map(_int)
    df["lateTransaction"] = [None if t is None else f"{_int(r)}:{t}" for r, t in zip(df["ruleId"], tx, strict=True)]
    return df


# ------------------------------------------------------------------------------------------ reading


def _checkpoint_batch(cfg: JobConfig) -> tuple[int | None, int | None, int | None]:
    """(batch id, watermark ms, batch timestamp ms) of the evaluate query's newest committed batch."""
    from fraudrules.monitor import EVALUATE_QUERY

    root = Path(cfg.checkpoint(EVALUATE_QUERY))
    commits = [int(p.name) for p in (root / "commits").glob("*") if p.name.isdigit()]
    if not commits:
        return None, None, None
    batch = max(commits)
    meta = json.loads((root / "offsets" / str(batch)).read_text().splitlines()[1])
    return batch, int(meta.get("batchWatermarkMs", 0)), int(meta.get("batchTimestampMs", 0))


def read_state(spark, cfg: JobConfig) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Retained events (with their rule signature) and per-shard meta of the newest committed batch."""
    from fraudrules import state
    from fraudrules.processor import decode

    batch, watermark, batch_time = _checkpoint_batch(cfg)
    info = {"batchId": batch, "watermarkMs": watermark, "batchTimestampMs": batch_time}
    cols = ["shard", "ruleId", "sig", "key", "eventTime", "seq", "value"]
    if batch is None:
        return pd.DataFrame(columns=cols), pd.DataFrame(columns=["shard", "active"]), info
    frames = []
    for row in state.raw(spark, cfg, "events", batch).collect():
        events = decode(bytes(row.value.blob)).to_frame()
        events.insert(0, "shard", int(row.key.shard))
        frames.append(events)
    entries = (
        pd.concat(frames, ignore_index=True).rename(columns={"rule": "ruleId", "t": "eventTime", "val": "value"})[cols]
        if frames
        else pd.DataFrame(columns=cols)
    )
    entries = entries.astype({c: "int64" for c in cols if c != "key"})
    meta = pd.DataFrame(
        [(int(r.key.shard), r.value.active) for r in state.raw(spark, cfg, "meta", batch).collect()],
        columns=["shard", "active"],
    )
    return entries, meta, info


def read_table(spark, cfg: JobConfig, name: str, columns: list[str] | None = None) -> pd.DataFrame:
    """A project table as pandas: local Delta tables straight from their log and parquet files (no Spark
    job), falling back to Spark for what that reader refuses (deletion vectors, V2 checkpoints) and for
    Unity Catalog tables."""
    if not cfg.uses_catalog:
        from fraudrules.monitor import read_delta

        try:
            return read_delta(cfg.table(name), columns)
        except NotImplementedError:
            pass
    from fraudrules import tables

    spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
    df = tables.read(spark, cfg, name)
    return (df.select(*columns) if columns else df).toPandas()


def read_frames(
    spark, cfg: JobConfig, lateness_ms: int, suites: tuple[str, ...] = SUITES
) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The checked tables as pandas frames with their derived columns."""
    started = time.time()
    notes: list[str] = []
    need = set(suites)
    history = read_table(spark, cfg, "rule_history") if need & {"rules", "alerts", "window_state"} else None
    rules = read_table(spark, cfg, "rules") if need & {"rules", "window_state"} else None
    frames: dict[str, pd.DataFrame] = {}
    if "transactions" in need:
        cols = "transactionId eventTime payeeId beneficiaryId paymentAmount paymentType ingestionTimestamp srcName"
        tx = read_table(spark, cfg, "transactions", [*cols.split(), "ingestedAt"])
        tx["paymentAmount"] = tx["paymentAmount"].astype("float64")  # range checks only; exact text not needed
        frames["transactions"] = derive_transactions(tx)
    if "quarantine" in need:
        frames["quarantine"] = derive_quarantine(read_table(spark, cfg, "quarantine"))
    if "rules" in need:
        frames["rules"] = derive_rules(rules, history)
    if "alerts" in need:
        frames["alerts"] = derive_alerts(read_table(spark, cfg, "alerts"), history)
    if "window_state" in need:
        entries, meta, info = read_state(spark, cfg)
        if info["batchId"] is None:
            notes.append("window_state: the evaluate query has no committed batch yet")
        else:
            notes.append(
                f"window_state: state of evaluate batch {info['batchId']} (watermark {info['watermarkMs']} ms), "
                f"{len(entries)} retained events"
            )
        frames["window_state"] = derive_window_state(
            entries, meta, rules, history, info["watermarkMs"], info["batchTimestampMs"], lateness_ms
        )
    if "late_events" in need:
        frames["late_events"] = derive_late_events(read_table(spark, cfg, "late_events"))
    notes.append(f"read and derived {len(frames)} tables in {time.time() - started:.1f} s")
    return {t: frames[t] for t in suites}, notes


# ------------------------------------------------------------------------------------------ validating


def load_suite_json(path: str | Path) -> dict:
    data = json.loads(Path(path).read_text())
    if not isinstance(data.get("expectations"), list):
        raise ValueError(f"{path}: not a GX suite (no 'expectations' list)")
    return data


def _suite(data: dict, path: Path):
    from great_expectations.core.expectation_suite import ExpectationSuite

    suite = ExpectationSuite(**{k: v for k, v in data.items() if k in ("name", "expectations", "meta", "notes")})
    if len(suite.expectations) != len(data["expectations"]):  # GX logs an invalid expectation and drops it
        loaded = {e.expectation_type for e in suite.expectations}
        bad = [e.get("type") for e in data["expectations"] if e.get("type") not in loaded]
        raise ValueError(f"{path}: invalid expectation(s) {bad}")
    return suite


def _context(docs_dir: str | None):
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    if docs_dir:
        context.add_data_docs_site(
            site_name="fraudrules",
            site_config={
                "class_name": "SiteBuilder",
                "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            },
        )
    return context


def _short(value, limit: int = 300) -> str | None:
    if value is None:
        return None
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def validate(
    frames: dict[str, pd.DataFrame],
    expectations_dir: str | Path = DEFAULT_EXPECTATIONS,
    docs_dir: str | None = None,
    parameters: dict | None = None,
    run_id: str | None = None,
) -> QualityReport:
    """Run the suite `<expectations_dir>/<table>.json` over each frame; Data Docs into `docs_dir` if given."""
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier

    run_id = run_id or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    now_ms = int(time.time() * 1000)
    params = {"now_ms": now_ms + CLOCK_SKEW_MS, **(parameters or {})}
    context = _context(docs_dir)
    source = context.data_sources.add_pandas("fraudrules")
    outcomes: list[Outcome] = []
    for table, frame in frames.items():
        path = Path(expectations_dir) / f"{table}.json"
        data = load_suite_json(path)
        suite = context.suites.add(_suite(data, path))
        batch = source.add_dataframe_asset(table).add_batch_definition_whole_dataframe(table)
        definition = context.validation_definitions.add(gx.ValidationDefinition(name=table, data=batch, suite=suite))
        checkpoint = context.checkpoints.add(
            gx.Checkpoint(
                name=table,
                validation_definitions=[definition],
                result_format={"result_format": "SUMMARY", "partial_unexpected_count": 5},
            )
        )
        result = checkpoint.run(
            batch_parameters={"dataframe": frame},
            expectation_parameters=params,
            run_id=RunIdentifier(run_name=run_id),
        )
        for validation in result.run_results.values():
            for r in validation.results:
                outcomes.append(_outcome(table, r))
    docs_index = None
    if docs_dir:  # once for all suites: every run's results are in the context's (in-memory) results store
        context.build_data_docs(site_names=["fraudrules"])
        index = Path(docs_dir) / "index.html"
        docs_index = str(index) if index.exists() else None
    return QualityReport(
        run_id=run_id,
        success=all(o.success for o in outcomes),
        outcomes=outcomes,
        rows={t: len(f) for t, f in frames.items()},
        docs_index=docs_index,
    )


def _outcome(table: str, r) -> Outcome:
    exp = r.expectation_config
    res = r.result or {}
    error = (r.exception_info or {}).get("exception_message") if not r.success else None
    return Outcome(
        table=table,
        expectation=exp.type,
        columns=", ".join(_columns(exp.kwargs)),
        success=bool(r.success),
        element_count=res.get("element_count"),
        unexpected_count=res.get("unexpected_count"),
        unexpected_percent=res.get("unexpected_percent"),
        observed=_short(f"error: {error}" if error else res.get("observed_value")),
        sample=_short(res.get("partial_unexpected_list")) if not r.success else None,
        invariant=(exp.meta or {}).get("invariant"),
    )


def _columns(kwargs: dict) -> list[str]:
    if "column" in kwargs:
        return [kwargs["column"]]
    if "column_A" in kwargs:
        return [kwargs["column_A"], kwargs["column_B"]]
    return list(kwargs.get("column_list") or [])


# ------------------------------------------------------------------------------------------ results table


def results_location(cfg: JobConfig) -> str:
    """Where the results table lives: beside the project's tables (not in config.TABLES yet)."""
    if cfg.uses_catalog:
        return f"{cfg.catalog}.{cfg.schema}.{RESULTS_TABLE}"
    return os.path.abspath(os.path.join(cfg.data_dir, "tables", RESULTS_TABLE))


def write_results(spark, cfg: JobConfig, report: QualityReport) -> str:
    """Append one row per expectation outcome to the Delta results table; returns its location."""
    from datetime import datetime, timezone

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
    where = results_location(cfg)
    writer = spark.createDataFrame(rows, RESULTS_SCHEMA).write.format("delta").mode("append")
    if cfg.uses_catalog:
        writer.saveAsTable(where)
    else:
        writer.save(where)
    return where


# ------------------------------------------------------------------------------------------ entry points


def run(
    spark,
    cfg: JobConfig,
    docs_dir: str | None,
    expectations_dir: str | Path = DEFAULT_EXPECTATIONS,
    suites: tuple[str, ...] = SUITES,
    results: bool = True,
) -> QualityReport:
    """Read, derive, validate, publish. Returns the report (check `.success`); see `check` for raising."""
    frames, notes = read_frames(spark, cfg, cfg.lateness_ms, suites)
    params = {"max_shard": cfg.shards - 1}
    report = validate(frames, expectations_dir, docs_dir, params)
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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fraudrules quality", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default="data", help="root of the local Delta tables and checkpoints")
    p.add_argument("--catalog", help="Unity Catalog (with --schema) instead of local tables")
    p.add_argument("--schema")
    p.add_argument("--checkpoint-root", help="the job's checkpoints (default <data-dir>/checkpoints)")
    p.add_argument("--shards", type=int, default=16, help="state groups of the stateful stage (as the job)")
    p.add_argument("--lateness-ms", type=int, default=60_000, help="allowed lateness (as the job)")
    p.add_argument("--docs-dir", help="Data Docs folder (default <data-dir>/dq/docs)")
    p.add_argument("--expectations", default=str(DEFAULT_EXPECTATIONS), help="folder of <table>.json suites")
    p.add_argument("--suites", default=",".join(SUITES), help="comma-separated tables to check")
    p.add_argument("--report", help="write the report as JSON here")
    p.add_argument("--no-results-table", action="store_true", help="do not append to the dq_results table")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    suites = tuple(s.strip() for s in args.suites.split(",") if s.strip())
    unknown = sorted(set(suites) - set(SUITES))
    if unknown:
        print(f"unknown suite(s): {', '.join(unknown)}; known: {', '.join(SUITES)}", file=sys.stderr)
        return 2
    cfg = JobConfig(
        data_dir=args.data_dir,
        catalog=args.catalog,
        schema=args.schema,
        checkpoint_root=args.checkpoint_root,
        shards=args.shards,
        lateness_ms=args.lateness_ms,
    )
    docs_dir = os.path.abspath(args.docs_dir or os.path.join(args.data_dir, "dq", "docs"))
    from fraudrules.session import get_spark

    spark = get_spark("fraudrules-quality")
    try:
        report = run(spark, cfg, docs_dir, args.expectations, suites, results=not args.no_results_table)
    finally:
        spark.stop()
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps(report.to_json(), indent=2, default=str))
    for note in report.notes:
        print(note)
    print(report.message())
    print(f"Data Docs: {report.docs_index}")
    if report.results_table:
        print(f"results appended to {report.results_table}")
    return 0 if report.success else 1


if __name__ == "__main__":
    sys.exit(main())
