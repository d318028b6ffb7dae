"""Backtest: the continuous job's own queries, run to completion over files with an available-now trigger."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from fraudrules import event_schema, tables
from fraudrules.config import EVALUATE_QUERY, RULES_QUERY, JobConfig
from fraudrules.engine import job, lines, state
from fraudrules.rules import store
from fraudrules.rules.model import Rule
from fraudrules.rules.text import plural
from fraudrules.tables import number_text, per_distinct

ALERT_FIELDS = (
    "alertId",
    "kind",
    "ruleId",
    "ruleVersion",
    "transactionId",
    "userId",
    "key",
    "aggregate",
    "aggregatorFunctionType",
    "aggregateFieldName",
    "limitOperatorType",
    "limit",
    "windowMinutes",
    "eventTimeMs",
    "producedAtMs",
    "message",
    "details",
)


JSON_TEXT_FIELDS = ("key", "details")  # stored as JSON text, written as the JSON value it holds
WRITE_ROWS = 10_000  # alerts written at a time: the driver holds their lines, not a rule's
ORDER = ("ruleId", "transactionId", "userId", "eventTimeMs")
# From this much input a backtest runs for most of a minute or more, and the tiered JIT's optimising compiler pays
# for the CPU it takes early (`local_runtime`). On 2 cores: 66 MB (500,000 records) took 3-5 s longer with it,
# 132 MB 1-4 s less.
TIERED_JIT_BYTES = 100 << 20
QUARANTINE_FIELDS = ("kind", "reason", "srcName", "srcPos", "raw")
SHOWN_QUARANTINED = 5  # quarantined records a backtest prints; its quarantine file has them all


@dataclass
class BacktestResult:
    transactions: int
    logins: int
    quarantined: int
    late: int
    alerts: int
    seconds: float
    per_rule: dict[int, int] = field(default_factory=dict)
    shadow_per_rule: dict[int, int] = field(default_factory=dict)  # SHADOW rules' hits (shadow_alerts)

    @property
    def rate(self) -> float:
        return (self.transactions + self.logins) / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        lines = [
            f"transactions: {self.transactions:,} valid, logins: {self.logins:,} valid, "
            f"{self.quarantined:,} quarantined, {self.late:,} late",
            f"alerts: {self.alerts:,}; {self.seconds:.1f} s wall clock incl. query start-up "
            f"({self.rate:,.0f} events/s)",
        ]
        lines += [f"  rule {rid}: {plural(n, 'alert')}" for rid, n in sorted(self.per_rule.items())]
        shadow = sorted(self.shadow_per_rule.items())
        lines += [f"  shadow rule {rid}: {plural(n, 'hit')} (shadow_alerts)" for rid, n in shadow]
        return "\n".join(lines)


def long_running(*inputs: str | None) -> bool:
    """Whether a backtest of these inputs (folders, files or globs of JSON lines; None: not given) reads
    `TIERED_JIT_BYTES` or more."""
    total = 0
    for path in filter(None, inputs):
        fs, location = lines.open_fs(path)
        total += sum(entry.size for entry in lines.list_files(fs, location))
    return total >= TIERED_JIT_BYTES


def run(
    spark: SparkSession, cfg: JobConfig, transactions: str | None, rules: list[Rule], logins: str | None = None
) -> BacktestResult:
    """Evaluate `rules` over JSON-lines files of transactions and/or logins into the tables under `cfg.data_dir`."""
    empty = os.path.join(cfg.data_dir, "landing", "none")
    os.makedirs(empty, exist_ok=True)
    cfg = cfg.with_(
        transactions_source=os.path.abspath(transactions or empty),
        available_now=True,
        logins=logins is not None,
        logins_source=logins and os.path.abspath(logins),
    )
    cfg = event_schema.resolved(cfg)
    tables.ensure(spark, cfg)
    store.upsert(spark, cfg, rules, author="backtest")
    started = time.time()
    # the rules are the given ones: no rules query (it would watch a rules folder or topic)
    names = tuple(q for q in job.query_names(cfg) if q != RULES_QUERY)
    running = job.start(spark, cfg, printer=None, names=names)
    running.wait()
    seconds = time.time() - started
    writer = tables.writer(spark, cfg)
    late = writer.arrow("late_events", ["kind", "transactionId", "userId", "eventTimeMs"])
    per_rule, shadow = _per_rule(writer, "alerts"), _per_rule(writer, "shadow_alerts")
    n_transactions, n_logins, quarantined = (writer.count(t) for t in ("transactions", "logins", "quarantine"))
    return BacktestResult(
        transactions=n_transactions,
        logins=n_logins,
        quarantined=quarantined,
        # a late event is recorded once per rule it would have been keyed for: count events
        late=len(late.group_by(late.column_names).aggregate([])),
        alerts=sum(per_rule.values()),
        seconds=seconds,
        per_rule=per_rule,
        shadow_per_rule=shadow,
    )


def discard(cfg: JobConfig) -> None:
    """Remove a backtest's tables and checkpoints (its temporary data dir) and its local chunk cache."""
    shutil.rmtree(cfg.data_dir, ignore_errors=True)
    state.drop_cache(job.namespace(cfg, EVALUATE_QUERY))


def _per_rule(writer: tables.TableWriter, table: str) -> dict[int, int]:
    counts = writer.arrow(table, ["ruleId"]).group_by("ruleId").aggregate([([], "count_all")])
    return dict(zip(counts.column("ruleId").to_pylist(), counts.column("count_all").to_pylist(), strict=True))


def write_alerts(spark: SparkSession, cfg: JobConfig, out: str, table: str = "alerts") -> int:
    """Alerts (of `table`: alerts or shadow_alerts) as JSON lines, ordered by (ruleId, transactionId); `key` as an
    object of name → value, and `eventTime` as an ISO timestamp beside the exact `eventTimeMs`: the one format of
    alerts in files (`backtest --out`, `export alerts`, notebook 04's export).

    One rule's alerts at a time (a scan each), sorted there: the driver holds a rule's alerts and the next one's
    (read while this one's lines are written: Arrow scans without holding the GIL), not all of them. Lines are
    built column by column (`alert_lines`) and written as Arrow's buffer."""
    writer = tables.writer(spark, cfg)
    order = [(c, "ascending", "at_start") for c in ORDER]  # nulls first, as Spark sorts
    rule_ids = sorted(_per_rule(writer, table))
    n = 0
    with open(out, "wb") as fh:
        for rows in _read_ahead(lambda r: writer.arrow(table, ALERT_FIELDS, where=("ruleId", r)), rule_ids):
            ordered = pc.sort_indices(rows.select(list(ORDER)), sort_keys=order)
            for start in range(0, len(ordered), WRITE_ROWS):  # the lines of a slice at a time
                lines = alert_lines(rows.take(ordered[start : start + WRITE_ROWS]))
                fh.write(_newline_ended(lines))
                n += len(lines)
    return n


def quarantine_path(out: str) -> str:
    """Where a backtest writing its alerts to `out` writes the records it quarantined: beside them, `alerts.jsonl` ->
    `alerts.quarantine.jsonl`."""
    return str(Path(out).with_suffix(".quarantine.jsonl"))


def write_quarantine(spark: SparkSession, cfg: JobConfig, path: str) -> list[str]:
    """The quarantined records as JSON lines at `path`, in source order, and what to print about them: how many for
    each reason, the first few with their file and line, and where they all are. None quarantined: no file (an
    earlier backtest's is removed) and nothing to print."""
    rows = tables.writer(spark, cfg).arrow("quarantine", QUARANTINE_FIELDS)
    if not rows.num_rows:
        Path(path).unlink(missing_ok=True)
        return []
    rows = rows.sort_by([("srcName", "ascending"), ("srcPos", "ascending")])
    raw = rows.column("raw").cast(pa.binary()).to_pylist()  # as it came: bytes that are not UTF-8 as \xNN
    records = [
        {**row, "raw": text.decode("utf-8", "backslashreplace")}
        for row, text in zip(rows.drop_columns(["raw"]).to_pylist(), raw, strict=True)
    ]
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    lines = [f"quarantined: {plural(len(records), 'record')}, all in {path} (kind, reason, srcName, srcPos, raw)"]
    lines += [f"  {n:,} × {reason}" for reason, n in Counter(r["reason"] for r in records).most_common()]
    lines += [f"  {_file_line(r['srcName'], r['srcPos'])}: {r['reason']}" for r in records[:SHOWN_QUARANTINED]]
    return lines


def _file_line(name: str, line: int) -> str:
    """A record's place as a person looks for it: the file's path (a local file's without `file:`) and line."""
    return f"{unquote(name.removeprefix('file:')) if name.startswith('file:') else name} line {line}"


def write_alerts_then_stop(spark: SparkSession, cfg: JobConfig, out: str) -> int:
    """`write_alerts`, and the session stopped. Path tables are read with delta-rs, without Spark: the session
    stops while the file is written (after a backtest of 1M records, each takes a second or more)."""
    if not tables.uses_delta_rs(cfg):
        try:
            return write_alerts(spark, cfg, out)
        finally:
            spark.stop()
    with ThreadPoolExecutor(1) as pool:
        stopped = pool.submit(spark.stop)
        n = write_alerts(spark, cfg, out)
        stopped.result()
    return n


def _read_ahead(read: Callable[[int], pa.Table], rule_ids: list[int]) -> Iterator[pa.Table]:
    """Each rule's alerts in turn, the next rule's read in a thread while the caller uses this one's."""
    with ThreadPoolExecutor(1) as pool:
        ahead = pool.submit(read, rule_ids[0]) if rule_ids else None
        for i in range(len(rule_ids)):
            rows = ahead.result()
            ahead = pool.submit(read, rule_ids[i + 1]) if i + 1 < len(rule_ids) else None
            yield rows


def _newline_ended(lines: pa.StringArray) -> memoryview:
    """The lines, each followed by a newline, as one buffer (no Python string per line)."""
    text = pc.binary_join_element_wise(lines, "", "\n")
    width = np.int64 if pa.types.is_large_string(text.type) else np.int32
    offsets = np.frombuffer(text.buffers()[1], width)[text.offset : text.offset + len(text) + 1]
    return memoryview(text.buffers()[2])[int(offsets[0]) : int(offsets[-1])]


def alert_lines(rows: pa.Table) -> pa.Array:
    """Each alert (ALERT_FIELDS) as one JSON object of those fields plus `eventTime`, as `json.dumps` writes it
    (", " and ": " between items, non-ASCII escaped) with decimals as exact numbers. Each field's values are
    written as JSON by Arrow (integers, times) or once per distinct value (`_distinct_json`), then joined."""
    parts: list[pa.Array | str] = []
    for name in ALERT_FIELDS:
        parts += [f"{', ' if parts else '{'}{encode_basestring_ascii(name)}: ", _json_values(rows.column(name), name)]
    times = pc.strftime(pc.cast(rows.column("eventTimeMs"), pa.timestamp("ms")), format='"%Y-%m-%dT%H:%M:%SZ"')
    parts += [', "eventTime": ', pc.fill_null(times, '"-"'), "}"]
    return pc.binary_join_element_wise(*parts, "").combine_chunks()


def _json_values(column: pa.ChunkedArray, name: str) -> pa.Array | pa.ChunkedArray:
    if pa.types.is_integer(column.type):
        return pc.fill_null(pc.cast(column, pa.string()), "null")
    if name in JSON_TEXT_FIELDS:
        return _distinct_json(column, lambda text: json.dumps(json.loads(text)) if text else "null")
    if pa.types.is_decimal(column.type):
        return _distinct_json(column, number_text)
    return _distinct_json(column, encode_basestring_ascii)  # a string, as json.dumps writes it


def _distinct_json(column: pa.ChunkedArray, encode: Callable[[object], str]) -> pa.Array:
    """`encode` (a value → its JSON text) applied once per distinct value; nulls as `null`."""
    return pc.fill_null(per_distinct(column, encode, pa.string()), "null")
