"""A hand-written Delta table (parquet files plus JSON commits, optionally a checkpoint) shaped like `batches`."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

BATCHES = pa.schema(
    [
        ("query", pa.string()),
        ("batchId", pa.int64()),
        ("committedAt", pa.timestamp("us")),
        ("inputRows", pa.int64()),
        ("alerts", pa.int64()),
        ("lateEvents", pa.int64()),
        ("watermarkMs", pa.int64()),
        ("latencyP50Ms", pa.float64()),
        ("latencyP99Ms", pa.float64()),
        ("latencyMaxMs", pa.float64()),
    ]
)
SCHEMA_STRING = json.dumps(
    {
        "type": "struct",
        "fields": [{"name": f.name, "type": "string", "nullable": True, "metadata": {}} for f in BATCHES],
    }
)


def batch_row(batch_id: int, committed: float, p99: float | None = 50.0, query: str = "evaluate") -> dict:
    return {
        "query": query,
        "batchId": batch_id,
        "committedAt": datetime.fromtimestamp(committed, timezone.utc).replace(tzinfo=None),
        "inputRows": None,
        "alerts": 0,
        "lateEvents": 0,
        "watermarkMs": 1_000 * batch_id,
        "latencyP50Ms": None if p99 is None else p99 / 2,
        "latencyP99Ms": p99,
        "latencyMaxMs": p99,
    }


class DeltaWriter:
    """Just enough of a Delta writer: parquet files plus JSON commits (and optionally a checkpoint)."""

    def __init__(self, path: Path):
        self.path, self.version, self.live = path, 0, {}
        (path / "_delta_log").mkdir(parents=True)
        self._commit(
            [
                {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
                {"metaData": {"id": "t", "format": {"provider": "parquet"}, "schemaString": SCHEMA_STRING}},
            ]
        )

    def _commit(self, actions: list[dict]) -> None:
        log = self.path / "_delta_log" / f"{self.version:020d}.json"
        log.write_text("\n".join(json.dumps(a) for a in actions) + "\n")
        self.version += 1

    def append(self, rows: list[dict], remove: str | None = None) -> str:
        name = f"part-{self.version:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=BATCHES), self.path / name)
        add = {"path": name, "partitionValues": {}, "size": 1, "modificationTime": self.version, "dataChange": True}
        self.live[name] = add
        actions = [{"add": add}]
        if remove:
            actions.append({"remove": {"path": remove, "dataChange": True}})
            self.live.pop(remove)
        self._commit(actions)
        return name

    def checkpoint(self) -> None:
        version = self.version - 1
        add_type = pa.struct(
            [
                ("path", pa.string()),
                ("partitionValues", pa.map_(pa.string(), pa.string())),
                ("size", pa.int64()),
                ("modificationTime", pa.int64()),
                ("dataChange", pa.bool_()),
            ]
        )
        meta_type = pa.struct([("id", pa.string()), ("schemaString", pa.string())])
        adds = [{**a, "partitionValues": []} for a in self.live.values()]
        table = pa.table(
            {
                "add": pa.array([*adds, None], type=add_type),
                "metaData": pa.array([*[None] * len(adds), {"id": "t", "schemaString": SCHEMA_STRING}], meta_type),
            }
        )
        pq.write_table(table, self.path / "_delta_log" / f"{version:020d}.checkpoint.parquet")
        (self.path / "_delta_log" / "_last_checkpoint").write_text(json.dumps({"version": version, "size": 1}))
