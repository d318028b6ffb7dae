"""The stateful queries' sink on the processor's Arrow output (no Spark): a micro-batch's alerts to the publisher,
every table's rows to the outbox, the heartbeat and the console lines."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pandas as pd
import pyarrow as pa

from fraudrules.engine.outbox import OUTBOX, Outbox
from fraudrules.engine.publisher import Publisher
from fraudrules.engine.results import ResultSink
from tests.support.harness import Engine, rule
from tests.unit.test_windowing import MIN, tx


def sink_batches(folder: str, outs: list[pd.DataFrame]) -> tuple[Outbox, list[pa.Table], list[str]]:
    """`outs` through a ResultSink as micro-batches 0, 1, ...: the outbox, the tables published, the lines printed."""
    box, published, lines = Outbox(folder), [], []
    committer = SimpleNamespace(
        error=None, query="evaluate", outbox=box, publisher=Publisher(published.append, box), wake=threading.Event()
    )
    sink = ResultSink(committer, printer=lines.append)
    for batch_id, out in enumerate(outs):
        arrow = pa.Table.from_pandas(out, preserve_index=False)  # what Spark's toArrow hands the sink
        sink(SimpleNamespace(toArrow=lambda arrow=arrow: arrow), batch_id)
    committer.publisher.flush()
    return box, published, lines


def test_a_batch_becomes_alert_late_heartbeat_and_rule_rows(tmp_path):
    engine, count = Engine(0), rule(1, field="COUNT_FLINK", op="GREATER", limit="0", window=10)
    outs = [engine.feed([tx(1, 10 * MIN), tx(2, 11 * MIN, payee=2)], [count]), engine.feed([tx(3, MIN)], [count])]
    box, published, lines = sink_batches(str(tmp_path), outs)

    alerts = box.read(0, "alerts")
    assert alerts.schema == OUTBOX["alerts"] and published == [alerts]  # no call for a batch without alerts
    assert sorted(alerts.column("alertId").to_pylist()) == ["1:1", "1:2"]
    first = next(a for a in alerts.to_pylist() if a["transactionId"] == 1)
    assert first["kind"] == "WINDOW" and first["groupingKeyNames"] == ["payeeId"] and first["windowMinutes"] == 10
    assert (first["eventTimeMs"], first["batchId"], first["limit"]) == (10 * MIN, 0, "0")

    late = box.read(1, "late_events").to_pylist()
    assert [(e["kind"], e["transactionId"], e["eventTimeMs"], e["batchId"]) for e in late] == [
        ("transaction", 3, MIN, 1)
    ]
    beats = [box.read(b, "batches").to_pylist()[0] for b in (0, 1)]
    assert [(h["alerts"], h["lateEvents"], h["inputRows"]) for h in beats] == [(2, 0, 2), (0, 1, 0)]
    assert beats[0]["watermarkMs"] == 0 and beats[1]["watermarkMs"] == 11 * MIN
    assert box.read(0, "rule_seen").select(["ruleId", "ruleVersion", "batchId"]).to_pylist() == [
        {"ruleId": 1, "ruleVersion": 1, "batchId": 0}
    ]
    assert box.read(0, "shadow_alerts").num_rows == 0
    assert lines[0].startswith("[evaluate] batch 0: 2 alerts in ")
    assert lines[1].startswith("  ALERT rule 1 · tx ") and lines[3].startswith("[evaluate] batch 1: 0 alerts")
