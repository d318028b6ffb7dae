"""Shadow rules: evaluated exactly like ACTIVE rules (the brute-force reference decides), hits kept apart,
live alerts untouched, state retained and freed like an ACTIVE rule's, promotion switching at one batch."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from decimal import Decimal

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fraudrules.engine import logins
from fraudrules.engine.evaluation import Batch
from fraudrules.engine.outbox import OUTBOX
from fraudrules.engine.results import shadow_rows
from fraudrules.engine.ruleset import RuleSet
from fraudrules.rules import store
from fraudrules.rules.codec import from_row
from fraudrules.rules.model import RuleError, parse_rule, parse_rules_text
from fraudrules.rules.shadow import (
    HOUR_MS,
    Comparison,
    Run,
    batch_period,
    batch_range,
    compare_frames,
    parse_time,
    shadow_run,
)
from tests.support import reference
from tests.support.harness import (
    LOGIN_EVENT_COLUMNS,
    Engine,
    RuleStream,
    login_event,
    login_frame,
    login_rule,
    rule,
    seed_attack,
)
from tests.support.properties import examples
from tests.unit.test_windowing import MIN, _assert_same, tx, workloads

SHADOW_BASE = 100  # a shadow copy of rule r is rule SHADOW_BASE + r


def shadow_copy(live, limit=None, **changes):
    """A SHADOW candidate challenging `live` (its own id, `shadowOf` the live rule)."""
    return replace(
        live,
        rule_id=SHADOW_BASE + live.rule_id,
        state="SHADOW",
        shadow_of=live.rule_id,
        limit=live.limit if limit is None else Decimal(limit),
        **changes,
    )


def as_active(r):
    return replace(r, state="ACTIVE", shadow_of=None)


@st.composite
def shadowed_workloads(draw):
    batches, rules = draw(workloads())
    chosen = draw(st.lists(st.sampled_from(rules), min_size=1, max_size=len(rules), unique_by=lambda r: r.rule_id))
    shadows = []
    for live in chosen:
        limit = draw(st.one_of(st.none(), st.integers(0, 4) if "COUNT" in live.field else st.integers(0, 900)))
        shadows.append(shadow_copy(live, None if limit is None else str(limit)))
    return batches, rules, shadows


@examples(100)
@given(shadowed_workloads(), st.integers(1, 3), st.integers(0, 2), st.randoms(use_true_random=False))
def test_shadow_hits_are_the_alerts_of_the_same_rule_when_active(workload, shards, lateness_minutes, rnd):
    batches, rules, shadows = workload
    if lateness_minutes:  # out of order within batches, some events late
        for b in batches:
            rnd.shuffle(b)
    lateness = lateness_minutes * MIN
    n = len(batches)

    engine = Engine(lateness, shards)
    engine.run(batches, [rules + shadows] * n)
    ref_all, ref_late = reference.run(batches, [rules + [as_active(s) for s in shadows]] * n, lateness)
    shadow_ids = {s.rule_id for s in shadows}

    # the shadow rules' hits are exactly what the reference alerts for them when ACTIVE ...
    _assert_same(engine.hits("shadow"), {k: v for k, v in ref_all.items() if k[0] in shadow_ids})
    # ... and the live alerts are unchanged by adding them: the reference without them, and the engine
    live_ref, _ = reference.run(batches, [rules] * n, lateness)
    _assert_same(engine.hits("alert"), live_ref)
    without, late_without = Engine(lateness, shards).run(batches, [rules] * n)
    assert set(engine.hits("alert")) == set(without)
    assert late_without == ref_late  # the reference names late transactions, whatever the rules

    # the same rules ACTIVE in the engine give the same hits in `alerts`
    active = Engine(lateness, shards)
    active.run(batches, [rules + [as_active(s) for s in shadows]] * n)
    assert {k: v for k, v in active.hits("alert").items() if k[0] in shadow_ids} == engine.hits("shadow")


def _retained(engine: Engine) -> dict[int, int]:
    out: dict[int, int] = {}
    for s in engine.state:
        for c in s.meta.chunks:
            for span in c.spans:
                out[span.rule] = out.get(span.rule, 0) + span.n
    return out


@pytest.mark.parametrize("stop", ["PAUSE", "DELETE"])
def test_shadow_state_is_retained_like_active_and_freed_when_stopped(stop):
    live = rule(1, field="COUNT_FLINK", op="GREATER", limit=5, window=1)
    candidate = shadow_copy(live, window_minutes=10)  # a wider window: it alone decides what is retained
    txs = [tx(i, i * 10_000) for i in range(60)]  # 10 minutes of events
    engine = Engine(0, shards=2)
    for i in range(0, 60, 10):
        engine.feed(txs[i : i + 10], [live, candidate])
    held = _retained(engine)
    assert held[candidate.rule_id] > held.get(live.rule_id, 0) >= 1  # 10 minutes' worth against 1 minute's

    engine.feed([tx(100, 600_000), tx(101, 610_000)], [live, replace(candidate, state=stop)])
    engine.feed([tx(102, 620_000)], [live, replace(candidate, state=stop)])
    assert candidate.rule_id not in _retained(engine)  # its state is gone
    assert not [k for k in engine.hits("shadow") if k[1] >= 100]


def promoted_at(engine: Engine, batches, k: int, live, candidate) -> Engine:
    """Batches fed with the live rule and its shadow candidate, the candidate promoted before batch `k`."""
    for b in batches[:k]:
        engine.feed(b, [live, candidate])
    promotion = store.promotion(engine.stream.rows, candidate.rule_id)
    for b in batches[k:]:
        engine.feed(b, promotion)
    return engine


def test_promote_switches_every_shard_at_one_batch():
    """No transaction is evaluated by both versions or by neither: the live version up to the promotion's
    batch, the promoted one from it; the shadow rule stops at the same batch."""
    live = rule(3, field="COUNT_FLINK", op="GREATER", limit=0, window=1, keys=("payeeId",))  # alerts on every tx
    candidate = shadow_copy(live, limit="-1")  # also alerts on every tx, distinguishable by version
    txs = [tx(i, i * 1_000, payee=i % 5) for i in range(120)]
    batches = [txs[i : i + 10] for i in range(0, 120, 10)]
    engine = promoted_at(Engine(0, shards=3), batches, 5, live, candidate)

    versions = {}
    out = [o[o.kind == "alert"] for o in engine.outputs]
    for batch_no, o in enumerate(out):
        for r in o.itertuples():
            assert (r.ruleId, r.transactionId) not in versions  # never by both
            versions[(r.ruleId, r.transactionId)] = (batch_no, r.ruleVersion)
    assert set(versions) == {(3, t["transactionId"]) for t in txs}  # never by neither
    assert {v for (b, v) in versions.values() if b < 5} == {1} and {v for (b, v) in versions.values() if b >= 5} == {2}
    shadow = engine.hits("shadow")
    assert set(shadow) == {(103, t["transactionId"]) for b in batches[:5] for t in b}
    assert engine.stream.rows[103]["ruleState"] == "DELETE"
    promoted = from_row(engine.stream.rows[3])
    assert (promoted.state, promoted.limit, promoted.shadow_of) == ("ACTIVE", Decimal(-1), None)


def test_promoted_rule_keeps_the_live_windows_and_matches_the_reference():
    live = rule(2, agg="SUM", op="GREATER", limit="300", window=2, keys=("payeeId",))
    candidate = shadow_copy(live, limit="150")
    txs = [tx(i, i * 7_000, payee=i % 3, amount=f"{(i * 37) % 100}.00") for i in range(80)]
    batches = [txs[i : i + 8] for i in range(0, 80, 8)]
    engine = promoted_at(Engine(0, shards=2), batches, 4, live, candidate)
    promoted = replace(candidate, rule_id=2, state="ACTIVE", shadow_of=None)
    ref, _ = reference.run(batches, [[live]] * 4 + [[promoted]] * 6, 0)
    _assert_same(engine.hits("alert"), ref)


# ------------------------------------------------------------------------------------------ rules


BASE = {
    "ruleId": 11,
    "ruleState": "SHADOW",
    "shadowOf": 1,
    "groupingKeyNames": ["payeeId"],
    "aggregateFieldName": "paymentAmount",
    "aggregatorFunctionType": "SUM",
    "limitOperatorType": "GREATER",
    "limit": "10",
    "windowMinutes": 1,
}
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_shadow_of_parses_round_trips_and_is_checked():
    r = parse_rule(BASE)
    assert (r.state, r.shadow_of, r.evaluated) == ("SHADOW", 1, True)
    assert parse_rule(r.to_json()) == r
    for change, problem in [
        ({"shadowOf": 11}, "cannot shadow itself"),
        ({"shadowOf": "x"}, "is not a rule id"),
        ({"ruleState": "ACTIVE"}, "an ACTIVE rule shadows nothing"),
    ]:
        with pytest.raises(RuleError) as err:
            parse_rule({**BASE, **change})
        assert any(problem in p for p in err.value.problems)
    login = parse_rule({"ruleId": 9, "ruleState": "SHADOW", "ruleType": "LOGIN_ANOMALY", "shadowOf": 100})
    assert login.shadow_of == 100 and parse_rule(login.to_json()) == login
    rules, errors = parse_rules_text(
        '[{"ruleId": 5, "ruleState": "ACTIVE", "groupingKeyNames": ["payeeId"], '
        '"aggregateFieldName": "COUNT_FLINK", "aggregatorFunctionType": "SUM", '
        '"limitOperatorType": "GREATER", "limit": 1, "windowMinutes": 1, '
        '"shadowOf": 1}]',
        state="SHADOW",
    )
    assert not errors and rules[0].state == "SHADOW"


def _rows(*rules):
    return store.plan({}, 0, list(rules), NOW, "t", None).rows


def test_shadow_changes_keep_live_rules_live():
    live = rule(1, limit="10")
    rows = _rows(live)
    (candidate,) = store.shadow_changes(rows, [parse_rule({**BASE, "ruleState": "PAUSE"})])
    assert candidate.state == "SHADOW"
    for bad, problem in [
        ({"ruleId": 1, "shadowOf": None}, "is ACTIVE"),
        ({"shadowOf": 42}, "no such rule"),
    ]:
        with pytest.raises(RuleError) as err:
            store.shadow_changes(rows, [parse_rule({**BASE, **bad})])
        assert any(problem in p for p in err.value.problems)


def test_promotion_is_one_change_set_replacing_the_live_rule():
    live = rule(1, limit="10")
    candidate = parse_rule(BASE)
    rows = _rows(live, candidate)
    p = store.plan(rows, 0, store.promotion(rows, 11), NOW, "t", None, label="promote:11")
    assert [(r["ruleId"], r["version"], r["ruleState"], r["change"]) for r in p.log] == [
        (1, 2, "ACTIVE", "promote:11"),
        (11, 2, "DELETE", "promote:11"),
    ]
    assert p.rows[1]["limit"] == "10" and p.rows[1]["sig"] == rows[1]["sig"]  # same windows carry on
    assert from_row(p.rows[1]).shadow_of is None
    with pytest.raises(RuleError, match="not SHADOW"):
        store.promotion(p.rows, 11)
    with pytest.raises(RuleError, match="no such rule"):
        store.promotion(p.rows, 99)


def test_promoting_a_shadow_without_live_rule_activates_it_with_its_windows():
    candidate = parse_rule({**BASE, "shadowOf": None})
    rows = _rows(candidate)
    p = store.plan(rows, 0, store.promotion(rows, 11), NOW, "t", None)
    assert [(r["ruleId"], r["ruleState"]) for r in p.log] == [(11, "ACTIVE")]
    assert p.rows[11]["sig"] == rows[11]["sig"] and p.rows[11]["activeSince"] == 1


def test_shadow_hits_leave_for_shadow_alerts_with_the_live_rule():
    engine = Engine(0)
    live = rule(1, field="COUNT_FLINK", op="GREATER", limit=0)
    out = engine.feed([tx(1, 1_000), tx(2, 2_000)], [live, shadow_copy(live)])
    rows = shadow_rows(pa.Table.from_pandas(out, preserve_index=False), batch_id=7, now_ms=5).to_pandas()
    assert list(rows["alertId"]) == ["101:1", "101:2"] and list(rows["shadowOf"]) == [1, 1]
    assert set(OUTBOX["shadow_alerts"].names) - set(OUTBOX["alerts"].names) == {"shadowOf"}
    assert (rows["kind"] == "WINDOW").all() and (rows["batchId"] == 7).all()


# ------------------------------------------------------------------------------------------ compare (pure part)


def _alerts(rule_id, txs, key='{"payeeId":"1"}', hour=0):
    return pd.DataFrame(
        {
            "alertId": [f"{rule_id}:{t}" for t in txs],
            "key": key,
            "eventTimeMs": [hour * HOUR_MS + t for t in txs],
            "batchId": 0,
        }
    )


def test_compare_frames_counts_keys_and_hours():
    live = pd.concat([_alerts(5, [1, 2, 3]), _alerts(5, [10], key='{"payeeId":"2"}', hour=1)])
    shadow = pd.concat([_alerts(105, [2, 3, 4, 5, 6]), _alerts(105, [10], key='{"payeeId":"2"}', hour=1)])
    got = compare_frames(live, shadow)
    assert got["counts"] == {"live": 4, "shadow": 6, "both": 3, "only_live": 1, "only_shadow": 3}
    assert got["per_key"].to_dict("records")[0] == {"key": '{"payeeId":"1"}', "live": 3, "shadow": 5, "difference": 2}
    assert got["per_hour"][["live", "shadow"]].values.tolist() == [[3, 5], [1, 1]]
    c = Comparison(105, 5, (0, None), window=(0, 2 * HOUR_MS), **got)
    assert c.rates() == {"live": 2.0, "shadow": 3.0}
    text = "\n".join(c.lines())
    assert "overlap (both) 3, only live 1, only shadow 3" in text and "payeeId=1" in text
    assert "alert rate per hour: live 2.0, shadow 3.0 (over the 2 h 0 min the compared micro-batches ran" in text
    # the rate is over the period the batches ran, however few hours of event time the alerts fell in
    short = Comparison(105, 5, (0, None), window=(1_000, 1_000 + 120_000), evaluated=(400, "transactions"), **got)
    assert short.rates() == {"live": 120.0, "shadow": 180.0}
    assert "live 120.0, shadow 180.0 (over the 2 min 0 s the compared" in "\n".join(short.lines())
    assert "; per 1,000 of the 400 transactions evaluated: live 10.0, shadow 15.0" in "\n".join(short.lines())
    empty = compare_frames(_alerts(5, []), _alerts(105, []))
    assert empty["counts"] == dict.fromkeys(("live", "shadow", "both", "only_live", "only_shadow"), 0)
    nothing = "\n".join(Comparison(105, None, (3, 3), **empty).lines())
    assert "no key differs" in nothing and "alert rate: no compared micro-batch has run yet" in nothing


def test_the_period_is_the_batches_both_rules_ran_in():
    run = Run(105, 5, (1, 2), started_ms=1_000, ended_ms=None, ended_by=None, rule_type="WINDOW")
    committed = [(0, 900), (1, 1_500), (2, 2_500), (3, 3_500)]
    assert batch_range(run, 1_200, committed) == (1, None)  # batch 1 committed after the first evaluation
    assert batch_range(run, 1_200, committed, since_ms=2_000) == (2, None)
    ended = replace(run, ended_ms=3_000, ended_by="promote:105")
    assert batch_range(ended, 1_200, committed) == (1, 3)  # batch 3 may have run after the promotion
    assert batch_range(run, 4_000, committed) == (4, None)  # not evaluated in any committed batch yet
    # from the commit before the first compared batch (its input came after it) to the commit of the last
    assert batch_period(committed, (1, None), 1_200) == (900, 3_500)
    assert batch_period(committed, (1, 3), 1_200) == (900, 2_500)
    assert batch_period(committed, (0, 2), 800) == (800, 1_500)  # the query's first batch: from its evaluation
    assert batch_period(committed, (4, None), 4_000) is None
    history = [
        {"ruleId": 105, "version": v, "ruleState": s, "ruleJson": '{"shadowOf": 5}', "updatedAt": t, "change": c}
        for v, s, t, c in [
            (1, "SHADOW", NOW, "create"),
            (2, "PAUSE", NOW, "state"),
            (3, "SHADOW", NOW, "state"),
            (4, "SHADOW", NOW, "update"),
            (5, "DELETE", NOW, "promote:105"),
        ]
    ]
    r = shadow_run(history, 105)
    assert (r.live_id, r.versions, r.ended_by) == (5, (3, 4), "promote:105")
    with pytest.raises(RuleError, match="never been a SHADOW rule"):
        shadow_run(history[1:2], 105)
    with pytest.raises(RuleError) as missing:
        shadow_run(history, 999)
    assert missing.value.problems == ["no such rule"]
    assert parse_time("2h", NOW) == datetime(2025, 12, 31, 22, tzinfo=timezone.utc)
    assert parse_time("2026-01-01T01:00:00", NOW) == datetime(2026, 1, 1, 1, tzinfo=timezone.utc)
    with pytest.raises(ValueError):
        parse_time("yesterday", NOW)


def test_a_shadow_login_detector_hits_what_the_active_one_alerts():
    live = login_rule(rule_id=100)
    candidate = replace(login_rule(min_failures=2, rule_id=200), state="SHADOW", shadow_of=100)
    events = [
        *seed_attack(1),
        login_event(2, "FAIL", "1.1.1.1", 5_000),
        login_event(2, "FAIL", "2.2.2.2", 6_000),
        login_event(2, "SUCCESS", "9.9.9.9", 7_000),
    ]
    stream = RuleStream()
    rows = pd.concat([login_frame(events, 0), stream.changes([live, candidate], LOGIN_EVENT_COLUMNS)])
    out, _ = logins.step(Batch.of(rows.reset_index(drop=True)), RuleSet(), {}, 0, 0, now_ms=0)
    hits = {(int(r.ruleId), int(r.userId)): r.kind for r in out[out.kind.isin(["alert", "shadow"])].itertuples()}
    assert hits == {(100, 1): "alert", (200, 1): "shadow", (200, 2): "shadow"}
    again = RuleStream()
    rows = pd.concat([login_frame(events, 0), again.changes([live, as_active(candidate)], LOGIN_EVENT_COLUMNS)])
    out_active, _ = logins.step(Batch.of(rows.reset_index(drop=True)), RuleSet(), {}, 0, 0, now_ms=0)
    active = out_active[(out_active.kind == "alert") & (out_active.ruleId == 200)]
    shadow = out[out.kind == "shadow"]
    assert list(active.details) == list(shadow.details) and list(active.userId) == list(shadow.userId)
    rows = shadow_rows(pa.Table.from_pandas(out, preserve_index=False), batch_id=1, now_ms=0).to_pandas()
    assert list(rows["alertId"]) == ["200:u1:4000", "200:u2:7000"] and set(rows["kind"]) == {"LOGIN_ANOMALY"}
