"""The analyst notebooks run headless, top to bottom, as a reader would: by `tests/e2e/test_notebooks.py` and by
`make notebooks` (`tools/notebooks_runner.py`).

Each notebook runs in a fresh kernel of this Python (the project's .venv), from a kernel spec
written next to the executed copies (nothing is installed into Jupyter's own folders). Notebook
parameters come in as FRAUDRULES_<KEY> environment variables (see `fraudrules.analyst.notebook.params`).
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS_DIR = REPO / "notebooks"
KERNEL_NAME = "fraudrules-python"
# Parameters of one notebook on top of the shared ones: 05 also takes its shadow path (a candidate in SHADOW on
# new traffic), so that every figure the notebooks can draw is drawn.
NOTEBOOK_ENV = {"05_backtest.ipynb": {"FRAUDRULES_SHADOW": "true"}}


def notebooks(folder: Path = NOTEBOOKS_DIR) -> list[Path]:
    """The numbered notebooks of `folder`, in order."""
    return sorted(p for p in folder.glob("[0-9]*.ipynb") if p.is_file())


def kernel_spec(root: Path, env: Mapping[str, str], python: str | None = None) -> Path:
    """Write a kernel spec running `python` (this interpreter by default) with `env` added; returns its folder."""
    python = python or sys.executable
    folder = root / KERNEL_NAME
    folder.mkdir(parents=True, exist_ok=True)
    spec = {
        # the kernel's own log at errors: not its warning that a local kernel talks plain TCP
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}", "--log-level=ERROR"],
        "display_name": f"fraudrules ({python})",
        "language": "python",
        "env": {
            "PYSPARK_PYTHON": python,
            "PYSPARK_DRIVER_PYTHON": python,
            **env,
        },
    }
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
    return folder


def execute(
    notebook: Path, out_dir: Path, env: Mapping[str, str] | None = None, timeout: int = 900, python: str | None = None
) -> Path:
    """Execute `notebook` in a fresh kernel and write the executed copy (outputs, plots) to `out_dir`.

    The kernel's working directory is `out_dir`. A failing cell raises nbconvert's CellExecutionError
    after the partly executed copy has been written, so the error can be read in place.
    """
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbconvert.preprocessors import CellExecutionError, ExecutePreprocessor

    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / notebook.name
    nb = nbformat.read(notebook, as_version=4)
    with tempfile.TemporaryDirectory(prefix="fraudrules-kernel-") as spec_root:
        kernel_spec(Path(spec_root), dict(env or {}), python)
        km = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=KernelSpecManager(kernel_dirs=[spec_root]))
        ep = ExecutePreprocessor(timeout=timeout, kernel_name=KERNEL_NAME)
        try:
            ep.preprocess(nb, {"metadata": {"path": str(out_dir)}}, km=km)
        except CellExecutionError:
            nbformat.write(nb, target)
            raise
        finally:
            # nbclient stops its client's channels only when it owns the kernel manager: left open, their ZeroMQ
            # sockets reconnect to the gone kernel's five ports ~40 times a second for the life of this process,
            # and the first listener to get one of those ports (a Spark JVM's, waiting for its Python worker)
            # reads ZeroMQ's greeting as a negative length (NegativeArraySizeException in SocketAuthHelper)
            if ep.kc is not None:
                ep.kc.stop_channels()
            if km.has_kernel:
                km.shutdown_kernel(now=True)
    nbformat.write(nb, target)
    return target


def to_html(executed: Path) -> Path:
    """An HTML copy of an executed notebook beside it (plots embedded): opens in any browser."""
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_filename(str(executed))
    html = executed.with_suffix(".html")
    html.write_text(body, encoding="utf-8")
    return html


def errors(executed: Path) -> list[str]:
    """Error outputs of an executed notebook ("ename: evalue" each)."""
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    return [
        f"{out.get('ename')}: {out.get('evalue')}"
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]
