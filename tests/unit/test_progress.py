"""What the running job prints, from the sinks' heartbeat and alerts (no Spark)."""

from __future__ import annotations

import sys
import threading
from types import SimpleNamespace

import pandas as pd
import pyarrow as pa
import pytest

from fraudrules.engine import progress
from fraudrules.rules.text import duration_text

ALERT_COLUMNS = ["ruleId", "key", "transactionId", "userId", "eventTimeMs", "message"]


def alerts(*rows: tuple) -> pa.Table:
    """A batch's alert rows, typed as the sink has them (nullable ids)."""
    frame = pd.DataFrame(list(rows), columns=ALERT_COLUMNS).astype({"transactionId": "Int64", "userId": "Int64"})
    return pa.Table.from_pandas(frame, preserve_index=False)


@pytest.fixture(autouse=True)
def fresh_tallies(monkeypatch):
    """Each test counts from nothing (the sinks' tallies are one per process)."""
    monkeypatch.setattr(progress, "TALLIES", progress.Tallies())


def heartbeat(**values) -> dict:
    return {
        "transactions": 0,
        "logins": 0,
        "inputRows": 0,
        "lateEvents": 0,
        "latencyP50Ms": None,
        "latencyP99Ms": None,
        **values,
    }


def test_a_batch_without_alerts_prints_nothing_but_is_counted():
    assert progress.batch_lines("evaluate", 3, heartbeat(transactions=212), alerts()) == []
    assert progress.batch_lines("evaluate", 4, heartbeat(transactions=100, logins=20, inputRows=500), alerts()) == []
    taken = progress.TALLIES.take()["evaluate"]
    assert (taken.transactions, taken.logins, taken.batches) == (312, 20, 2)


def test_a_batch_with_alerts_shows_one_line_per_rule_and_key():
    burst = [(1, '{"payeeId":"4"}', 100 + i, None, 1_700_000_000_000, f"COUNT = {3 + i}") for i in range(6)]
    other = (5, '{"payeeId":"9"}', 200, None, 1_700_000_000_250, "SUM = 45,000.00")
    login = (100, '{"userId":"7"}', None, 7, 1_700_000_000_500, "user 7: 3 failed logins")
    lines = progress.batch_lines(
        "evaluate",
        7,
        heartbeat(transactions=1043, latencyP50Ms=850.0, latencyP99Ms=1430.0),
        alerts(*burst, other, login),
    )
    assert lines == [
        "[evaluate] batch 7: 8 alerts in 1,043 transactions; ingestion→alert p50 850 ms, p99 1.4 s",
        "  ALERT rule 1 · tx 100 at 2023-11-14T22:13:20.000Z · COUNT = 3 (+5 more of this key)",
        "  ALERT rule 5 · tx 200 at 2023-11-14T22:13:20.250Z · SUM = 45,000.00",
        "  ALERT rule 100 · user 7 at 2023-11-14T22:13:20.500Z · user 7: 3 failed logins",
    ]
    many = [(2, f'{{"payeeId":"{k}"}}', 300 + k, None, 1_700_000_000_000, "SUM") for k in range(7)]
    lines = progress.batch_lines("evaluate", 8, heartbeat(transactions=50), alerts(*many, *burst), show=5)
    assert len(lines) == 7 and lines[-1] == "  … 3 more keys; all 13 alerts by rule: 1: 6, 2: 7"


def test_a_printed_batch_names_the_batches_before_it_that_had_no_alerts():
    one = alerts((1, '{"payeeId":"4"}', 100, None, 1_700_000_000_000, "COUNT = 3"))
    logins = heartbeat(transactions=10, logins=4)
    assert progress.batch_lines("evaluate", 3, logins, one)[0].endswith("in 10 transactions and 4 login events")
    for batch in (4, 5, 6):
        assert progress.batch_lines("evaluate", batch, heartbeat(), alerts()) == []
    assert progress.batch_lines("evaluate", 7, heartbeat(), one)[0].endswith("(batches 4–6: no alerts)")
    assert progress.batch_lines("evaluate", 8, heartbeat(), one)[0].endswith("in 0 transactions")
    progress.batch_lines("evaluate", 9, heartbeat(), alerts())
    assert progress.batch_lines("evaluate", 10, heartbeat(), one)[0].endswith("(batch 9: no alerts)")
    assert progress.batch_range_text(3, 11, 6) == "6 batches of 3–11"


def test_throughput_in_transactions_and_login_events_per_second():
    tallies = {"evaluate": progress.Tally(transactions=2_000, alerts=1, batches=9)}
    lines = progress.throughput_lines(tallies, {"evaluate": [900.0, 1100.0, 1000.0]}, 10.0)
    assert lines == [
        "[evaluate] last 10 s: 2,000 transactions (200/s), 1 alert; micro-batches took 1.0 s (median of 3)"
    ]
    tallies = {"evaluate": progress.Tally(transactions=2_000, logins=150, alerts=3, late=2, batches=9)}
    assert progress.throughput_lines(tallies, {}, 10.0) == [
        "[evaluate] last 10 s: 2,000 transactions (200/s) and 150 login events (15/s), 3 alerts, 2 late"
    ]
    assert progress.throughput_lines({}, {}, 10.0) == []


def test_rules_in_force_in_one_line():
    applied = [
        {"ruleId": 5, "version": 2, "delayMs": 1_250},
        {"ruleId": 1, "version": 1, "delayMs": 3_000},
        {"ruleId": 9, "version": 1, "delayMs": None},
    ]
    assert progress.rules_in_force_lines("evaluate", applied) == [
        "[evaluate] in force: rule 1 v1, rule 5 v2 (first evaluated 1.2 s to 3.0 s after the change)"
    ]


def test_durations():
    assert [duration_text(v) for v in (None, 850, 1_430, 125_000)] == ["-", "850 ms", "1.4 s", "2 min 5 s"]


def test_ctrl_c_while_starting_lets_the_step_finish_then_a_second_quits(monkeypatch):
    import signal

    from fraudrules.engine import run

    lines, exits = [], []
    monkeypatch.setattr(run.os, "_exit", exits.append)
    previous = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        stop = run.Stop(lines.append)
        stop.starting = "the tables are ready"
        signal.raise_signal(signal.SIGINT)  # no KeyboardInterrupt: the step in progress goes on
        assert stop.requested.is_set() and not stop.hurry.is_set() and exits == []
        signal.raise_signal(signal.SIGINT)
        assert exits == [130]
        assert lines == ["  stopping once the tables are ready (Ctrl-C again: at once)", "  stopping at once"]

        running = run.Stop(lines.append)  # once the queries run: stop, then hurry; never an exit
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
        assert running.requested.is_set() and running.hurry.is_set() and exits == [130]
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


def test_lines_said_by_many_threads_at_once_stay_whole(capsys):
    """The sinks of two queries print at the same moment (`make run` once showed a login line and an
    evaluation line run together): every line stays whole and on its own."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: a line written in two parts gets split
    sent = [f"[query {t}] batch {i}: " + "x" * 200 for t in range(8) for i in range(300)]

    def speak(t: int) -> None:
        for line in sent[t * 300 : (t + 1) * 300]:
            progress.say(line)

    threads = [threading.Thread(target=speak, args=(t,)) for t in range(8)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(interval)
    assert sorted(capsys.readouterr().out.splitlines()) == sorted(sent)


def test_a_stop_waits_for_each_query_to_report_its_end():
    """Spark reports a query's end to the listener after `stop()` returns: the job waits for those reports (with a
    bound) before it removes the listener, so that every query prints its last line."""
    lines: list[str] = []
    listener = progress.ProgressPrinter(lines.append)
    for i, name in enumerate(("ingest", "evaluate")):
        listener.onQueryStarted(SimpleNamespace(id=i, name=name))
    assert listener.wait_ended(["ingest", "evaluate"], timeout_s=0.05) == ["ingest", "evaluate"]
    listener.onQueryTerminated(SimpleNamespace(id=0, exception=None))
    late = threading.Timer(0.2, listener.onQueryTerminated, [SimpleNamespace(id=1, exception="boom\nat ...")])
    late.start()
    assert listener.wait_ended(["ingest", "evaluate"], timeout_s=10) == []
    assert lines[-2:] == ["[ingest] stopped", "[evaluate] FAILED: boom"]
