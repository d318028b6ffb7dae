"""The JVM jars of a local session: the Delta and Kafka-connector jars (and the optional no-fork file system and
class-data archive) come from the folder named by `FRAUDRULES_JARS`, else, for an editable install (`make setup`),
from its repository's `.jars/spark`, which `make setup` fills with Maven: the same from any current folder. An
installed wheel has no jars of its own: it needs `FRAUDRULES_JARS`."""

from __future__ import annotations

import glob
import json
import os
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

JARS_ENV = "FRAUDRULES_JARS"
REQUIRED_JARS = ("delta-spark_", "delta-storage-")  # a local session cannot read or write a table without them


def source_tree() -> Path | None:
    """The repository of an editable install (`make setup`), as its record says (PEP 610: `direct_url.json`);
    None for an installed wheel."""
    try:
        record = json.loads(metadata.distribution("fraudrules").read_text("direct_url.json") or "{}")
    except metadata.PackageNotFoundError:
        return None
    url = urlparse(str(record.get("url", "")))
    editable = bool(record.get("dir_info", {}).get("editable"))
    return Path(unquote(url.path)) if editable and url.scheme == "file" else None


def jars_folder() -> str | None:
    """`FRAUDRULES_JARS`, else the `.jars/spark` of the repository of an editable install (None for a wheel)."""
    if os.environ.get(JARS_ENV):
        return os.path.abspath(os.environ[JARS_ENV])
    repo = source_tree()
    return str(repo / ".jars" / "spark") if repo else None


def jars_problem() -> str | None:
    """Why a local session cannot start for want of its jars, in one line; None when they are there."""
    folder = jars_folder()
    if folder is None:
        return (
            f"no Spark jars: set {JARS_ENV} to a folder holding the Delta and Kafka jars (an installed fraudrules has "
            "none of its own; `make setup` puts them in the repository's .jars/spark)"
        )
    names = [os.path.basename(p) for p in glob.glob(os.path.join(folder, "*.jar"))]
    if not names:
        return f"no jars in {folder}: run `make setup` in the repository, or point {JARS_ENV} at a folder of them"
    missing = [prefix for prefix in REQUIRED_JARS if not any(n.startswith(prefix) for n in names)]
    return f"no {' or '.join(m + '*.jar' for m in missing)} in {folder}: run `make setup` again" if missing else None


def jars_file(name: str) -> str | None:
    """A file of the jars folder (`local_runtime`'s no-fork file system jar, class-data archive); None without one."""
    folder = jars_folder()
    return os.path.join(folder, name) if folder else None


def local_jars() -> list[str]:
    """The jars of `jars_folder()`; raises RuntimeError saying why when they are not there."""
    problem = jars_problem()
    if problem:
        raise RuntimeError(problem)
    return sorted(glob.glob(os.path.join(str(jars_folder()), "*.jar")))
