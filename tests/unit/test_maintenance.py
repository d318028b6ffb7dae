"""Maintenance of local path tables (delta-rs, no JVM) against the job's concurrent commits."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from fraudrules import maintenance
from fraudrules.config import JobConfig


def test_the_retention_properties_are_set_again_after_a_concurrent_delete(tmp_path, monkeypatch):
    """The ingest query's bronze expiry deletes rows between maintenance's read of the table and its commit of the
    retention properties: delta-rs refuses that commit ("a concurrent transaction deleted data this operation
    read"), and maintenance sets them again on the new version instead of failing the run."""
    cfg = JobConfig(data_dir=str(tmp_path))
    path = cfg.table("transactions")
    write_deltalake(path, pa.table({"transactionId": [1, 2, 3]}))
    set_properties = maintenance._set_properties_rs
    read_at: list[int] = []

    def racing(table: DeltaTable, properties: dict[str, str]) -> None:
        read_at.append(table.version())
        if len(read_at) == 1:
            DeltaTable(path).delete("transactionId < 2")  # the expiry, committed meanwhile
        set_properties(table, properties)

    monkeypatch.setattr(maintenance, "_set_properties_rs", racing)
    (report,) = maintenance.maintain(None, cfg, ("transactions",))
    assert read_at == [0, 1] and report.after.files == 1
    configuration = DeltaTable(path).metadata().configuration
    assert {k: configuration.get(k) for k in maintenance.log_properties(cfg)} == maintenance.log_properties(cfg)
    assert DeltaTable(path).to_pyarrow_table().column("transactionId").to_pylist() == [2, 3]
