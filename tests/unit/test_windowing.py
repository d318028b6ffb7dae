"""The vectorised window evaluator against the brute-force reference, plus the spec's edge cases."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fraudrules.engine.state import policy
from fraudrules.engine.windowing import render
from fraudrules.rules.model import AGGREGATORS, OPERATORS
from tests.support import reference
from tests.support.harness import Engine, rule
from tests.support.properties import examples

MIN = 60_000


def tx(tid, t, payee=1, ben=1, amount="1.00", ptype="CSH"):
    return {
        "transactionId": tid,
        "eventTime": t,
        "payeeId": payee,
        "beneficiaryId": ben,
        "paymentAmount": amount,
        "paymentType": ptype,
    }


def alerts_of(batches, rules, lateness=0, shards=1):
    return Engine(lateness, shards).run(batches, [rules] * len(batches))


def test_window_includes_both_ends():
    r = rule(1, field="COUNT_FLINK", op="GREATER_EQUAL", limit=2, window=1)
    # t=0 and t=60000 are exactly W apart: same window; t=120001 is W+1 after 60000
    alerts, _ = alerts_of([[tx(1, 0), tx(2, MIN), tx(3, 2 * MIN + 1)]], [r])
    assert alerts == {(1, 2): Decimal(2)}


def test_equal_timestamps_follow_source_order():
    r = rule(1, field="COUNT_FLINK", op="EQUAL", limit=2)
    alerts, _ = alerts_of([[tx(10, 5000), tx(11, 5000), tx(12, 5000)]], [r])
    assert alerts == {(1, 11): Decimal(2)}


def test_batch_cut_does_not_change_in_order_results():
    r = rule(1, agg="AVG", op="GREATER", limit="2.5")
    txs = [tx(i, i * 1000, amount=f"{i}.00") for i in range(1, 9)]
    whole, _ = alerts_of([txs], [r])
    cut, _ = alerts_of([txs[:3], txs[3:4], txs[4:]], [r])
    assert whole == cut and whole


def test_count_with_reset_empties_the_window():
    r = rule(1, field="COUNT_WITH_RESET_FLINK", op="GREATER_EQUAL", limit=2)
    alerts, _ = alerts_of([[tx(1, 1000), tx(2, 2000)], [tx(3, 3000), tx(4, 4000), tx(5, 5000)]], [r])
    assert sorted(alerts) == [(1, 2), (1, 4)]


def test_paused_and_deleted_rules_key_nothing():
    active = rule(1, field="COUNT_FLINK", op="GREATER", limit=0)
    paused = rule(2, field="COUNT_FLINK", op="GREATER", limit=0, state="PAUSE")
    deleted = rule(3, field="COUNT_FLINK", op="GREATER", limit=0, state="DELETE")
    alerts, _ = alerts_of([[tx(1, 1000)]], [active, paused, deleted])
    assert set(alerts) == {(1, 1)}


def test_late_events_are_reported_not_evaluated():
    r = rule(1, field="COUNT_FLINK", op="GREATER", limit=0)
    alerts, late = alerts_of([[tx(1, 100_000)], [tx(2, 10_000), tx(3, 100_001)]], [r], lateness=5_000)
    assert late == {2} and set(alerts) == {(1, 1), (1, 3)}


def test_min_max_and_exact_decimals():
    lo = rule(1, agg="MIN", op="LESS", limit="0.30")
    hi = rule(2, agg="MAX", op="EQUAL", limit="0.3")
    total = rule(3, agg="SUM", op="EQUAL", limit="0.6")
    batch = [tx(1, 1000, amount="0.10"), tx(2, 2000, amount="0.20"), tx(3, 3000, amount="0.30")]
    alerts, _ = alerts_of([batch], [lo, hi, total])
    assert alerts[(1, 1)] == Decimal("0.1") and (1, 3) in alerts
    assert alerts[(2, 3)] == Decimal("0.3") and (2, 2) not in alerts
    assert alerts[(3, 3)] == Decimal("0.6")


def test_avg_is_exact_sum_over_count():
    r = rule(1, agg="AVG", op="GREATER", limit="0.3333333333")
    alerts, _ = alerts_of([[tx(1, 1, amount="0.00"), tx(2, 2, amount="0.00"), tx(3, 3, amount="1.00")]], [r])
    assert alerts == {(1, 3): render(100, 300)}


def test_distinct_count_with_filter():
    r = rule(
        1,
        field="COUNT_FLINK",
        op="GREATER_EQUAL",
        limit=3,
        window=10,
        unique=["beneficiaryId"],
        filter=[{"field": "paymentType", "op": "EQ", "value": "CSH"}],
    )
    batch = [
        tx(1, 1, ben=1),
        tx(2, 2, ben=2),
        tx(3, 3, ben=2),
        tx(4, 4, ben=9, ptype="CRD"),
        tx(5, 5, ben=3),
        tx(6, 6, ben=1),
    ]
    alerts, _ = alerts_of([batch], [r])
    assert alerts == {(1, 5): Decimal(3), (1, 6): Decimal(3)}


def test_render_terminating_and_repeating():
    assert render(1050, 100) == Decimal("10.5")
    assert render(100, 300) == Decimal("0.333333333333333333")


def _assert_same(engine, ref):
    assert set(engine) == set(ref)
    for k, v in ref.items():
        assert abs(Fraction(engine[k]) - v) <= Fraction(1, 10**18), k


FILTERS = st.lists(
    st.one_of(
        st.builds(lambda v: {"field": "paymentType", "op": "EQ", "value": v}, st.sampled_from(["CSH", "CRD"])),
        st.builds(lambda v: {"field": "paymentAmount", "op": "GE", "value": f"{v}.50"}, st.integers(0, 400)),
        st.builds(lambda v: {"field": "payeeId", "op": "IN", "values": v}, st.lists(st.integers(1, 3), min_size=1)),
        st.builds(lambda v: {"field": "beneficiaryId", "op": "NE", "value": v}, st.integers(1, 2)),
    ),
    min_size=1,
    max_size=2,
)


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 60))
    times = sorted(draw(st.lists(st.integers(0, 8 * MIN), min_size=n, max_size=n)))
    txs = [
        tx(
            i,
            t,
            payee=draw(st.integers(1, 3)),
            ben=draw(st.integers(1, 2)),
            amount=f"{draw(st.integers(0, 500))}.{draw(st.integers(0, 99)):02d}",
            ptype=draw(st.sampled_from(["CSH", "CRD"])),
        )
        for i, t in enumerate(times)
    ]
    rules = []
    for rid in range(1, draw(st.integers(1, 4)) + 1):
        field = draw(st.sampled_from(["paymentAmount", "COUNT_FLINK", "COUNT_WITH_RESET_FLINK", "payeeId"]))
        keys = draw(st.sampled_from([("payeeId",), ("beneficiaryId",), ("payeeId", "beneficiaryId"), ("paymentType",)]))
        limit = (
            draw(st.integers(0, 4)) if "COUNT" in field else f"{draw(st.integers(0, 900))}.{draw(st.integers(0, 99))}"
        )
        extras = {}
        if draw(st.booleans()):
            extras["filter"] = draw(FILTERS)
        if field == "COUNT_FLINK" and draw(st.booleans()):
            extras["unique"] = [draw(st.sampled_from(["beneficiaryId", "paymentType", "payeeId"]))]
        rules.append(
            rule(
                rid,
                field=field,
                agg=draw(st.sampled_from(AGGREGATORS)),
                op=draw(st.sampled_from(OPERATORS)),
                limit=limit,
                window=draw(st.integers(1, 4)),
                keys=keys,
                **extras,
            )
        )
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, n - 1)), max_size=5))))
    batches = [txs[a:b] for a, b in zip([0, *cuts], [*cuts, n], strict=True) if txs[a:b]]
    return batches, rules


@examples(150)
@given(workloads(), st.integers(1, 3))
def test_matches_reference_on_random_in_order_streams(workload, shards):
    batches, rules = workload
    per_batch = [rules] * len(batches)
    ref_alerts, ref_late = reference.run(batches, per_batch, lateness_ms=MIN)
    got_alerts, got_late = Engine(MIN, shards).run(batches, per_batch)
    _assert_same(got_alerts, ref_alerts)
    assert got_late == ref_late == set()
    whole, _ = Engine(MIN, shards).run([[t for b in batches for t in b]], [rules])
    assert set(whole) == set(ref_alerts)


@examples(100)
@given(workloads(), st.integers(0, 3 * MIN), st.randoms(use_true_random=False))
def test_matches_reference_with_out_of_order_and_late_events(workload, lateness, rnd):
    batches, rules = workload
    for b in batches:
        rnd.shuffle(b)
    per_batch = [rules] * len(batches)
    ref_alerts, ref_late = reference.run(batches, per_batch, lateness_ms=lateness)
    got_alerts, got_late = Engine(lateness, 2).run(batches, per_batch)
    _assert_same(got_alerts, ref_alerts)
    assert got_late == ref_late


@pytest.mark.parametrize("limit", ["1", "1.5", "-2"])
def test_limit_fraction_is_exact(limit):
    n, e = rule(1, limit=limit).limit_fraction
    assert Fraction(n, 10**e) == Fraction(Decimal(limit))


@examples(60)
@given(workloads(), st.integers(1, 2), st.integers(0, 2))
def test_matches_reference_in_small_batches_without_caches(workload, shards, lateness_minutes):
    """Every event its own micro-batch: chunks are merged, rewritten and dropped on the way, and every
    batch reads them back from the state store (no cache), as on a fresh worker."""
    batches, rules = workload
    singles = [[t] for b in batches for t in b]
    per_batch = [rules] * len(singles)
    ref_alerts, ref_late = reference.run(singles, per_batch, lateness_ms=lateness_minutes * MIN)
    got_alerts, got_late = Engine(lateness_minutes * MIN, shards, cached=False).run(singles, per_batch)
    _assert_same(got_alerts, ref_alerts)
    assert got_late == ref_late


@examples(100)
@given(workloads(), st.integers(0, 2 * MIN), st.randoms(use_true_random=False))
def test_matches_reference_when_chunks_are_folded(workload, lateness, rnd):
    """Every chunk counts as settled and is folded at once, in blocks of two: later batches ask the blocks, ask a
    block's chunks where their windows cut it, drop a block whose chunk is rewritten or dropped and fold its other
    chunk again."""
    batches, rules = workload
    for b in batches:
        rnd.shuffle(b)
    per_batch = [rules] * len(batches)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(policy, "MAX_MERGED", 1)
        patch.setattr(policy, "FOLD_MIN", 1)
        patch.setattr(policy, "FOLD_BLOCK", 2)
        got_alerts, got_late = Engine(lateness, 2).run(batches, per_batch)
    ref_alerts, ref_late = reference.run(batches, per_batch, lateness_ms=lateness)
    _assert_same(got_alerts, ref_alerts)
    assert got_late == ref_late


@examples(100)
@given(workloads(), st.integers(0, 2 * MIN), st.integers(0, 10), st.randoms(use_true_random=False))
def test_matches_reference_when_merged_chunks_are_folded_and_a_rule_stops(workload, lateness, stop_at, rnd):
    """Small merges (at most 6 events): chunks settle once the newer ones outweigh them and fold in blocks of
    two, while merges go on at the tail; from batch `stop_at` the first rule is paused, its events are dropped
    from chunks (rewritten) and blocks holding them are folded again."""
    batches, rules = workload
    for b in batches:
        rnd.shuffle(b)
    paused = [replace(rules[0], state="PAUSE"), *rules[1:]]
    per_batch = [rules if i < stop_at else paused for i in range(len(batches))]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(policy, "MAX_MERGED", 6)
        patch.setattr(policy, "FOLD_MIN", 1)
        patch.setattr(policy, "FOLD_BLOCK", 2)
        got_alerts, got_late = Engine(lateness, 2).run(batches, per_batch)
    ref_alerts, ref_late = reference.run(batches, per_batch, lateness_ms=lateness)
    _assert_same(got_alerts, ref_alerts)
    assert got_late == ref_late


def test_long_stream_keeps_state_bounded_and_results_exact():
    """Hours of events against 1- and 3-minute windows: retained state stays near one window's worth."""
    rules = [
        rule(1, agg="MAX", op="GREATER", limit="400", window=1),
        rule(2, field="COUNT_WITH_RESET_FLINK", op="GREATER_EQUAL", limit=5, window=3, keys=("beneficiaryId",)),
        rule(3, agg="AVG", op="LESS", limit="100", window=3, keys=("payeeId", "beneficiaryId")),
    ]
    txs = [tx(i, i * 1_000, payee=i % 7, ben=i % 3, amount=f"{(i * 37) % 500}.{i % 100:02d}") for i in range(3_000)]
    batches = [txs[i : i + 25] for i in range(0, len(txs), 25)]
    engine = Engine(0, shards=2)
    got, _ = engine.run(batches, [rules] * len(batches))
    ref, _ = reference.run(batches, [rules] * len(batches), lateness_ms=0)
    _assert_same(got, ref)
    retained = sum(c.n for s in engine.state for c in s.meta.chunks)
    chunks = sum(len(s.meta.chunks) for s in engine.state)
    assert retained <= 3 * (60 + 3 * 60 + 3 * 60), retained  # ≈ one window per rule, a few batches of slack
    assert chunks <= 2 * 12, chunks
