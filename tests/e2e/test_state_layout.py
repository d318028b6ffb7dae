"""A checkpoint written by the release before the shard value (state layout 1, `engine.shard_values`) goes on under
this one with every alert: the previous release itself, taken from the repository's history, writes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fraudrules.config import EVALUATE_QUERY, JobConfig
from fraudrules.engine.shard_values import LAYOUT_FILE
from fraudrules.rules.model import load_rules_file
from tests.support import reference
from tools.support.upgrade import previous_release

REPO = Path(__file__).parents[2]
FIXTURES = REPO / "tests" / "fixtures"
LAYOUT_1 = "9a8fb66"  # the last commit whose job keeps the six state variables
SHARDS = "4"


def backtest(tmp_path: Path, part: int, lib: Path | None = None) -> Path:
    """`fraudrules backtest` on the data dir the parts before ran on, with one more part in its folder: the library
    of `lib` (default this one's)."""
    out = tmp_path / f"alerts{part}.jsonl"
    environment = {**os.environ, "PYSPARK_PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    if lib is not None:
        environment["PYTHONPATH"] = os.pathsep.join([str(lib), environment.get("PYTHONPATH", "")])
    args = ["--transactions", str(tmp_path / "tx"), "--rules", str(FIXTURES / "rules.json"), "--out", str(out)]
    args += ["--data-dir", str(tmp_path / "data"), "--shards", SHARDS]
    res = subprocess.run(
        [sys.executable, "-m", "fraudrules.cli", "backtest", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.mark.e2e
def test_a_checkpoint_of_state_layout_1_goes_on_with_every_alert(tmp_path):
    known = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{LAYOUT_1}^{{commit}}"], capture_output=True)
    if known.returncode:
        pytest.skip(f"needs the repository's history with {LAYOUT_1} (the previous release is taken from it)")
    lib = previous_release(LAYOUT_1, tmp_path / "previous")
    lines = (FIXTURES / "transactions.jsonl").read_text().splitlines()
    parts = [lines[i * len(lines) // 3 : (i + 1) * len(lines) // 3] for i in range(3)]  # windows span the parts
    (tmp_path / "tx").mkdir()
    marker = Path(JobConfig(data_dir=str(tmp_path / "data")).checkpoint(EVALUATE_QUERY)) / LAYOUT_FILE
    batches = [[json.loads(x) for x in part] for part in parts]
    rules = load_rules_file(str(FIXTURES / "rules.json"))
    for i, part in enumerate(parts):
        (tmp_path / "tx" / f"part{i}.jsonl").write_text("\n".join(part) + "\n")
        out = backtest(tmp_path, i, lib if i == 0 else None)
        alerts = {(a["ruleId"], a["transactionId"]) for a in map(json.loads, out.read_text().splitlines())}
        expected, late = reference.run(batches[: i + 1], [rules] * (i + 1), 60_000)
        assert alerts == set(expected) and not late, i
        # the previous release knows no mark; the first start here migrates; the next finds nothing left to move
        assert marker.exists() == (i == 2), i
    assert len(expected) > 50
