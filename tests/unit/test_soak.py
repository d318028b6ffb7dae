"""The soak bench's figures (tools/soak.py): live files apart from the Parquet files on disk, the interval line."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from tools import soak


def test_table_shape_counts_live_files_apart_from_files_on_disk(tmp_path):
    path = str(tmp_path / "t")
    for i in range(4):
        write_deltalake(path, pa.table({"a": [i] * 10}), mode="append")
    DeltaTable(path).optimize.compact()
    files, size, on_disk = soak.table_shape(path)
    assert (files, on_disk) == (1, 5)  # the compacted file; the 4 it replaced stay until VACUUM
    assert size == sum(DeltaTable(path).get_add_actions(flatten=True).column("size_bytes").to_pylist())
    assert soak.full_read(path)[1] == 40


def test_an_interval_line_says_every_figure():
    line = soak.Interval(
        5, 10, np.array([100.0, 200.0, 900.0]), 3 * 2**30, {"alerts": (3, 2**20, 9)}, 5 * 2**20, 0.25, 1_234
    ).line()
    assert line.startswith("  min   5-10         3 alerts: send → alert p50 200 ms")
    assert "job PSS 3,072 MiB; alerts 3 files (9 on disk) 1.0 MiB; checkpoints 5.0 MiB" in line
    assert line.endswith("full read of alerts 0.25 s (1,234 rows)")
