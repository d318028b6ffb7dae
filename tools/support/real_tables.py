"""Tables and checkpoints of a real backtest (the job's own queries), shared by the e2e tests that check them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from fraudrules.generator import LoginWorkload, Workload, write_jsonl

REPO = Path(__file__).resolve().parents[2]
JOB_PYTHON = Path(sys.executable)

RULES = REPO / "tests" / "fixtures" / "rules.json"
LOGIN_RULE = {"ruleId": 100, "ruleState": "ACTIVE", "ruleType": "LOGIN_ANOMALY", "windowMinutes": 10}
SHADOW_RULE = {  # a candidate for the fixture's rule 1 with a lower limit, in SHADOW: hits in shadow_alerts
    "ruleId": 101,
    "ruleState": "SHADOW",
    "shadowOf": 1,
    "groupingKeyNames": ["payeeId", "beneficiaryId"],
    "aggregateFieldName": "paymentAmount",
    "aggregatorFunctionType": "SUM",
    "limitOperatorType": "GREATER",
    "limit": "15000",
    "windowMinutes": 20,
}
FIELDS = ("transactionId", "eventTime", "payeeId", "beneficiaryId", "paymentAmount", "paymentType")


def bad_records() -> list[bytes]:
    """One record per quarantine reason of ingest.parse()."""
    ok = {
        "transactionId": 9_000_001,
        "eventTime": 1_700_000_000_000,
        "payeeId": 1,
        "beneficiaryId": 2,
        "paymentAmount": "1.00",
        "paymentType": "CSH",
    }
    records = ["not json", json.dumps(ok)[:40]]  # not an object; an object cut short
    records += [json.dumps({k: v for k, v in ok.items() if k != name}) for name in FIELDS]
    records += [json.dumps(ok | {name: "abc"}) for name in ("transactionId", "eventTime", "payeeId", "beneficiaryId")]
    records += [
        json.dumps(ok | {"paymentAmount": "abc"}),
        json.dumps(ok | {"paymentAmount": "1.001"}),
        json.dumps(ok | {"paymentAmount": "10000000000000000000"}),
        json.dumps(ok | {"paymentType": "XXX"}),
        json.dumps(ok | {"eventTime": -5}),
        json.dumps(ok | {"ingestionTimestamp": "soon"}),
    ]
    return [r.encode() for r in records] + [json.dumps(ok).encode().replace(b"CSH", b"C\xffSH")]  # not UTF-8


def job_env() -> dict:
    return dict(os.environ, PYSPARK_PYTHON=str(JOB_PYTHON), PYSPARK_DRIVER_PYTHON=str(JOB_PYTHON))


def real_backtest(root: Path) -> Path:
    """A real backtest under `root`; its data dir (tables and checkpoints).

    3,000 transactions over ~20 minutes of event time (so the 1- and 5-minute windows retire events and the
    watermark matters) in one micro-batch, then a second one of records that each hit one quarantine reason,
    which runs with the watermark the first one set; 603 login events (the last of the attacks, every 100 events,
    ends past the 600th) over the same 20 minutes, failures left open at the end, for the login detector (rule 100,
    next to the fixture's rules); and a SHADOW candidate for rule 1 (rule 101, for shadow_alerts)."""
    landing, logins = root / "landing", root / "logins"
    write_jsonl(str(landing), Workload(count=3000, events_per_second=2.5).transactions(), per_file=3000)
    write_jsonl(str(logins), LoginWorkload(count=600, events_per_second=0.5, attack_every=100).events(), per_file=600)
    bad = landing / "zz-bad.json"
    bad.write_bytes(b"\n".join(bad_records()) + b"\n")
    later = time.time() + 2
    os.utime(bad, (later, later))  # taken last: its batch runs with the watermark of all the others
    rules = root / "rules.json"
    rules.write_text(json.dumps([*json.loads(RULES.read_text()), LOGIN_RULE, SHADOW_RULE]))
    cmd = [str(JOB_PYTHON), "-m", "fraudrules.cli", "backtest", "--transactions", str(landing), "--logins", str(logins)]
    cmd += ["--rules", str(rules), "--out", str(root / "alerts.jsonl"), "--data-dir", str(root / "data")]
    cmd += ["--max-records-per-trigger", "3000"]  # one micro-batch per file
    proc = subprocess.run(cmd, env=job_env(), capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert re.search(r"transactions: 3,000 valid, logins: 603 valid, 19 quarantined", proc.stdout), proc.stdout
    return root / "data"
