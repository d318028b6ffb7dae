"""A local supervisor of the continuous job: start `fraudrules run` detached, stop it, restart it, or do what
`fraudrules status` recommends (`ensure`). The local target of the `fraud_stream` DAG calls it:

    python -m fraudrules.ops.supervisor start  --data-dir data --rate 200
    python -m fraudrules.ops.supervisor ensure --data-dir data     # start / restart as the status recommends
    python -m fraudrules.ops.supervisor stop   --data-dir data

It writes the pid file, log and restart history under <data-dir>/run that `fraudrules.ops.health` reads.
Nothing here imports pyspark: the job runs as its own detached process.
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
from pathlib import Path

from fraudrules.config import JobConfig
from fraudrules.ops import health


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
    current = health.process(data_dir)
    if current["alive"]:
        return {"started": False, "pid": current["pid"], "reason": "already running", "log": current["log"]}
    rdir = health.run_dir(data_dir)
    rdir.mkdir(parents=True, exist_ok=True)
    # `fraudrules run` starts its file source before its generator writes the first file, and Spark refuses
    # a missing source folder: create it, so that a fresh data dir starts.
    Path(JobConfig(data_dir=data_dir).landing).mkdir(parents=True, exist_ok=True)
    python = python or sys.executable
    cmd = [python, "-m", "fraudrules.cli", "run", "--data-dir", str(Path(data_dir).resolve()), "--rate", f"{rate:g}"]
    if seconds:
        cmd += ["--seconds", f"{seconds:g}"]
    cmd += list(extra_args or [])
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", python)
    env.setdefault("PYSPARK_DRIVER_PYTHON", python)
    env["PYTHONUNBUFFERED"] = "1"
    log_path = rdir / health.LOG_FILE
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
    health.write_json(rdir / health.PID_FILE, info)  # the job writes the same record when it starts
    with open(rdir / health.RESTARTS_FILE, "a", encoding="utf-8") as fh:
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
    info = health.read_json(health.run_dir(data_dir) / health.PID_FILE)
    if not info:
        return {"stopped": False, "reason": "no pid file"}
    pid = int(info["pid"])
    pgid = pid  # started with start_new_session: the job leads its own process group
    if not health.alive(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)  # a dead leader may have left its JVM behind
        return {"stopped": False, "pid": pid, "reason": "not running"}
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGCONT)  # a frozen (SIGSTOPped) job cannot handle SIGINT
        os.kill(pid, signal.SIGINT)
    deadline = time.time() + timeout_s
    while time.time() < deadline and (health.alive(pid) or _group_alive(pgid)):  # the JVM exits after its driver
        _reap(pid)
        time.sleep(0.5)
    forced = health.alive(pid) or _group_alive(pgid)
    if forced:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        deadline = time.time() + 10
        while time.time() < deadline and (health.alive(pid) or _group_alive(pgid)):
            _reap(pid)
            time.sleep(0.2)
    _reap(pid)
    return {"stopped": True, "pid": pid, "forced": forced}


def restart(data_dir: str, reason: str = "restart", stop_timeout_s: float = 30.0, **start_kwargs) -> dict:
    stopped = stop(data_dir, stop_timeout_s)
    started = start(data_dir, reason=reason, **start_kwargs)
    return {"stopped": stopped, **started}


def ensure(data_dir: str, thresholds: health.Thresholds | None = None, **start_kwargs) -> dict:
    """Do what `status` recommends: start a job that is not running, restart one whose heartbeat is stale."""
    verdict = health.status(data_dir, thresholds)
    done: dict = {"action": "none"}
    if verdict["action"] == "start":
        done = {"action": "start", **start(data_dir, reason=verdict["reason"], **start_kwargs)}
    elif verdict["action"] == "restart":
        done = {"action": "restart", **restart(data_dir, reason=verdict["reason"], **start_kwargs)}
    return {"status": verdict, "done": done}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fraudrules.ops.supervisor", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default="data")
    launch = argparse.ArgumentParser(add_help=False)
    launch.add_argument("--rate", type=float, default=200.0, help="generated transactions per second (0: none)")
    launch.add_argument("--seconds", type=float, default=0.0, help="let the job stop itself after this long")
    launch.add_argument("--job-arg", action="append", default=[], help="extra argument for `fraudrules run`")
    launch.add_argument("--reason", help="why (recorded in run/restarts.jsonl)")
    sub.add_parser("start", parents=[common, launch], help="start the job detached")
    sp = sub.add_parser("stop", parents=[common], help="stop the job")
    sp.add_argument("--timeout-s", type=float, default=30.0)
    sub.add_parser("restart", parents=[common, launch], help="stop, then start")
    sub.add_parser("ensure", parents=[common, launch], help="start or restart as `fraudrules status` recommends")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    launch = {}
    if hasattr(args, "rate"):
        launch = {"rate": args.rate, "seconds": args.seconds, "extra_args": args.job_arg}
    reason = getattr(args, "reason", None)
    if args.command == "start":
        out = start(args.data_dir, reason=reason or "start", **launch)
    elif args.command == "stop":
        out = stop(args.data_dir, args.timeout_s)
    elif args.command == "restart":
        out = restart(args.data_dir, reason=reason or "restart", **launch)
    else:
        out = ensure(args.data_dir, **launch)
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
