"""Health of the continuous job, and a local launcher for it.

Health comes from what the job leaves behind, so that a scheduler (Airflow) can judge it without a JVM:

- heartbeat: the `batches` Delta table (one row per committed evaluate micro-batch), read straight from
  its transaction log and newest parquet files with pyarrow;
- process: the pid file written by `start` (local runs);
- latency: the p99 alert latency of recent batches, over a threshold or rising;
- lag: landing files newer than the newest file the evaluate query has taken (its file-source log).

`status()` turns these into flags and one recommended action: "start" (not running), "restart" (running
but no batch committed for `stale_after_s` while input waits - its own generator, landing files it has not
taken, or a source the monitor cannot see - or none at all within `startup_grace_s` of starting) or
"none". An idle job without input commits nothing and is left alone. Latency and lag are reported, not
acted on: a restart does not make a slow job fast.

    python -m fraudrules.monitor status  --data-dir data [--stale-after-s 120 ...]   # JSON on stdout
    python -m fraudrules.monitor start   --data-dir data --rate 200
    python -m fraudrules.monitor ensure  --data-dir data     # start / restart as status() recommends
    python -m fraudrules.monitor stop    --data-dir data

Nothing here imports pyspark: the launcher runs `python -m fraudrules.cli run` as a detached process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

EVALUATE_QUERY = "evaluate"  # fraudrules.job.EVALUATE_QUERY; job.py is not imported here because it imports pyspark
PID_FILE = "fraudrules-run.json"
LOG_FILE = "fraudrules-run.log"
RESTARTS_FILE = "restarts.jsonl"
LAST_STATUS_FILE = "monitor-last.json"


@dataclass(frozen=True)
class Thresholds:
    stale_after_s: float = 120.0  # no evaluate batch committed for this long while running: stalled
    startup_grace_s: float = 180.0  # a fresh process gets this long to commit its first batch
    p99_ms: float = 5_000.0  # alert latency p99 of the newest batch above this: latency_high
    rising_factor: float = 1.5  # newer half of recent batches' p99 this much above the older half: rising
    trend_batches: int = 20  # recent batches looked at for the latency trend
    lag_s: float = 300.0  # oldest landing file not yet taken by the evaluate query older than this: lag_high
    max_restarts_per_hour: int = 3  # more restarts than this in the last hour: crash loop


# ---------------------------------------------------------------------------------------------- paths


def run_dir(data_dir: str) -> Path:
    return Path(data_dir).resolve() / "run"


def table_path(data_dir: str, name: str) -> Path:
    return Path(data_dir).resolve() / "tables" / name


def landing_dir(data_dir: str) -> Path:
    return Path(data_dir).resolve() / "landing" / "transactions"  # JobConfig.landing default


def checkpoint_dir(data_dir: str, query: str = EVALUATE_QUERY) -> Path:
    return Path(data_dir).resolve() / "checkpoints" / query  # JobConfig.checkpoint default


# ------------------------------------------------------------------------------- Delta without a JVM


def delta_snapshot(path: str | Path) -> tuple[list[dict], list[str]]:
    """The live data files (`add` actions) and column names of a Delta table, from its last checkpoint plus
    later commits.

    Handles classic single- and multi-part checkpoints. Tables whose files carry deletion vectors, or
    that use V2 checkpoints, are refused (NotImplementedError) rather than misread.
    """
    import pyarrow.parquet as pq

    log = Path(path) / "_delta_log"
    if not log.is_dir():
        raise FileNotFoundError(f"no Delta table at {path}")
    files: dict[str, dict] = {}
    schema = None
    start = 0
    last = log / "_last_checkpoint"
    if last.exists():
        info = json.loads(last.read_text())
        if "v2Checkpoint" in info:
            raise NotImplementedError(f"{path}: V2 checkpoints are not read here; read the table with Spark")
        version = int(info["version"])
        parts = info.get("parts")
        names = (
            [f"{version:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, parts + 1)]
            if parts
            else [f"{version:020d}.checkpoint.parquet"]
        )
        for name in names:
            checkpoint = pq.read_table(log / name, columns=["add", "metaData"])
            for add in checkpoint.column("add").to_pylist():
                if add:
                    files[add["path"]] = add
            for meta in checkpoint.column("metaData").to_pylist():
                if meta:
                    schema = meta["schemaString"]
        start = version + 1
    commits = sorted((int(p.name[:20]), p) for p in log.glob("*.json") if p.name[:20].isdigit() and len(p.name) == 25)
    for version, commit in commits:
        if version < start:
            continue
        for line in commit.read_text().splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "add" in action:
                files[action["add"]["path"]] = action["add"]
            elif "remove" in action:
                files.pop(action["remove"]["path"], None)
            elif "metaData" in action:
                schema = action["metaData"]["schemaString"]
    for add in files.values():
        if add.get("deletionVector"):
            raise NotImplementedError(f"{path}: deletion vectors are not read here; read the table with Spark")
    columns = [f["name"] for f in json.loads(schema)["fields"]] if schema else []
    return list(files.values()), columns


def delta_files(path: str | Path) -> list[dict]:
    """The live data files (`add` actions) of a Delta table; see `delta_snapshot`."""
    return delta_snapshot(path)[0]


def _data_file(table: Path, add: dict) -> str:
    from urllib.parse import unquote, urlparse

    if add.get("partitionValues"):
        raise NotImplementedError(f"{table}: partitioned tables are not read here")
    url = urlparse(add["path"])
    if url.scheme in ("", "file"):
        path = Path(unquote(url.path))
        return str(path if path.is_absolute() else table / path)
    raise NotImplementedError(f"{table}: data file {add['path']} is not local")


def read_delta(path: str | Path, columns: list[str] | None = None, newest_files: int | None = None):
    """A local Delta table (or its `newest_files` newest data files) as pandas, without Spark."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    adds, names = delta_snapshot(path)
    adds = sorted(adds, key=lambda a: a.get("modificationTime", 0), reverse=True)
    if newest_files is not None:
        adds = adds[:newest_files]
    parts = [pq.read_table(_data_file(Path(path), add), columns=columns) for add in adds]
    rows = [t for t in parts if t.num_rows]
    if rows:
        return pa.concat_tables(rows, promote_options="default").to_pandas()
    if parts:  # typed, empty
        return parts[0].to_pandas()
    return pd.DataFrame(columns=columns or names)


def read_newest(path: str | Path, columns: list[str], max_files: int = 64):
    """Rows of the newest `max_files` data files of a Delta table (by modification time) as pandas."""
    return read_delta(path, columns, newest_files=max_files)


# ---------------------------------------------------------------------------------------------- health


def heartbeat(data_dir: str, recent: int = 20, now: float | None = None) -> dict:
    """The newest evaluate batches: last commit, its age, watermark and recent p99 latencies (oldest first)."""
    now = time.time() if now is None else now
    path = table_path(data_dir, "batches")
    out: dict = {"batches": 0, "last_batch_id": None, "last_commit_ms": None, "age_s": None, "watermark_ms": None}
    out["p99_ms"] = []
    if not (path / "_delta_log").is_dir():
        return out
    cols = ["query", "batchId", "committedAt", "watermarkMs", "latencyP99Ms"]
    df = read_newest(path, cols, max_files=4 * recent)
    df = df[df["query"] == EVALUATE_QUERY].sort_values("batchId")
    if df.empty:
        return out
    last = df.iloc[-1]
    commit_ms = int(last["committedAt"].value // 1_000_000)  # pandas Timestamp (UTC, naive) → epoch ms
    wm = df["watermarkMs"].dropna()
    out.update(
        batches=len(df),
        last_batch_id=int(last["batchId"]),
        last_commit_ms=commit_ms,
        age_s=round(now - commit_ms / 1000, 3),
        watermark_ms=int(wm.iloc[-1]) if len(wm) else None,
        p99_ms=[float(v) for v in df["latencyP99Ms"].dropna().tail(recent)],
    )
    return out


def lag(data_dir: str, now: float | None = None) -> dict:
    """Landing files the evaluate query has not taken yet (by modification time), and the oldest one's age."""
    now = time.time() if now is None else now
    landing, sources = landing_dir(data_dir), checkpoint_dir(data_dir) / "sources" / "0"
    out = {"pending_files": 0, "oldest_pending_age_s": None, "newest_taken_ms": None}
    if not landing.is_dir():
        return out
    newest_taken = -1
    logs = sorted(
        (p for p in sources.glob("*") if p.name.split(".")[0].isdigit()), key=lambda p: int(p.name.split(".")[0])
    )
    if logs:  # the file-source log of the newest batch (a .compact file holds every batch up to it)
        for line in logs[-1].read_text().splitlines()[1:]:
            if line.strip():
                newest_taken = max(newest_taken, int(json.loads(line).get("timestamp", -1)))
    pending = []
    with os.scandir(landing) as entries:
        for entry in entries:
            if entry.is_file() and not entry.name.startswith("."):
                mtime_ms = int(entry.stat().st_mtime * 1000)
                if mtime_ms > newest_taken:
                    pending.append(mtime_ms)
    out["pending_files"] = len(pending)
    out["newest_taken_ms"] = newest_taken if newest_taken >= 0 else None
    if pending:
        out["oldest_pending_age_s"] = round(now - min(pending) / 1000, 3)
    return out


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    """The process exists, is not a zombie, and is a fraudrules run (guards against pid reuse)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    proc = Path(f"/proc/{pid}")
    if proc.exists():
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return False
            return b"fraudrules" in (proc / "cmdline").read_bytes()
        except OSError:
            return False
    return True


def process(data_dir: str, now: float | None = None) -> dict:
    now = time.time() if now is None else now
    info = _read_json(run_dir(data_dir) / PID_FILE)
    if not info:
        return {
            "launched": False,
            "pid": None,
            "alive": False,
            "rate": 0.0,
            "started_at": None,
            "uptime_s": None,
            "log": None,
        }
    alive = _alive(int(info["pid"]))
    argv = info.get("argv") or []
    rate = float(argv[argv.index("--rate") + 1]) if "--rate" in argv[:-1] else 200.0  # `fraudrules run` default
    return {
        "launched": True,
        "pid": int(info["pid"]),
        "rate": rate,
        "alive": alive,
        "started_at": float(info["started_at"]),
        "uptime_s": round(now - float(info["started_at"]), 3) if alive else None,
        "log": info.get("log"),
    }


def restarts_last_hour(data_dir: str, now: float | None = None) -> int:
    now = time.time() if now is None else now
    path = run_dir(data_dir) / RESTARTS_FILE
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.strip() and json.loads(line)["at"] > now - 3600)


def _age_text(age: float | None) -> str:
    return "no evaluate batch committed yet" if age is None else f"last evaluate batch {age:.0f} s ago"


def latency_rising(p99: list[float], factor: float) -> bool:
    """The newer half of the recent batches' p99 is `factor` times the older half's (median of each)."""
    if len(p99) < 6:
        return False
    half = len(p99) // 2
    older, newer = sorted(p99[:half]), sorted(p99[-half:])
    med_old, med_new = older[len(older) // 2], newer[len(newer) // 2]
    return med_old > 0 and med_new >= factor * med_old


def status(
    data_dir: str, thresholds: Thresholds | None = None, now: float | None = None, remember: bool = True
) -> dict:
    """Health of the local job as a JSON-able dict; `action` is what `ensure` would do about it."""
    th = thresholds or Thresholds()
    now = time.time() if now is None else now
    proc, beat, backlog = process(data_dir, now), heartbeat(data_dir, th.trend_batches, now), lag(data_dir, now)
    previous = _read_json(run_dir(data_dir) / LAST_STATUS_FILE) or {}

    age = beat["age_s"]
    # Input the job should be taking: its own generator (run --rate > 0), landing files it has not taken, or
    # a source this monitor cannot see (no landing folder: Kafka). An idle job without input commits nothing.
    expects_input = proc["rate"] > 0 or backlog["pending_files"] > 0 or not landing_dir(data_dir).is_dir()
    stale = False  # no evaluate batch for too long while the job should be committing
    if proc["alive"]:
        # A batch committed before this process started is no sign of life of this process.
        own_batch = beat["last_commit_ms"] is not None and beat["last_commit_ms"] >= proc["started_at"] * 1000
        stale = (age > th.stale_after_s and expects_input) if own_batch else proc["uptime_s"] > th.startup_grace_s
    elif proc["launched"]:
        stale = age is None or age > th.stale_after_s
    p99 = beat["p99_ms"]
    latency_high = bool(p99) and p99[-1] > th.p99_ms
    rising = latency_rising(p99, th.rising_factor)
    oldest = backlog["oldest_pending_age_s"]
    lag_high = oldest is not None and oldest > th.lag_s
    prev_lag = previous.get("lag") or {}
    prev_pending = prev_lag.get("pending_files") or 0
    lag_rising = bool(
        prev_pending
        and backlog["pending_files"] > prev_pending
        and oldest is not None
        and oldest > (prev_lag.get("oldest_pending_age_s") or 0)
    )
    restarts = restarts_last_hour(data_dir, now)

    if not proc["alive"]:
        action = "start"
        reason = f"process {proc['pid']} is not running" if proc["launched"] else "never started here"
    elif stale:  # alive but not committing: hung
        action = "restart"
        reason = (
            f"stale heartbeat: last batch {age:.0f} s ago"
            if age is not None and age < proc["uptime_s"]
            else f"no batch committed in {proc['uptime_s']:.0f} s since start"
        )
    else:
        action, reason = "none", "healthy"
    problems = []
    if stale:
        problems.append(reason if proc["alive"] else "stale heartbeat: " + _age_text(age))
    if not proc["alive"] and proc["launched"]:
        problems.append(f"dead: process {proc['pid']} is gone")
    if latency_high:
        problems.append(f"latency p99 {p99[-1]:.0f} ms > {th.p99_ms:g} ms")
    if rising:
        problems.append(f"latency rising (p99 of recent batches up {th.rising_factor:g}x)")
    if lag_high:
        problems.append(f"lag: oldest unprocessed landing file is {oldest:.0f} s old (> {th.lag_s:g} s)")
    if lag_rising:
        problems.append(f"lag rising: {backlog['pending_files']} landing files pending")
    if restarts > th.max_restarts_per_hour:
        problems.append(f"crash loop: {restarts} restarts in the last hour")
    out = {
        "data_dir": str(Path(data_dir).resolve()),
        "checked_at": now,
        "process": proc,
        "heartbeat": beat,
        "lag": backlog,
        "flags": {
            "running": proc["alive"],
            "dead": proc["launched"] and not proc["alive"],
            "stale_heartbeat": stale,
            "latency_high": latency_high,
            "latency_rising": rising,
            "lag_high": lag_high,
            "lag_rising": lag_rising,
            "crash_loop": restarts > th.max_restarts_per_hour,
        },
        "restarts_last_hour": restarts,
        "problems": problems,
        "action": action,
        "reason": reason,
        "thresholds": asdict(th),
    }
    if remember:
        run_dir(data_dir).mkdir(parents=True, exist_ok=True)
        (run_dir(data_dir) / LAST_STATUS_FILE).write_text(json.dumps(out))
    return out


# ---------------------------------------------------------------------------------------------- launcher


def start(
    data_dir: str,
    rate: float = 200.0,
    seconds: float = 0.0,
    extra_args: list[str] | None = None,
    python: str | None = None,
    reason: str = "start",
    confirm_s: float = 3.0,
) -> dict:
    """Start `fraudrules run` detached (own session, output to a log file); return at once, never wait for it."""
    current = process(data_dir)
    if current["alive"]:
        return {"started": False, "pid": current["pid"], "reason": "already running", "log": current["log"]}
    rdir = run_dir(data_dir)
    rdir.mkdir(parents=True, exist_ok=True)
    # `fraudrules run` starts its file source before its generator writes the first file, and Spark refuses
    # a missing source folder: create it, so that a fresh data dir starts.
    landing_dir(data_dir).mkdir(parents=True, exist_ok=True)
    python = python or sys.executable
    cmd = [python, "-m", "fraudrules.cli", "run", "--data-dir", str(Path(data_dir).resolve()), "--rate", f"{rate:g}"]
    if seconds:
        cmd += ["--seconds", f"{seconds:g}"]
    cmd += list(extra_args or [])
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", python)
    env.setdefault("PYSPARK_DRIVER_PYTHON", python)
    env["PYTHONUNBUFFERED"] = "1"
    log_path = rdir / LOG_FILE
    with open(log_path, "ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {reason}: {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=rdir,
            env=env,
            start_new_session=True,
        )
    info = {"pid": proc.pid, "started_at": time.time(), "argv": cmd, "log": str(log_path)}
    (rdir / PID_FILE).write_text(json.dumps(info))
    with open(rdir / RESTARTS_FILE, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"at": info["started_at"], "pid": proc.pid, "reason": reason}) + "\n")
    deadline = time.time() + confirm_s
    while time.time() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"fraudrules run exited at once with code {proc.returncode}:\n{tail}")
        time.sleep(0.2)
    return {"started": True, "pid": proc.pid, "reason": reason, "log": str(log_path)}


def _group_alive(pgid: int) -> bool:
    """Some live (non-zombie) process is left in the process group."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)  # when this process happens to be its parent (tests, `restart`)


def stop(data_dir: str, timeout_s: float = 30.0) -> dict:
    """Ctrl-C the job (it stops its queries and Spark cleanly); kill its process group if that takes too long."""
    info = _read_json(run_dir(data_dir) / PID_FILE)
    if not info:
        return {"stopped": False, "reason": "no pid file"}
    pid = int(info["pid"])
    pgid = pid  # started with start_new_session: the job leads its own process group
    if not _alive(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)  # a dead leader may have left its JVM behind
        return {"stopped": False, "pid": pid, "reason": "not running"}
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGCONT)  # a frozen (SIGSTOPped) job cannot handle SIGINT
        os.kill(pid, signal.SIGINT)
    deadline = time.time() + timeout_s
    while time.time() < deadline and (_alive(pid) or _group_alive(pgid)):  # the JVM exits after its driver
        _reap(pid)
        time.sleep(0.5)
    forced = _alive(pid) or _group_alive(pgid)
    if forced:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        deadline = time.time() + 10
        while time.time() < deadline and (_alive(pid) or _group_alive(pgid)):
            _reap(pid)
            time.sleep(0.2)
    _reap(pid)
    return {"stopped": True, "pid": pid, "forced": forced}


def restart(data_dir: str, reason: str = "restart", stop_timeout_s: float = 30.0, **start_kwargs) -> dict:
    stopped = stop(data_dir, stop_timeout_s)
    started = start(data_dir, reason=reason, **start_kwargs)
    return {"stopped": stopped, **started}


def ensure(data_dir: str, thresholds: Thresholds | None = None, **start_kwargs) -> dict:
    """Do what `status` recommends: start a job that is not running, restart one whose heartbeat is stale."""
    health = status(data_dir, thresholds)
    done: dict = {"action": "none"}
    if health["action"] == "start":
        done = {"action": "start", **start(data_dir, reason=health["reason"], **start_kwargs)}
    elif health["action"] == "restart":
        done = {"action": "restart", **restart(data_dir, reason=health["reason"], **start_kwargs)}
    return {"status": health, "done": done}


# ------------------------------------------------------------------------------------------------ CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fraudrules.monitor", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default="data")
    th = argparse.ArgumentParser(add_help=False)
    defaults = Thresholds()
    for name in Thresholds.__dataclass_fields__:
        th.add_argument(
            f"--{name.replace('_', '-')}", type=type(getattr(defaults, name)), default=getattr(defaults, name)
        )
    launch = argparse.ArgumentParser(add_help=False)
    launch.add_argument("--rate", type=float, default=200.0, help="generated transactions per second (0: none)")
    launch.add_argument("--seconds", type=float, default=0.0, help="let the job stop itself after this long")
    launch.add_argument("--job-arg", action="append", default=[], help="extra argument for `fraudrules run`")
    launch.add_argument("--reason", help="why (recorded in run/restarts.jsonl)")
    sub.add_parser("status", parents=[common, th], help="health as JSON")
    sub.add_parser("start", parents=[common, launch], help="start the job detached")
    sp = sub.add_parser("stop", parents=[common], help="stop the job")
    sp.add_argument("--timeout-s", type=float, default=30.0)
    sub.add_parser("restart", parents=[common, launch], help="stop, then start")
    sub.add_parser("ensure", parents=[common, th, launch], help="start or restart as status recommends")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    th = None
    if hasattr(args, "stale_after_s"):
        th = Thresholds(**{name: getattr(args, name) for name in Thresholds.__dataclass_fields__})
    launch = {}
    if hasattr(args, "rate"):
        launch = {"rate": args.rate, "seconds": args.seconds, "extra_args": args.job_arg}
    reason = getattr(args, "reason", None)
    if args.command == "status":
        out = status(args.data_dir, th)
    elif args.command == "start":
        out = start(args.data_dir, reason=reason or "start", **launch)
    elif args.command == "stop":
        out = stop(args.data_dir, args.timeout_s)
    elif args.command == "restart":
        out = restart(args.data_dir, reason=reason or "restart", **launch)
    else:
        out = ensure(args.data_dir, th, **launch)
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
