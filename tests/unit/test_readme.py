"""The README's list of make targets is the Makefile's: every target a user can call is described, there and in
`make help`."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def makefile_targets() -> set[str]:
    phony = re.search(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert phony, "the Makefile declares its targets as .PHONY"
    return set(phony.group(1).split())


def readme_targets() -> set[str]:
    section = (ROOT / "README.md").read_text().split("### Make targets", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `make")]
    return {name for row in rows for name in re.findall(r"`make ([a-z-]+)", row.split(" | ")[0])}


def test_every_make_target_is_in_the_readme_table():
    assert makefile_targets() == readme_targets()


def test_make_help_lists_every_target_with_a_description():
    if shutil.which("make") is None:
        pytest.skip("no make")
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    rows = [line.split(maxsplit=2) for line in out.splitlines()]
    assert all(len(row) == 3 and row[0] == "make" for row in rows), out
    assert {row[1] for row in rows} == makefile_targets()
