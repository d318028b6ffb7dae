"""Input paths as users give them: a JSON-lines file, a folder of them, or a glob (`landing/part-*.json`).

Standard library only: the command line checks paths with these before it starts Spark, and the file source
(`engine.lines`) reads the same three forms.
"""

from __future__ import annotations

import glob
import os

GLOB_CHARS = frozenset("*?[{")


def is_remote(path: str) -> bool:
    """A URI (`s3://...`, `abfss://...`, `dbfs:/...`): not checked or created locally."""
    return "://" in path or path.startswith("dbfs:")


def is_glob(path: str) -> bool:
    return any(c in GLOB_CHARS for c in path)


def _hadoop_glob(pattern: str) -> list[str]:
    """Files matching a Hadoop-style glob, `{a,b}` alternatives included (Python's glob has none)."""
    start = pattern.find("{")
    end = pattern.find("}", start)
    if start < 0 or end < 0:
        return sorted(glob.glob(pattern))
    head, options, tail = pattern[:start], pattern[start + 1 : end], pattern[end + 1 :]
    return sorted({m for option in options.split(",") for m in _hadoop_glob(head + option + tail)})


def input_files(path: str) -> list[str]:
    """The readable, non-hidden files `path` names now: itself, the files of a folder, or a glob's matches."""
    if os.path.isfile(path):
        candidates = [path]
    elif os.path.isdir(path):
        candidates = [os.path.join(path, n) for n in sorted(os.listdir(path))]
    elif is_glob(path):
        candidates = _hadoop_glob(path)
    else:
        return []
    visible = [p for p in candidates if os.path.isfile(p) and not os.path.basename(p).startswith((".", "_"))]
    return [p for p in visible if os.access(p, os.R_OK)]


def input_problem(path: str, what: str, must_have_files: bool = True) -> str | None:
    """Why `path` cannot be read as `what` (e.g. "--transactions"), or None when it can.

    With `must_have_files` (a backtest) a folder or glob must hold at least one readable file; otherwise
    (a streaming job, which waits for files) a folder may be empty and a glob's folder must exist.
    """
    if is_remote(path):
        return None
    if os.path.isfile(path):
        return None if os.access(path, os.R_OK) else f"{what} {path}: file is not readable"
    if os.path.isdir(path):
        if not os.access(path, os.R_OK | os.X_OK):
            return f"{what} {path}: folder is not readable"
        if must_have_files and not input_files(path):
            return f"{what} {path}: folder holds no readable files"
        return None
    if is_glob(path):
        folder = os.path.dirname(path) or "."
        if not is_glob(folder) and not os.path.isdir(folder):
            return f"{what} {path}: no such folder {folder}"
        if must_have_files and not input_files(path):
            return f"{what} {path}: no readable file matches"
        return None
    return f"{what} {path}: no such file or folder"


def output_problem(path: str, what: str) -> str | None:
    """Why a file cannot be written at `path` (its folder is created when missing), or None."""
    if os.path.isdir(path):
        return f"{what} {path}: is a folder"
    folder = os.path.dirname(os.path.abspath(path))
    existing = folder
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{what} {path}: {existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{what} {path}: cannot write in {existing}"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"{what} {path}: file is not writable"
    return None
