"""What only shows after hours: resources held per micro-batch. PySpark 4.2.0's transformWithState state server kept
the socket of every task it served (SPARK-58932); a continuous job at 4 micro-batches a second ran out of its 20,000
open files after 75 minutes (docs/performance.md, the soak)."""

from __future__ import annotations

import os

import pytest

from fraudrules.event_schema import DEFAULT
from fraudrules.rules.model import parse_rule
from tests.integration.test_rules_lifecycle import count_rule, txn
from tests.support.streams import FileStream

pytestmark = pytest.mark.spark


def _jvm_pid() -> int:
    """The local JVM this process launched (the session's)."""
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/comm") as fh:
                command = fh.read().strip()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and command == "java":
            return int(name)
    raise AssertionError("no JVM launched by this process")


def _sockets(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            continue  # closed meanwhile
    return count


def test_micro_batches_leave_no_sockets_behind(spark, tmp_path):
    """20 micro-batches of 4 shards: on PySpark 4.2.0 the JVM kept 80 more sockets (one per task)."""
    pid = _jvm_pid()
    stream = FileStream(spark, str(tmp_path), [parse_rule(count_rule(), DEFAULT)], shards=4).start()
    try:
        stream.feed([txn(0)])  # Python workers and state stores started
        before = _sockets(pid)
        for i in range(1, 21):
            stream.feed([txn(i)])
        after = _sockets(pid)
    finally:
        stream.stop()
    assert after - before < 20, (
        f"the JVM holds {after - before} more sockets after 20 micro-batches ({before} → {after})"
    )
