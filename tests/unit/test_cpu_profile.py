"""`make bench ARGS="--mode cpu"`'s sampler: what it calls each process and JVM thread, and the CPU it attributes."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from tools.cpu_profile import Proc, Profile, Sampler, process_kind, thread_kind

JAVA = "/usr/lib/jvm/java-17-openjdk-amd64/bin/java"
SUBMIT = "org.apache.spark.deploy.SparkSubmit"


def test_processes_are_named_by_what_they_run():
    assert process_kind([JAVA, "-cp", "jars/*", "-Xmx768m", SUBMIT, "pyspark-shell"]) == "driver JVM"
    launcher = ["java", "-Xmx128m", "-cp", "jars/*", "org.apache.spark.launcher.Main", SUBMIT, "pyspark-shell"]
    assert process_kind(launcher) == "java"
    assert process_kind(["/v/bin/python3", "-m", "pyspark.daemon", "pyspark.worker"]) == "Python worker"
    assert process_kind(["python3", "-m", "pyspark.daemon", "pyspark.sql.worker.create_data_source"]) == (
        "Python create_data_source"
    )
    runner = ["python3", "-m", "pyspark.sql.streaming.python_streaming_source_runner"]
    assert process_kind(runner) == "Python python_streaming_source_runner"
    assert process_kind(["/v/bin/python3", "-m", "fraudrules.cli", "backtest", "--fresh"]) == "Python cli"
    assert process_kind(["/bin/bash", "spark-class"]) == "bash"
    assert process_kind([]) == ""  # gone: the sampler keeps what it last called it


def test_jvm_threads_are_grouped_by_their_work():
    names = ["Executor task i", "C1 CompilerThre", "C2 CompilerThre", "Thread-12", "stream executio", "VM Thread"]
    assert [thread_kind(n) for n in names] == [
        "executor tasks",
        "JIT compiler",
        "JIT compiler",
        "Py4J (calls from Python)",
        "stream threads (offsets, planning)",
        "GC",
    ]
    assert thread_kind("GC Thread#1") == "GC"
    assert thread_kind("Thread-12-x") == "other"
    assert thread_kind("dag-scheduler-e") == "other"


BURN = "import time\nwhile time.process_time() < {s}: pass\n"


def test_the_cpu_of_a_process_and_of_its_child_is_counted_once_each():
    """A parent that burns 0.4 s of CPU beside a child that burns 0.6 s: both found, each with its own CPU (not the
    child's inside the parent's), and the run's busy cores add up to the total."""
    parent = f"import subprocess, sys\nc = subprocess.Popen([sys.executable, '-c', {BURN.format(s=0.6)!r}])\n"
    parent += BURN.format(s=0.4) + "c.wait()\n"
    proc = subprocess.Popen([sys.executable, "-c", parent])
    sampler = Sampler(proc.pid, interval_s=0.05)
    sampler.start()
    proc.wait()
    found = sampler.stop()
    cpus = sorted(p.cpu for p in found.processes.values())
    assert len(cpus) == 2
    assert 0.3 <= cpus[0] <= 0.55 and 0.5 <= cpus[1] <= 0.75, cpus
    assert abs(found.cpu - sum(cpus)) < 1e-9
    assert found.timeline[-1][1] == found.cpu
    assert not found.threads  # no driver JVM in this tree


def test_the_report_names_processes_threads_and_busy_cores():
    found = Profile(
        seconds=10.0,
        processes={1: Proc("Python cli", 1.0), 2: Proc("driver JVM", 12.0), 3: Proc("Python worker", 2.0)}
        | {4: Proc("Python worker", 1.5)},
        threads=Counter({"executor tasks": 8.0, "JIT compiler": 2.5}),
        timeline=[(1.0, 0.5), (5.0, 4.5), (6.0, 6.0), (10.0, 16.5)],
    )
    assert found.busy(5.0) == pytest.approx([0.9, 2.4])  # 4.5 s of CPU in the first 5 s, 12 s in the next
    lines = found.report(every_s=5.0)
    assert lines[0].startswith("  10.0 s wall, 16.5 s CPU (1.65 of ")
    assert lines[1] == "  busy cores in each 5 s: 0.9 2.4"
    assert lines[2] == "  by process (count): driver JVM 12.0 s, Python worker 3.5 s (2), Python cli 1.0 s"
    assert lines[3] == "  driver JVM by thread (10.5 s seen): executor tasks 8.0 s, JIT compiler 2.5 s"
