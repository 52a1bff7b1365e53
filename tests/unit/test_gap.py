"""The gap to the oracle in parts (`evaluation.gap`): the parts sum to the gap, each has its sign, known
schedules land where the rules say, and `autoscaler evaluate --explain-gap` shows it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from evaluation.cli import evaluate_command
from evaluation.gap import (
    MEASURING_CODES,
    PARTS,
    WINDOW_PARTS,
    GapDecomposition,
    decompose,
    reasons_per_window,
    summarize_gaps,
    undone_runs,
    window_categories,
)
from evaluation.html_report import report_page
from evaluation.report import markdown, print_gap_table
from evaluation.suite import EvalSettings, evaluate_case

W = 10.0
CODES = [None, "planned_hold", "cost_plan", *MEASURING_CODES]


@st.composite
def schedules(draw: st.DrawFn) -> tuple[list[int], list[int], list[str | None]]:
    """A policy's and an oracle's per-window schedules (runs of levels, as rescales make them) and reasons."""
    n = draw(st.integers(1, 60))

    def schedule() -> list[int]:
        out: list[int] = []
        while len(out) < n:
            out += [draw(st.integers(1, 8))] * draw(st.integers(1, 12))
        return out[:n]

    return schedule(), schedule(), draw(st.lists(st.sampled_from(CODES), min_size=n, max_size=n))


def signed(value: float) -> float:
    return math.copysign(1.0, value) if value else 0.0


@settings(max_examples=200, deadline=None)
@given(case=schedules(), paid=st.floats(-500, 500), horizon=st.sampled_from([0.0, 10.0, 50.0, 300.0]),
       within=st.sampled_from([0.0, 20.0, 300.0]))
def test_the_parts_sum_to_the_gap_and_keep_their_signs(case: tuple[list[int], list[int], list[str | None]],
                                                       paid: float, horizon: float, within: float) -> None:
    policy, oracle, reasons = case
    windows = sum(policy) * W
    got = decompose(policy, oracle, W, reasons=reasons, policy_slot_seconds=windows + paid,
                    oracle_slot_seconds=sum(oracle) * W, horizon_s=horizon, undone_within_s=within)
    assert got.gap == pytest.approx((sum(policy) - sum(oracle)) * W + paid, abs=1e-9)
    assert math.fsum(got.parts().values()) == pytest.approx(got.gap, abs=1e-9)
    assert got.timing == pytest.approx(paid, abs=1e-9)
    assert all(getattr(got, name) >= 0 for name in WINDOW_PARTS if name != "below") and got.below <= 0
    assert math.fsum(got.excess_by_reason.values()) == pytest.approx(got.gap - got.below - got.timing)
    # Every window's difference goes to exactly one part, and only windows that differ to one.
    categories = window_categories(policy, oracle, W, reasons, horizon_s=horizon, undone_within_s=within)
    for name in WINDOW_PARTS:
        per_window = sum(p - o for p, o, c in zip(policy, oracle, categories, strict=True) if c == name)
        assert getattr(got, name) == per_window * W
        assert all(signed(p - o) == (-1 if name == "below" else 1)
                   for p, o, c in zip(policy, oracle, categories, strict=True) if c == name)
    assert all((c is None) == (p == o) for p, o, c in zip(policy, oracle, categories, strict=True))


@settings(max_examples=100, deadline=None)
@given(case=schedules())
def test_a_policy_that_is_the_oracle_has_no_gap(case: tuple[list[int], list[int], list[str | None]]) -> None:
    _, oracle, reasons = case
    got = decompose(oracle, oracle, W, reasons=reasons)
    assert got.gap == 0 and all(value == 0 for value in got.parts().values())
    assert got.actions == got.oracle_actions and got.excess_by_reason == {}


@settings(max_examples=100, deadline=None)
@given(case=schedules(), short=st.sampled_from([0.0, 30.0, 100.0]), long=st.sampled_from([100.0, 300.0, 1000.0]))
def test_a_longer_horizon_only_moves_margin_to_early_and_late(
        case: tuple[list[int], list[int], list[str | None]], short: float, long: float) -> None:
    policy, oracle, reasons = case
    near = decompose(policy, oracle, W, reasons=reasons, horizon_s=min(short, long))
    far = decompose(policy, oracle, W, reasons=reasons, horizon_s=max(short, long))
    # Windows move from margin to a dip, early or late, from early or late to a dip, and out of undone
    # excursions the oracle comes near (into any part but below); nothing else moves.
    def near_the_oracle(got: GapDecomposition) -> float:
        return got.oracle_dip + got.early_scale_up + got.late_scale_down

    assert near_the_oracle(far) >= near_the_oracle(near) and far.oracle_dip >= near.oracle_dip
    assert far.undone <= near.undone and far.measuring >= near.measuring and far.below == near.below
    assert far.margin <= near.margin + (near.undone - far.undone)
    assert far.gap == near.gap and far.undone_rescales == near.undone_rescales


def test_a_steady_excess_is_margin_and_a_shortfall_is_below() -> None:
    got = decompose([3] * 10, [2] * 10, W)
    assert (got.margin, got.gap, got.actions, got.undone_rescales) == (100.0, 100.0, 0, 0)
    got = decompose([2] * 10, [3] * 10, W)
    assert (got.below, got.margin, got.gap) == (-100.0, 0.0, -100.0)


def test_a_spike_undone_within_minutes() -> None:
    # Up from 2 to 4 for two windows, then back: one rescale undone; the oracle never moves.
    got = decompose([2, 2, 4, 4, 2, 2], [2] * 6, W)
    assert (got.undone, got.margin, got.undone_rescales, got.actions, got.oracle_actions) == (40.0, 0.0, 1, 2, 0)
    # The oracle makes the same trip a window later: the spike followed the load (early), and both undid one.
    got = decompose([2, 2, 4, 4, 2, 2], [2, 2, 2, 4, 4, 2], W)
    assert (got.undone, got.early_scale_up, got.late_scale_down, got.below) == (0.0, 20.0, 0.0, -20.0)
    assert (got.undone_rescales, got.oracle_undone_rescales) == (1, 1)
    # The oracle reaches the level only beyond the horizon: undone again.
    assert decompose([2, 2, 4, 4, 2, 2, 2, 2], [2] * 7 + [4], W, horizon_s=20.0).undone == 40.0
    # Held longer than the limit, the same spike is an ordinary excess.
    got = decompose([2, 2, 4, 4, 2, 2], [2] * 6, W, undone_within_s=10.0)
    assert (got.undone, got.margin, got.undone_rescales) == (0.0, 40.0, 0)
    # Two steps down are no excursion; a dip is counted but its windows go by the other rules.
    assert undone_runs([4, 3, 2, 2], W) == []
    got = decompose([4, 4, 3, 4, 4], [2] * 5, W)
    assert (got.undone_rescales, got.undone, got.margin) == (1, 0.0, 90.0)


def test_early_scale_ups_and_late_scale_downs() -> None:
    # The policy goes up 3 windows before the oracle, and down 2 windows after it.
    policy = [2, 4, 4, 4, 4, 4, 4, 4, 2, 2]
    oracle = [2, 2, 2, 2, 4, 4, 2, 2, 2, 2]
    got = decompose(policy, oracle, W, horizon_s=30.0)
    assert (got.early_scale_up, got.late_scale_down, got.margin) == (60.0, 40.0, 0.0)
    # With a horizon of one window, only the window just before and just after.
    got = decompose(policy, oracle, W, horizon_s=10.0)
    assert (got.early_scale_up, got.late_scale_down, got.margin) == (20.0, 20.0, 60.0)


def test_holding_through_a_dip_of_the_oracle() -> None:
    # The oracle leaves 4 for two windows and comes back: the policy held through a dip.
    got = decompose([4] * 7, [4, 4, 2, 2, 4, 4, 4], W, horizon_s=30.0)
    assert (got.oracle_dip, got.early_scale_up, got.late_scale_down, got.margin) == (40.0, 0.0, 0.0, 0.0)
    # With a horizon of one window, the dip's first window was late and its last early.
    got = decompose([4] * 7, [4, 4, 2, 2, 4, 4, 4], W, horizon_s=10.0)
    assert (got.oracle_dip, got.early_scale_up, got.late_scale_down) == (0.0, 20.0, 20.0)


def test_measuring_holds_come_from_the_decisions_reasons() -> None:
    policy, oracle = [4] * 5, [2] * 5
    reasons = [None, "stabilizing", "measuring", "planned_hold", "planned_hold"]
    got = decompose(policy, oracle, W, reasons=reasons)
    assert (got.measuring, got.margin) == (40.0, 60.0)
    assert got.excess_by_reason == {"planned_hold": 40.0, "(no decision)": 20.0, "stabilizing": 20.0,
                                    "measuring": 20.0}
    # Without the reasons the same windows are margin.
    assert decompose(policy, oracle, W).margin == 100.0


def test_what_the_simulator_pays_within_windows_is_its_own_part() -> None:
    got = decompose([3, 3], [2, 2], W, policy_slot_seconds=65.0, oracle_slot_seconds=40.0)
    assert (got.gap, got.margin, got.timing) == (25.0, 20.0, 5.0)
    assert got.shares()["gap"] == pytest.approx(25 / 40)


def test_the_schedules_must_cover_the_same_windows() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        decompose([1, 2], [1], W)
    with pytest.raises(ValueError, match="reasons"):
        decompose([1, 2], [1, 2], W, reasons=[None])


def test_each_window_gets_the_reason_decided_at_the_end_of_the_window_before() -> None:
    decided = [(10.0, "stabilizing"), (20.0, "measuring"), (40.0, "planned_hold"), (60.0, "late")]
    assert reasons_per_window(decided, W, 5) == [None, "stabilizing", "measuring", None, "planned_hold"]


def test_the_measuring_codes_are_the_planners() -> None:
    """The codes the gap counts as measuring holds are reason codes the planner emits."""
    source = "".join(path.read_text() for path in Path(__file__).resolve().parents[2].joinpath("plan").rglob("*.py"))
    for code in MEASURING_CODES:
        assert f'"{code}"' in source, code


@pytest.fixture(scope="module")
def case() -> dict:
    return evaluate_case("steps", "compressed", 0, ["default", "threshold"], EvalSettings(hours=1.0, peak=1000.0))


def test_every_run_of_a_case_carries_its_gap_over_every_window(case: dict) -> None:
    for row in case["runs"]:
        gap = row["gap"]
        assert gap["gap"] == pytest.approx(row["slot_seconds"] - case["oracle"]["slot_seconds"], abs=0.01)
        assert sum(gap[name] for name in PARTS) == pytest.approx(gap["gap"], abs=0.01)
        assert gap["timing"] == pytest.approx(0.0, abs=1e-6)  # the fused job pays whole windows
        assert gap["oracle_actions"] == case["oracle"]["actions"] and gap["actions"] == row["actions"]
    default = next(row for row in case["runs"] if row["policy"] == "default")
    assert default["gap"]["measuring"] > 0  # the default measures after each rescale


def test_the_gaps_summary_is_the_median_share_per_trace_and_regime(case: dict) -> None:
    other = json.loads(json.dumps(case)) | {"seed": 1}
    for row in other["runs"]:
        row["gap"] = {**row["gap"], "margin": row["gap"]["margin"] + 3 * row["gap"]["oracle_slot_seconds"]}
    [summary] = summarize_gaps([case, other], "default")
    first = next(row["gap"] for row in case["runs"] if row["policy"] == "default")
    assert summary["seeds"] == 2 and summary["actions"] == first["actions"]
    assert summary["shares"]["margin"] == pytest.approx(first["margin"] / first["oracle_slot_seconds"] + 1.5, abs=1e-4)
    assert summarize_gaps([case], "flink") == []
    console = Console(record=True, width=200)
    print_gap_table(console, [summary])
    printed = console.export_text()
    assert "steps (compressed)" in printed and "default" in printed
    assert "| steps (compressed) |" in markdown([], [], [summary])


evaluate_app = typer.Typer()
evaluate_app.command()(evaluate_command)


def test_the_command_explains_the_gap(tmp_path: Path) -> None:
    out = tmp_path / "evaluate.json"
    result = CliRunner().invoke(evaluate_app, [
        "--policy", "default", "--trace", "steps", "--hours", "0.5", "--seeds", "1", "--workers", "1",
        "--json", str(out), "--explain-gap", "--html", str(tmp_path / "report.html")])
    assert result.exit_code == 0, result.output
    assert "cost above the oracle's comes from" in result.output and "steps (real-time)" in result.output
    data = json.loads(out.read_text())
    assert [row["trace"] for row in data["gaps"]] == ["steps"]
    assert "| steps (real-time) |" in out.with_suffix(".md").read_text()
    assert 'data-trace="steps" data-regime="real-time"><td>steps (real-time)</td>' in \
        (tmp_path / "report.html").read_text()
    refused = CliRunner().invoke(evaluate_app, ["--policy", "static", "--explain-gap", "--json", str(out)])
    assert refused.exit_code != 0 and "not among the policies run" in refused.output


def test_the_page_has_no_gap_section_without_the_option(case: dict) -> None:
    assert "comes from" not in report_page([case], [], EvalSettings())
