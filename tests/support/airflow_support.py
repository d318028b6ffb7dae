"""Airflow for the job environment's tests: Airflow lives in its own venv (.venv-airflow), so DAGs are loaded
and `dag.test()` is run in a subprocess of that venv's python (tests/airflow_runner.py), against a SQLite
metadata database migrated once per test session under a temporary AIRFLOW_HOME.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
RUNNER = Path(__file__).resolve().parent / "airflow_runner.py"
AIRFLOW_PYTHON = Path(os.environ.get("FRAUDRULES_AIRFLOW_PYTHON", REPO / ".venv-airflow" / "bin" / "python"))
JOB_PYTHON = Path(sys.executable)

needs_airflow = pytest.mark.skipif(
    not AIRFLOW_PYTHON.exists(),
    reason=f"no Airflow environment at {AIRFLOW_PYTHON} (make setup installs requirements-airflow.txt there)",
)


@functools.cache
def airflow_home() -> str:
    """A migrated SQLite AIRFLOW_HOME for this session (removed at exit)."""
    home = tempfile.mkdtemp(prefix="airflow-home-")
    atexit.register(shutil.rmtree, home, True)
    proc = subprocess.run(
        [str(AIRFLOW_PYTHON.parent / "airflow"), "db", "migrate"],
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return home


def _env(home: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=home,
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=str(DAGS),
        AIRFLOW__CORE__UNIT_TEST_MODE="False",
        AIRFLOW__LOGGING__LOGGING_LEVEL="INFO",
        FRAUDRULES_JOB_PYTHON=str(JOB_PYTHON),
        FRAUDRULES_ALERT_LOG=os.path.join(home, "alerts.jsonl"),
        # a workspace that only the faked HTTP layer answers (tests/support/airflow_runner.py test-databricks)
        AIRFLOW_CONN_DATABRICKS_DEFAULT=json.dumps(
            {"conn_type": "databricks", "host": "https://workspace.example", "password": "token"}
        ),
        PYSPARK_PYTHON=str(JOB_PYTHON),
        PYSPARK_DRIVER_PYTHON=str(JOB_PYTHON),
    )
    return env


def run_airflow(*args: str, timeout: float = 600) -> tuple[dict, str]:
    """Run tests/airflow_runner.py in the Airflow venv; (its JSON answer, its whole output)."""
    proc = subprocess.run(
        [str(AIRFLOW_PYTHON), str(RUNNER), *args],
        env=_env(airflow_home()),
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = proc.stdout
    if proc.returncode != 0:
        raise AssertionError(f"airflow runner {args[:2]} exited {proc.returncode}:\n{output[-6000:]}")
    return json.loads(output.strip().splitlines()[-1]), output


def last_json(cmd: list[str], timeout: float = 600, **kwargs) -> dict:
    """Run a command that ends its output with one JSON line; that line, parsed (the command must succeed)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def dag_test(dag_id: str, conf: dict, timeout: float = 600) -> tuple[dict, str]:
    return run_airflow("test", dag_id, json.dumps(conf), timeout=timeout)


def dag_test_databricks(dag_id: str, conf: dict, workspace: dict, timeout: float = 300) -> tuple[dict, str]:
    """`dag_test` against a faked Databricks workspace (see airflow_runner.FakeWorkspace); adds its `calls`."""
    return run_airflow("test-databricks", dag_id, json.dumps(conf), json.dumps(workspace), timeout=timeout)


def alerts() -> list[dict]:
    """What the DAGs' failure notifier recorded in this session."""
    path = Path(airflow_home()) / "alerts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
