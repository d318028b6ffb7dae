"""What a data-quality run found: one Outcome per expectation (or per input it could not find), and the report.

Built from Great Expectations' validation results (`outcomes`); the report's message names every failed
expectation and its table, which is what the DAG fails with. `summary_lines` is what `fraudrules quality` and
`make dq` print: per table what was read and its checks passed and failed. `summary_page` is the same for the
newest runs, as one HTML page without scripts or styles from the internet (GX's own Data Docs index loads its
table from CDNs and shows nothing offline).
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields


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
    version: dict[str, str] = field(default_factory=dict)  # table -> its pin: "Delta version N" or "batch N"
    summary_page: str | None = None  # the newest runs, readable offline (`summary_page`)

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.success]

    @property
    def failed_tables(self) -> list[str]:
        return sorted({o.table for o in self.failures})

    def message(self) -> str:
        if self.success:
            return f"data quality passed: {len(self.outcomes)} expectations on {len(self.rows)} tables and states"
        lines = [f"data quality FAILED on {', '.join(self.failed_tables)}: {len(self.failures)} expectation(s)"]
        lines += [f"  {o.describe()}" for o in self.failures]
        return "\n".join(lines)

    def per_table(self) -> dict[str, tuple[int, int]]:
        """Checks passed and failed per table (or state), in the order they were checked."""
        out: dict[str, tuple[int, int]] = {}
        for o in self.outcomes:
            passed, failed = out.get(o.table, (0, 0))
            out[o.table] = (passed + o.success, failed + (not o.success))
        return out

    def summary_lines(self) -> list[str]:
        """The verdict, one line per table (what was read, checks passed and failed), every failed check, and
        where the details are."""
        verdict, *failed = self.message().splitlines()
        counts = self.per_table()
        name_width = max(map(len, counts), default=0)
        read_width = max((len(self.version.get(t, "not found")) for t in counts), default=0)
        lines = [f"{verdict} (run {self.run_id})"]
        for table, (passed, failures) in counts.items():
            where = self.version.get(table, "not found")
            lines.append(
                f"  {table:<{name_width}}  {where:<{read_width}}  {passed:>3} passed"
                + (f", {failures} FAILED" if failures else "")
            )
        if failed:
            lines += ["failed checks:", *failed]
        if self.docs_index:
            lines.append(f"Data Docs: {self.docs_index} (GX's pages; the index loads its table from the internet)")
        if self.summary_page:
            lines.append(f"recent runs, readable offline: {self.summary_page}")
        if self.path:
            lines.append(f"report: {self.path}")
        return lines

    @classmethod
    def from_json(cls, data: Mapping) -> QualityReport:
        """A report as `to_json` wrote it."""
        names = {f.name for f in fields(Outcome)}
        found = [Outcome(**{k: v for k, v in o.items() if k in names}) for o in data.get("outcomes", [])]
        return cls(
            run_id=data["run_id"],
            success=bool(data["success"]),
            outcomes=found,
            rows=dict(data.get("rows") or {}),
            docs_index=data.get("docs_index"),
            read=dict(data.get("read") or {}),
            notes=list(data.get("notes") or []),
            path=data.get("report"),
            version=dict(data.get("version") or {}),
            summary_page=data.get("summary_page"),
        )

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
            "version": self.version,
            "summary_page": self.summary_page,
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


# ------------------------------------------------------------------------------------------ the offline page

PAGE_STYLE = (
    "body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}"
    "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}td.n{text-align:right}"
    ".FAILED{color:#b00020;font-weight:bold}.passed{color:#186a3b}li{margin:.2em 0}"
)


def summary_page(reports: Sequence[QualityReport], pages: Mapping[tuple[str, str], str]) -> str:
    """Runs (newest first) as one self-contained HTML page: verdict, per table what was read, checks passed and
    failed with a link to its GX validation page (`pages`: (run, table) -> relative link), failed checks."""
    e = html.escape
    body = [f"<h1>Data quality: {len(reports)} run(s), newest first</h1>"]
    for r in reports:
        verdict = "passed" if r.success else "FAILED"
        body.append(f'<h2>run {e(r.run_id)}: <span class="{verdict}">{verdict}</span></h2>')
        body.append(
            "<table><tr><th>table or state</th><th>read</th><th>passed</th><th>failed</th><th>details</th></tr>"
        )
        for table, (passed, failed) in r.per_table().items():
            link = pages.get((r.run_id, table))
            details = f'<a href="{e(link)}">validation page</a>' if link else ""
            status = ' class="FAILED"' if failed else ""
            body.append(
                f"<tr><td>{e(table)}</td><td>{e(r.read.get(table) or 'not found')}</td><td class=n>{passed}</td>"
                f"<td class=n{status}>{failed}</td><td>{details}</td></tr>"
            )
        body.append("</table>")
        if r.failures:
            body.append("<ul>" + "".join(f"<li>{e(o.describe())}</li>" for o in r.failures) + "</ul>")
    head = f'<meta charset="utf-8"><title>fraudrules data quality</title><style>{PAGE_STYLE}</style>'
    return f"<!DOCTYPE html><html><head>{head}</head><body>{''.join(body)}</body></html>\n"
