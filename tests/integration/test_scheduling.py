"""Background work yields the CPU: the JVM threads the job marks as background (a bronze ingest query's stream
thread, the committer's) run at nice 19 in a local session; every other JVM thread keeps nice 0."""

from __future__ import annotations

import glob
import threading

import pytest

from fraudrules.session import background_thread

pytestmark = pytest.mark.spark


def _nice(spark) -> dict[int, int]:
    """The nice value of each of the JVM's OS threads."""
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    values = {}
    for path in glob.glob(f"/proc/{pid}/task/*/stat"):
        try:
            with open(path) as fh:
                values[int(path.split("/")[-2])] = int(fh.read().rsplit(")", 1)[1].split()[16])
        except OSError:
            continue  # the thread ended
    return values


def test_a_background_python_thread_runs_its_jvm_side_at_nice_19(spark):
    seen: dict[str, dict[int, int]] = {}

    def work() -> None:
        spark._jvm.java.lang.Thread.currentThread().setPriority(5)  # py4j may hand this thread a used connection
        seen["before"] = _nice(spark)
        background_thread(spark)
        seen["after"] = _nice(spark)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    lowered = [tid for tid, nice in seen["after"].items() if nice == 19 and seen["before"].get(tid) == 0]
    assert len(lowered) == 1, "the JVM thread serving the Python thread did not go to nice 19"


def test_no_jvm_thread_runs_above_nice_0(spark):
    """HotSpot's own priority mapping would put GC and JIT threads at nice -5: ours keeps them at 0."""
    assert min(_nice(spark).values()) == 0
