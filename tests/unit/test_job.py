"""Starting a query on a checkpoint that a kill left half-made."""

from __future__ import annotations

from pathlib import Path

from fraudrules.engine.job import discard_unstarted


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")


def test_a_start_killed_before_its_first_offset_leaves_nothing_behind(tmp_path):
    cp = tmp_path / "evaluate"
    _touch(cp / "metadata")
    _touch(cp / "offsets" / ".0.5f1c.tmp")
    _touch(cp / "state" / "0" / "_metadata" / "schema")
    assert discard_unstarted(str(cp))
    assert sorted(p.name for p in cp.iterdir()) == ["metadata"]  # the query id stays


def test_a_checkpoint_with_a_batch_is_left_alone(tmp_path):
    cp = tmp_path / "evaluate"
    _touch(cp / "offsets" / "0")
    _touch(cp / "offsets" / ".1.5f1c.tmp")
    _touch(cp / "state" / "0" / "1.changelog")
    assert not discard_unstarted(str(cp))
    assert (cp / "offsets" / ".1.5f1c.tmp").exists() and (cp / "state" / "0" / "1.changelog").exists()


def test_no_checkpoint_yet(tmp_path):
    assert not discard_unstarted(str(tmp_path / "new"))
