"""The local driver JVM's options, checked against the JDK that runs them; where a session finds its jars."""

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from fraudrules import jars, local_runtime


def final_flags(options: str) -> dict[str, str]:
    out = subprocess.run(
        ["java", *shlex.split(options), "-XX:+PrintFlagsFinal", "-version"], capture_output=True, text=True, check=True
    ).stdout
    return {f[1]: f[3] for f in (line.split() for line in out.splitlines()) if len(f) >= 4 and f[2] == "="}


@pytest.mark.parametrize("short_lived", [False, True])
def test_the_jit_keeps_a_full_size_code_cache(short_lived, monkeypatch):
    """C1 alone defaults to a 48 MiB code cache, which a backtest fills (the JVM then stops compiling and
    prints a warning on stdout): short-lived sessions keep the tiered JIT's 240 MiB."""
    monkeypatch.delenv(local_runtime.JIT_ENV, raising=False)
    flags = final_flags(local_runtime.jvm_options(short_lived))
    assert flags["TieredStopAtLevel"] == ("1" if short_lived else "4")
    assert int(flags["ReservedCodeCacheSize"]) >= 240 * 2**20


def test_a_short_lived_session_that_runs_long_keeps_the_tiered_jit_and_the_small_heap(monkeypatch):
    """A backtest of a large input (`backtest.long_running`): the tiered JIT pays off, the heap stays a command's."""
    monkeypatch.delenv(local_runtime.JIT_ENV, raising=False)
    flags = final_flags(local_runtime.jvm_options(short_lived=True, tiered_jit=True))
    assert flags["TieredStopAtLevel"] == "4"
    assert (flags["UseSerialGC"], flags["UseG1GC"]) == ("true", "false")


@pytest.mark.parametrize("short_lived", [False, True])
def test_short_lived_sessions_keep_a_small_heap_committed_as_used(short_lived, monkeypatch):
    """A command's heap holds one bounded micro-batch: 768m with the serial collector (G1 grew it to its maximum);
    the continuous job keeps G1 and 3g; a session may ask for more (the data-quality run). FRAUDRULES_DRIVER_MEMORY
    overrides them all."""
    monkeypatch.delenv(local_runtime.DRIVER_MEMORY_ENV, raising=False)
    flags = final_flags(local_runtime.jvm_options(short_lived))
    assert (flags["UseSerialGC"], flags["UseG1GC"]) == (("true", "false") if short_lived else ("false", "true"))
    assert local_runtime.driver_memory(short_lived) == ("768m" if short_lived else "3g")
    assert local_runtime.driver_memory(short_lived, local_runtime.QUALITY_HEAP) == "2g"  # a session that needs more
    monkeypatch.setenv(local_runtime.DRIVER_MEMORY_ENV, "1g")
    assert local_runtime.driver_memory(short_lived) == local_runtime.driver_memory(short_lived, "2g") == "1g"


@pytest.mark.parametrize(("choice", "short_lived", "level"), [("c1", False, "1"), ("tiered", True, "4")])
def test_the_jit_environment_variable_chooses_for_every_session(choice, short_lived, level, monkeypatch):
    """FRAUDRULES_JIT (the test suite sets c1) overrides the session's own choice, and names what it takes."""
    monkeypatch.setenv(local_runtime.JIT_ENV, choice)
    flags = final_flags(local_runtime.jvm_options(short_lived, tiered_jit=True))
    assert flags["TieredStopAtLevel"] == level and int(flags["ReservedCodeCacheSize"]) >= 240 * 2**20
    monkeypatch.setenv(local_runtime.JIT_ENV, "C2")
    with pytest.raises(ValueError, match="FRAUDRULES_JIT='C2': c1 or tiered"):
        local_runtime.jvm_options(short_lived)


def test_only_the_continuous_job_commits_its_heap_at_launch():
    """Its heap is its steady state from the first minute (G1 grew the soak's heap in steps over an hour)."""
    flags = final_flags(local_runtime.jvm_options(short_lived=False, fixed_heap="1g"))
    assert (flags["InitialHeapSize"], flags["AlwaysPreTouch"]) == (str(2**30), "true")
    assert final_flags(local_runtime.jvm_options(short_lived=False))["AlwaysPreTouch"] == "false"


def test_only_the_lowest_java_priority_is_niced():
    """Background threads (Thread.MIN_PRIORITY) run at nice 19; every other priority maps to nice 0."""
    flags = final_flags(local_runtime.jvm_options(short_lived=False))
    assert flags["ThreadPriorityPolicy"] == "1"
    assert flags["JavaPriority1_To_OSPriority"] == "19"
    assert {flags[f"JavaPriority{p}_To_OSPriority"] for p in range(2, 11)} == {"0"}


@pytest.mark.parametrize(
    ("master", "built", "expected"),
    [
        ("local[2]", True, {"spark.hadoop.fs.file.impl": local_runtime.LOCAL_FS}),
        ("local[2]", False, {}),  # not built (Maven failed): Hadoop's own local file system
        ("local[*]", True, {"spark.hadoop.fs.file.impl": local_runtime.LOCAL_FS}),
        ("local", True, {"spark.hadoop.fs.file.impl": local_runtime.LOCAL_FS}),
        ("local-cluster[2,1,1024]", True, {}),  # executors in other JVMs would not have the class
        ("spark://host:7077", True, {}),
    ],
)
def test_the_no_fork_local_file_system_only_where_it_is_built_and_the_session_is_local(
    tmp_path, monkeypatch, master, built, expected
):
    monkeypatch.setenv("FRAUDRULES_JARS", str(tmp_path))
    jar = tmp_path / local_runtime.LOCAL_FS_JAR
    if built:
        jar.parent.mkdir()
        jar.write_bytes(b"")
    options = local_runtime.local_fs_options(master)
    assert {k: v for k, v in options.items() if k != "spark.driver.extraClassPath"} == expected
    assert options.get("spark.driver.extraClassPath") == (str(jar) if expected else None)


def test_an_editable_install_finds_its_repositorys_jars_from_any_folder(tmp_path, monkeypatch):
    """`make setup` installs the project editable: its jars are the repository's, wherever the command runs."""
    repo = Path(__file__).resolve().parents[2]
    monkeypatch.delenv(jars.JARS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert jars.source_tree() == repo
    assert jars.jars_folder() == str(repo / ".jars" / "spark")
    monkeypatch.setenv(jars.JARS_ENV, "elsewhere")  # the setting wins, relative to the current folder
    assert jars.jars_folder() == str(tmp_path / "elsewhere")
    assert jars.jars_problem() == (
        f"no jars in {tmp_path / 'elsewhere'}: run `make setup` in the repository, or point FRAUDRULES_JARS at a "
        "folder of them"
    )


def test_the_malloc_setting_for_a_launched_jvm_keeps_what_the_environment_says(monkeypatch):
    """A local JVM and its Python workers get glibc's fixed mmap threshold, unless the environment sets one."""
    ((key, value),) = local_runtime.MALLOC_ENV.items()
    monkeypatch.delenv(key, raising=False)
    local_runtime.malloc_env()
    assert os.environ[key] == value == "1048576"
    monkeypatch.setenv(key, "65536")
    local_runtime.malloc_env()
    assert os.environ[key] == "65536"
