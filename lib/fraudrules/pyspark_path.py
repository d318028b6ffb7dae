"""Python workers import PySpark from the installed package, not from the zip Spark puts first on their path.

Spark starts each Python process it needs (a daemon per worker kind, the streaming source runners, the stateful
processors' driver worker) with `$SPARK_HOME/python/lib/pyspark.zip` and py4j's source zip at the head of its
PYTHONPATH. With a pip-installed PySpark those zips hold the files of the installed packages themselves, but Python
compiles what it imports from a zip at every start (it caches compiled files for folders only): 0.45 s of CPU more
per process, several of them one after the other before a job's first micro-batch. `make setup` installs a .pth file
in the environment that calls `prefer_installed` when its interpreter starts; elsewhere nothing calls it.

Only stdlib imports here: this runs at the start of every interpreter of the environment.
"""

from __future__ import annotations

import os
import re
import sys

PY4J_ZIP = re.compile(r"py4j-(.+)-src\.zip")


def redundant(entry: str, entries: list[str]) -> bool:
    """Whether `entry` is a zip of an installed PySpark's `python/lib` whose packages `entries` reach installed:
    `pyspark.zip` inside the `pyspark` package found on `entries`, or py4j's source zip of the installed py4j's
    release."""
    lib, name = os.path.split(entry)
    package = os.path.dirname(os.path.dirname(lib))  # <site>/pyspark from <site>/pyspark/python/lib
    site = os.path.dirname(package)
    if (
        not lib.endswith(os.path.join("python", "lib"))
        or os.path.basename(package) != "pyspark"
        or site not in entries
        or not os.path.isfile(os.path.join(package, "__init__.py"))
    ):
        return False
    if name == "pyspark.zip":
        return True
    py4j = PY4J_ZIP.fullmatch(name)
    return py4j is not None and os.path.isdir(os.path.join(site, f"py4j-{py4j.group(1)}.dist-info"))


def prefer_installed(entries: list[str] | None = None) -> None:
    """Remove the `redundant` zips from `entries` (by default the interpreter's path), in place."""
    entries = sys.path if entries is None else entries
    entries[:] = [e for e in entries if not redundant(e, entries)]
