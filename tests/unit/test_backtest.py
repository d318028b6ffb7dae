"""Which backtests run long enough to be given the tiered JIT (`backtest.long_running`)."""

from __future__ import annotations

from fraudrules.backtest import TIERED_JIT_BYTES, long_running


def _file(path, size: int) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)  # sparse: the size is what counts
    return str(path)


def test_a_backtest_is_long_running_from_its_inputs_total_size(tmp_path):
    half = TIERED_JIT_BYTES // 2
    folder = tmp_path / "tx"
    _file(folder / "a.json", half)
    assert not long_running(str(folder), None)
    _file(folder / "b.json", half)
    assert long_running(str(folder), None)
    logins = _file(tmp_path / "logins.json", 1)
    assert long_running(None, _file(tmp_path / "one.json", TIERED_JIT_BYTES - 1)) is False
    assert long_running(str(tmp_path / "one.json"), logins)


def test_hidden_files_of_a_folder_do_not_count(tmp_path):
    """As the file source skips them (names starting with `.` or `_`)."""
    _file(tmp_path / "tx" / "_committed", TIERED_JIT_BYTES)
    _file(tmp_path / "tx" / ".part.crc", TIERED_JIT_BYTES)
    assert not long_running(str(tmp_path / "tx"))
