"""Health of the continuous job, judged from what it leaves behind, without a JVM.

- heartbeat: the `batches` Delta table (one row per committed evaluate micro-batch), read from its log;
- runner: what runs the job — locally the process of the pid file that `fraudrules run` writes when it starts,
  whoever started it (`make run`, a shell, the supervisor `ops.supervisor`), on Databricks the job's active
  run (observed by the DAG, handed in as facts);
- latency: the p99 alert latency of recent batches, over a threshold or rising;
- lag: landing files the evaluate query has not read to the end (its source's ledger and committed offsets).

`judge` turns these into flags and one recommended action, the same rules for both DAG targets: "start" (not
running: stopped cleanly, which `fraudrules run` marks in its pid file, or dead), "restart" (running but no batch
committed for `stale_after_s` while input waits - its own generator, landing files it has not taken, or a source
this cannot see - or none at all within `startup_grace_s` of starting) or "none". An idle job without input commits
nothing and is left alone. Latency and lag are reported, not acted on: a restart does not make a slow job fast.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fraudrules.compat.delta_log import read_newest
from fraudrules.config import EVALUATE_QUERY, JobConfig

PID_FILE = "fraudrules-run.json"
LOG_FILE = "fraudrules-run.log"
RESTARTS_FILE = "restarts.jsonl"
LAST_STATUS_FILE = "monitor-last.json"
DEFAULT_RATE = 200.0  # `fraudrules run --rate` default


@dataclass(frozen=True)
class Thresholds:
    stale_after_s: float = 120.0  # no evaluate batch committed for this long while running: stalled
    startup_grace_s: float = 180.0  # a fresh process gets this long to commit its first batch
    p99_ms: float = 5_000.0  # alert latency p99 of the newest batch above this: latency_high
    rising_factor: float = 1.5  # newer half of recent batches' p99 this much above the older half: rising
    trend_batches: int = 20  # recent batches looked at for the latency trend
    lag_s: float = 300.0  # oldest landing file not yet taken by the evaluate query older than this: lag_high
    max_restarts_per_hour: int = 3  # more restarts than this in the last hour: crash loop


@dataclass(frozen=True)
class Runner:
    """What runs the job, as observed now."""

    launched: bool  # started at some point (otherwise: never started here)
    alive: bool
    started_at: float | None = None  # epoch seconds of the running process or run
    down: str = "not running"  # says what is not running, e.g. "process 123 is not running"
    stopped: bool = False  # not running after a clean stop: not dead, and no heartbeat is expected
    expects_input: bool = True  # input waits (own generator, pending files, or a source this cannot see)


def run_dir(data_dir: str) -> Path:
    """The local supervisor's folder: pid file, job log, restart history, last status."""
    return Path(data_dir).resolve() / "run"


# ------------------------------------------------------------------------------------------ observations


def heartbeat(data_dir: str, recent: int = 20, now: float | None = None) -> dict:
    """The newest evaluate batches: last commit, its age, watermark and recent p99 latencies (oldest first)."""
    now = time.time() if now is None else now
    path = Path(JobConfig(data_dir=data_dir).table("batches"))
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
        age_s=round(max(0.0, now - commit_ms / 1000), 3),  # committed while this looked: 0 s old
        watermark_ms=int(wm.iloc[-1]) if len(wm) else None,
        p99_ms=[round(float(v), 1) for v in df["latencyP99Ms"].dropna().tail(recent)],  # interpolated: 0.1 ms
    )
    return out


def lag(data_dir: str, now: float | None = None) -> dict:
    """Landing files the evaluate query has not read to the end yet, and the oldest one's age (by modification
    time)."""
    from fraudrules.engine.lines import unread

    now = time.time() if now is None else now
    cfg = JobConfig(data_dir=data_dir)
    out: dict = {"pending_files": 0, "oldest_pending_age_s": None}
    if not Path(cfg.landing).is_dir():
        return out
    pending = unread(cfg.landing, cfg.checkpoint(EVALUATE_QUERY))
    out["pending_files"] = len(pending)
    if pending:
        out["oldest_pending_age_s"] = round(now - min(e.mtime_ms for e in pending) / 1000, 3)
    return out


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, value: dict) -> None:
    """Replace `path` at once: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def register(data_dir: str, argv: list[str], pid: int | None = None, now: float | None = None) -> dict:
    """Record the job process (this one by default) in the data dir's pid file, which `process` reads. The
    supervisor writes the same record for the process it starts, with its log file, which is kept."""
    pid = os.getpid() if pid is None else pid
    path = run_dir(data_dir) / PID_FILE
    previous = read_json(path) or {}
    info = {
        "pid": pid,
        "started_at": time.time() if now is None else now,
        "argv": argv,
        "log": previous.get("log") if previous.get("pid") == pid else None,
    }
    write_json(path, info)
    return info


def mark_stopped(data_dir: str, pid: int | None = None, now: float | None = None) -> bool:
    """Record in the pid file that its process (this one by default) stopped cleanly, so that `status` tells a
    stopped job from a dead one. Only the process's own record: a job started since keeps its own."""
    pid = os.getpid() if pid is None else pid
    path = run_dir(data_dir) / PID_FILE
    info = read_json(path)
    if not info or info.get("pid") != pid:
        return False
    write_json(path, {**info, "stopped_at": round(time.time() if now is None else now, 3)})
    return True


def alive(pid: int) -> bool:
    """The process exists, is not a zombie, and is a `fraudrules run` (guards against pid reuse)."""
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
            args = (proc / "cmdline").read_bytes().split(b"\0")
            return any(b"fraudrules" in a for a in args) and b"run" in args
        except OSError:
            return False
    return True


def process(data_dir: str, now: float | None = None) -> dict:
    """The local job process of the supervisor's pid file: alive?, since when, at what generator rate."""
    now = time.time() if now is None else now
    info = read_json(run_dir(data_dir) / PID_FILE)
    if not info:
        return {
            "launched": False,
            "pid": None,
            "alive": False,
            "rate": 0.0,
            "started_at": None,
            "uptime_s": None,
            "stopped_at": None,
            "log": None,
        }
    is_alive = alive(int(info["pid"]))
    return {
        "launched": True,
        "pid": int(info["pid"]),
        "rate": generator_rate(info.get("argv") or []),
        "alive": is_alive,
        "started_at": round(float(info["started_at"]), 3),
        "uptime_s": round(now - float(info["started_at"]), 3) if is_alive else None,
        "stopped_at": info.get("stopped_at"),  # set by a clean stop
        "log": info.get("log"),
    }


def generator_rate(argv: list[str]) -> float:
    """The embedded generator's rate of a `fraudrules run` command line."""
    if "--no-generator" in argv:
        return 0.0
    return float(argv[argv.index("--rate") + 1]) if "--rate" in argv[:-1] else DEFAULT_RATE


def restarts_last_hour(data_dir: str, now: float | None = None) -> int:
    now = time.time() if now is None else now
    path = run_dir(data_dir) / RESTARTS_FILE
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.strip() and json.loads(line)["at"] > now - 3600)


# ------------------------------------------------------------------------------------------ judgement


def latency_rising(p99: list[float], factor: float) -> bool:
    """The newer half of the recent batches' p99 is `factor` times the older half's (median of each)."""
    if len(p99) < 6:
        return False
    half = len(p99) // 2
    older, newer = sorted(p99[:half]), sorted(p99[-half:])
    med_old, med_new = older[len(older) // 2], newer[len(newer) // 2]
    return med_old > 0 and med_new >= factor * med_old


def _stale(runner: Runner, beat: dict | None, th: Thresholds, now: float) -> bool:
    """No evaluate batch for too long while the job should be committing (unknown without a heartbeat)."""
    if beat is None:
        return False
    age = beat["age_s"]
    if not runner.alive:
        return runner.launched and not runner.stopped and (age is None or age > th.stale_after_s)
    # A batch committed before this process (or run) started is no sign of its life.
    own_batch = beat["last_commit_ms"] is not None and beat["last_commit_ms"] >= (runner.started_at or 0) * 1000
    if own_batch:
        return age > th.stale_after_s and runner.expects_input
    return now - (runner.started_at or now) > th.startup_grace_s


def judge(
    runner: Runner,
    beat: dict | None,
    th: Thresholds,
    now: float,
    backlog: dict | None = None,
    previous_lag: dict | None = None,
    restarts: int = 0,
) -> dict:
    """Flags, problems and the recommended action ("start", "restart" or "none") with its reason."""
    stale = _stale(runner, beat, th, now)
    age = (beat or {}).get("age_s")
    uptime = now - runner.started_at if runner.alive and runner.started_at is not None else None
    # Latency is a running job's: a stopped one's last batches may be its first ones, slow while it warmed up.
    p99 = ((beat or {}).get("p99_ms") or []) if runner.alive else []
    latency_high = bool(p99) and p99[-1] > th.p99_ms
    rising = latency_rising(p99, th.rising_factor)
    oldest = (backlog or {}).get("oldest_pending_age_s")
    pending = (backlog or {}).get("pending_files") or 0
    lag_high = oldest is not None and oldest > th.lag_s
    prev_pending = (previous_lag or {}).get("pending_files") or 0
    lag_rising = bool(
        prev_pending
        and pending > prev_pending
        and oldest is not None
        and oldest > ((previous_lag or {}).get("oldest_pending_age_s") or 0)
    )
    crash_loop = restarts > th.max_restarts_per_hour
    dead = runner.launched and not runner.alive and not runner.stopped

    if not runner.alive:
        action, reason = "start", runner.down if runner.launched else "never started here"
    elif stale:  # alive but not committing: hung
        action = "restart"
        reason = (
            f"stale heartbeat: last batch {age:.0f} s ago"
            if age is not None and uptime is not None and age < uptime
            else f"no batch committed in {uptime or 0:.0f} s since start"
        )
    else:
        action, reason = "none", "healthy"
    problems = []
    if stale:
        problems.append(reason if runner.alive else "stale heartbeat: " + _age_text(age))
    if dead:
        problems.append(f"dead: {runner.down}")
    if latency_high:
        problems.append(f"latency p99 {p99[-1]:.0f} ms > {th.p99_ms:g} ms")
    if rising:
        problems.append(f"latency rising (p99 of recent batches up {th.rising_factor:g}x)")
    if lag_high:
        problems.append(f"lag: oldest unprocessed landing file is {oldest:.0f} s old (> {th.lag_s:g} s)")
    if lag_rising:
        problems.append(f"lag rising: {pending} landing files pending")
    if crash_loop:
        problems.append(f"crash loop: {restarts} restarts in the last hour")
    flags = {
        "running": runner.alive,
        "dead": dead,
        "stopped": runner.launched and not runner.alive and runner.stopped,
        "stale_heartbeat": stale,
        "latency_high": latency_high,
        "latency_rising": rising,
        "lag_high": lag_high,
        "lag_rising": lag_rising,
        "crash_loop": crash_loop,
    }
    return {"flags": flags, "problems": problems, "action": action, "reason": reason, "thresholds": asdict(th)}


def _age_text(age: float | None) -> str:
    return "no evaluate batch committed yet" if age is None else f"last evaluate batch {age:.0f} s ago"


def judge_facts(facts: dict, th: Thresholds, now: float | None = None) -> dict:
    """`judge` over facts observed elsewhere (the Databricks DAG target): {"runner": {...}, "heartbeat": {...}}."""
    now = time.time() if now is None else now
    return judge(Runner(**facts["runner"]), facts.get("heartbeat"), th, now)


def status(
    data_dir: str, thresholds: Thresholds | None = None, now: float | None = None, remember: bool = True
) -> dict:
    """Health of the local job as a JSON-able dict; `action` is what the supervisor's `ensure` would do. With
    `remember`, kept for the next look's lag trend in the job's run folder, when there is one."""
    th = thresholds or Thresholds()
    now = time.time() if now is None else now
    proc, beat, backlog = process(data_dir, now), heartbeat(data_dir, th.trend_batches, now), lag(data_dir, now)
    # Input the job should be taking: its own generator (run --rate > 0), landing files it has not taken, or
    # a source this cannot see (no landing folder: Kafka). An idle job without input commits nothing.
    landing = Path(JobConfig(data_dir=data_dir).landing)
    expects_input = proc["rate"] > 0 or backlog["pending_files"] > 0 or not landing.is_dir()
    stopped = proc["stopped_at"] is not None
    runner = Runner(
        launched=proc["launched"],
        alive=proc["alive"],
        started_at=proc["started_at"],
        down=f"process {proc['pid']} " + ("stopped cleanly" if stopped else "is not running"),
        expects_input=expects_input,
        stopped=stopped,
    )
    previous = read_json(run_dir(data_dir) / LAST_STATUS_FILE) or {}
    restarts = restarts_last_hour(data_dir, now)
    verdict = judge(runner, beat, th, now, backlog, previous.get("lag"), restarts)
    out = {
        "data_dir": str(Path(data_dir).resolve()),
        "checked_at": round(now, 3),
        "process": proc,
        "heartbeat": beat,
        "lag": backlog,
        "flags": verdict["flags"],
        "restarts_last_hour": restarts,
        "problems": verdict["problems"],
        "action": verdict["action"],
        "reason": verdict["reason"],
        "thresholds": verdict["thresholds"],
    }
    if remember and run_dir(data_dir).is_dir():  # beside a job's pid file: a look creates nothing
        write_json(run_dir(data_dir) / LAST_STATUS_FILE, out)
    return out
