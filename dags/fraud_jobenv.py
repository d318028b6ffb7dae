"""The job environment's commands, run by the fraud-rules DAGs' tasks, and the DAGs' shared defaults (no DAG here).

Airflow lives in its own venv; Spark, Great Expectations and fraudrules live in the job environment, whose python
(`job_python`) runs `python -m <module> ...` of the installed package (`fraudrules.cli`, the local supervisor
`fraudrules.ops.supervisor`) from the repository folder. Its log
lines (stderr) go to the task log as they come and its output (stdout) once it ends, so that nothing but the
command's own lines is there (no serialisation of the task's context into the other environment).
"""

from __future__ import annotations

import os
import subprocess
import threading
from datetime import timedelta
from pathlib import Path

from fraud_alerting import TaskFailed

REPO = Path(__file__).resolve().parents[1]
# The DAGs' defaults for their params: the job environment's python, the local data dir, where the job runs.
JOB_PYTHON = os.environ.get("FRAUDRULES_JOB_PYTHON", str(REPO / ".venv" / "bin" / "python"))
DATA_DIR = os.environ.get("FRAUDRULES_DATA_DIR", str(REPO / "data"))
TARGET = os.environ.get("FRAUDRULES_TARGET", "local")


def task_defaults(retry_delay: timedelta, execution_timeout: timedelta) -> dict:
    """The DAGs' task defaults: two retries, and failures recorded by the `fraud_alerting.TaskFailed` notifier."""
    return {
        "owner": "fraud-platform",
        "retries": 2,
        "retry_delay": retry_delay,
        "execution_timeout": execution_timeout,
        "on_failure_callback": [TaskFailed()],
    }


def job_command(
    python: str, module: str, *args: str, stdin: str | None = None, timeout: float = 120
) -> tuple[int, str, str]:
    """Run `python -m module args` of the job environment; (exit status, its stdout, the tail of its stderr)."""
    if not os.path.isfile(python):
        raise FileNotFoundError(f"job environment python {python} not found: run `make setup`")
    env = dict(os.environ, PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python)
    cmd = [python, "-m", module, *args]
    print("running:", " ".join(cmd), flush=True)
    tail: list[str] = []
    with subprocess.Popen(
        cmd, env=env, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:

        def relay() -> None:
            for line in proc.stderr:  # type: ignore[union-attr]
                print(line.rstrip(), flush=True)
                tail[:] = [*tail[-40:], line]

        relaying = threading.Thread(target=relay, daemon=True)
        relaying.start()
        proc.stdin.write(stdin or "")  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            out = proc.stdout.read()  # type: ignore[union-attr]
            proc.wait()
        finally:
            timer.cancel()
        relaying.join(timeout=5)
    if out:
        print(out.rstrip(), flush=True)
    return proc.returncode, out, "".join(tail)
