"""The command line as the README writes it: each command without extra options, in a fresh folder (so `data`
is the default data dir), its output quiet (no Spark or Python-worker chatter) and its results checked."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from fraudrules.config import QUERIES
from fraudrules.engine import ingest
from fraudrules.generator import LoginWorkload
from fraudrules.rules.model import load_rules_file
from tests.support import reference
from tools.support.real_tables import bad_records

FIXTURES = Path(__file__).parents[1] / "fixtures"
SAMPLE_RULES = Path(__file__).parents[2] / "lib" / "fraudrules" / "sample_rules.json"
FRAUDRULES = [sys.executable, "-m", "fraudrules.cli"]
CHATTER = ("Python worker", "StructType", "log4j", " WARN ", "WARNING", "Setting default log level")


def fraudrules(*args: str, cwd: Path, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess:
    """`fraudrules ARGS` in `cwd`; temporary folders (a backtest's default work dir) under `cwd` too."""
    environment = {**os.environ, "PYSPARK_PYTHON": sys.executable, "TMPDIR": str(cwd), **env}
    environment.pop("FRAUDRULES_LOG_LEVEL", None)
    return subprocess.run(
        [*FRAUDRULES, *args], cwd=cwd, capture_output=True, text=True, input=stdin, timeout=600, env=environment
    )


def assert_quiet(res: subprocess.CompletedProcess) -> None:
    """Only the command's own lines: nothing on stderr, none of Spark's or its workers' chatter anywhere."""
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr == "", res.stderr[-3000:]
    assert not [line for line in res.stdout.splitlines() if any(c in line for c in CHATTER)], res.stdout


@pytest.mark.e2e
def test_backtest_as_written_is_quiet_matches_the_reference_and_says_what_it_quarantined(tmp_path):
    """A folder of transactions, the fixture's and one bad record per reason: the alerts equal the reference's, and
    each quarantined record is counted per reason, the first ones printed with their file and line (from 1, as an
    editor counts), all of them beside the alerts; the backtest's temporary tables are gone."""
    (tmp_path / "in").mkdir()
    shutil.copy(FIXTURES / "transactions.jsonl", tmp_path / "in" / "a.jsonl")
    bad = bad_records()  # one per reason
    (tmp_path / "in" / "bad.jsonl").write_bytes(b"\n".join(bad) + b"\n")
    res = fraudrules(
        "backtest",
        "--transactions",
        "in",
        "--rules",
        str(FIXTURES / "rules.json"),
        "--out",
        "alerts.jsonl",
        cwd=tmp_path,
    )
    assert_quiet(res)
    lines = res.stdout.splitlines()
    assert lines[0] == f"transactions: 2,000 valid, logins: 0 valid, {len(bad)} quarantined, 0 late"
    assert lines[-1] == "wrote 4,478 alerts to alerts.jsonl"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alerts.jsonl", "alerts.quarantine.jsonl", "in"]
    alerts = {
        (a["ruleId"], a["transactionId"]): a
        for a in (json.loads(x, parse_float=Decimal) for x in (tmp_path / "alerts.jsonl").read_text().splitlines())
    }
    txs = [json.loads(line) for line in (FIXTURES / "transactions.jsonl").read_text().splitlines()]
    expected, _ = reference.run([txs], [load_rules_file(str(FIXTURES / "rules.json"))], 60_000)
    assert set(alerts) == set(expected) and len(expected) > 50
    for k, agg in expected.items():
        assert abs(Fraction(str(alerts[k]["aggregate"])) - agg) <= Fraction(1, 10**18)
    assert {a["ruleId"] for a in alerts.values()} >= {1, 2, 3, 4, 6, 7}
    assert all(isinstance(a["key"], dict) for a in alerts.values())
    assert all(a["eventTime"].endswith("Z") for a in alerts.values())

    rows = [json.loads(line) for line in (tmp_path / "alerts.quarantine.jsonl").read_text().splitlines()]
    assert sorted(r["reason"] for r in rows) == sorted(ingest.reasons())
    assert [r["srcPos"] for r in rows] == list(range(1, len(bad) + 1))
    assert [r["raw"] for r in rows] == [b.decode("utf-8", "backslashreplace") for b in bad]  # line srcPos of the file
    at = lines.index(
        f"quarantined: {len(bad)} records, all in alerts.quarantine.jsonl (kind, reason, srcName, srcPos, raw)"
    )
    assert lines[at + 1 : at + 1 + len(bad)] == [f"  1 × {r['reason']}" for r in rows]  # each reason once
    shown = lines[at + 1 + len(bad) : at + 6 + len(bad)]
    assert shown == [f"  {tmp_path}/in/bad.jsonl line {r['srcPos']}: {r['reason']}" for r in rows[:5]]


@pytest.mark.e2e
def test_missing_input_exits_2_at_once(tmp_path):
    res = fraudrules(
        "backtest",
        "--transactions",
        "nope.jsonl",
        "--rules",
        str(FIXTURES / "rules.json"),
        "--out",
        "a.jsonl",
        cwd=tmp_path,
    )
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr == "fraudrules backtest: --transactions nope.jsonl: no such file or folder\n"
    assert not (tmp_path / "a.jsonl").exists()


@pytest.mark.e2e
def test_a_single_login_file_a_glob_of_transaction_files_and_verbose(tmp_path):
    """`backtest --logins FILE` (a file, not a folder) and `--transactions 'GLOB'`, in one backtest; with
    --verbose, the Python workers' output that is quiet by default is back."""
    events = list(LoginWorkload(count=400, users=30, attack_every=40, seed=3).events())
    (tmp_path / "logins.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert_quiet(fraudrules("generate", "--out", "landing", "--count", "3000", "--per-file", "1000", cwd=tmp_path))
    (tmp_path / "landing" / "notes.txt").write_text("not a transaction\n")  # outside the glob
    res = fraudrules(
        "backtest",
        "--transactions",
        "landing/part-*.json",
        "--logins",
        "logins.jsonl",
        "--rules",
        str(SAMPLE_RULES),
        "--out",
        "alerts.jsonl",
        "--verbose",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Streaming TransformWithStateInPandas Python worker" in res.stderr
    assert res.stdout.startswith(f"transactions: 3,000 valid, logins: {len(events)} valid, 0 quarantined")
    alerts = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert {a["kind"] for a in alerts} == {"WINDOW", "LOGIN_ANOMALY"}
    assert {a["ruleId"] for a in alerts if a["kind"] == "WINDOW"} <= {1, 2, 3, 4, 5}


@pytest.mark.e2e
def test_rules_commands_as_written(tmp_path):
    rule = json.loads((FIXTURES / "rules.json").read_text())[0]
    (tmp_path / "rule.json").write_text(json.dumps(rule))
    assert fraudrules("rules", "put", "rule.json", cwd=tmp_path).stdout == "rule 1 v1 ACTIVE\n"
    assert (tmp_path / "data" / "tables" / "rules" / "_delta_log").is_dir()  # the default data dir
    assert fraudrules("rules", "pause", "1", cwd=tmp_path).stdout == "rule 1 v2 PAUSE\n"
    assert fraudrules("rules", "activate", "1", cwd=tmp_path).stdout == "rule 1 v3 ACTIVE\n"
    listed = fraudrules("rules", "list", cwd=tmp_path)
    assert_quiet(listed)
    assert (
        listed.stdout == "     1 v3    ACTIVE  SUM(paymentAmount) by payeeId, beneficiaryId over 20 min > 20,000.00\n"
    )
    missing = fraudrules("rules", "delete", "42", cwd=tmp_path)
    assert missing.returncode == 2 and "rule 42: no such rule" in missing.stderr
    nothing = fraudrules("rules", "history", "4242", cwd=tmp_path)
    assert (nothing.returncode, nothing.stdout, nothing.stderr) == (
        2,
        "",
        "fraudrules rules: rule 4242: no such rule\n",
    )
    deleted = fraudrules("rules", "delete", "1", "--author", "a.reviewer@example.com", cwd=tmp_path)
    assert deleted.stdout == "rule 1 v4 DELETE\n"
    revived = fraudrules("rules", "activate", "1", cwd=tmp_path)
    assert revived.returncode == 2 and "rule 1: is deleted: `rules put` its definition again" in revived.stderr
    assert fraudrules("rules", "put", "rule.json", cwd=tmp_path).stdout == "rule 1 v5 ACTIVE\n"
    history = fraudrules("rules", "history", "1", cwd=tmp_path).stdout.splitlines()
    assert [line.split()[0] for line in history] == ["v1", "v2", "v3", "v4", "v5"]
    states = {line.index(s) for line, s in zip(history, ["ACTIVE", "PAUSE", "ACTIVE", "DELETE", "ACTIVE"], strict=True)}
    assert len(states) == 1, history  # one column, whatever the authors' lengths
    invalid = [{**rule, "ruleId": 9, "aggregateFieldName": "colour", "windowMinutes": 0}]
    res = fraudrules("rules", "put", "-", stdin=json.dumps(invalid), cwd=tmp_path)
    assert res.returncode == 2
    assert "invalid rule 9" in res.stderr and "windowMinutes must be > 0" in res.stderr
    assert "aggregateFieldName: 'colour' is not in the event schema" in res.stderr
    res = fraudrules("rules", "put", "-", stdin="{oops", cwd=tmp_path)
    assert res.returncode == 2 and "malformed JSON" in res.stderr


@pytest.mark.e2e
def test_rules_through_a_rules_table_as_written(tmp_path):
    """`rules init-table` moves a data dir's rules into a table that admins edit with SQL; with `--rules-table`,
    `rules pause` writes that table (the job applies it) instead of the history."""
    rule = json.loads((FIXTURES / "rules.json").read_text())[0]
    (tmp_path / "rule.json").write_text(json.dumps(rule))
    assert fraudrules("rules", "put", "rule.json", cwd=tmp_path).returncode == 0
    alone = fraudrules("rules", "init-table", cwd=tmp_path)
    assert (alone.returncode, alone.stderr.splitlines()[-1]) == (
        2,
        "fraudrules rules: rules init-table needs --rules-table TABLE (a catalog name, or a path)",
    )
    table = str(tmp_path / "rules_admin")
    made = fraudrules("rules", "init-table", "--rules-table", table, cwd=tmp_path)
    assert_quiet(made)
    assert made.stdout == (
        f"created {table} (change data feed on) with 1 rule in force: run the job with --rules-table {table}, and "
        "edit the rules there (docs/rules.md)\n"
    )
    assert fraudrules("rules", "init-table", "--rules-table", table, cwd=tmp_path).stdout == (
        f"{table} exists already: nothing done\n"
    )
    paused = fraudrules("rules", "pause", "1", "--rules-table", table, cwd=tmp_path)
    assert paused.stdout == f"rule 1 v2 PAUSE -> {table} (the job applies it at its next micro-batch)\n"
    from deltalake import DeltaTable

    rows = DeltaTable(table).to_pyarrow_table(columns=["ruleId", "ruleState", "disabled"]).to_pylist()
    assert rows == [{"ruleId": 1, "ruleState": "PAUSE", "disabled": False}]
    listed = fraudrules("rules", "list", cwd=tmp_path).stdout
    assert " v1    ACTIVE " in listed  # the history's: the pause is the job's to apply


@pytest.mark.e2e
def test_export_and_status_as_written(tmp_path, backtest_data):
    (tmp_path / "data").symlink_to(backtest_data)
    res = fraudrules("export", "alerts", "--out", "a.jsonl", cwd=tmp_path)
    assert_quiet(res)
    rows = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert rows and res.stdout == f"wrote {len(rows):,} rows of alerts to a.jsonl\n"
    # one format of alerts in files: as the backtest wrote them (`key` an object, `eventTime` in UTC)
    assert rows == [json.loads(line) for line in (backtest_data.parent / "alerts.jsonl").read_text().splitlines()]
    res = fraudrules("export", "rules", "--out", "r.jsonl", cwd=tmp_path)
    assert_quiet(res)
    rules = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert rules and all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", r["updatedAt"]) for r in rules), (
        rules[0]
    )
    status = fraudrules("status", "--data-dir", "data", cwd=tmp_path)
    assert status.returncode == 0 and "action" in json.loads(status.stdout)


@pytest.mark.e2e
def test_status_knows_the_job_whichever_command_started_it(tmp_path):
    """`fraudrules run` started as `make run` starts it (not by the supervisor): `status` sees its process and, once
    it commits, its heartbeat; a second job on the same data dir is refused. A SIGTERM to its process group (a
    service manager's stop, Airflow killing a task: the JVM gets it too) stops it cleanly, without a traceback, and
    it then reads as stopped, not dead."""
    log = (tmp_path / "run.log").open("w")
    environment = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    job = subprocess.Popen(
        [*FRAUDRULES, "run", "--rate", "50"],
        cwd=tmp_path,
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline, status = time.time() + 240, {}
        while time.time() < deadline and not (status.get("heartbeat") or {}).get("batches"):
            time.sleep(2)
            looked = fraudrules("status", cwd=tmp_path)  # exit 2 ("no data dir") until the job recorded itself
            status = json.loads(looked.stdout) if looked.returncode == 0 else {}
            assert job.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        assert status["flags"]["running"] and status["process"]["pid"] == job.pid, status
        assert (status["action"], status["reason"]) == ("none", "healthy") and status["heartbeat"]["age_s"] < 60
        second = fraudrules("run", cwd=tmp_path)
        assert (second.returncode, second.stderr) == (
            2,
            f"fraudrules run: a job already runs on {tmp_path / 'data'}: process {job.pid}\n",
        )
    finally:
        os.killpg(job.pid, signal.SIGTERM)
        job.wait(timeout=180)
        log.close()
    printed = (tmp_path / "run.log").read_text()
    assert job.returncode == 0 and "stopped cleanly" in printed and "Traceback" not in printed, printed[-3000:]
    assert all(f"[{q}] stopped\n" in printed for q in QUERIES), printed[-3000:]  # each query's own last line
    after = json.loads(fraudrules("status", cwd=tmp_path).stdout)
    assert (after["flags"]["running"], after["flags"]["dead"], after["flags"]["stopped"]) == (False, False, True)
    assert (after["action"], after["reason"]) == ("start", f"process {job.pid} stopped cleanly")
    # lag: on a loaded machine the generator's last files may wait at the stop; a stopped job has no other problem
    assert [p for p in after["problems"] if not p.startswith("lag")] == [], after["problems"]
