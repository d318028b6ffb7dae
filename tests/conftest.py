"""Shared fixtures: one local Spark session (with Delta and RocksDB) for the integration tier."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

VENV_PYTHON = sys.executable
os.environ.setdefault("PYSPARK_PYTHON", VENV_PYTHON)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", VENV_PYTHON)
# The repository's jars (what the Makefile exports), also for `pytest` run from elsewhere or without make.
os.environ.setdefault("FRAUDRULES_JARS", str(Path(__file__).resolve().parents[1] / ".jars" / "spark"))
# Every JVM the tests start (sessions, jobs, commands, notebooks, DAG tasks) with the C1-only JIT: they live seconds
# to minutes, and C2's compilations took CPU the suite waits for on 2 cores (local_runtime.JIT_ENV). The benchmarks
# run the JVMs as users get them.
os.environ.setdefault("FRAUDRULES_JIT", "c1")


CATALOG_SCHEMA = "fraudrules_tests"


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """With a local catalog, where tests write catalog tables through Spark's Delta writer as the bundle does."""
    from fraudrules.config import JobConfig
    from fraudrules.session import get_spark

    catalog = JobConfig(data_dir=str(tmp_path_factory.mktemp("spark")), catalog="spark_catalog", schema=CATALOG_SCHEMA)
    session = get_spark("fraudrules-tests", cfg=catalog)
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _session_settings_restored(request):
    """Runtime settings a test's code puts on the worker's one session end with the test. A Spark Delta writer sets
    its auto compaction there (`writers.auto_compaction`): after a test with `compact_min_files` 3, a later test's
    second INSERT into a rules table was followed by a compaction commit, which moved the versions it expected."""
    if "spark" not in request.fixturenames:
        yield
        return
    conf = request.getfixturevalue("spark").conf
    before = dict(conf.getAll)
    yield
    after = dict(conf.getAll)
    for key in after.keys() - before.keys():
        conf.unset(key)
    for key, value in before.items():
        if after.get(key) != value:
            conf.set(key, value)


# The order in which pytest-xdist hands the test files out (`make test`: `--dist loadfile --no-loadscope-reorder`,
# a file to the next worker with less than two pending): the slowest tiers first, the unit tier's many short files
# last, to fill a worker that ends before the other.
TIER_ORDER = ("e2e", "integration", "dags", "unit")


def pytest_collection_modifyitems(items):
    def tier(item) -> int:
        parts = Path(str(item.path)).relative_to(Path(__file__).parent).parts
        return TIER_ORDER.index(parts[0]) if parts[0] in TIER_ORDER else len(TIER_ORDER)

    items.sort(key=tier)  # stable: each file's tests stay in their order


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test still running (setup, call or teardown, the session's fixtures' at the end included) when faulthandler
    prints its Python stacks (pyproject's faulthandler_timeout) also prints the threads of this process's JVMs: a
    collect or a Python worker that hangs shows where the JVM waits. One still running a minute past its timeout
    (the timeout's exception did not end it: a teardown that waits forever) ends its pytest-xdist worker and the
    worker's processes: xdist reports the test as crashed and goes on in a new worker, where the run would
    otherwise wait until CI ended it with no summary (stop 79's landing)."""
    marker = item.get_closest_marker("timeout")
    timeout_s = float(marker.args[0] if marker else item.config.getini("timeout") or 0)
    stacks_s = float(item.config.getini("faulthandler_timeout") or 0)
    timers = []
    if stacks_s:
        timers.append(threading.Timer(stacks_s, _print_jvm_stacks))
    if timeout_s:
        timers.append(threading.Timer(timeout_s + 60, _end_worker, (item.nodeid,)))
    for timer in timers:
        timer.daemon = True
        timer.start()
    yield
    for timer in timers:
        timer.cancel()


def _end_worker(nodeid: str) -> None:
    print(f"{nodeid} still runs a minute past its timeout: ending this worker", file=sys.__stderr__, flush=True)
    for pid in _descendants(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    os._exit(3)


def _print_jvm_stacks() -> None:
    for pid in _descendants(os.getpid()):
        if Path(f"/proc/{pid}/comm").read_text().strip() == "java":
            dump = subprocess.run(["jstack", str(pid)], capture_output=True, text=True, timeout=60)
            print(f"JVM {pid} threads:\n{dump.stdout}{dump.stderr}", file=sys.__stderr__, flush=True)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:  # "pid (comm) state ppid ...": comm may hold spaces and parentheses
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # a process that ended meanwhile
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        todo.extend(kids := children.get(todo.pop(), []))
        found.extend(kids)
    return found
