"""Delta's transaction log, read and written by hand where a JVM costs too much (the Delta protocol, PROTOCOL.md).

Read: what a scheduler or a health check needs is small (the newest rows of `batches`, a results table) and must
not wait for a Spark JVM; pyarrow reads the data files the log says are live (`delta_snapshot`, `read_delta`). A
commit's provenance (`commit_info`) is one line of its file, where Delta's history API takes 0.2-0.4 s (1.5 s the
first time in a JVM) to list it.

Written: a local path table's version 0 and its checksum, as Delta's `CREATE TABLE` writes them (`first_commit`),
without the Spark job and Delta transaction that cost ~1 s per table at every fresh start. Only with the Delta
release it was compared with (`DELTA_RELEASE`, `writes_first_commits`; `tests/integration/test_tables.py` compares
the files with Delta's own): with another, tables are created by Delta, in SQL.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from importlib import metadata
from pathlib import Path

DELTA_RELEASE = "4.4.0"  # delta-spark, whose CREATE TABLE `first_commit` writes as


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


def commit_info(path: str | Path, version: int) -> dict | None:
    """The `commitInfo` action of a local table's commit (operation, userName, ... as its writer recorded them), {}
    when the commit has none; None when the commit's file is gone (log retention) or not local."""
    try:
        text = (Path(path) / "_delta_log" / f"{version:020d}.json").read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    for line in text.splitlines():
        if '"commitInfo"' in line:
            action = json.loads(line)
            if "commitInfo" in action:
                return action["commitInfo"]
    return {}


VERSION_FILE = re.compile(r"^\d{20}\.(json|checkpoint\b)")


def has_version(path: str) -> bool:
    """Whether a path table has a commit or checkpoint, not just a log folder: a creation killed half-way leaves an
    empty log behind."""
    log = os.path.join(path, "_delta_log")
    return os.path.isdir(log) and any(VERSION_FILE.match(f) for f in os.listdir(log))


def clear_unfinished(path: str) -> None:
    """Remove the log folder a creation killed half-way left without a version (`has_version`): Delta takes a path
    whose folder holds anything for an existing table, and would skip creating it."""
    log = os.path.join(path, "_delta_log")
    if os.path.isdir(log) and not has_version(path):
        shutil.rmtree(log, ignore_errors=True)


def writes_first_commits() -> bool:
    """Whether `first_commit` writes as this process's Delta would (its release is `DELTA_RELEASE`)."""
    try:
        return metadata.version("delta-spark") == DELTA_RELEASE
    except metadata.PackageNotFoundError:
        return False


def first_commit(path: str, schema_json: str, configuration: dict[str, str]) -> None:
    """Create a path table: its version 0 and that version's checksum as `CREATE TABLE` writes them (protocol
    1/2, the schema, no partitions, its properties), without the Spark job and Delta transaction that cost ~1 s per
    table. If another writer created the table first, theirs stands."""
    log = os.path.join(path, "_delta_log")
    os.makedirs(log, exist_ok=True)
    now = int(time.time() * 1000)
    protocol = {"minReaderVersion": 1, "minWriterVersion": 2}
    metadata = {
        "id": str(uuid.uuid4()),
        "format": {"provider": "parquet", "options": {}},
        "schemaString": schema_json,
        "partitionColumns": [],
        "configuration": configuration,
        "createdTime": now,
    }
    commit = {"timestamp": now, "operation": "CREATE TABLE", "isBlindAppend": True}
    actions = [{"commitInfo": commit}, {"protocol": protocol}, {"metaData": metadata}]
    if _write_new(os.path.join(log, f"{0:020d}.json"), "".join(json.dumps(a) + "\n" for a in actions)):
        # with the checksum Delta reads version 0's protocol and schema from the file, not with a Spark job (which
        # a stream starting there, `read_stream`, would wait for behind busy cores)
        counts = {"tableSizeBytes": 0, "numFiles": 0, "numMetadata": 1, "numProtocol": 1}
        none = {"setTransactions": [], "domainMetadata": [], "allFiles": []}
        checksum = counts | none | {"metadata": metadata, "protocol": protocol}
        _write_new(os.path.join(log, f"{0:020d}.crc"), json.dumps(checksum))


def _write_new(path: str, text: str) -> bool:
    """Write a file whole, atomically, unless it exists (False: another writer's stands)."""
    tmp = os.path.join(os.path.dirname(path), f".{uuid.uuid4().hex}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    try:
        os.link(tmp, path)  # atomic, and never over an existing file
        return True
    except FileExistsError:
        return False
    finally:
        os.remove(tmp)
