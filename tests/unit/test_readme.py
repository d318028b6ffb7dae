"""The README's list of make targets is the Makefile's: every target a user can call is described."""

from __future__ import annotations

import re
from pathlib import Path

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
