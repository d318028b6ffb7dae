"""Input paths: a file, a folder or a glob, checked before Spark starts."""

from __future__ import annotations

import os

import pytest

from fraudrules.paths import input_files, input_problem, output_problem


@pytest.fixture
def landing(tmp_path):
    folder = tmp_path / "landing"
    folder.mkdir()
    for name in ("a.jsonl", "b.jsonl", "c.json", ".hidden.jsonl", "_SUCCESS"):
        (folder / name).write_text("{}\n")
    return folder


def test_a_file_a_folder_or_a_glob(landing):
    assert input_files(str(landing / "a.jsonl")) == [str(landing / "a.jsonl")]
    assert [os.path.basename(p) for p in input_files(str(landing))] == ["a.jsonl", "b.jsonl", "c.json"]
    assert [os.path.basename(p) for p in input_files(str(landing / "*.jsonl"))] == ["a.jsonl", "b.jsonl"]
    assert [os.path.basename(p) for p in input_files(str(landing / "{a,c}.json*"))] == ["a.jsonl", "c.json"]
    assert input_files(str(landing / "nope")) == []


def test_problems_name_the_option_and_the_path(landing, tmp_path):
    assert input_problem(str(landing), "--transactions") is None
    assert input_problem(str(landing / "*.json"), "--transactions") is None
    assert (
        input_problem(str(landing / "x.jsonl"), "--logins") == f"--logins {landing / 'x.jsonl'}: no such file or folder"
    )
    assert "no readable file matches" in input_problem(str(landing / "*.csv"), "--logins")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "holds no readable files" in input_problem(str(empty), "--transactions")
    # a streaming job waits for files: an empty folder or a glob without matches is fine, a missing folder is not
    assert input_problem(str(empty), "--transactions", must_have_files=False) is None
    assert input_problem(str(empty / "*.json"), "--transactions", must_have_files=False) is None
    assert "no such folder" in input_problem(str(tmp_path / "no" / "*.json"), "--transactions", must_have_files=False)
    assert input_problem("s3://bucket/landing", "--transactions") is None


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads everything")
def test_unreadable_input(landing):
    os.chmod(landing / "a.jsonl", 0)
    assert "not readable" in input_problem(str(landing / "a.jsonl"), "--transactions")


def test_outputs(tmp_path):
    assert output_problem(str(tmp_path / "new" / "deeper" / "a.jsonl"), "--out") is None  # folders are created
    assert "is a folder" in output_problem(str(tmp_path), "--out")
    (tmp_path / "f").write_text("")
    assert "is not a folder" in output_problem(str(tmp_path / "f" / "a.jsonl"), "--out")
