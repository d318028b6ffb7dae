"""Rules over any declared field: keys mixing text and numbers, nested fields, nulls, and AND/OR/NOT filters under
SQL's three-valued logic, against the brute-force reference (which reads the raw records)."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fraudrules.engine import keying
from fraudrules.event_schema import parse
from fraudrules.rules.model import AGGREGATORS, OPERATORS, parse_rule
from tests.support import reference
from tests.support.harness import Engine, rule, tx_rows
from tests.support.properties import examples

MIN = 60_000
SCHEMA = parse(
    "transactionId BIGINT, eventTime BIGINT, amount DECIMAL(12,2), kind STRING COMMENT 'values: A, B', dev STRING, "
    "m STRUCT<country: STRING, n: INT, flag: BOOLEAN, deep: STRUCT<code: STRING>>"
)


def event(tid: int, t: int, **fields: object) -> dict:
    """A record of SCHEMA; a field given as None is absent (nested ones by their path: `m.country=...`)."""
    out: dict = {"transactionId": tid, "eventTime": t}
    for path, value in fields.items():
        if value is None:
            continue
        *parents, leaf = path.split("__")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def _tx(records: list[dict]) -> keying.Transactions:
    return keying.Transactions.of(tx_rows(records, 0, SCHEMA), SCHEMA)


def truth(term: dict, records: list[dict]) -> list[str]:
    """Each record's value of a filter term: T, F or U (UNKNOWN)."""
    r = rule(1, field="COUNT_FLINK", keys=(), schema=SCHEMA, filter=[term])
    true, false = keying.truth(_tx(records), r.filter[0])
    return ["T" if t else "F" if f else "U" for t, f in zip(true, false, strict=True)]


NULL_5_7 = [event(1, 1), event(2, 2, m__n=5), event(3, 3, m__n=7)]  # m.n: null, 5, 7


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ({"field": "m.n", "op": "EQ", "value": 5}, ["U", "T", "F"]),
        ({"field": "m.n", "op": "NE", "value": 5}, ["U", "F", "T"]),
        ({"field": "m.n", "op": "GT", "value": "5"}, ["U", "F", "T"]),
        ({"field": "m.n", "op": "LE", "value": "6.5"}, ["U", "T", "F"]),
        ({"field": "m.n", "op": "IN", "values": [5, 6]}, ["U", "T", "F"]),
        ({"field": "m.n", "op": "NOT_IN", "values": [5, 6]}, ["U", "F", "T"]),
        ({"field": "m.n", "op": "IS_NULL"}, ["T", "F", "F"]),
        ({"field": "m.n", "op": "NOT_NULL"}, ["F", "T", "T"]),
        ({"not": {"field": "m.n", "op": "EQ", "value": 5}}, ["U", "F", "T"]),  # NOT UNKNOWN is UNKNOWN
        ({"not": {"field": "m.n", "op": "IS_NULL"}}, ["F", "T", "T"]),
        ({"any": [{"field": "m.n", "op": "EQ", "value": 5}, {"field": "m.n", "op": "IS_NULL"}]}, ["T", "T", "F"]),
        (
            {"any": [{"field": "m.n", "op": "EQ", "value": 5}, {"field": "m.n", "op": "GT", "value": 9}]},
            ["U", "T", "F"],
        ),
        ({"not": {"any": [{"field": "m.n", "op": "EQ", "value": 5}]}}, ["U", "F", "T"]),
    ],
)
def test_three_valued_logic(term, expected):
    assert truth(term, NULL_5_7) == expected


def test_text_boolean_and_declared_value_fields_compare_and_are_unknown_when_null():
    records = [event(1, 1, dev="d1", m__flag=True, kind="A"), event(2, 2, m__flag=False, kind="B"), event(3, 3)]
    assert truth({"field": "dev", "op": "NE", "value": "d1"}, records) == ["F", "U", "U"]
    assert truth({"field": "dev", "op": "NOT_IN", "values": ["x"]}, records) == ["T", "U", "U"]
    assert truth({"field": "m.flag", "op": "EQ", "value": True}, records) == ["T", "F", "U"]
    assert truth({"field": "kind", "op": "IN", "values": ["B", "Z"]}, records) == ["F", "T", "U"]


def test_an_event_is_keyed_only_when_its_filter_is_true_and_its_fields_are_not_null():
    r = rule(
        1,
        field="amount",
        keys=("m.country", "kind"),
        schema=SCHEMA,
        filter=[{"not": {"field": "dev", "op": "EQ", "value": "bad"}}],
    )
    records = [
        event(1, 1, amount="1.00", kind="A", m__country="FR", dev="ok"),  # keyed
        event(2, 2, amount="1.00", kind="A", m__country="FR"),  # dev null: NOT UNKNOWN, not keyed
        event(3, 3, amount="1.00", kind="A", dev="ok"),  # grouping field null
        event(4, 4, kind="A", m__country="FR", dev="ok"),  # aggregated field null
        event(5, 5, amount="1.00", kind="A", m__country="FR", dev="bad"),  # filter FALSE
    ]
    assert keying.passes(_tx(records), r).tolist() == [True, False, False, False, False]


def test_keys_mixing_text_and_numbers_show_as_declared():
    r = rule(1, field="COUNT_FLINK", op="GREATER_EQUAL", limit=1, keys=("m.country", "m.n", "kind"), schema=SCHEMA)
    alerts = Engine(MIN, schema=SCHEMA).feed([event(1, 1, m__country='F"R', m__n=-3, kind="B")], [r])
    assert alerts.loc[alerts.kind == "alert", "key"].tolist() == ['{"m.country":"F\\"R","m.n":"-3","kind":"B"}']


def test_colliding_text_hashes_are_told_apart_by_the_second_hash(monkeypatch):
    """Two devices whose first hash collides share `g` but not `h2`: their windows stay apart."""
    real = keying.string_hashes

    def colliding(values):
        h1, h2 = real(values)
        return np.zeros_like(h1), h2

    monkeypatch.setattr(keying, "string_hashes", colliding)
    r = rule(1, field="COUNT_FLINK", op="GREATER_EQUAL", limit=1, keys=("dev",), schema=SCHEMA, window=10)
    records = [event(i, i * 1000, dev=f"d{i % 2}") for i in range(1, 7)]
    got, _ = Engine(MIN, schema=SCHEMA).run([records[:3], records[3:]], [[r], [r]])
    assert got == {(1, i): Decimal((i + 1) // 2) for i in range(1, 7)}  # 1, 1, 2, 2, 3, 3: per device


# ------------------------------------------------------------------------------------------ property-based

VALUES = {
    "dev": st.sampled_from(["d1", "d2", "d3"]),
    "kind": st.sampled_from(["A", "B"]),
    "m__country": st.sampled_from(["FR", "DE"]),
    "m__n": st.integers(-2, 3),
    "m__flag": st.booleans(),
    "m__deep__code": st.sampled_from(["x", "y"]),
}
PATHS = [p.replace("__", ".") for p in VALUES]
LITERALS = {"dev": ["d1", "d2", "zz"], "kind": ["A", "B"], "m.country": ["FR", "DE", "US"], "m.deep.code": ["x", "q"]}


def leaf_terms() -> st.SearchStrategy[dict]:
    def comparison(path: str, op: str, draw_value) -> dict:
        if op in ("IS_NULL", "NOT_NULL"):
            return {"field": path, "op": op}
        if op in ("IN", "NOT_IN"):
            return {"field": path, "op": op, "values": draw_value}
        return {"field": path, "op": op, "value": draw_value[0]}

    numeric = st.builds(
        comparison,
        st.sampled_from(["m.n", "amount"]),
        st.sampled_from(["EQ", "NE", "GT", "GE", "LT", "LE", "IN", "NOT_IN", "IS_NULL", "NOT_NULL"]),
        st.lists(st.sampled_from(["-1", "0", "1.5", "2", "3.00"]), min_size=1, max_size=2),
    )
    text = st.sampled_from(sorted(LITERALS)).flatmap(
        lambda path: st.builds(
            comparison,
            st.just(path),
            st.sampled_from(["EQ", "NE", "IN", "NOT_IN", "IS_NULL", "NOT_NULL"]),
            st.lists(st.sampled_from(LITERALS[path]), min_size=1, max_size=2),
        )
    )
    flag = st.builds(
        comparison, st.just("m.flag"), st.sampled_from(["EQ", "NE", "IS_NULL"]), st.lists(st.booleans(), min_size=1)
    )
    return st.one_of(numeric, text, flag)


TERMS = st.recursive(
    leaf_terms(),
    lambda inner: st.one_of(
        st.builds(lambda t: {"not": t}, inner),
        st.builds(lambda ts: {"any": ts}, st.lists(inner, min_size=1, max_size=3)),
    ),
    max_leaves=5,
)


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 50))
    times = sorted(draw(st.lists(st.integers(0, 6 * MIN), min_size=n, max_size=n)))
    records = []
    for i, t in enumerate(times):
        fields = {p: draw(st.none() | s) for p, s in VALUES.items()}  # each field may be absent
        fields["amount"] = draw(st.none() | st.integers(-500, 500).map(lambda c: f"{c / 100:.2f}"))
        records.append(event(i, t, **fields))
    rules = []
    for rid in range(1, draw(st.integers(1, 4)) + 1):
        field = draw(st.sampled_from(["COUNT_FLINK", "COUNT_WITH_RESET_FLINK", "amount", "m.n"]))
        extras = {"filter": draw(st.lists(TERMS, max_size=2))}
        if field == "COUNT_FLINK" and draw(st.booleans()):
            extras["unique"] = draw(st.lists(st.sampled_from(PATHS), min_size=1, max_size=2, unique=True))
        counts = "COUNT" in field
        rules.append(
            parse_rule(
                {
                    "ruleId": rid,
                    "ruleState": "ACTIVE",
                    "groupingKeyNames": draw(st.lists(st.sampled_from(PATHS), max_size=2, unique=True)),
                    "aggregateFieldName": field,
                    "aggregatorFunctionType": draw(st.sampled_from(AGGREGATORS)),
                    "limitOperatorType": draw(st.sampled_from(OPERATORS)),
                    "limit": draw(st.integers(0, 3)) if counts else draw(st.sampled_from(["-1", "0", "0.5", "2"])),
                    "windowMinutes": draw(st.integers(1, 3)),
                    **extras,
                },
                SCHEMA,
            )
        )
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, n - 1)), max_size=4))))
    batches = [records[a:b] for a, b in zip([0, *cuts], [*cuts, n], strict=True) if records[a:b]]
    return batches, rules


def _same(engine: dict, ref: dict) -> None:
    assert set(engine) == set(ref)
    for k, v in ref.items():
        assert abs(Fraction(engine[k]) - v) <= Fraction(1, 10**18), k


@examples(200)
@given(workloads(), st.integers(1, 3))
def test_matches_the_reference_over_nested_fields_nulls_and_boolean_filters(workload, shards):
    batches, rules = workload
    ref, ref_late = reference.run(batches, [rules] * len(batches), MIN, SCHEMA)
    got, late = Engine(MIN, shards, schema=SCHEMA).run(batches, [rules] * len(batches))
    _same(got, ref)
    assert late == ref_late == set()


@examples(60)
@given(workloads(), st.randoms(use_true_random=False))
def test_matches_the_reference_out_of_order_in_single_batches_without_caches(workload, rnd):
    batches, rules = workload
    singles = [[t] for b in batches for t in b]
    rnd.shuffle(singles)
    ref, ref_late = reference.run(singles, [rules] * len(singles), 2 * MIN, SCHEMA)
    got, late = Engine(2 * MIN, 2, cached=False, schema=SCHEMA).run(singles, [rules] * len(singles))
    _same(got, ref)
    # late events go to late_events per rule that would have keyed them: those no rule keys are not listed
    keyed = {tx["transactionId"] for b in singles for tx in b if any(reference.passes(r, tx) for r in rules)}
    assert late == ref_late & keyed


def test_a_shadow_rule_on_a_nested_field_hits_what_it_alerts_when_active():
    filters = [{"any": [{"field": "dev", "op": "IS_NULL"}, {"not": {"field": "kind", "op": "EQ", "value": "A"}}]}]
    active = rule(1, field="amount", limit="1", keys=("m.country",), schema=SCHEMA, filter=filters, window=2)
    shadow = replace(active, rule_id=2, state="SHADOW")
    records = [
        event(
            i,
            i * 10_000,
            amount=f"{i}.50",
            m__country="FR" if i % 3 else None,
            dev=None if i % 2 else "d",
            kind="AB"[i % 2],
        )
        for i in range(1, 30)
    ]
    engine = Engine(MIN, shards=2, schema=SCHEMA)
    engine.run([records[:10], records[10:]], [[active, shadow]] * 2)
    alerts, hits = engine.hits("alert"), engine.hits("shadow")
    assert alerts and {tx: a for (_, tx), a in hits.items()} == {tx: a for (_, tx), a in alerts.items()}
    assert {r for r, _ in alerts} == {1} and {r for r, _ in hits} == {2}
