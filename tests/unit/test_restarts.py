"""When `fraudrules run` restarts its queries after a failure (engine/run.py): the backoff, the hourly limit, which
errors are retried, and the one line that says what failed."""

from __future__ import annotations

import pytest

from fraudrules import failures
from fraudrules.engine import run
from fraudrules.engine.progress import error_line
from fraudrules.event_schema import SchemaError
from fraudrules.rules.model import RuleError


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(run.time, "monotonic", lambda: now[0])
    return now


def test_the_backoff_doubles_to_its_ceiling_and_starts_again_after_a_healthy_run(clock):
    restarts = run.Restarts(per_hour=100)
    waits = []
    for _ in range(6):
        waits.append(restarts.backoff(ran_s=30))
        clock[0] += 60
    assert waits == [5, 10, 20, 40, 60, 60]
    assert restarts.backoff(ran_s=300) == 5  # five minutes without a failure: healthy
    assert restarts.backoff(ran_s=1) == 10
    assert restarts.count == 8


def test_at_most_per_hour_restarts_in_any_hour(clock):
    restarts = run.Restarts(per_hour=3)
    assert [restarts.backoff(ran_s=1) for _ in range(3)] == [5, 10, 20]
    assert restarts.backoff(ran_s=1) is None
    clock[0] += 3599
    assert restarts.backoff(ran_s=1) is None
    clock[0] += 2  # the first restarts are more than an hour old
    assert restarts.backoff(ran_s=1) == 40


def test_zero_restarts_ends_at_the_first_failure(clock):
    assert run.Restarts(per_hour=0).backoff(ran_s=1000) is None


def test_transient_errors_are_restartable_but_not_a_dead_jvm_or_a_job_that_does_not_fit(monkeypatch):
    monkeypatch.setattr(failures, "jvm_exit_status", lambda wait_s=0.0: None)  # the JVM runs
    assert run.restartable(RuntimeError("org.apache.kafka.common.errors.TimeoutException: Timed out"))
    assert run.restartable(OSError("Generic LocalFileSystem error"))
    assert not run.restartable(RuntimeError("Python worker exited unexpectedly (crashed)"))
    assert not run.restartable(RuntimeError("java.lang.OutOfMemoryError: Java heap space"))
    assert not run.restartable(SchemaError("the checkpoint was started with login detection on"))
    assert not run.restartable(RuleError(1, ["limit is not a number"]))
    monkeypatch.setattr(failures, "jvm_exit_status", lambda wait_s=0.0: -9)  # the JVM was killed
    assert not run.restartable(RuntimeError("Connection refused"))


def test_error_line_says_what_failed_in_one_line():
    delta = OSError(
        "Generic LocalFileSystem error\n   \x1b[31m↳\x1b[0m Unable to open file /t/2.json#1\n"
        "    \x1b[31m↳\x1b[0m Operation not permitted (os error 1)\n"
    )
    assert error_line(delta) == (
        "Generic LocalFileSystem error: Unable to open file /t/2.json#1: Operation not permitted (os error 1)"
    )
    sink = (
        "An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):\n"
        '  File "x.py", line 6, in sink\n    raise RuntimeError("3 of 5 alerts not delivered")\n'
        "RuntimeError: 3 of 5 alerts not delivered\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 8, in sink\n    raise RuntimeError("publishing ... failed") from e\n'
        "RuntimeError: publishing the alerts of micro-batch 3 failed\n\n"
        "=== Streaming Query ===\nIdentifier: [id = 1, runId = 2]\nCurrent State: ACTIVE\n"
    )
    assert error_line(sink) == (
        "RuntimeError: publishing the alerts of micro-batch 3 failed (from RuntimeError: 3 of 5 alerts not delivered)"
    )
    assert error_line("java.util.concurrent.ExecutionException: TimeoutException: x\n\tat a.b(C.java:1)") == (
        "java.util.concurrent.ExecutionException: TimeoutException: x"
    )
    assert error_line(ValueError()) == "ValueError"
    task = (
        "An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):\n"
        '  File "results.py", line 155, in __call__\n    out = df.toArrow()\n'
        "py4j.protocol.Py4JJavaError: An error occurred while calling o3782.getResult.\n"
        ": org.apache.spark.SparkException: Exception thrown in awaitResult: \n\tat org.apache.X(X.scala:70)\n"
        "Caused by: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 53.0 failed\n"
        "Caused by: org.apache.kafka.common.errors.TimeoutException: Timeout of 60000ms expired\n"
    )
    assert error_line(task) == (
        "py4j.protocol.Py4JJavaError: An error occurred while calling o3782.getResult. "
        "(caused by org.apache.kafka.common.errors.TimeoutException: Timeout of 60000ms expired)"
    )
    driver = (
        "java.util.concurrent.ExecutionException: org.apache.kafka.common.errors.TimeoutException: Timed out\n"
        "\tat java.base/java.util.concurrent.CompletableFuture.reportGet(CompletableFuture.java:396)\n"
        "Caused by: org.apache.kafka.common.errors.TimeoutException: Timed out\n"
    )
    assert error_line(driver) == driver.splitlines()[0]  # the root cause already said
