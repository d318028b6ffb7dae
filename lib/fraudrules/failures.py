"""A command's Spark side died: say so in one line (what died, the likely cause, the setting to change) instead
of the Py4J tracebacks a dead JVM leaves behind.

- The local JVM (driver and, locally, executors) exits with 52 on an `OutOfMemoryError` (Spark's handler of
  uncaught errors); killed with SIGKILL, it was most likely the system's out-of-memory killer.
- A Python worker (a stateful processor, the file source's reader) that dies fails its task with "Python worker
  exited unexpectedly (crashed)"; locally a failed task fails the query.
"""

from __future__ import annotations

import signal
import subprocess

from fraudrules.local_runtime import DRIVER_MEMORY_ENV, launched_heap

JVM_OUT_OF_MEMORY = 52  # SparkExitCode.OOM
BATCH_HINT = "smaller micro-batches with --max-records-per-trigger"


def jvm_exit_status(wait_s: float = 0.0) -> int | None:
    """The exit status of the JVM this process launched, once it has exited (a signal as its negative number),
    waiting up to `wait_s` for it; None while it runs, or when this process did not launch one (a cluster's
    session)."""
    from fraudrules.compat.spark_jvm import launched_jvm

    proc = launched_jvm()
    if proc is None:
        return None
    try:
        return proc.wait(timeout=wait_s) if wait_s else proc.poll()
    except subprocess.TimeoutExpired:
        return None


def lost_connection(err: BaseException) -> bool:
    """The error, or one it came from, is a broken connection to the JVM (which closes its sockets as it exits,
    before it has exited: a large heap takes a moment to free)."""
    from py4j.protocol import Py4JNetworkError

    return any(isinstance(e, (Py4JNetworkError, ConnectionError)) for e in _chain(err))


def _chain(err: BaseException | None) -> list[BaseException]:
    """The error and every error it came from."""
    out: list[BaseException] = []
    while err is not None and all(err is not e for e in out):
        out.append(err)
        err = err.__cause__ or err.__context__
    return out


def explain(err: BaseException, status: int | None = None) -> str | None:
    """One line on why Spark failed under the command, or None when `err` is not such a failure. `status`: the
    JVM's exit status (default: looked up)."""
    if status is None:
        status = jvm_exit_status(wait_s=10.0 if lost_connection(err) else 0.0)
    text = "\n".join(f"{type(e).__name__}: {e}" for e in _chain(err))
    heap = (
        f"the Spark JVM ran out of heap memory (java.lang.OutOfMemoryError); give it more with "
        f"{DRIVER_MEMORY_ENV} (now {launched_heap()}) or use {BATCH_HINT}"
    )
    if status is not None:
        if status == JVM_OUT_OF_MEMORY or "java.lang.OutOfMemoryError" in text:
            return heap
        if status == -signal.SIGKILL:
            return (
                "the Spark JVM was killed (SIGKILL), most likely by the system's out-of-memory killer; free memory, "
                f"lower {DRIVER_MEMORY_ENV} (now {launched_heap()}) or use {BATCH_HINT}"
            )
        how = f"signal {-status}" if status < 0 else f"status {status}"
        return f"the Spark JVM exited unexpectedly ({how}); run again with --verbose to see its log"
    if "Python worker exited unexpectedly" in text:
        return (
            "a Spark Python worker died (killed or crashed), most likely out of memory; free memory or use "
            f"{BATCH_HINT}"
        )
    if "java.lang.OutOfMemoryError" in text:
        return heap
    return None
