"""The soak bench's figures (tools/soak.py): live files apart from the Parquet files on disk, the interval line."""

from __future__ import annotations

import subprocess
import sys
import time

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
    memory = np.array([[2 * 2**30, 2**30], [3 * 2**30, 2**30]], dtype=np.float64)  # (JVM, Python) per sample
    line = soak.Interval(
        5, 10, np.array([100.0, 200.0, 900.0]), memory, {"alerts": (3, 2**20, 9)}, 5 * 2**20, 0.25, 1_234
    ).line()
    assert line.startswith("  min   5-10         3 alerts: send → alert p50 200 ms")
    assert "job PSS mean 3,584 MiB (JVM 2,560, Python 1,024), max 4,096 MiB; alerts 3 files (9 on disk)" in line
    assert "1.0 MiB; checkpoints 5.0 MiB" in line
    assert line.endswith("full read of alerts 0.25 s (1,234 rows)")


def test_memory_samples_split_the_jvm_from_python(monkeypatch):
    """The sampler files a Python process tree under Python, nothing under JVM, and keeps an interval's samples."""
    monkeypatch.setattr(soak, "MEMORY_SAMPLE_S", 0.02)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        samples = soak.MemorySamples(sleeper.pid)
        started = time.time()
        samples.start()
        while len(samples.samples) < 3:
            time.sleep(0.02)
        samples.stop()
    finally:
        sleeper.kill()
    taken = samples.between(started, time.time() + 1)
    assert taken.shape[1] == 2 and len(taken) >= 3
    assert (taken[:, 0] == 0).all() and (taken[:, 1] > 0).all()
    assert len(samples.between(0, started)) == 0
