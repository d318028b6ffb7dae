"""One JobConfig from CLI arguments and from notebook or job parameters."""

from __future__ import annotations

import pytest

from fraudrules.cli import parser
from fraudrules.config import JobConfig, config_from, flag


def test_cli_arguments_by_field_name():
    args = parser().parse_args(["run", "--data-dir", "d", "--shards", "4", "--available-now", "--logins", "l/"])
    cfg = config_from(vars(args), logins=True)
    assert (cfg.data_dir, cfg.shards, cfg.available_now, cfg.logins, cfg.logins_source) == ("d", 4, True, True, "l/")
    assert cfg.source == "files" and cfg.kafka_rules_topic is None  # Kafka settings only with a Kafka source


def test_a_bootstrap_means_kafka_with_its_topics_and_options():
    argv = ["run", "--kafka-bootstrap", "h:9092", "--kafka-option", "kafka.sasl.mechanism=PLAIN", "--rules-topic", ""]
    args = parser().parse_args(argv)
    cfg = config_from(vars(args), kafka_options=args.kafka_option)
    assert (cfg.source, cfg.kafka_bootstrap, cfg.kafka_alerts_topic, cfg.kafka_rules_topic) == (
        "kafka",
        "h:9092",
        "alerts",
        None,  # '' names no rules topic
    )
    assert cfg.kafka_options == {"kafka.sasl.mechanism": "PLAIN"}  # KEY=VALUE strings as the options dict
    files = config_from(vars(parser().parse_args([*argv, "--source", "files"])))
    assert files.source == "files" and files.kafka_bootstrap is None


def test_notebook_parameters_are_text():
    p = {
        "data_dir": "d",
        "catalog": "",
        "shards": "8",
        "available_now": "false",
        "max_records_per_trigger": "2",
        "trigger_seconds": "1.5",
        "figures_dir": "f",
        "kafka_bootstrap": "",
    }
    cfg = config_from(p)
    assert cfg == JobConfig(data_dir="d", shards=8, available_now=False, max_records_per_trigger=2, trigger_seconds=1.5)


@pytest.mark.parametrize(
    ("text", "value"), [("true", True), ("1", True), (" Yes ", True), ("false", False), ("", False)]
)
def test_flag(text, value):
    assert flag(text) is value


def test_bad_kafka_option():
    with pytest.raises(ValueError, match="not KEY=VALUE"):
        config_from({"kafka_bootstrap": "h:1", "kafka_options": ["oops"]})
