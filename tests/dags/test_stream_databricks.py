"""fraud_stream's Databricks path, against a stand-in for the provider's hook (run in the Airflow venv)."""

from __future__ import annotations

import textwrap

from tests.support.airflow_support import AIRFLOW_PYTHON, DAGS, last_json, needs_airflow

pytestmark = [needs_airflow]

SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, sys, time

    spec = importlib.util.spec_from_file_location("fraud_stream", sys.argv[1])
    dag_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dag_module)

    class Hook:
        def __init__(self, runs, continuous):
            self.runs, self.continuous, self.calls = runs, continuous, []

        def find_job_id_by_name(self, name):
            return 7 if name == "fraudrules-streaming" else None

        def _do_api_call(self, endpoint, body):
            if endpoint[1] == "2.2/jobs/runs/list":
                assert body == {"job_id": 7, "active_only": "true"}
                return {"runs": self.runs}
            assert endpoint[1] == "2.2/jobs/get"
            return {"settings": {"continuous": self.continuous} if self.continuous else {}}

        def cancel_run(self, run_id):
            self.calls.append(["cancel", run_id])

        def update_job(self, job_id, settings):
            self.calls.append(["update", job_id, settings])

        def run_now(self, body):
            self.calls.append(["run_now", body])
            return 99

        def get_run_page_url(self, run_id):
            return f"https://workspace/run/{run_id}"

    params = {p: v.value if hasattr(v, "value") else v for p, v in dag_module.DAG.params.items()}
    params |= {"target": "databricks", "stale_after_s": 120, "startup_grace_s": 180}
    now_ms = int(time.time() * 1000)
    running = [{"run_id": 5, "start_time": now_ms - 3_600_000, "state": {"life_cycle_state": "RUNNING"}}]
    cases = {
        "paused": (Hook([], {"pause_status": "PAUSED"}), None),
        "triggered": (Hook([], None), None),
        "hung": (Hook(running, {"pause_status": "UNPAUSED"}), {"last_commit_ms": now_ms - 600_000,
                  "age_s": 600.0, "p99_ms": []}),
        "healthy": (Hook(running, {"pause_status": "UNPAUSED"}), {"last_commit_ms": now_ms - 5_000,
                    "age_s": 5.0, "p99_ms": [10.0] * 6 + [90.0] * 6}),
    }
    out = {}
    for name, (hook, beat) in cases.items():
        dag_module._databricks_hook = lambda p, hook=hook: hook
        dag_module._databricks_heartbeat = lambda p, beat=beat: beat
        health = dag_module._databricks_status(params)
        done = dag_module._databricks_heal(params, health) if health["action"] != "none" else None
        out[name] = {"health": health, "done": done, "calls": hook.calls}
    print(json.dumps(out))
    """
)


def test_databricks_start_restart_and_latency():
    out = last_json([str(AIRFLOW_PYTHON), "-c", SCRIPT, str(DAGS / "fraud_stream.py")], timeout=120)

    paused = out["paused"]
    assert paused["health"]["action"] == "start" and paused["health"]["job_id"] == 7
    assert paused["calls"] == [["update", "7", {"continuous": {"pause_status": "UNPAUSED"}}]]

    assert out["triggered"]["calls"] == [["run_now", {"job_id": 7}]]
    assert out["triggered"]["done"]["url"] == "https://workspace/run/99"

    hung = out["hung"]
    assert hung["health"]["action"] == "restart" and hung["health"]["flags"]["stale_heartbeat"]
    assert hung["calls"] == [["cancel", 5]]  # the continuous trigger starts the next run

    healthy = out["healthy"]
    assert healthy["health"]["action"] == "none" and healthy["calls"] == []
    assert healthy["health"]["flags"]["latency_rising"] and not healthy["health"]["flags"]["latency_high"]
