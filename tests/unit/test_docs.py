"""README.md and docs/ cite only what the repository holds: every path in backticks, every relative link and its
anchor; the README stays a short user guide."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "lib" / "fraudrules"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 220
# A backticked token whose first folder is one of these is a repository path; `engine/job.py` and the like are
# short for lib/fraudrules/engine/job.py.
REPOSITORY_DIRS = ("lib", "tools", "tests", "notebooks", "dags", "expectations", "docs", "jvm", "resources")
PACKAGE_DIRS = ("engine", "ops", "rules", "analyst", "schemas")
PATH = re.compile(r"^[\w.*-]+(/[\w.*-]*)+$")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def prose(path: Path) -> str:
    """The document without its fenced code blocks (commands and pictures, not citations)."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def cited_paths(text: str) -> set[str]:
    tokens = {t.strip(".,;:()") for span in CODE_SPAN.findall(text) for t in span.split()}
    return {t for t in tokens if PATH.match(t) and t.split("/")[0] in REPOSITORY_DIRS + PACKAGE_DIRS}


def outputs() -> tuple[str, ...]:
    """Folders that commands write and git ignores (`notebooks/_executed/`): cited as where to look, not kept."""
    lines = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    return tuple(line for line in lines if line.endswith("/") and "/" in line[:-1])


def exists(cited: str) -> bool:
    if f"{cited.rstrip('/')}/".startswith(outputs()):
        return True
    base = PACKAGE if cited.split("/")[0] in PACKAGE_DIRS else ROOT
    return any(base.glob(cited.rstrip("/"))) if "*" in cited else (base / cited).exists()


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a document's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", prose(path), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_paths_exist(doc):
    assert not sorted(p for p in cited_paths(prose(doc)) if not exists(p))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    broken = []
    for target in LINK.findall(prose(doc)):
        if re.match(r"^[a-z]+:", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        linked = (doc.parent / file).resolve() if file else doc
        inside = linked.is_relative_to(ROOT) and linked.exists()
        if not inside or (anchor and anchor not in anchors(linked)):
            broken.append(target)
    assert not broken


def test_docs_stay_inside_the_repository():
    """The spec of what an alert is lives in docs/semantics.md, not in a folder beside the repository."""
    assert not [doc.name for doc in DOCS if "../shared" in doc.read_text(encoding="utf-8")]


def test_readme_is_a_short_user_guide():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= README_MAX_LINES
