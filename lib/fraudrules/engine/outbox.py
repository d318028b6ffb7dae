"""The outbox: a stateful query's micro-batch results waiting for Delta, files in its checkpoint folder.

One Arrow file per (batch, table), then a `done` marker: a batch is in the outbox once its marker exists. Rows
are plain types (times in ms); the committer derives the tables' timestamps (`with_times`). Per table, a
progress file says which batches the table has (`Progress`).
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa

from fraudrules.tables.schemas import SCHEMAS, arrow_fields

# Arrow integers as pandas' nullable ones (`to_pandas(types_mapper=EXACT_INTS.get)`): 64-bit ids stay exact.
EXACT_INTS = {pa.int32(): pd.Int32Dtype(), pa.int64(): pd.Int64Dtype()}
OUTBOX_FOLDER = "outbox"  # a query's outbox: this folder of its checkpoint
# Table timestamps derived from outbox milliseconds when committed (column: milliseconds column).
ALERT_TIMES = {"eventTime": "eventTimeMs", "producedAt": "producedAtMs"}
TIMES = {
    "alerts": ALERT_TIMES,
    "shadow_alerts": ALERT_TIMES,
    "late_events": {"detectedAt": "detectedAtMs"},
    "batches": {"committedAt": "committedAtMs"},
}


def rows_of(table: str) -> pa.Schema:
    """A table's outbox rows: plain types, from the table's own schema (`tables.SCHEMAS`): decimals as their exact
    text, and each timestamp the committer derives (`TIMES`) as its milliseconds, in its place unless the table
    keeps those too."""
    fields = arrow_fields(SCHEMAS[table])
    names, times, out = {f.name for f in fields}, TIMES.get(table, {}), []
    for f in fields:
        if f.name in times:
            if times[f.name] not in names:
                out.append(pa.field(times[f.name], pa.int64()))
        else:
            out.append(pa.field(f.name, pa.string()) if pa.types.is_decimal(f.type) else f)
    return pa.schema(out)


# Outbox rows per table; `rule_seen` is the evaluation's first sight of each rule version, which the committer turns
# into `rule_applied` rows.
OUTBOX = {name: rows_of(name) for name in TIMES} | {
    "rule_seen": pa.schema(
        [("ruleId", pa.int32()), ("ruleVersion", pa.int64()), ("firstMs", pa.int64()), ("batchId", pa.int64())]
    )
}


def with_times(rows: pa.Table, times: dict[str, str]) -> pa.Table:
    for column, ms in times.items():
        rows = rows.append_column(column, rows.column(ms).cast(pa.timestamp("ms", tz="UTC")))
    return rows


class Outbox:
    """A query's micro-batch results waiting for Delta: one Arrow file per (batch, table), then a marker."""

    def __init__(self, folder: str):
        self.folder = folder

    def _path(self, batch_id: int, part: str) -> str:
        return os.path.join(self.folder, f"{batch_id:020d}.{part}")

    def put(self, batch_id: int, parts: dict[str, pa.Table]) -> None:
        os.makedirs(self.folder, exist_ok=True)
        for name, table in parts.items():
            tmp = self._path(batch_id, f"{name}.{uuid.uuid4().hex}.tmp")
            with pa.OSFile(tmp, "wb") as fh, pa.ipc.new_file(fh, table.schema) as writer:
                writer.write_table(table)
            os.replace(tmp, self._path(batch_id, f"{name}.arrow"))
        with open(self._path(batch_id, "done"), "w"):  # the batch is complete once this exists
            pass

    def pending(self) -> list[int]:
        if not os.path.isdir(self.folder):
            return []
        return sorted(int(n.split(".")[0]) for n in os.listdir(self.folder) if n.endswith(".done"))

    def read(self, batch_id: int, name: str) -> pa.Table | None:
        path = self._path(batch_id, f"{name}.arrow")
        if not os.path.exists(path):
            return None
        with pa.OSFile(path, "rb") as fh:
            return pa.ipc.open_file(fh).read_all()

    def remove(self, batch_ids: list[int]) -> None:
        for b in batch_ids:
            for name in [*OUTBOX, "done"]:
                path = self._path(b, name if name == "done" else f"{name}.arrow")
                if os.path.exists(path):
                    os.remove(path)

    def progress(self, table: str) -> Progress:
        path = os.path.join(self.folder, f"progress-{table}.json")
        if not os.path.exists(path):
            return Progress(-1, None)
        with open(path, encoding="utf-8") as fh:
            return Progress(**json.load(fh))

    def set_progress(self, table: str, progress: Progress) -> None:
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, f"progress-{table}.json")
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"committed": progress.committed, "group": progress.group}, fh)
        os.replace(tmp, path)


@dataclass(frozen=True)
class Progress:
    """How far a table has the outbox's rows: every batch up to `committed`; `group`, the batches of a commit in
    flight (recorded before it is made: after a crash, exactly this group is committed again, and Delta skips it
    if it had made it)."""

    committed: int
    group: list[int] | None
