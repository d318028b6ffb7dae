"""Failure notifier of the fraud-rules DAGs (no DAG here): every failed task is logged as an alert and appended,
as one JSON line, to the alert log (`FRAUDRULES_ALERT_LOG`, default `$AIRFLOW_HOME/fraudrules-alerts.jsonl`) that
an on-call channel tails. Swap in a provider's notifier (Slack, SMTP, ...) where one is installed: the DAGs pass
`on_failure_callback=[TaskFailed()]`.
"""

from __future__ import annotations

import json
import os
import time

from airflow.sdk import BaseNotifier


def alert_log() -> str:
    home = os.environ.get("AIRFLOW_HOME", os.path.expanduser("~/airflow"))
    return os.environ.get("FRAUDRULES_ALERT_LOG", os.path.join(home, "fraudrules-alerts.jsonl"))


class TaskFailed(BaseNotifier):
    """Record a failed task: DAG, task, run, try, and the error it failed with."""

    def notify(self, context) -> None:
        ti = context["ti"]
        error = context.get("exception")
        alert = {
            "at": time.time(),
            "dag_id": ti.dag_id,
            "task_id": ti.task_id,
            "run_id": ti.run_id,
            "try_number": ti.try_number,
            "error": str(error)[:4000] if error else None,
        }
        self.log.error("ALERT fraudrules %s.%s failed: %s", ti.dag_id, ti.task_id, alert["error"])
        path = alert_log()
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(alert) + "\n")
