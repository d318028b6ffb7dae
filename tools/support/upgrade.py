"""A data dir left by a released commit, kept as a fixture (`tests/fixtures/upgrade-<commit>.tar.gz`): what an upgrade
resumes. `make` builds it with that commit's own library, taken from the repository's history
(`tools/upgrade_fixture.py` calls it); `tests/e2e/test_upgrade.py` resumes it with this one.

The released job runs on the first part of the input (`write_part(0)`) as `fraudrules run --no-generator
--available-now` and is killed with SIGKILL once every table has commits and the evaluate query's outbox holds
micro-batches not yet in Delta: the fixture has tables, checkpoints (state, offsets, file ledgers) and a non-empty
outbox. The file sources' ledgers name their files by absolute path, as Spark's own file source does: a checkpoint
cannot move, so the data dir is made and unpacked at `ROOT`.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from fraudrules.config import EVALUATE_QUERY, JobConfig
from fraudrules.engine.outbox import OUTBOX_FOLDER, Outbox
from fraudrules.generator import LoginWorkload
from tools.support.real_tables import LOGIN_RULE, RULES, bad_records

REPO = Path(__file__).resolve().parents[2]
COMMIT = "a5f864d"  # the released commit the fixture was made with
FIXTURE = REPO / "tests" / "fixtures" / f"upgrade-{COMMIT}.tar.gz"
ROOT = Path("/tmp/fraudrules-upgrade-fixture")  # where the data dir is made and unpacked (see above)
DATA_DIR = ROOT / "data"
MANIFEST = "manifest.json"
SHARDS = "4"  # fixed for the life of a checkpoint: the released job's and the resumed one's
SPLIT = 0.6  # the share of the input the released job sees
LOGINS = LoginWorkload(count=400, events_per_second=4.0, attack_every=100)
TRANSACTIONS = REPO / "tests" / "fixtures" / "transactions.jsonl"  # every one valid


def rules_file() -> Path:
    """The fixture's rules (loaded by the released job into its empty rules table) for a backtest to use."""
    path = ROOT / "rules.json"
    path.write_text(json.dumps([*json.loads(RULES.read_text()), LOGIN_RULE]))
    return path


def _split(lines: list[bytes], part: int) -> list[bytes]:
    cut = int(len(lines) * SPLIT)
    return lines[:cut] if part == 0 else lines[cut:]


def write_part(part: int) -> None:
    """Part 0 (the released job's input) or 1 (what the resumed job reads next) into the landing folders, each file
    modified after the ones before: the file sources take files in modification-time order."""
    cfg = JobConfig(data_dir=str(DATA_DIR))
    transactions = TRANSACTIONS.read_bytes().splitlines()
    logins = [json.dumps(e).encode() for e in LOGINS.events()]
    files = {Path(cfg.landing) / f"part{part}.jsonl": _split(transactions, part)}
    files[Path(cfg.logins_landing) / f"part{part}.jsonl"] = _split(logins, part)
    # quarantined: the released job's rows count lines from 0, this one's from 1
    files[Path(cfg.landing) / f"part{part}-bad.jsonl"] = bad_records()
    for path, lines in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\n".join(lines) + b"\n")
        time.sleep(0.01)


def job_env(lib: Path | None = None) -> dict[str, str]:
    """The job's environment: the library of `lib` (default the installed one), its own temporary folder (the state
    cache)."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env["TMPDIR"] = str(ROOT / "tmp")
    (ROOT / "tmp").mkdir(parents=True, exist_ok=True)
    if lib is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(lib), env.get("PYTHONPATH", "")])
    return env


def run_job(*args: str, lib: Path | None = None) -> subprocess.Popen:
    """`fraudrules run --no-generator --available-now` on the fixture's data dir, in its own process group."""
    cmd = [sys.executable, "-m", "fraudrules.cli", "run", "--no-generator", "--available-now"]
    cmd += ["--data-dir", str(DATA_DIR), "--shards", SHARDS, *args]
    log = (ROOT / "run.log").open("ab")
    return subprocess.Popen(cmd, env=job_env(lib), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def pending() -> list[int]:
    """The evaluate query's micro-batches in its outbox, not yet committed to Delta."""
    return Outbox(os.path.join(JobConfig(data_dir=str(DATA_DIR)).checkpoint(EVALUATE_QUERY), OUTBOX_FOLDER)).pending()


def _committed(table: str) -> bool:
    """The table has a commit after its creation."""
    return (Path(JobConfig(data_dir=str(DATA_DIR)).table(table)) / "_delta_log" / f"{1:020d}.json").exists()


def previous_release(commit: str, into: Path) -> Path:
    """The library of `commit`, from the repository's history."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "lib"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into / "lib"


def make(commit: str = COMMIT, out: Path = FIXTURE, timeout_s: float = 600) -> dict:
    """Build the fixture with `commit`'s library; its manifest."""
    shutil.rmtree(ROOT, ignore_errors=True)
    lib = previous_release(commit, ROOT / "release")
    write_part(0)
    job = run_job("--rules", str(rules_file()), "--max-records-per-trigger", "50", lib=lib)
    deadline = time.time() + timeout_s
    while not (pending() and all(map(_committed, ("batches", "alerts", "transactions", "quarantine", "logins")))):
        if job.poll() is not None or time.time() > deadline:
            job.kill()
            raise RuntimeError(
                f"the released job ended before its kill point:\n{(ROOT / 'run.log').read_text()[-3000:]}"
            )
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGKILL)  # the driver, its JVM and Python workers at once: a crash
    job.wait()
    shutil.rmtree(DATA_DIR / "run")  # the dead job's pid file: a resumed job writes its own
    manifest = {"commit": commit, "root": str(ROOT), "outbox_pending": pending(), "made_at": time.time()}
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tar:
        tar.add(DATA_DIR, arcname="data")
        info = tarfile.TarInfo(MANIFEST)
        body = json.dumps(manifest, indent=1).encode()
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    return {**manifest, "bytes": out.stat().st_size}


def unpack(fixture: Path = FIXTURE) -> dict:
    """The fixture's data dir at `ROOT` (anything there before removed); its manifest."""
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    with tarfile.open(fixture) as tar:
        tar.extractall(ROOT, filter="data")
    return json.loads((ROOT / MANIFEST).read_text())
