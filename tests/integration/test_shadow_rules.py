"""Shadow rules on the real job and real Delta tables: shadow hits in `shadow_alerts` only (as the reference
decides for the same rule ACTIVE), `alerts` untouched; promote switches at one micro-batch; compare's counts
equal a direct computation from the two tables."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pyspark.sql import functions as F

from fraudrules.rules import shadow, store
from fraudrules.rules.model import parse_rule
from tests.support import reference
from tests.support.streams import FileStream

pytestmark = pytest.mark.spark


def count_rule(rid, op="GREATER_EQUAL", limit=2, state="ACTIVE", **kw):
    return parse_rule(
        {
            "ruleId": rid,
            "ruleState": state,
            "groupingKeyNames": ["payeeId"],
            "aggregateFieldName": "COUNT_FLINK",
            "aggregatorFunctionType": "SUM",
            "limitOperatorType": op,
            "limit": limit,
            "windowMinutes": 60,
            **kw,
        }
    )


def txn(i):
    return {
        "transactionId": i,
        "eventTime": 60_000 * i,
        "payeeId": i % 3,
        "beneficiaryId": 1,
        "paymentAmount": f"{i}.00",
        "paymentType": "CSH",
    }


def hits(df) -> dict[tuple[int, int], int]:
    return {(r.ruleId, r.transactionId): r.ruleVersion for r in df.collect()}


def test_shadow_rules_promote_and_compare_on_the_running_job(spark, tmp_path):
    every = count_rule(1, op="GREATER", limit=0)  # alerts on every transaction
    every_candidate = count_rule(101, op="GREATER_EQUAL", limit=1, state="SHADOW", shadowOf=1)  # the same, v2
    pairs = count_rule(2, limit=2)
    tighter = count_rule(
        102, limit=3, state="SHADOW", shadowOf=2, filter=[{"field": "paymentAmount", "op": "GE", "value": 3}]
    )
    stream = FileStream(spark, str(tmp_path), [every, pairs], shards=2).start()
    batches = [[txn(i) for i in range(b * 4, b * 4 + 4)] for b in range(6)]
    try:
        store.shadow(spark, stream.cfg, [every_candidate, tighter], author="test")
        for b in batches[:3]:
            stream.feed(b)
        promoted = store.promote(spark, stream.cfg, 101, author="test")
        for b in batches[3:]:
            stream.feed(b)
    finally:
        stream.stop()
    assert [(r["ruleId"], r["version"], r["ruleState"], r["change"]) for r in promoted] == [
        (1, 2, "ACTIVE", "promote:101"),
        (101, 2, "DELETE", "promote:101"),
    ]
    alerts, shadows = stream.table("alerts"), stream.table("shadow_alerts")

    # promote: rule 1 alerted every transaction exactly once, v1 before the switch and v2 from it
    by_tx = hits(alerts.where("ruleId = 1"))
    assert sorted(t for _, t in by_tx) == list(range(24))
    assert alerts.where("ruleId = 1").count() == 24
    switch = min(t for (_, t), v in by_tx.items() if v == 2)
    assert all((v == 1) == (t < switch) for (_, t), v in by_tx.items())
    assert 4 <= switch <= 12  # at a batch boundary of the 2nd to 4th file (rule changes apply per micro-batch)
    assert switch % 4 == 0
    assert {t for (_, t) in hits(shadows.where("ruleId = 101"))} == set(range(switch))

    # the shadow of rule 2 ran throughout: exactly the reference's alerts of the same rule ACTIVE
    active_102 = count_rule(102, limit=3, filter=[{"field": "paymentAmount", "op": "GE", "value": 3}])
    ref, _ = reference.run(batches, [[pairs, active_102]] * 6, 60_000)
    assert set(hits(shadows.where("ruleId = 102"))) == {k for k in ref if k[0] == 102}
    assert set(hits(alerts.where("ruleId = 2"))) == {k for k in ref if k[0] == 2}  # live alerts unchanged
    assert alerts.where("ruleId >= 100").count() == 0
    assert {r.shadowOf for r in shadows.select("shadowOf").distinct().collect()} == {1, 2}

    # compare: counts equal a direct computation from the two tables over the same batches
    for sid, live_id in ((102, 2), (101, 1)):
        c = shadow.compare(spark, stream.cfg, sid)
        first, end = c.batches
        in_range = F.col("batchId") >= first if end is None else F.col("batchId").between(first, end - 1)
        live_tx = {r.transactionId for r in alerts.where((F.col("ruleId") == live_id) & in_range).collect()}
        shadow_tx = {r.transactionId for r in shadows.where((F.col("ruleId") == sid) & in_range).collect()}
        assert c.counts == {
            "live": len(live_tx),
            "shadow": len(shadow_tx),
            "both": len(live_tx & shadow_tx),
            "only_live": len(live_tx - shadow_tx),
            "only_shadow": len(shadow_tx - live_tx),
        }
        assert c.counts["shadow"] > 0
    c102 = shadow.compare(spark, stream.cfg, 102)
    assert c102.counts["shadow"] == len({k for k in ref if k[0] == 102})  # it ran from the first batch on
    assert c102.counts["only_live"] > 0 and c102.per_key["difference"].abs().sum() > 0
    c101 = shadow.compare(spark, stream.cfg, 101)
    assert c101.counts["both"] == c101.counts["live"] == c101.counts["shadow"] == switch  # same tx, until the switch
    assert "promote:101" in "\n".join(c101.lines())


def test_the_backtest_notebooks_shadow_path(spark, tmp_path):
    """Locally (available-now, no running job): the candidate goes into SHADOW beside the live rule, new traffic
    is generated and the job's queries run over it, then the two are compared; the live-vs-shadow chart."""
    from fraudrules.analyst import notebook

    p = {"data_dir": str(tmp_path / "data"), "available_now": "true", "generate": "true", "transactions": "600"}
    cfg = notebook.config_from(p).with_(shards=2)
    notebook.prepare(spark, cfg, p)
    notebook.catch_up(spark, cfg)
    live = notebook.live_rule(spark, cfg, 5)
    candidate = replace(live, limit=live.limit / 2)
    assert notebook.shadow_candidate(spark, cfg, candidate, "false", author="t") == []
    rows = notebook.shadow_candidate(spark, cfg, candidate, "true", author="t")
    sid = notebook.SHADOW_OFFSET + 5
    assert [(r["ruleId"], r["ruleState"]) for r in rows] == [(sid, "SHADOW")]
    c = notebook.compare_shadow(spark, cfg, sid, traffic=600)
    assert c.live_id == 5 and c.counts["shadow"] > 0 and c.counts["shadow"] >= c.counts["both"]
    assert notebook.newest_shadow_rule(spark, cfg) == sid
    image = notebook.plot_shadow(spark, cfg, sid, str(tmp_path / "figures"), "live_vs_shadow")
    assert (tmp_path / "figures" / "live_vs_shadow.png").stat().st_size > 5_000 and image is not None
    assert notebook.compare_shadow(spark, cfg, 5) is None  # not a shadow rule
