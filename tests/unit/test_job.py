"""Starting a query: on a checkpoint that a kill left half-made, or that started with other sources; how often each
query triggers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fraudrules.config import EVALUATE_QUERY, QUERIES, RULES_QUERY, JobConfig
from fraudrules.engine.job import STATEFUL, Job, check_sources, discard_unstarted, trigger_seconds
from fraudrules.event_schema import SchemaError


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


def _offsets(checkpoint: Path, batch: int, sources: int) -> None:
    """An offset log entry as Spark writes it: a version, the batch's metadata, one offset per source."""
    lines = ["v1", '{"batchWatermarkMs":0}', *['{"file":0,"line":0}'] * sources]
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets" / str(batch)).write_text("\n".join(lines))


def test_login_detection_cannot_change_on_a_checkpoint_that_has_run(tmp_path):
    off, on = JobConfig(data_dir=str(tmp_path)), JobConfig(data_dir=str(tmp_path), logins=True)
    check_sources(off)  # no batch yet: anything goes
    check_sources(on)
    evaluate = Path(off.checkpoint(EVALUATE_QUERY))
    _offsets(evaluate, 0, sources=3)  # transactions, login events, rule changes
    _offsets(evaluate, 1, sources=3)
    check_sources(on)
    with pytest.raises(SchemaError, match=r"was started with login detection on.* run it with login detection on"):
        check_sources(off)
    _offsets(evaluate, 2, sources=2)  # the newest batch is what counts
    check_sources(off)
    with pytest.raises(SchemaError, match="was started with login detection off"):
        check_sources(on)


class _Query:
    def __init__(self, stuck: bool = False):
        self.isActive, self.status, self.stuck = True, {"isTriggerActive": False}, stuck

    def stop(self) -> None:
        if self.stuck:
            raise TimeoutError("Stream Execution thread failed to stop within 120000 milliseconds")
        self.isActive = False


class _Committer:
    stopped = False

    def stop(self, failed: bool = False) -> None:
        self.stopped = True


def test_a_query_that_does_not_stop_in_time_leaves_the_others_stopped_and_the_committers_ended():
    """Spark's stopTimeout ends the wait for a stuck stream thread: the job still stops its other queries and ends
    its committers, then says which one did not stop."""
    stuck, other, committer = _Query(stuck=True), _Query(), _Committer()
    with pytest.raises(TimeoutError, match="failed to stop"):
        Job({"evaluate": stuck, "ingest": other}, [committer]).stop(drain_s=0)
    assert not other.isActive and committer.stopped


class _BackToBack:
    """Always in a micro-batch (batch 7 at first); it ends at the `ends_at`-th look at the query's progress."""

    def __init__(self, ends_at: int):
        self.isActive, self.status, self.looks, self.ends_at = True, {"isTriggerActive": True}, 0, ends_at

    @property
    def lastProgress(self) -> dict:
        self.looks += 1
        return {"batchId": 7 if self.looks >= self.ends_at else 6}

    def stop(self) -> None:
        self.isActive = False


def test_a_stop_waits_for_the_micro_batch_in_progress_not_for_a_back_to_back_query_to_idle():
    """A query that runs back to back is never seen idle: the stop waits for the micro-batch it was in to end,
    then stops it, long before the drain's deadline."""
    query = _BackToBack(ends_at=4)
    started = time.monotonic()
    Job({"evaluate": query}, []).stop(drain_s=30)
    assert not query.isActive and query.looks == 4 and time.monotonic() - started < 5
