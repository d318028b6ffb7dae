"""The alerts producer's settings from the job's Java Kafka options, and its delivery errors (no broker needed)."""

from __future__ import annotations

import time

import pytest

from fraudrules.config import JobConfig
from fraudrules.engine.kafka import AlertsProducer, producer_config
from fraudrules.engine.outbox import OUTBOX


def _cfg(options: dict[str, str], bootstrap: str = "broker:9093") -> JobConfig:
    return JobConfig(kafka_bootstrap=bootstrap, kafka_alerts_topic="alerts", kafka_options=options)


def test_java_options_become_librdkafka_settings():
    jaas = (
        "kafkashaded.org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="svc" password="p\\"w=1;";'
    )
    config = producer_config(
        _cfg(
            {
                "kafka.security.protocol": "SASL_SSL",
                "kafka.sasl.mechanism": "PLAIN",
                "kafka.sasl.jaas.config": jaas,
                "kafka.ssl.endpoint.identification.algorithm": "",
                "kafka.acks": "1",
                "kafka.group.id": "readers-only",  # a consumer setting: the producer skips it
                "failOnDataLoss": "false",  # not `kafka.`: the readers' only
            }
        )
    )
    assert config == {
        "bootstrap.servers": "broker:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "svc",
        "sasl.password": 'p"w=1;',
        "ssl.endpoint.identification.algorithm": "none",
        "acks": "1",  # the job's own setting over the default
        "enable.idempotence": "true",
        "delivery.timeout.ms": "120000",
    }


def test_scram_logins_and_pem_trust_stores_translate():
    jaas = 'org.apache.kafka.common.security.scram.ScramLoginModule required password="s" username="u";'
    options = {"kafka.sasl.jaas.config": jaas, "kafka.ssl.truststore.type": "PEM"}
    located = producer_config(_cfg({**options, "kafka.ssl.truststore.location": "/etc/ca.pem"}))
    assert (located["sasl.username"], located["sasl.password"], located["ssl.ca.location"]) == ("u", "s", "/etc/ca.pem")
    inline = producer_config(_cfg({**options, "kafka.ssl.truststore.certificates": "-----BEGIN CERTIFICATE-----"}))
    assert inline["ssl.ca.pem"] == "-----BEGIN CERTIFICATE-----" and "ssl.truststore.type" not in inline


@pytest.mark.parametrize(
    "options, named",
    [
        ({"kafka.ssl.truststore.location": "/etc/truststore.jks"}, "kafka.ssl.truststore.location"),
        (
            {"kafka.ssl.truststore.location": "/t.p12", "kafka.ssl.truststore.type": "PKCS12"},
            "kafka.ssl.truststore.location",
        ),
        ({"kafka.sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;"}, "sasl.jaas.config"),
        ({"kafka.max.block.ms": "1000"}, "max.block.ms"),  # a Java producer setting librdkafka does not have
    ],
)
def test_options_without_a_librdkafka_equivalent_are_named(options, named):
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        AlertsProducer(_cfg(options))


def test_an_undelivered_alert_raises_after_the_delivery_timeout():
    producer = AlertsProducer(_cfg({"kafka.delivery.timeout.ms": "1000"}, bootstrap="127.0.0.1:1"))  # nobody there
    alerts = OUTBOX["alerts"].empty_table()
    producer(alerts)  # nothing to send: returns at once
    row = {name: [None] for name in alerts.column_names} | {"alertId": ["1:7"], "ruleId": [1], "transactionId": [7]}
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="1 of 1 alerts not delivered to alerts"):
        producer(alerts.from_pydict(row, schema=alerts.schema))
    assert time.monotonic() - started < 30
