"""The login anomaly detector's per-shard step, with time fully under the test's control."""

from __future__ import annotations

import json

import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from fraudrules.engine.evaluation import Batch
from fraudrules.engine.logins import State, step
from fraudrules.engine.ruleset import RuleSet
from tests.support import reference_logins
from tests.support.harness import LOGIN_EVENT_COLUMNS, RuleStream, login_frame, login_rule, seed_attack
from tests.support.harness import login_event as ev
from tests.support.properties import examples

MIN = 60_000
W = 10 * MIN


class Detector:
    """Feeds batches through `step` with Spark's watermark rule (max seen − lateness, per batch)."""

    def __init__(self, lateness_ms=0, min_failures=3, min_ips=2, window_ms=W):
        self.state: State = {}
        self.rules, self.stream = RuleSet(), RuleStream()
        self.max_seen = None
        self.lateness_ms = lateness_ms
        self.rule = login_rule(min_failures, min_ips, window_ms)
        self.batch_no = 0

    def feed(self, batch):
        wm = 0 if self.max_seen is None else max(0, self.max_seen - self.lateness_ms)
        changes = self.stream.changes([self.rule], LOGIN_EVENT_COLUMNS)
        rows = pd.concat([login_frame(batch, self.batch_no), changes], ignore_index=True)
        self.batch_no += 1
        out, self.state = step(Batch.of(rows), self.rules, self.state, wm, 0, now_ms=0)
        top = max(e["eventTimestamp"] for e in batch)
        self.max_seen = top if self.max_seen is None else max(self.max_seen, top)
        return out


def alerts(out):
    return [(r.userId, r.eventTime, json.loads(r.details)) for r in out[out.kind == "alert"].itertuples()]


def test_three_failures_then_success_from_new_ip_alerts_once():
    d = Detector()
    out = d.feed(seed_attack())
    [(user, t, details)] = alerts(out)
    assert (user, t) == (1, 4000)
    assert details["failedIps"] == ["1.1.1.1", "2.2.2.2", "3.3.3.3"] and details["failures"] == 3
    assert (details["sequenceStart"], details["sequenceEnd"]) == (1000, 4000)
    assert "3 failed logins from 3 IPs" in out[out.kind == "alert"].message.iloc[0]
    assert d.state == {}


def test_two_failures_then_expiry_no_alert_and_state_empty():
    d = Detector()
    assert alerts(d.feed([ev(1, "FAIL", "1.1.1.1", 1000), ev(1, "FAIL", "2.2.2.2", 2000)])) == []
    assert (1, 1) in d.state
    d.feed([ev(2, "SUCCESS", "5.5.5.5", 1000 + W + 1)])  # another user moves the watermark past 1000 + W
    d.feed([ev(2, "SUCCESS", "5.5.5.5", 1000 + W + 2)])
    assert d.state == {}


def test_expire_at_prunes_to_the_next_batchs_watermark_in_the_same_step():
    rules, stream = RuleSet(), RuleStream()
    changes = stream.changes([login_rule(3, 2, W)], LOGIN_EVENT_COLUMNS)
    rows = pd.concat([login_frame([ev(1, "FAIL", "1.1.1.1", 1000), ev(2, "FAIL", "1.1.1.1", 5000)], 0), changes])
    _, kept = step(Batch.of(rows.reset_index(drop=True)), rules, {}, 0, 0, now_ms=0)
    assert set(kept) == {(1, 1), (1, 2)}  # expiry at this batch's watermark (0) keeps both
    _, kept = step(Batch.of(rows.reset_index(drop=True)), RuleSet(), {}, 0, 0, now_ms=0, expire_at=1000 + W + 1)
    assert set(kept) == {(1, 2)}  # user 1's sequence ends at 1000 + W, before the next watermark


def test_late_event_goes_to_the_side_output():
    d = Detector(lateness_ms=5_000)
    d.feed([ev(1, "FAIL", "1.1.1.1", 100_000)])
    out = d.feed([ev(1, "FAIL", "2.2.2.2", 10_000)])
    late = out[out.kind == "late"]
    assert list(late.eventTime) == [10_000] and list(late.watermark) == [95_000]
    assert d.state[(1, 1)].ips == ["1.1.1.1"]


def test_success_from_a_failed_ip_or_single_ip_does_not_alert():
    d = Detector()
    out = d.feed(
        [
            ev(1, "FAIL", "1.1.1.1", 1),
            ev(1, "FAIL", "2.2.2.2", 2),
            ev(1, "FAIL", "2.2.2.2", 3),
            ev(1, "SUCCESS", "2.2.2.2", 4),
            ev(2, "FAIL", "7.7.7.7", 1),
            ev(2, "FAIL", "7.7.7.7", 2),
            ev(2, "FAIL", "7.7.7.7", 3),
            ev(2, "SUCCESS", "8.8.8.8", 4),
        ]
    )
    assert alerts(out) == [] and d.state == {}


def test_expiry_boundary_is_inclusive_and_a_second_sequence_starts_after_it():
    d = Detector()
    at_edge = d.feed(
        [ev(1, "FAIL", "a", 0 + 1), ev(1, "FAIL", "b", 2), ev(1, "FAIL", "c", 3), ev(1, "SUCCESS", "z", 1 + W)]
    )
    assert [(u, t) for u, t, _ in alerts(at_edge)] == [(1, 1 + W)]
    d2 = Detector()
    out = d2.feed(
        [
            ev(1, "FAIL", "a", 1),
            ev(1, "FAIL", "b", 2),
            ev(1, "FAIL", "c", 3),
            ev(1, "FAIL", "d", 2 + W),  # after the first sequence: a new one opens here
            ev(1, "FAIL", "e", 3 + W),
            ev(1, "FAIL", "f", 4 + W),
            ev(1, "SUCCESS", "z", 5 + W),
        ]
    )
    [(_u, _t, details)] = alerts(out)
    assert details["failedIps"] == ["d", "e", "f"] and details["sequenceStart"] == 2 + W


@st.composite
def login_streams(draw):
    n = draw(st.integers(1, 80))
    times = sorted(draw(st.lists(st.integers(0, 40 * MIN), min_size=n, max_size=n)))
    events = [
        ev(
            draw(st.integers(1, 3)),
            draw(st.sampled_from(["FAIL", "FAIL", "SUCCESS"])),
            draw(st.sampled_from(["a", "b", "c", "d"])),
            t,
        )
        for t in times
    ]
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, n - 1)), max_size=4))))
    return [events[a:b] for a, b in zip([0, *cuts], [*cuts, n], strict=True) if events[a:b]]


@examples(150)
@given(login_streams(), st.integers(1, 4), st.integers(1, 3), st.integers(0, 20 * MIN), st.randoms())
def test_matches_reference_on_random_streams(batches, min_failures, min_ips, lateness, rnd):
    for b in batches:
        rnd.shuffle(b)
    expected, late = reference_logins.run(batches, min_failures, min_ips, W, lateness)
    d = Detector(lateness, min_failures, min_ips)
    outs = [d.feed(b) for b in batches]
    got = {(u, t): (x["failures"], x["failedIps"]) for o in outs for u, t, x in alerts(o)}
    assert got == expected
    assert sum(int((o.kind == "late").sum()) for o in outs) == len(late)
