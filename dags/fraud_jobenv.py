"""The job environment's commands, run by the fraud-rules DAGs' tasks (no DAG here).

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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
