"""Run the analyst notebooks headless, top to bottom, as a reader would (`make notebooks`; the runner is
`tools/support/notebooks.py`).

    python -m tools.notebooks_runner --out notebooks/_executed
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from tools.support.notebooks import NOTEBOOK_ENV, NOTEBOOKS_DIR, execute, notebooks, to_html


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.notebooks_runner", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="notebooks/_executed", help="executed copies (and figures/) go here")
    ap.add_argument("--data-dir", help="data dir shared by the notebooks (default: a fresh one under --out)")
    ap.add_argument("--notebooks", type=Path, default=NOTEBOOKS_DIR, help="folder of the numbered notebooks")
    ap.add_argument("--transactions", default="3000", help="size of the generated workload")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    args = ap.parse_args(argv)

    out = Path(args.out).resolve()
    data_dir = Path(args.data_dir).resolve() if args.data_dir else out / "data"
    if not args.data_dir and data_dir.exists():
        shutil.rmtree(data_dir)
    shutil.rmtree(out / "figures", ignore_errors=True)  # only this run's figures: none left from an earlier one
    env = {
        "FRAUDRULES_DATA_DIR": str(data_dir),
        "FRAUDRULES_FIGURES_DIR": str(out / "figures"),
        "FRAUDRULES_GENERATE": "true",
        "FRAUDRULES_TRANSACTIONS": args.transactions,
        "FRAUDRULES_AVAILABLE_NOW": "true",
    }
    found = notebooks(args.notebooks)
    if not found:
        print(f"no notebooks in {args.notebooks}", file=sys.stderr)
        return 2
    for nb in found:
        started = time.time()
        try:
            executed = execute(nb, out, {**env, **NOTEBOOK_ENV.get(nb.name, {})})
        except Exception as exc:  # report which notebook failed, then stop: later ones build on it
            print(f"FAILED {nb.name} after {time.time() - started:.0f} s: {exc}", file=sys.stderr)
            return 1
        print(f"ok {nb.name} in {time.time() - started:.0f} s -> {executed} (+ {to_html(executed).name})")
    print(f"figures in {out / 'figures'}, data in {data_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
