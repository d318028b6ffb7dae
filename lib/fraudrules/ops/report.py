"""What a data-quality run found: one Outcome per expectation (or per input it could not find), and the report.

Built from Great Expectations' validation results (`outcomes`); the report's message names every failed
expectation and its table, which is what `fraudrules quality` prints and the DAG fails with.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


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
        if self.unexpected_count and self.element_count is None:
            text += f" - {self.unexpected_count} unexpected rows"
        elif self.unexpected_count:
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
    read: dict[str, str] = field(default_factory=dict)  # table -> what was read (table @ Delta version N, ...)
    notes: list[str] = field(default_factory=list)
    path: str | None = None  # where the whole report (to_json) was written

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

    def summary(self) -> dict:
        """The verdict, what was read and where the details are (what the DAG keeps as its task's result)."""
        return {
            "run_id": self.run_id,
            "success": self.success,
            "failed_tables": self.failed_tables,
            "failed": [o.label for o in self.failures],
            "message": self.message(),
            "rows": self.rows,
            "read": self.read,
            "docs_index": self.docs_index,
            "report": self.path,
        }

    def to_json(self) -> dict:
        return {
            **self.summary(),
            "notes": self.notes,
            "outcomes": [asdict(o) | {"label": o.label} for o in self.outcomes],
        }


def outcomes(table: str, validation) -> list[Outcome]:
    """The outcomes of one suite's validation result."""
    return [outcome(table, r) for r in validation.results]


def outcome(table: str, r) -> Outcome:
    exp = r.expectation_config
    res = r.result or {}
    error = (r.exception_info or {}).get("exception_message") if not r.success else None
    return Outcome(
        table=table,
        expectation=exp.type,
        columns=", ".join(_columns(exp.kwargs, exp.meta or {})),
        success=bool(r.success),
        element_count=res.get("element_count"),
        unexpected_count=res.get(
            "unexpected_count", res.get("observed_value") if "check" in (exp.meta or {}) else None
        ),
        unexpected_percent=res.get("unexpected_percent"),
        observed=_short(f"error: {error}" if error else res.get("observed_value")),
        sample=_short(res.get("partial_unexpected_list") or _rows(res)) if not r.success else None,
        invariant=(exp.meta or {}).get("invariant"),
    )


def _columns(kwargs: dict, meta: dict) -> list[str]:
    if "check" in meta:  # a query (UnexpectedRowsExpectation): the invariant it checks, by name
        return [meta["check"]]
    if "column" in kwargs:
        return [kwargs["column"]]
    if "column_A" in kwargs:
        return [kwargs["column_A"], kwargs["column_B"]]
    return list(kwargs.get("column_list") or [])


def _short(value, limit: int = 300) -> str | None:
    if value is None:
        return None
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _rows(res: dict) -> list | None:
    """The first unexpected rows of a query expectation (its `details.unexpected_rows`)."""
    found = (res.get("details") or {}).get("unexpected_rows")
    return found[:3] if found else None


def missing(table: str, reason: str) -> Outcome:
    """A suite whose input cannot be found fails with that reason: a run never passes on nothing."""
    invariant = "a suite that cannot find what it checks fails, it never passes on nothing"
    return Outcome(table, "input_found", "", False, observed=reason, invariant=invariant)
