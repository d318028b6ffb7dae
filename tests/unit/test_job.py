"""Starting a query: on a checkpoint that a kill left half-made; how often each query triggers."""

from __future__ import annotations

from pathlib import Path

from fraudrules.config import QUERIES, RULES_QUERY, JobConfig
from fraudrules.engine.job import STATEFUL, discard_unstarted, trigger_seconds


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


def test_rule_changes_are_looked_for_more_often_than_bronze_is_committed():
    """A rule file waits for the rules query's next trigger: 0.5 s by default, not the 5 s of bronze commits."""
    cfg = JobConfig(data_dir="d", trigger_seconds=0.2, rules_trigger_seconds=0.7, background_trigger_seconds=9.0)
    assert {q: trigger_seconds(cfg, q) for q in QUERIES} == {
        q: 0.2 if q in STATEFUL else 0.7 if q == RULES_QUERY else 9.0 for q in QUERIES
    }
    assert trigger_seconds(JobConfig(data_dir="d"), RULES_QUERY) == 0.5
