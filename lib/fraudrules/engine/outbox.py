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

# Arrow integers as pandas' nullable ones (`to_pandas(types_mapper=EXACT_INTS.get)`): 64-bit ids stay exact.
EXACT_INTS = {pa.int32(): pd.Int32Dtype(), pa.int64(): pd.Int64Dtype()}
# Outbox rows: plain types (times in ms); the committer derives the tables' timestamps and decimals.
OUTBOX_FOLDER = "outbox"  # a query's outbox: this folder of its checkpoint
OUTBOX = {
    "alerts": pa.schema(
        [
            ("alertId", pa.string()),
            ("kind", pa.string()),
            ("ruleId", pa.int32()),
            ("ruleVersion", pa.int64()),
            ("transactionId", pa.int64()),
            ("userId", pa.int64()),
            ("key", pa.string()),
            ("groupingKeyNames", pa.list_(pa.string())),
            ("aggregate", pa.string()),
            ("aggregateFieldName", pa.string()),
            ("aggregatorFunctionType", pa.string()),
            ("limitOperatorType", pa.string()),
            ("limit", pa.string()),
            ("windowMinutes", pa.int32()),
            ("eventTimeMs", pa.int64()),
            ("ingestionTimestamp", pa.int64()),
            ("producedAtMs", pa.int64()),
            ("publishedAtMs", pa.int64()),
            ("watermarkMs", pa.int64()),
            ("batchId", pa.int64()),
            ("shard", pa.int32()),
            ("message", pa.string()),
            ("details", pa.string()),
        ]
    ),
    "late_events": pa.schema(
        [
            ("kind", pa.string()),
            ("transactionId", pa.int64()),
            ("userId", pa.int64()),
            ("ruleId", pa.int32()),
            ("ruleVersion", pa.int64()),
            ("key", pa.string()),
            ("eventTimeMs", pa.int64()),
            ("watermarkMs", pa.int64()),
            ("reason", pa.string()),
            ("detectedAtMs", pa.int64()),
            ("batchId", pa.int64()),
        ]
    ),
    "batches": pa.schema(
        [
            ("query", pa.string()),
            ("batchId", pa.int64()),
            ("committedAtMs", pa.int64()),
            ("inputRows", pa.int64()),
            ("alerts", pa.int64()),
            ("lateEvents", pa.int64()),
            ("watermarkMs", pa.int64()),
            ("latencyP50Ms", pa.float64()),
            ("latencyP99Ms", pa.float64()),
            ("latencyMaxMs", pa.float64()),
            ("retainedEvents", pa.int64()),
            ("chunks", pa.int32()),
            ("chunksFromStore", pa.int32()),
            ("transactions", pa.int64()),
            ("pythonMs", pa.float64()),
            ("pythonStages", pa.string()),
            ("logins", pa.int64()),
        ]
    ),
    "rule_seen": pa.schema(
        [("ruleId", pa.int32()), ("ruleVersion", pa.int64()), ("firstMs", pa.int64()), ("batchId", pa.int64())]
    ),
}
OUTBOX["shadow_alerts"] = OUTBOX["alerts"].append(pa.field("shadowOf", pa.int32()))
# Table timestamps derived from outbox milliseconds when committed (column: milliseconds column).
ALERT_TIMES = {"eventTime": "eventTimeMs", "producedAt": "producedAtMs"}
TIMES = {
    "alerts": ALERT_TIMES,
    "shadow_alerts": ALERT_TIMES,
    "late_events": {"detectedAt": "detectedAtMs"},
    "batches": {"committedAt": "committedAtMs"},
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
