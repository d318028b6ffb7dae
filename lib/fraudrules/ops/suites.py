"""Great Expectations 1.x over pandas frames: the suites (one per checked table), validation, Data Docs.

The suites are the repository's top-level `expectations/*.json`, shipped in the wheel as the package
`fraudrules.expectations`, so an installed package finds them without the repository.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import pandas as pd

CLOCK_SKEW_MS = 5 * 60_000  # timestamps may be this far ahead of the checking machine's clock


def shipped_suites() -> Path:
    """The folder of the suites shipped with the package."""
    return Path(str(resources.files("fraudrules.expectations")))


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
    expectations_dir: str | Path | None = None,
    docs_dir: str | None = None,
    parameters: dict | None = None,
    run_id: str | None = None,
) -> QualityReport:
    """Run the suite `<expectations_dir>/<table>.json` (default: the suites shipped in the package) over each
    frame; Data Docs into `docs_dir` if given."""
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier

    run_id = run_id or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    now_ms = int(time.time() * 1000)
    params = {"now_ms": now_ms + CLOCK_SKEW_MS, **(parameters or {})}
    context = _context(docs_dir)
    source = context.data_sources.add_pandas("fraudrules")
    outcomes: list[Outcome] = []
    for table, frame in frames.items():
        path = Path(expectations_dir or shipped_suites()) / f"{table}.json"
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
