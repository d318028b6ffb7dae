"""What a command says when Spark's JVM or a Python worker died under it: one line, the likely cause, the setting."""

from __future__ import annotations

import signal

from py4j.protocol import Py4JNetworkError

from fraudrules import failures, local_runtime


def chained(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as err:
            raise outer from err
    except BaseException as err:
        return err


def test_a_jvm_that_ran_out_of_heap(monkeypatch):
    monkeypatch.setenv("FRAUDRULES_DRIVER_MEMORY", "1g")
    monkeypatch.setattr(local_runtime, "_launched", [])  # no JVM launched: the heap a new one would get
    empty = Py4JNetworkError("Answer from Java side is empty")
    lost = chained(ConnectionRefusedError(111, "Connection refused"), empty)
    line = failures.explain(lost, status=failures.JVM_OUT_OF_MEMORY)
    assert line.startswith("the Spark JVM ran out of heap memory") and "FRAUDRULES_DRIVER_MEMORY (now 1g)" in line
    assert "--max-records-per-trigger" in line and "\n" not in line


def test_a_killed_jvm_and_an_unexplained_exit():
    killed = failures.explain(Py4JNetworkError("Error while sending or receiving"), status=-signal.SIGKILL)
    assert killed.startswith("the Spark JVM was killed (SIGKILL), most likely by the system's out-of-memory killer")
    assert failures.explain(ConnectionResetError(), status=3) == (
        "the Spark JVM exited unexpectedly (status 3); run again with --verbose to see its log"
    )


def test_a_python_worker_that_died_while_the_jvm_lives():
    crashed = RuntimeError("Python worker exited unexpectedly (crashed)")
    err = chained(RuntimeError("Query evaluate terminated"), crashed)
    line = failures.explain(err, status=None)
    assert line.startswith("a Spark Python worker died (killed or crashed), most likely out of memory")


def test_other_errors_are_not_explained_away():
    assert failures.explain(ValueError("a bug"), status=None) is None


def test_the_heap_named_is_the_launched_jvms(monkeypatch):
    monkeypatch.setenv("FRAUDRULES_DRIVER_MEMORY", "1g")
    monkeypatch.setattr(local_runtime, "_launched", [])
    local_runtime.launched("768m")
    line = failures.explain(Py4JNetworkError("Answer from Java side is empty"), status=failures.JVM_OUT_OF_MEMORY)
    assert "FRAUDRULES_DRIVER_MEMORY (now 768m)" in line
