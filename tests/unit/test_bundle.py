"""The Databricks Asset Bundle (databricks.yml + resources/*.yml) checked offline.

`problems(bundle)` lists every broken reference or missing field that `databricks bundle deploy`
would trip over; the bundle in the repository must have none, and each check is shown to fire on a
bundle broken on purpose. The jobs are also parsed by the `databricks-bundles` models (strict about
field names and enums) when that package is installed. The Databricks CLI itself is a Go binary
published on neither PyPI nor npm, so `databricks bundle validate` only runs where it is on PATH.
"""

from __future__ import annotations

import ast
import copy
import glob
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BUNDLE_FILE = ROOT / "databricks.yml"
VAR_REF = re.compile(r"\$\{var\.([A-Za-z0-9_]+)\}")
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))


# ------------------------------------------------------------------ loading


def load_bundle(path: Path = BUNDLE_FILE) -> dict[str, Any]:
    """databricks.yml with its included files; each job remembers the folder its paths are relative to."""
    bundle = yaml.safe_load(path.read_text())
    bundle["_root"] = path.parent
    bundle["_files"] = {str(path): bundle.copy()}
    jobs: dict[str, Any] = {}
    for pattern in bundle.get("include", []):
        for name in sorted(glob.glob(str(path.parent / pattern))):
            part = yaml.safe_load(Path(name).read_text()) or {}
            bundle["_files"][name] = part
            for key, job in (part.get("resources", {}).get("jobs") or {}).items():
                assert key not in jobs, f"job {key} defined twice"
                jobs[key] = {**job, "_dir": Path(name).parent}
    for key, job in (bundle.get("resources", {}).get("jobs") or {}).items():
        jobs[key] = {**job, "_dir": path.parent}
    bundle["_jobs"] = jobs
    return bundle


def notebook_params(path: Path) -> set[str]:
    """Keys of the `notebook.params({...})` dict in the notebook's cell tagged "parameters"."""
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            source = "".join(cell["source"])
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "params":
                    return {k.value for k in node.args[0].keys}
    raise AssertionError(f"{path.name}: no parameters cell calling notebook.params")


def pyproject(folder: Path) -> dict[str, Any]:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((folder / "pyproject.toml").read_text())


def _strings(node: Any):
    if isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)
    elif isinstance(node, str):
        yield node


# ------------------------------------------------------------------ the checks


def problems(bundle: dict[str, Any]) -> list[str]:
    out: list[str] = []
    root: Path = bundle["_root"]
    declared = set(bundle.get("variables") or {})

    if not bundle.get("bundle", {}).get("name"):
        out.append("bundle.name is missing")
    for name, var in (bundle.get("variables") or {}).items():
        if not isinstance(var, dict) or "description" not in var or "default" not in var:
            out.append(f"variable {name} needs a description and a default")

    # every ${var.X}, in any file, is declared; targets only override declared variables
    for fname, content in bundle["_files"].items():
        for text in _strings({k: v for k, v in content.items() if not k.startswith("_")}):
            for ref in VAR_REF.findall(text):
                if ref not in declared:
                    out.append(f"{Path(fname).name}: ${{var.{ref}}} is not a declared variable")

    targets = bundle.get("targets") or {}
    for name, target in targets.items():
        for var in (target or {}).get("variables") or {}:
            if var not in declared:
                out.append(f"target {name} sets undeclared variable {var}")
    for name, target in targets.items():
        host = ((target or {}).get("workspace") or {}).get("host") or ""
        if not host.startswith("https://") or VAR_REF.search(host):
            out.append(f"target {name} needs its own workspace.host (an https URL; variables are not resolved there)")
    dev, prod = targets.get("dev") or {}, targets.get("prod") or {}
    if dev.get("mode") != "development" or dev.get("default") is not True:
        out.append("target dev must be the default, in development mode")
    if prod.get("mode") != "production":
        out.append("target prod must be in production mode")
    if not (prod.get("run_as") or {}).get("service_principal_name") and not (prod.get("run_as") or {}).get("user_name"):
        out.append("target prod needs run_as")
    if not prod.get("permissions"):
        out.append("target prod needs permissions")
    for perm in prod.get("permissions") or []:
        if perm.get("level") not in ("CAN_VIEW", "CAN_MANAGE_RUN", "CAN_MANAGE"):
            out.append(f"prod permission level {perm.get('level')!r} is not valid for jobs")

    # artifacts: a wheel built from a folder with a pyproject
    wheels = {}
    for name, art in (bundle.get("artifacts") or {}).items():
        folder = (root / art.get("path", ".")).resolve()
        if art.get("type") != "whl":
            out.append(f"artifact {name} is not a wheel")
        if not (folder / "pyproject.toml").is_file():
            out.append(f"artifact {name}: no pyproject.toml in {folder}")
        if not art.get("build"):
            out.append(f"artifact {name} has no build command")
        wheels[name] = folder
    if not wheels:
        out.append("no wheel artifact")

    jobs = bundle["_jobs"]
    if not jobs:
        out.append("no jobs")
    for key, job in jobs.items():
        out += [f"job {key}: {p}" for p in job_problems(job, wheels, bundle.get("variables") or {})]
    if not any(job.get("continuous") for job in jobs.values()):
        out.append("no continuous job")
    for key, job in jobs.items():
        if not job.get("continuous") and (job.get("schedule") or job.get("trigger")):
            out.append(f"job {key} is scheduled by the bundle: Airflow (dags/) schedules and triggers it")
    return out


def job_problems(job: dict[str, Any], wheels: dict[str, Path], variables: dict[str, Any]) -> list[str]:
    out: list[str] = []
    here: Path = job["_dir"]
    if not job.get("name"):
        out.append("no name")
    tasks = job.get("tasks") or []
    if not tasks:
        out.append("no tasks")
    clusters = {c.get("job_cluster_key"): c for c in job.get("job_clusters") or []}
    environments = {e.get("environment_key") for e in job.get("environments") or []}
    keys = [t.get("task_key") for t in tasks]
    if None in keys or len(set(keys)) != len(keys):
        out.append(f"every task needs a unique task_key, got {keys}")
    continuous = bool(job.get("continuous"))
    if continuous and job["continuous"].get("pause_status") != "UNPAUSED":
        out.append("continuous job must be UNPAUSED")
    if job.get("schedule") and not job["schedule"].get("quartz_cron_expression"):
        out.append("schedule without quartz_cron_expression")
    if not (job.get("email_notifications") or {}).get("on_failure"):
        out.append("no email on failure")
    if not job.get("tags"):
        out.append("no tags")
    for task in tasks:
        tk = task.get("task_key")
        compute = [k for k in ("job_cluster_key", "existing_cluster_id", "environment_key", "new_cluster") if k in task]
        if len(compute) != 1:
            out.append(
                f"task {tk} needs exactly one of job_cluster_key/existing_cluster_id/environment_key, has {compute}"
            )
        if "job_cluster_key" in task and task["job_cluster_key"] not in clusters:
            out.append(f"task {tk}: job cluster {task['job_cluster_key']!r} is not defined")
        if "environment_key" in task and task["environment_key"] not in environments:
            out.append(f"task {tk}: environment {task['environment_key']!r} is not defined")
        for dep in task.get("depends_on") or []:
            if continuous:
                out.append(f"task {tk}: a continuous job's tasks must not depend on each other")
            elif dep.get("task_key") not in keys:
                out.append(f"task {tk} depends on unknown task {dep.get('task_key')!r}")
        kinds = [k for k in task if k.endswith("_task")]
        if len(kinds) != 1:
            out.append(f"task {tk} needs exactly one *_task, has {kinds}")
        if "notebook_task" in task:
            nb = (here / task["notebook_task"].get("notebook_path", "")).resolve()
            if not nb.is_file():
                out.append(f"task {tk}: notebook {nb} does not exist")
            else:
                unknown = set(task["notebook_task"].get("base_parameters") or {}) - notebook_params(nb)
                if unknown:
                    out.append(f"task {tk}: base_parameters {sorted(unknown)} are not widgets of {nb.name}")
        if "python_wheel_task" in task:
            wt = task["python_wheel_task"]
            project = {f: pyproject(f)["project"] for f in wheels.values() if (f / "pyproject.toml").is_file()}
            names = {p["name"] for p in project.values()}
            scripts = {s for p in project.values() for s in p.get("scripts", {})}
            if wt.get("package_name") not in names:
                out.append(f"task {tk}: package {wt.get('package_name')!r} is not built by the bundle ({names})")
            if wt.get("entry_point") not in scripts:
                out.append(f"task {tk}: entry point {wt.get('entry_point')!r} is not in [project.scripts]")
            elif wt.get("entry_point") == "fraudrules":
                out += [f"task {tk}: {p}" for p in cli_problems(wt.get("parameters") or [], variables)]
        for lib in task.get("libraries") or []:
            if "whl" in lib:
                pattern = (here / lib["whl"]).resolve()
                if not any(pattern.parent == folder / "dist" for folder in wheels.values()):
                    out.append(f"task {tk}: library {lib['whl']} is not the dist/ of a wheel artifact")
        if ("notebook_task" in task or "python_wheel_task" in task) and not any(
            "whl" in lib for lib in task.get("libraries") or []
        ):
            out.append(f"task {tk} does not install the wheel")
    if continuous:
        for key, cluster in clusters.items():
            conf = (cluster.get("new_cluster") or {}).get("spark_conf") or {}
            if conf.get("spark.sql.streaming.stateStore.providerClass") != ROCKSDB:
                out.append(f"job cluster {key} does not use the RocksDB state store")
    for key, cluster in clusters.items():
        new = cluster.get("new_cluster") or {}
        for field in ("spark_version", "node_type_id"):
            if not new.get(field):
                out.append(f"job cluster {key} has no {field}")
        if "num_workers" not in new and "autoscale" not in new:
            out.append(f"job cluster {key} needs num_workers or autoscale")
    return out


def with_defaults(text: str, variables: dict[str, Any]) -> str:
    """`text` with each ${var.X} replaced by X's default."""
    return VAR_REF.sub(lambda m: str((variables.get(m.group(1)) or {}).get("default", "")), text)


def cli_problems(parameters: list[str], variables: dict[str, Any]) -> list[str]:
    """What `fraudrules <parameters>` would reject, the variables at their defaults."""
    from fraudrules.cli import parser

    args = [with_defaults(a, variables) for a in parameters]
    try:
        parser().parse_args(args)
    except SystemExit:
        return [f"`fraudrules {' '.join(args)}` is not a valid command line"]
    return []


# ------------------------------------------------------------------ tests


@pytest.fixture(scope="module")
def bundle() -> dict[str, Any]:
    return load_bundle()


def test_bundle_has_no_problems(bundle):
    assert problems(bundle) == []


def _options(task: dict[str, Any]) -> dict[str, str]:
    """A wheel task's `--option value` pairs."""
    params = task["python_wheel_task"]["parameters"]
    return {a: b for a, b in zip(params, [*params[1:], ""], strict=True) if a.startswith("--")}


def test_expected_resources(bundle):
    """Production runs the wheel: the streaming job is `fraudrules run` without the demo generator, on the
    bundle's tables, checkpoints and Kafka settings; the data-quality job checks the state those checkpoints hold."""
    jobs = bundle["_jobs"]
    streaming = jobs["fraudrules_streaming"]
    assert streaming["continuous"] == {"pause_status": "UNPAUSED"}
    (task,) = streaming["tasks"]
    assert task["python_wheel_task"]["package_name"] == "fraudrules"
    assert task["python_wheel_task"]["parameters"][:2] == ["run", "--no-generator"]
    assert not any("notebook_task" in t for job in jobs.values() for t in job["tasks"]), "production runs notebooks"
    options = _options(task)
    for option, var in [
        ("--catalog", "catalog"),
        ("--schema", "schema"),
        ("--data-dir", "data_dir"),
        ("--checkpoint-root", "checkpoint_root"),
        ("--kafka-bootstrap", "kafka_bootstrap"),
        ("--kafka-secret-scope", "kafka_secret_scope"),
        ("--shards", "shards"),
    ]:
        assert options[option] == f"${{var.{var}}}", option
    quality = jobs["fraudrules_data_quality"]
    assert "schedule" not in quality and "trigger" not in quality  # one schedule: the fraud_data_quality DAG's
    dag = (ROOT / "dags" / "fraud_data_quality.py").read_text()
    assert f'Param("{quality["name"]}"' in dag, "the DAG triggers the job by its bundle name"
    (task,) = quality["tasks"]
    assert task["python_wheel_task"]["package_name"] == "fraudrules"
    assert task["python_wheel_task"]["parameters"][0] == "quality"
    quality_options = _options(task)
    for option in ("--catalog", "--schema", "--data-dir", "--checkpoint-root", "--shards", "--shuffle-partitions"):
        assert quality_options[option] == options[option], option  # the tables and state the job writes
    assert quality_options["--dq-dir"] == "${var.dq_dir}"  # results and Data Docs history outlive the job's runs
    assert set(bundle["variables"]) >= {"catalog", "schema", "checkpoint_root", "kafka_bootstrap", "kafka_secret_scope"}
    hosts = {name: t["workspace"]["host"] for name, t in bundle["targets"].items()}
    assert set(hosts) == {"dev", "prod"} and len(set(hosts.values())) == 2


def _broken(bundle: dict[str, Any], edit) -> list[str]:
    copy_ = copy.deepcopy(bundle)
    edit(copy_)
    return problems(copy_)


def _task(b: dict[str, Any], job: str, index: int = 0) -> dict[str, Any]:
    return b["_jobs"][job]["tasks"][index]


def _notebook_task(b: dict[str, Any]) -> dict[str, Any]:
    """A notebook task (an analyst notebook run as a job) added to the streaming job of a copy of the bundle."""
    task = {
        "task_key": "notebook",
        "job_cluster_key": "streaming",
        "notebook_task": {"notebook_path": "../notebooks/01_ingest.ipynb", "base_parameters": {"data_dir": "d"}},
        "libraries": [{"whl": "../dist/*.whl"}],
    }
    b["_jobs"]["fraudrules_streaming"]["tasks"].append(task)
    return task


@pytest.mark.parametrize(
    ("what", "edit", "expected"),
    [
        ("a notebook task is valid", lambda b: _notebook_task(b), None),
        (
            "missing notebook",
            lambda b: _notebook_task(b)["notebook_task"].update(notebook_path="../notebooks/nope.ipynb"),
            "does not exist",
        ),
        (
            "undeclared variable",
            lambda b: b["_files"][str(BUNDLE_FILE)]["bundle"].update(name="${var.nope}"),
            "${var.nope} is not a declared variable",
        ),
        (
            "undeclared variable in a resource",
            lambda b: next(f for n, f in b["_files"].items() if "streaming" in n)["resources"]["jobs"][
                "fraudrules_streaming"
            ].update(name="${var.nope}"),
            "${var.nope} is not a declared variable",
        ),
        (
            "a second schedule for the data-quality check",
            lambda b: b["_jobs"]["fraudrules_data_quality"].update(schedule={"quartz_cron_expression": "0 0 * * * ?"}),
            "job fraudrules_data_quality is scheduled by the bundle",
        ),
        (
            "wheel without pyproject",
            lambda b: b["artifacts"]["fraudrules_wheel"].update(path="notebooks"),
            "no pyproject",
        ),
        (
            "dependency in a continuous job",
            lambda b: _notebook_task(b).update(depends_on=[{"task_key": "stream"}]),
            "must not depend",
        ),
        (
            "task without compute",
            lambda b: _task(b, "fraudrules_streaming").pop("job_cluster_key"),
            "needs exactly one",
        ),
        (
            "undefined job cluster",
            lambda b: _task(b, "fraudrules_data_quality").update(job_cluster_key="nope"),
            "is not defined",
        ),
        ("task without key", lambda b: _task(b, "fraudrules_streaming").pop("task_key"), "unique task_key"),
        (
            "paused continuous job",
            lambda b: b["_jobs"]["fraudrules_streaming"]["continuous"].update(pause_status="PAUSED"),
            "UNPAUSED",
        ),
        (
            "no RocksDB",
            lambda b: b["_jobs"]["fraudrules_streaming"]["job_clusters"][0]["new_cluster"]["spark_conf"].clear(),
            "RocksDB",
        ),
        (
            "widget the notebook lacks",
            lambda b: _notebook_task(b)["notebook_task"]["base_parameters"].update(nope="1"),
            "are not widgets",
        ),
        (
            "unknown entry point",
            lambda b: _task(b, "fraudrules_data_quality")["python_wheel_task"].update(entry_point="nope"),
            "not in [project.scripts]",
        ),
        (
            "wheel not installed",
            lambda b: _task(b, "fraudrules_streaming").pop("libraries"),
            "does not install the wheel",
        ),
        (
            "unknown CLI option",
            lambda b: _task(b, "fraudrules_streaming")["python_wheel_task"]["parameters"].append("--nope"),
            "is not a valid command line",
        ),
        (
            "quality without a command",
            lambda b: _task(b, "fraudrules_data_quality")["python_wheel_task"]["parameters"].pop(0),
            "is not a valid command line",
        ),
        ("no workspace host", lambda b: b["targets"]["dev"].pop("workspace"), "target dev needs its own workspace"),
        (
            "workspace host from a variable",
            lambda b: b["targets"]["prod"]["workspace"].update(host="${var.catalog}"),
            "target prod needs its own workspace.host",
        ),
        ("no prod run_as", lambda b: b["targets"]["prod"].pop("run_as"), "run_as"),
        ("dev not default", lambda b: b["targets"]["dev"].pop("default"), "target dev"),
        ("no prod target", lambda b: b["targets"].pop("prod"), "production mode"),
    ],
)
def test_each_check_fires(bundle, what, edit, expected):
    found = _broken(bundle, edit)
    if expected is None:  # the edit itself is fine: the checks it enables start from no problem
        assert found == [], f"{what}: {found}"
    else:
        assert any(expected in p for p in found), f"{what}: {found}"


def test_jobs_parse_with_the_databricks_bundles_models(bundle):
    """Field names and enum values as the Databricks CLI's own Python models know them."""
    jobs_models = pytest.importorskip("databricks.bundles.jobs", reason="pip install databricks-bundles")
    for job in bundle["_jobs"].values():
        spec = {k: v for k, v in job.items() if not k.startswith("_")}
        jobs_models.Job.from_dict(spec)
        broken = copy.deepcopy(spec)
        broken["tasks"][0]["notebook_taskk"] = {}
        with pytest.raises(ValueError, match="notebook_taskk"):
            jobs_models.Job.from_dict(broken)


def test_maintenance_job_runs_fraudrules_maintain_triggered_by_its_dag(bundle):
    """The maintenance job is `fraudrules maintain` on the bundle's tables with its retentions, without a schedule
    of its own (the fraud_maintenance DAG triggers it by name); the streaming job expires bronze itself."""
    from fraudrules.cli import parser

    job = bundle["_jobs"]["fraudrules_maintenance"]
    assert "schedule" not in job and "trigger" not in job
    assert f'Param("{job["name"]}"' in (ROOT / "dags" / "fraud_maintenance.py").read_text()
    (task,) = job["tasks"]
    args = [with_defaults(a, bundle["variables"]) for a in task["python_wheel_task"]["parameters"]]
    parsed = parser().parse_args(args)
    assert parsed.func.__name__ == "cmd_maintain"
    assert (parsed.catalog, parsed.retention_hours, parsed.log_retention_days) == ("main", 168.0, 30.0)
    (streaming,) = bundle["_jobs"]["fraudrules_streaming"]["tasks"]
    assert _options(streaming)["--bronze-retention-days"] == "${var.bronze_retention_days}"


def test_quality_task_runs_a_cli_command(bundle):
    from fraudrules.cli import parser

    (task,) = bundle["_jobs"]["fraudrules_data_quality"]["tasks"]
    args = [with_defaults(a, bundle["variables"]) for a in task["python_wheel_task"]["parameters"]]
    assert args[0] == "quality"  # `fraudrules quality ...`
    assert parser().parse_args(args).func.__name__ == "cmd_quality"


def test_the_streaming_cluster_gets_the_malloc_setting_local_jvms_get(bundle):
    from fraudrules.local_runtime import MALLOC_ENV

    (cluster,) = bundle["_jobs"]["fraudrules_streaming"]["job_clusters"]
    assert cluster["new_cluster"]["spark_env_vars"] == MALLOC_ENV


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_are_stored_clean(path):
    """No outputs in git, an id on every cell (nbformat 4.5 requires them); a title, a tagged parameters cell calling
    notebook.params, one config cell."""
    nb = json.loads(path.read_text())
    cells = nb["cells"]
    ids = [cell.get("id") for cell in cells]
    assert all(ids) and len(set(ids)) == len(ids), "cells without an id, or with the same one"
    assert cells[0]["cell_type"] == "markdown" and "".join(cells[0]["source"]).startswith("# ")
    for cell in cells:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, "stored with outputs"
    assert notebook_params(path) >= {"data_dir", "catalog", "schema", "checkpoint_root", "available_now"}
    source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert source.count("notebook.config_from(p)") == 1


@pytest.mark.skipif(shutil.which("databricks") is None, reason="the Databricks CLI (a Go binary) is not installed")
def test_databricks_bundle_validate():
    proc = subprocess.run(
        ["databricks", "bundle", "validate", "-t", "dev"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
