"""A command whose Spark JVM dies says so in one line and exits 1: no Py4J tracebacks from its threads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fraudrules.generator import Workload, write_jsonl

RULES = Path(__file__).parents[2] / "tools" / "bench_rules.json"

pytestmark = pytest.mark.e2e


def jvm_of(pid: int) -> int | None:
    """The java process among the descendants of `pid`."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,comm="], capture_output=True, text=True).stdout
    rows = [line.split() for line in out.splitlines()]
    children: dict[int, list[tuple[int, str]]] = {}
    for child, parent, name in (r for r in rows if len(r) == 3):
        children.setdefault(int(parent), []).append((int(child), name))
    stack = [pid]
    while stack:
        for child, name in children.get(stack.pop(), []):
            if name == "java":
                return child
            stack.append(child)
    return None


def test_a_killed_jvm_ends_a_backtest_with_one_line(tmp_path):
    write_jsonl(str(tmp_path / "in"), Workload(count=200_000).transactions(), per_file=200_000)
    work = tmp_path / "work"
    cmd = [sys.executable, "-m", "fraudrules.cli", "backtest", "--transactions", str(tmp_path / "in")]
    cmd += ["--rules", str(RULES), "--out", str(tmp_path / "a.jsonl"), "--data-dir", str(work)]
    cmd += ["--max-records-per-trigger", "20000"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop("FRAUDRULES_LOG_LEVEL", None)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 300
    offsets = work / "checkpoints" / "evaluate" / "offsets"
    while not (offsets.is_dir() and any(offsets.iterdir())) and time.monotonic() < deadline:  # mid-run
        time.sleep(0.2)
    jvm = jvm_of(proc.pid)
    assert jvm is not None and proc.poll() is None, "the backtest ended before it could be killed"
    os.kill(jvm, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, (proc.returncode, err[-3000:])
    assert err.splitlines() == [
        "fraudrules backtest: the Spark JVM was killed (SIGKILL), most likely by the system's out-of-memory killer; "
        "free memory, lower FRAUDRULES_DRIVER_MEMORY (now 768m) or use smaller micro-batches with "
        "--max-records-per-trigger"
    ], err[-3000:]
    assert "Traceback" not in out
