"""The Kafka mode of `make bench` without Spark or a broker: its figures and lines, the highest sustained rate, the
job's command line and how far the job has read."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from fraudrules import cli
from fraudrules.config import JobConfig, config_from
from tools import bench
from tools.bench import LIVE_START_MS, KafkaRun, Preload, committed_offsets, highest_sustained


def run(rate: float, latencies: list[float], **kwargs) -> KafkaRun:
    return KafkaRun(rate, 40, 60, latencies=np.array(latencies, dtype=np.float64), **kwargs)


def test_a_run_prints_its_percentiles_memory_and_the_delta_check():
    ms = np.arange(1, 1001, dtype=np.float64)  # 1..1000 ms
    stages = {"evaluated": ms * 0.6, "on the driver": ms * 0.1, "received": ms * 0.3}
    lines = KafkaRun(1_000, 40, 60, latencies=ms, stages=stages, in_delta=1_000, memory="PSS 1,234 MiB").lines()
    assert lines[0] == (
        "kafka: 1,000 tx/s, 1,000 alerts measured over 60 s after a 40 s warm-up: send → alert received "
        "p50 500 ms, p90 900 ms, p99 990 ms, max 1,000 ms; job peak PSS 1,234 MiB"
    )
    assert lines[1] == "  the window's alerts: 1,000 received, 1,000 in the job's Delta alerts table"
    assert lines[2] == (
        "  where the time goes (p50 / p99 ms of each step): sent → evaluated 300 / 594, → on the driver 50 / 99, "
        "→ received 150 / 297"
    )


def test_a_run_names_the_driver_cpu_per_micro_batch_when_measured():
    assert not any("driver" in line for line in run(1_000, [300.0]).lines())
    lines = run(1_000, [300.0], driver_ms=22.6, batches=171).lines()
    assert lines[-1] == (
        "  the driver's Python (sinks, publisher, committers): 3.9 s of CPU in the window, 23 ms per micro-batch "
        "(171 micro-batches)"
    )


def test_a_run_without_alerts_or_behind_says_so():
    quiet = run(200, [], in_delta=None).lines()
    assert "0 alerts measured" in quiet[0] and "no alerts" in quiet[0]
    assert "?" in quiet[1] and len(quiet) == 2  # no breakdown without alerts
    late = run(5_000, [100.0], in_delta=3, behind=1_234, duplicates=2).lines()[1]
    assert "3 in the job's Delta alerts table (2 received twice)" in late
    assert "had not evaluated the last 1,234 transactions" in late
    assert run(300, [], error="the job exited with 1").lines() == ["kafka: 300 tx/s: FAILED: the job exited with 1"]


def test_the_highest_rate_is_the_fastest_that_kept_p99_within_a_second():
    runs = [
        run(1_000, [200.0] * 99 + [900.0]),
        run(5_000, [400.0] * 90 + [3_000.0] * 10),  # p99 3 s
        run(2_000, [300.0] * 100),
        run(10_000, [], error="the job exited with 137"),
    ]
    assert [r.sustained for r in runs] == [True, False, True, False]
    assert highest_sustained(runs) == "highest rate with p99 <= 1 s: 2,000 tx/s"
    # a lower rate that failed does not matter; one that fell behind or measured nothing never counts
    assert not run(500, [100.0], behind=10).sustained and not run(500, []).sustained
    assert highest_sustained([run(2_000, [2_000.0]), run(1_000, [], behind=5)]) == (
        "highest rate with p99 <= 1 s: none of 1,000, 2,000 tx/s"
    )


def test_rates_are_a_comma_separated_list_of_positive_numbers():
    assert bench._rates("1000,2000, 5000") == [1_000.0, 2_000.0, 5_000.0]
    for bad in ("1000,x", "0,100", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            bench._rates(bad)


@pytest.mark.parametrize("profile", ["local", "cluster"])
def test_the_job_command_is_a_valid_production_run(profile):
    topics = {kind: f"kafka-1000-{kind}" for kind in bench.KAFKA_KINDS}
    command = bench.kafka_command("127.0.0.1:9092", "bench/work/kafka-1000", topics, profile, str(bench.BENCH_RULES))
    assert command[1:4] == ["-m", "fraudrules.cli", "run"]
    args = cli.parser().parse_args(command[3:])
    cfg = config_from(vars(args))
    assert args.no_generator and args.rules == str(bench.BENCH_RULES)
    assert (cfg.source, cfg.kafka_bootstrap) == ("kafka", "127.0.0.1:9092")
    assert (cfg.kafka_transactions_topic, cfg.kafka_logins_topic) == ("kafka-1000-transactions", "kafka-1000-logins")
    assert (cfg.kafka_rules_topic, cfg.kafka_alerts_topic) == ("kafka-1000-rules", "kafka-1000-alerts")
    if profile == "cluster":
        assert (cfg.shards, cfg.catalog, cfg.schema) == (16, "spark_catalog", "fraudrules_bench_kafka_1000")
    else:
        assert cfg.shards == JobConfig.shards and not cfg.uses_catalog


def test_committed_offsets_are_those_of_the_last_committed_batch(tmp_path):
    checkpoint = tmp_path / "evaluate"
    assert committed_offsets(str(checkpoint), "tx") == 0  # not started
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    for batch, offset in ((0, 10), (1, 25), (2, 40)):
        meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1})
        sources = [json.dumps({"tx": {"0": offset, "1": 5}}), json.dumps({"logins": {"0": 3}})]
        (checkpoint / "offsets" / str(batch)).write_text("\n".join(["v1", meta, *sources]))
    for batch in (0, 1):  # batch 2 planned, not committed
        (checkpoint / "commits" / str(batch)).write_text("v1\n{}")
    assert committed_offsets(str(checkpoint), "tx") == 30
    assert committed_offsets(str(checkpoint), "other") == 0


def test_a_preload_spans_its_hours_of_event_time_and_ends_before_the_live_input(tmp_path):
    preload = Preload(hours=0.5, rate=20)  # 36,000 s of events at 20/s: 35,820 of them (0.5% short)
    events = list(preload.events())
    assert len(events) == preload.count == 35_820
    times = np.array([e["eventTime"] for e in events])
    assert np.all(np.diff(times) >= 0) and times[-1] < LIVE_START_MS
    assert LIVE_START_MS - 1_800_000 <= times[0] < LIVE_START_MS - 1_700_000  # starts half an hour before
    assert len({e["transactionId"] for e in events}) == len(events) and max(e["transactionId"] for e in events) < 10**9
    rules = json.loads(Path(bench.rules_file(str(tmp_path), preload.window_minutes)).read_text())
    assert len(rules) == len(json.loads(bench.BENCH_RULES.read_text())) and {r["windowMinutes"] for r in rules} == {30}
    assert "on long-lived state: 4 transactions" in run(1_000, [100.0], preloaded="4 transactions").lines()[-1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preload-hours", "24"], "--preload-hours is for --mode kafka"),
        (["--mode", "kafka", "--preload-hours", "-1"], "--preload-hours must be >= 0"),
        (["--mode", "kafka", "--preload-hours", "24", "--preload-rate", "0"], "--preload-rate > 0"),
    ],
)
def test_preload_options_are_checked(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.cli(argv)
    assert message in capsys.readouterr().err
