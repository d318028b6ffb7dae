"""`make dq`: the data-quality DAG run locally (`airflow dags test`, target local), then a short summary.

    python -m tools.dq_local --data-dir data [--conf '{"max_age_minutes": 1440}']

Airflow's own output of the run (its task runner's lines, the job environment's) goes to
`<dq_dir>/logs/dag-test-<time>.log`; the console gets the run's summary from the report its `validate` task wrote:
per table what was read and its checks passed and failed, every failed check, where Data Docs, the offline
summary page and the log are. The exit status is the DAG run's: non-zero when a check failed or nothing could be
checked.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from fraudrules.ops.report import QualityReport

REPO = Path(__file__).resolve().parents[1]
AIRFLOW = REPO / ".venv-airflow" / "bin" / "airflow"
DAG_ID = "fraud_data_quality"
FAILURE = re.compile(r"(?:AirflowFailException|Error|Exception): (\S.*)$")


def airflow_env(data_dir: Path) -> dict[str, str]:
    """A local Airflow: its home (SQLite) under the data dir, the repository's DAGs, no examples, and not its
    warning that `airflow dags test` could draw the DAG with graphviz (it is not installed, nor needed)."""
    return dict(
        os.environ,
        AIRFLOW_HOME=str(data_dir / "airflow"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
        PYTHONWARNINGS="ignore:Could not import graphviz:UserWarning",
    )


def reason(log: Path) -> str:
    """Why a run that wrote no report failed: the last error its log names."""
    found = [m.group(1).strip() for m in map(FAILURE.search, log.read_text(errors="replace").splitlines()) if m]
    return found[-1] if found else "see its log"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.dq_local", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default="data", help="the job's data dir (tables, checkpoints)")
    ap.add_argument("--conf", default="{}", help="more DAG params as a JSON object, e.g. '{\"max_age_minutes\": 1440}'")
    args = ap.parse_args(argv)
    data_dir = Path(args.data_dir).resolve()
    conf = {"target": "local", "data_dir": str(data_dir), **json.loads(args.conf)}
    dq_dir = Path(conf.get("dq_dir") or data_dir / "dq")
    log = dq_dir / "logs" / f"dag-test-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    before = set((dq_dir / "reports").glob("*.json"))
    env = airflow_env(data_dir)
    print(f"data quality of {data_dir}: Airflow DAG {DAG_ID}, target local (log: {log})", flush=True)
    with open(log, "w", encoding="utf-8") as out:
        code = subprocess.run([str(AIRFLOW), "db", "migrate"], stdout=out, stderr=subprocess.STDOUT, env=env).returncode
        if code == 0:
            test = [str(AIRFLOW), "dags", "test", DAG_ID, "-c", json.dumps(conf)]
            code = subprocess.run(test, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    written = sorted(set((dq_dir / "reports").glob("*.json")) - before, key=lambda p: p.stat().st_mtime)
    if written:
        for line in QualityReport.from_json(json.loads(written[-1].read_text())).summary_lines():
            print(line)
    else:
        print(f"the DAG run checked nothing: {reason(log)}")
        code = code or 1
    return code


if __name__ == "__main__":
    sys.exit(main())
