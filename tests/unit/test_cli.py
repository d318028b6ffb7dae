"""The command line's contract without Spark: help everywhere, defaults per command, invalid values and unusable
paths rejected with a one-line error and exit status 2 before anything starts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from fraudrules import __version__, cli, event_schema, logs
from fraudrules.cli.common import job_config
from fraudrules.cli.rules import history_lines

FIXTURE_RULES = "tests/fixtures/rules.json"


def subcommands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_option_of_every_command_has_help():
    missing = [
        f"{name} {'/'.join(action.option_strings) or action.dest}"
        for name, command in subcommands().items()
        for action in command._actions
        if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()
    ]
    assert missing == []


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"fraudrules {__version__}"


@pytest.mark.parametrize(
    "argv",
    [["run"], ["export", "alerts", "--out", "a.jsonl"], ["rules", "list"], ["rules", "pause", "1"], ["quality"]],
)
def test_commands_on_the_local_tables_default_to_data(argv):
    """One subcommand's defaults never leak into another's (argparse shares a parent's actions)."""
    args = cli.parser().parse_args(argv)
    assert args.data_dir == "data"
    assert cli.parser().parse_args(["backtest", "--rules", "r", "--out", "o"]).data_dir is None


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--out", "d", "--count", "-5"],
        ["generate", "--out", "d", "--count", "0"],
        ["generate", "--out", "d", "--per-file", "0"],
        ["generate", "--out", "d", "--seed", "-1"],  # numpy takes no negative seed
        ["run", "--rate", "-1"],
        ["run", "--shards", "0"],
        ["run", "--trigger-seconds", "0"],
        ["run", "--seconds", "-3"],
        ["run", "--kafka-option", "no-equals-sign"],
        ["run", "--rules-format", "avro"],
        ["run", "--rules-column", "limit"],
        ["run", "--max-records-per-trigger", "0"],
        ["backtest", "--rules", "r", "--out", "o", "--max-offsets-per-trigger", "-2"],
        ["backtest", "--rules", "r", "--out", "o", "--lateness-ms", "-1"],
        ["status", "--p99-ms", "0"],
        ["quality", "--max-age-minutes", "0"],
        ["export", "nope", "--out", "o"],
        ["rules", "frobnicate"],
    ],
)
def test_invalid_values_are_rejected_on_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parser().parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fraudrules {argv[0]}: argument ") and len(err.splitlines()) == 1, err
    assert err.endswith(f"(see `fraudrules {argv[0]} --help`)\n") and "usage:" not in err


def test_a_missing_command_is_one_line_too(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "fraudrules: the following arguments are required: COMMAND (see `fraudrules --help`)\n"
    )


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, *expected: str) -> None:
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert all(text in err for text in expected), err


def test_missing_inputs_end_a_backtest_before_spark_starts(tmp_path, capsys):
    out = str(tmp_path / "a.jsonl")
    code, _, err = run_main(capsys, "backtest", "--transactions", "nope.jsonl", "--rules", FIXTURE_RULES, "--out", out)
    one_line_error(code, err, "--transactions nope.jsonl: no such file or folder")
    code, _, err = run_main(
        capsys, "backtest", "--logins", str(tmp_path / "l*.jsonl"), "--rules", FIXTURE_RULES, "--out", out
    )
    one_line_error(code, err, "--logins", "no readable file matches")
    code, _, err = run_main(capsys, "backtest", "--transactions", str(tmp_path), "--rules", FIXTURE_RULES, "--out", out)
    one_line_error(code, err, "folder holds no readable files")
    (tmp_path / "t.jsonl").write_text("{}\n")
    code, _, err = run_main(
        capsys, "backtest", "--transactions", str(tmp_path / "t.jsonl"), "--rules", "nope.json", "--out", out
    )
    one_line_error(code, err, "--rules nope.json: no such file")
    code, _, err = run_main(capsys, "backtest", "--rules", FIXTURE_RULES, "--out", out)
    one_line_error(code, err, "needs --transactions and/or --logins")
    code, _, err = run_main(
        capsys,
        "backtest",
        "--transactions",
        str(tmp_path / "t.jsonl"),
        "--rules",
        FIXTURE_RULES,
        "--out",
        str(tmp_path),
    )
    one_line_error(code, err, "--out", "is a folder")


def test_unusable_arguments_of_the_other_commands(tmp_path, capsys):
    data = str(tmp_path)
    code, _, err = run_main(capsys, "export", "alerts", "--out", str(tmp_path / "a.jsonl"), "--data-dir", data)
    one_line_error(code, err, "no tables under", "make run")
    (tmp_path / "tables" / "rules" / "_delta_log").mkdir(parents=True)
    code, _, err = run_main(capsys, "export", "alerts", "--out", str(tmp_path / "a.jsonl"), "--data-dir", data)
    one_line_error(code, err, f"no table alerts under {tmp_path}/tables", "make run")
    code, _, err = run_main(capsys, "rules", "pause", "--data-dir", data)
    one_line_error(code, err, "rules pause needs a rule id")
    code, _, err = run_main(capsys, "rules", "history", "one", "--data-dir", data)
    one_line_error(code, err, "rule id 'one' is not an integer")
    code, _, err = run_main(capsys, "rules", "put", "nope.json", "--data-dir", data)
    one_line_error(code, err, "rules put nope.json: no such file")
    code, _, err = run_main(capsys, "rules", "shadow", "nope.json", "--data-dir", data)
    one_line_error(code, err, "rules shadow nope.json: no such file")
    code, _, err = run_main(capsys, "rules", "promote", "--data-dir", data)
    one_line_error(code, err, "rules promote needs a rule id")
    code, _, err = run_main(capsys, "rules", "compare", "105", "--since", "last week", "--data-dir", data)
    one_line_error(code, err, "rules compare: 'last week' is neither an ISO time nor an age")
    code, _, err = run_main(capsys, "run", "--rules", "nope.json", "--data-dir", data)
    one_line_error(code, err, "--rules nope.json: no such file")
    code, _, err = run_main(capsys, "run", "--transactions", str(tmp_path / "missing" / "*.json"), "--data-dir", data)
    one_line_error(code, err, "no such folder")
    code, _, err = run_main(capsys, "status", "--facts", "nope.json")
    one_line_error(code, err, "--facts nope.json: no such file")
    code, _, err = run_main(capsys, "run", "--rules-format", "debezium", "--rules-column", "lmit=x", "--data-dir", data)
    one_line_error(code, err, "rules_columns: lmit not a rule field (fields: ruleId, ruleState")


@pytest.mark.parametrize(
    "argv",
    [
        ["backtest", "--transactions", "t.jsonl", "--rules", "r.json", "--out", "a.jsonl", "--schema", "rich"],
        ["rules", "list", "--catalog", "main"],
        ["export", "alerts", "--out", "a.jsonl", "--catalog", "main"],
    ],
)
def test_catalog_or_schema_alone_is_an_error_not_path_tables(argv, tmp_path, capsys, monkeypatch):
    """Without its partner, --catalog or --schema would quietly mean path tables (`--schema rich` is not the event
    schema: that is --event-schema)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jsonl").write_text("")
    (tmp_path / "r.json").write_text((Path(__file__).parents[1] / "fixtures" / "rules.json").read_text())
    code, _, err = run_main(capsys, *argv, "--data-dir", str(tmp_path))
    one_line_error(code, err, "catalog and schema go together")


def test_rules_files_that_cannot_be_used_are_one_line_errors(tmp_path, capsys):
    """An invalid rule, text that is not UTF-8 and JSON that is not JSON: named, exit 2, before Spark starts (a
    backtest with an invalid rule included: a backtest without it would answer another question)."""
    (tmp_path / "t.jsonl").write_text("{}\n")
    rules = json.loads((Path(FIXTURE_RULES)).read_text())
    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps([rules[0], {**rules[1], "ruleId": 9, "windowMinutes": 0}]))
    backtest = ["backtest", "--transactions", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "a.jsonl")]
    code, out, err = run_main(capsys, *backtest, "--rules", str(invalid))
    one_line_error(code, err, f"fraudrules backtest: --rules {invalid}: invalid rule 9: windowMinutes must be > 0")
    assert out == "" and not (tmp_path / "a.jsonl").exists()
    latin = tmp_path / "latin1.json"
    latin.write_bytes(json.dumps(rules[0]).replace("SUM", "SUM\u00e9").encode("latin-1"))
    for argv in ([*backtest, "--rules", str(latin)], ["rules", "put", str(latin), "--data-dir", str(tmp_path)]):
        code, _, err = run_main(capsys, *argv)
        one_line_error(code, err, f"{latin}: not UTF-8 text (byte 0xe9 at offset ")
    broken = tmp_path / "broken.json"
    broken.write_text('[{"ruleId": 1,')
    code, _, err = run_main(capsys, "rules", "shadow", str(broken), "--data-dir", str(tmp_path))
    one_line_error(code, err, f"fraudrules rules: rules shadow {broken}: malformed JSON: ")
    assert "None" not in err
    code, _, err = run_main(capsys, "run", "--rules", str(broken), "--data-dir", str(tmp_path / "d"))
    one_line_error(code, err, f"fraudrules run: --rules {broken}: malformed JSON: ")
    assert not (tmp_path / "d").exists()  # nothing started, nothing registered


def test_commands_that_only_read_never_create_tables(tmp_path, capsys):
    typo = tmp_path / "dta"
    for argv in (["rules", "list"], ["rules", "history", "4"], ["rules", "compare", "105"], ["quality"]):
        code, _, err = run_main(capsys, *argv, "--data-dir", str(typo))
        one_line_error(code, err, f"fraudrules {argv[0]}: no data dir {typo} (check --data-dir)")
    code, _, err = run_main(capsys, "status", "--data-dir", str(typo))
    one_line_error(code, err, f"no data dir {typo}")
    empty = tmp_path / "empty"
    empty.mkdir()
    for argv in (["rules", "list"], ["quality"], ["export", "alerts", "--out", str(tmp_path / "a.jsonl")], ["status"]):
        code, _, err = run_main(capsys, *argv, "--data-dir", str(empty))
        one_line_error(code, err, f"no tables under {empty} (run the job first")
    assert not typo.exists() and list(empty.iterdir()) == []
    (empty / "run").mkdir()  # a job's run folder: a job that has not made its tables yet is judged
    code, out, _ = run_main(capsys, "status", "--data-dir", str(empty))
    assert code == 0 and json.loads(out)["action"] == "start"
    assert [p.name for p in (empty / "run").iterdir()] == ["monitor-last.json"]


def test_missing_jars_are_a_one_line_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "tables" / "alerts" / "_delta_log").mkdir(parents=True)
    monkeypatch.setenv("FRAUDRULES_JARS", str(tmp_path / "jars"))
    code, _, err = run_main(capsys, "export", "alerts", "--out", str(tmp_path / "a.jsonl"), "--data-dir", str(tmp_path))
    one_line_error(code, err, f"fraudrules export: no jars in {tmp_path / 'jars'}: run `make setup`")
    (tmp_path / "jars").mkdir()
    (tmp_path / "jars" / "kafka-clients-3.9.2.jar").write_bytes(b"")
    code, _, err = run_main(capsys, "export", "alerts", "--out", str(tmp_path / "a.jsonl"), "--data-dir", str(tmp_path))
    one_line_error(code, err, "no delta-spark_*.jar or delta-storage-*.jar in")


def test_an_invalid_log_level_is_a_usage_error(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(logs.ENV, "LOUD")
    code, _, err = run_main(capsys, "status", "--data-dir", str(tmp_path))
    one_line_error(code, err, "FRAUDRULES_LOG_LEVEL='LOUD' is not a log level")


def test_verbose_brings_spark_warnings_back(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(logs.ENV, "ERROR")  # restored after the test, as main() sets it
    assert logs.quiet()
    (tmp_path / "tables").mkdir()
    code, out, _ = run_main(capsys, "status", "--verbose", "--data-dir", str(tmp_path))
    assert code == 0 and json.loads(out)
    assert logs.level() == "WARN" and not logs.quiet()
    monkeypatch.setenv(logs.ENV, "debug")
    logs.set_verbose()  # a more verbose level stays
    assert logs.level() == "DEBUG"


def test_generate_writes_the_workload(tmp_path, capsys):
    code, out, _ = run_main(capsys, "generate", "--out", str(tmp_path / "w"), "--count", "120", "--per-file", "50")
    assert code == 0 and out.strip() == f"wrote 120 transactions to {tmp_path / 'w'} (3 files)"
    lines = [json.loads(x) for f in sorted((tmp_path / "w").iterdir()) for x in f.read_text().splitlines()]
    assert [t["transactionId"] for t in lines] == list(range(1, 121))


RICH_SCHEMA = "lib/fraudrules/schemas/rich.ddl"


def test_a_backtest_with_an_invalid_rule_exits_2_naming_each_before_spark_starts(tmp_path, capsys, monkeypatch):
    import fraudrules.session

    monkeypatch.setattr(fraudrules.session, "get_spark", lambda *a, **k: pytest.fail("Spark started"))
    base = {
        "ruleState": "ACTIVE",
        "groupingKeyNames": ["deviceId"],
        "aggregateFieldName": "COUNT_FLINK",
        "aggregatorFunctionType": "SUM",
        "limitOperatorType": "GREATER",
        "limit": 40,
        "windowMinutes": 2,
    }
    rules = [
        {**base, "ruleId": 1},
        {**base, "ruleId": 2, "groupingKeyNames": ["merchant.contry"]},
        {**base, "ruleId": 3, "aggregateFieldName": "card.bin"},
        {**base, "ruleId": 4, "filter": [{"field": "channel", "op": "GE", "value": "web"}]},
        {**base, "ruleId": 5, "filter": [{"any": [{"field": "basket.items", "op": "IN", "values": [1, "lots"]}]}]},
    ]
    (tmp_path / "rules.json").write_text(json.dumps(rules))
    (tmp_path / "t.jsonl").write_text("{}\n")
    argv = ["backtest", "--transactions", str(tmp_path / "t.jsonl"), "--rules", str(tmp_path / "rules.json")]
    code, out, err = run_main(capsys, *argv, "--out", str(tmp_path / "a.jsonl"), "--event-schema", RICH_SCHEMA)
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "invalid rule 2: groupingKeyNames: 'merchant.contry' is not in the event schema (closest: merchant.country, "
        "merchant.category, merchant.id)",
        "invalid rule 3: aggregateFieldName 'card.bin' is non-numeric (STRING): aggregate an integer or decimal "
        "field, or count with COUNT_FLINK",
        "invalid rule 4: filter: GE on 'channel' needs a numeric field, channel is STRING",
        "invalid rule 5: filter: IN on 'basket.items': 'lots' is not a number (basket.items is INT)",
        f"fraudrules backtest: --rules {tmp_path}/rules.json: 4 invalid rules",
    ]
    code, _, err = run_main(capsys, *argv[:5], "--out", str(tmp_path / "a.jsonl"))  # the default schema: no device
    assert code == 2 and "invalid rule 1: groupingKeyNames: 'deviceId' is not in the event schema" in err
    code, _, err = run_main(capsys, *argv, "--out", str(tmp_path / "a.jsonl"), "--event-schema", "nope.ddl")
    one_line_error(code, err, "--event-schema nope.ddl: no such file")
    (tmp_path / "bad.ddl").write_text("transactionId BIGINT, eventTime BIGINT, price DOUBLE")
    code, _, err = run_main(
        capsys, *argv, "--out", str(tmp_path / "a.jsonl"), "--event-schema", str(tmp_path / "bad.ddl")
    )
    one_line_error(code, err, "bad.ddl: price: type DOUBLE is not supported")


def test_generate_writes_the_rich_schemas_events(tmp_path, capsys):
    code, out, _ = run_main(capsys, "generate", "--events", "rich", "--out", str(tmp_path), "--count", "10")
    assert code == 0 and out.startswith("wrote 10 transactions")
    record = json.loads((tmp_path / "part-000000.json").read_text().splitlines()[0])
    assert {"channel", "merchant"} <= set(record) and set(record["merchant"]) >= {"id", "country"}


def test_rules_history_keeps_its_columns_whatever_the_authors_and_changes():
    from datetime import datetime, timezone

    when = datetime(2026, 12, 6, 12, tzinfo=timezone.utc)
    rows = [
        {"version": 1, "updatedAt": when, "updatedBy": "cli", "change": "create", "ruleState": "ACTIVE"},
        {
            "version": 12,
            "updatedAt": None,
            "updatedBy": "a.reviewer@example.com",
            "change": "promote:105",
            "ruleState": "DELETE",
        },
    ]
    lines = history_lines(rows, lambda row: "SUM(x) by y")
    assert lines == [
        "v1  2026-12-06T12:00:00Z cli                    create      ACTIVE SUM(x) by y",
        "v12 -                    a.reviewer@example.com promote:105 DELETE SUM(x) by y",
    ]


def test_a_recorded_event_schema_that_does_not_parse_is_left_to_the_commands_that_use_it(tmp_path):
    """Every command's config resolves the event schema once (`event_schema.resolved`); one that cannot be read
    (a later release's DDL after a downgrade, say) stops no command that does not need it."""
    record = tmp_path / "checkpoints" / "event_schema.ddl"
    record.parent.mkdir(parents=True)
    record.write_text("transactionId long, amount money")
    args = cli.parser().parse_args(["maintain", "--data-dir", str(tmp_path)])
    assert job_config(args).events is None
    record.write_text(Path(event_schema.builtin_path("rich")).read_text())
    assert job_config(args).events == event_schema.builtin("rich")
