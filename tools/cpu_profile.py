"""Where a command's CPU goes, from /proc (Linux) while it runs: its process tree by kind of process, the Spark
driver JVM by kind of thread, and busy cores over time.

A process's or thread's CPU is its last sample (user + system time): one that ends between two samples loses at
most one interval of CPU; a thread that lives less than an interval is missed.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

TICK = os.sysconf("SC_CLK_TCK")
# The JVM's thread names as /proc shows them (the first 15 bytes), by what the threads do
THREAD_KINDS = (
    (re.compile(r"^Executor task"), "executor tasks"),
    (re.compile(r"CompilerThre"), "JIT compiler"),
    (re.compile(r"^Thread-\d+$"), "Py4J (calls from Python)"),
    (re.compile(r"^stream executio"), "stream threads (offsets, planning)"),
    (re.compile(r"^(VM Thread|GC Thread|G1 )"), "GC"),
)


@dataclass
class Proc:
    kind: str
    cpu: float


def _stat(path: str) -> tuple[str, int, float]:
    """(name, parent pid, CPU seconds) of a /proc stat file."""
    with open(path) as fh:
        text = fh.read()
    name, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
    return name, int(rest[1]), (int(rest[11]) + int(rest[12])) / TICK


def process_tree(root: int) -> dict[int, float]:
    """CPU seconds of process `root` and of every descendant alive now, by pid (empty once `root` is gone)."""
    children: dict[int, list[tuple[int, float]]] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            _, ppid, cpu = _stat(f"/proc/{name}/stat")
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append((int(name), cpu))
    try:
        found, stack = {root: _stat(f"/proc/{root}/stat")[2]}, [root]
    except (OSError, ValueError, IndexError):
        return {}
    while stack:
        for pid, cpu in children.get(stack.pop(), []):
            found[pid] = cpu
            stack.append(pid)
    return found


def process_kind(argv: list[str]) -> str:
    """What a process of a Spark command is: the driver JVM, a Python worker by its module, or its own name."""
    if not argv:
        return ""
    if os.path.basename(argv[0]) == "java":
        driver = "org.apache.spark.deploy.SparkSubmit" in argv and "org.apache.spark.launcher.Main" not in argv
        return "driver JVM" if driver else "java"
    if "-m" in argv:  # `python -m pyspark.daemon pyspark.worker`: the worker module is the last argument
        module = argv[-1] if argv[argv.index("-m") + 1] == "pyspark.daemon" else argv[argv.index("-m") + 1]
        return f"Python {module.rsplit('.', 1)[-1]}"
    return os.path.basename(argv[0])


def thread_kind(name: str) -> str:
    return next((kind for pattern, kind in THREAD_KINDS if pattern.search(name)), "other")


@dataclass
class Profile:
    seconds: float
    processes: dict[int, Proc]
    threads: Counter  # driver JVM CPU by thread kind
    timeline: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, tree CPU so far)

    @property
    def cpu(self) -> float:
        return sum(p.cpu for p in self.processes.values())

    def busy(self, every_s: float) -> list[float]:
        """Busy cores in each `every_s` of the run."""
        out, last = [], (0.0, 0.0)
        for t, cpu in self.timeline:
            if t - last[0] >= every_s:
                out.append((cpu - last[1]) / (t - last[0]))
                last = (t, cpu)
        return out

    def report(self, every_s: float = 5.0) -> list[str]:
        kinds: dict[str, list[float]] = {}
        for p in self.processes.values():
            kinds.setdefault(p.kind, []).append(p.cpu)
        by_cpu = sorted(kinds.items(), key=lambda kv: -sum(kv[1]))
        processes = ", ".join(f"{k} {sum(v):.1f} s" + (f" ({len(v)})" if len(v) > 1 else "") for k, v in by_cpu)
        jvm = sum(self.threads.values())
        threads = ", ".join(f"{k} {v:.1f} s" for k, v in self.threads.most_common())
        busy = " ".join(f"{b:.1f}" for b in self.busy(every_s))
        return [
            f"  {self.seconds:.1f} s wall, {self.cpu:.1f} s CPU ({self.cpu / self.seconds:.2f} of "
            f"{os.cpu_count()} cores busy on average)",
            f"  busy cores in each {every_s:g} s: {busy}",
            f"  by process (count): {processes}",
            f"  driver JVM by thread ({jvm:.1f} s seen): {threads}",
        ]


class Sampler(threading.Thread):
    """Samples the CPU of process `pid` and its descendants, and of the driver JVM's threads, until stop()."""

    def __init__(self, pid: int, interval_s: float = 0.25):
        super().__init__(daemon=True)
        self.pid, self.interval_s, self._halt = pid, interval_s, threading.Event()
        self.processes: dict[int, Proc] = {}
        self.threads: dict[int, tuple[str, float]] = {}
        self.timeline: list[tuple[float, float]] = []
        self.started = time.monotonic()

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval_s)

    def sample(self) -> None:
        for pid, cpu in process_tree(self.pid).items():
            # named at every sample: `spark-class` (bash) becomes the driver JVM by exec, under the same pid
            kind = process_kind(_argv(pid)) or (self.processes[pid].kind if pid in self.processes else "?")
            proc = self.processes[pid] = Proc(kind, cpu)
            if proc.kind == "driver JVM":
                self._sample_threads(pid)
        self.timeline.append((time.monotonic() - self.started, sum(p.cpu for p in self.processes.values())))

    def _sample_threads(self, pid: int) -> None:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return
        for tid in tids:
            try:
                name, _, cpu = _stat(f"/proc/{pid}/task/{tid}/stat")
            except (OSError, ValueError, IndexError):
                continue
            self.threads[int(tid)] = (name, cpu)

    def stop(self) -> Profile:
        self._halt.set()
        self.join()
        threads: Counter = Counter()
        for name, cpu in self.threads.values():
            threads[thread_kind(name)] += cpu
        return Profile(time.monotonic() - self.started, self.processes, threads, self.timeline)


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return []
