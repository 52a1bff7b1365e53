"""A trace file with missing rows: refused by default, filled on request (`--fill-gaps linear`), with the rows
filled counted and a long outage still refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from evaluation.cli import evaluate_command
from evaluation.traces import MAX_FILLED_GAP_ROWS, GapError, TraceError, fill_gaps, load_trace, read_trace_file

evaluate_app = typer.Typer()
evaluate_app.command()(evaluate_command)

ROW_S = 300.0  # 5-minute rows, as the public traces
MISSING = (5, 17, 18, 30, 44, 60)  # six rows lost, two of them in a row


def gapped(tmp_path: Path, rows: int = 72, missing: tuple[int, ...] = MISSING) -> tuple[Path, np.ndarray]:
    """A 5-minute trace (a day's swing) written without the `missing` rows, and the full trace."""
    rates = 1000 + 400 * np.sin(np.arange(rows) * 2 * np.pi / 48)
    kept = [i for i in range(rows) if i not in missing]
    path = tmp_path / "gapped.csv"
    path.write_text("seconds,rate\n" + "".join(f"{i * ROW_S:g},{float(rates[i])!r}\n" for i in kept))
    return path, rates


def test_a_file_with_missing_rows_is_refused_by_default_and_says_how_to_read_it(tmp_path: Path) -> None:
    path, _ = gapped(tmp_path)
    with pytest.raises(TraceError, match=r"line 18: irregular sampling \(900 s .*most rows are 300 s apart\); "
                                         r"2 row\(s\) missing there, 6 in 5 gap\(s\) in all: --fill-gaps linear"):
        read_trace_file(path)


def test_linear_fill_puts_the_missing_rows_back_on_the_grid(tmp_path: Path) -> None:
    path, rates = gapped(tmp_path)
    series = read_trace_file(path, "linear")
    assert series.filled == len(MISSING) and series.row_s == ROW_S and len(series.values) == len(rates)
    kept = [i for i in range(len(rates)) if i not in MISSING]
    np.testing.assert_array_equal(series.values[kept], rates[kept])  # recorded rows untouched
    assert series.values[5] == pytest.approx((rates[4] + rates[6]) / 2)
    assert series.values[17] == pytest.approx(rates[16] + (rates[19] - rates[16]) / 3)
    assert "6 missing rows filled linearly" in load_trace(str(path), hours=1.0, fill="linear").description


def test_a_long_outage_is_refused_even_when_filling(tmp_path: Path) -> None:
    longest = tuple(range(10, 10 + MAX_FILLED_GAP_ROWS))
    path, _ = gapped(tmp_path, missing=longest)
    assert read_trace_file(path, "linear").filled == MAX_FILLED_GAP_ROWS
    path, _ = gapped(tmp_path, missing=(*longest, 10 + MAX_FILLED_GAP_ROWS))
    with pytest.raises(TraceError, match=re.escape(f"{MAX_FILLED_GAP_ROWS + 1} rows missing before this one")):
        read_trace_file(path, "linear")


def test_a_step_of_no_whole_number_of_rows_is_refused_even_when_filling(tmp_path: Path) -> None:
    path = tmp_path / "odd.csv"
    path.write_text("seconds,rate\n0,1\n300,2\n600,3\n1050,4\n1350,5\n")
    with pytest.raises(TraceError, match=r"line 5: irregular sampling \(450 s"):
        read_trace_file(path, "linear")


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(3, 60), data=st.data())
def test_filling_recovers_a_straight_line_and_counts_what_it_filled(rows: int, data: st.DataObject) -> None:
    """Rows dropped from a linear trace (never the first or last, runs within the bound) come back exactly,
    the others are untouched, and the count is the number dropped; sampling jitter within tolerance is kept."""
    drop = data.draw(st.sets(st.integers(1, rows - 2), max_size=rows - 2))
    keep = np.array([i for i in range(rows) if i not in drop])
    runs = np.diff(keep) - 1
    if runs.size and runs.max() > MAX_FILLED_GAP_ROWS:
        with pytest.raises(GapError, match="rows missing before this one"):
            fill_gaps(keep * 10.0, 3.0 * keep + 7.0, 10.0)
        return
    jitter = np.asarray(data.draw(st.lists(st.floats(-0.04, 0.04), min_size=len(keep), max_size=len(keep))))
    values, filled = fill_gaps(keep * 10.0 + jitter, 3.0 * keep + 7.0, 10.0)
    assert filled == len(drop)
    np.testing.assert_allclose(values, 3.0 * np.arange(rows) + 7.0, rtol=1e-12)
    if drop:
        with pytest.raises(GapError, match="irregular sampling"):
            fill_gaps(keep * 10.0, 3.0 * keep + 7.0, 10.0, allow=False)


def test_the_command_fills_on_request_and_reports_it(tmp_path: Path) -> None:
    path, _ = gapped(tmp_path)
    out = tmp_path / "evaluate.json"
    common = ["--policy", "static", "--trace-file", str(path), "--hours", "0.5", "--seeds", "1",
              "--regime", "compressed", "--workers", "1", "--json", str(out)]
    refused = CliRunner().invoke(evaluate_app, common, env={"COLUMNS": "200"})  # the error panel on one line
    assert refused.exit_code != 0 and "--fill-gaps linear" in refused.output
    result = CliRunner().invoke(evaluate_app, [*common, "--fill-gaps", "linear"])
    assert result.exit_code == 0, result.output
    assert "6 missing rows filled linearly" in result.output
    data = json.loads(out.read_text())
    assert data["settings"]["fill_gaps"] == "linear"
    assert "6 missing rows filled linearly" in data["cases"][0]["description"]
    wrong = CliRunner().invoke(evaluate_app, [*common, "--fill-gaps", "cubic"])
    assert wrong.exit_code != 0 and "choose none or linear" in wrong.output
