"""Executor profiles (QEScalor): dynamic sampling, the random forest, the cheapest plan, and the command."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capacity.model_profiles import MEMORY_GB, profile_plan
from capacity.profiles import (
    HEADROOM,
    Profile,
    ProfileModel,
    ProfilePlan,
    cheapest_plan,
    dynamic_sampling,
    fixed_sampling,
    slot_curve,
)
from capacity.testbed import ProfileTruth, profile_truths

MEMORY = [0.5 * i for i in range(1, 17)]


def counting(values: dict[Profile, list[float]] | None = None, f=lambda p: 100.0):
    """A measure that records what it was asked; `values` gives successive answers per profile."""
    asked: list[Profile] = []

    def measure(profile: Profile) -> float:
        asked.append(profile)
        if values and values.get(profile):
            return values[profile].pop(0)
        return f(profile)

    return measure, asked


def test_a_profile_needs_a_core_and_memory_and_has_a_price() -> None:
    assert Profile(2, 3.0).price(0.03, 0.004) == pytest.approx(0.072)
    for cores, memory in ((0, 1.0), (1, 0.0), (1, math.inf)):
        with pytest.raises(ValueError):
            Profile(cores, memory)


def test_fixed_sampling_takes_every_nth_memory_size_and_the_largest() -> None:
    measure, asked = counting()
    samples = fixed_sampling(measure, [1, 2], MEMORY, stride=3)
    per_axis = [s.profile.memory_gb for s in samples if s.profile.cores == 1]
    assert per_axis == [0.5, 2.0, 3.5, 5.0, 6.5, 8.0] and len(asked) == 12
    with pytest.raises(ValueError):
        fixed_sampling(measure, [1], MEMORY, stride=0)


def test_dynamic_sampling_strides_over_flat_ground_and_stops_where_memory_no_longer_helps() -> None:
    measure, asked = counting()  # 100 rec/s whatever the memory
    samples = dynamic_sampling(measure, [1], MEMORY)
    # The first step finds no change: the step doubles, finds none again, and the axis ends.
    assert [s.profile.memory_gb for s in samples] == [0.5, 1.0, 2.0] and len(asked) == 3


def test_dynamic_sampling_samples_every_point_where_the_throughput_changes_a_lot() -> None:
    # Throughput rises steeply up to 4 GB, then is flat.
    measure, _ = counting(f=lambda p: 50.0 * min(p.memory_gb, 4.0))
    samples = dynamic_sampling(measure, [2], MEMORY)
    memory = [s.profile.memory_gb for s in samples]
    assert memory[: memory.index(4.0) + 1] == [m for m in MEMORY if m <= 4.0]  # none skipped on the rise
    assert max(memory) < 8.0 and len(samples) < len(MEMORY)  # and it stopped on the plateau


def test_a_fall_as_memory_grows_is_measured_again_and_averaged() -> None:
    # One noisy low reading at 1 GB, then the true value.
    measure, asked = counting({Profile(1, 1.0): [70.0, 100.0]}, f=lambda p: 100.0)
    samples = dynamic_sampling(measure, [1], MEMORY)
    again = {s.profile: s for s in samples}
    assert asked.count(Profile(1, 1.0)) == 2 and again[Profile(1, 1.0)].measurements == 2
    assert again[Profile(1, 1.0)].throughput == pytest.approx(85.0)
    assert asked.count(Profile(1, 0.5)) == 2  # its neighbour too


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1.0, 1000.0), min_size=16, max_size=16), st.sampled_from([1, 2, 3, 4]))
def test_dynamic_sampling_never_measures_a_profile_more_than_twice_and_always_starts_at_the_smallest(
        values: list[float], cores: int) -> None:
    by_memory = dict(zip(MEMORY, values, strict=True))
    measure, asked = counting(f=lambda p: by_memory[p.memory_gb])
    samples = dynamic_sampling(measure, [cores], MEMORY)
    assert samples[0].profile == Profile(cores, 0.5)
    assert all(asked.count(s.profile) == s.measurements <= 2 for s in samples)
    assert len(asked) == sum(s.measurements for s in samples) <= 2 * len(MEMORY)
    assert [s.profile.memory_gb for s in samples] == sorted({s.profile.memory_gb for s in samples})
    assert all(s.throughput == pytest.approx(by_memory[s.profile.memory_gb]) for s in samples)


def test_the_forest_learns_a_known_surface_and_asks_beyond_an_axis_at_its_end() -> None:
    truth = ProfileTruth()
    grid = [Profile(c, m) for c in (1, 2, 3, 4) for m in MEMORY]
    measure, _ = counting(f=truth.executor_mst)
    model = ProfileModel(seed=1).update(fixed_sampling(measure, [1, 2, 3, 4], MEMORY, stride=2))
    mean, low, high = model.predict(grid)
    errors = [abs(m / truth.executor_mst(p) - 1) for p, m in zip(grid, mean, strict=True)]
    assert sorted(errors)[len(errors) // 2] < 0.03 and max(errors) < 0.25
    assert all(lo <= hi for lo, hi in zip(low, high, strict=True)) and (high > low).any()
    # An axis that ended at 3 GB: a larger memory is asked at 3 GB, not where other core counts were.
    short = ProfileModel().update(dynamic_sampling(counting(f=truth.executor_mst)[0], [1, 4], MEMORY))
    top = max(s.profile.memory_gb for s in short.samples if s.profile.cores == 1)
    assert top < 8.0
    assert short.predict([Profile(1, 8.0)])[0][0] == pytest.approx(short.predict([Profile(1, top)])[0][0])
    assert short.within(Profile(2, 8.0)) and not short.within(Profile(8, 8.0))
    with pytest.raises(ValueError):
        ProfileModel().update(short.samples[:1])
    with pytest.raises(ValueError):
        ProfileModel().predict(grid)


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.tuples(st.integers(1, 8), st.sampled_from(MEMORY)), st.floats(1.0, 500.0),
                       min_size=1, max_size=12),
       st.floats(1.0, 20_000.0), st.floats(0.001, 0.1), st.floats(0.0, 0.02))
def test_the_cheapest_plan_reaches_the_rate_with_headroom_and_nothing_cheaper_does(
        rates: dict[tuple[int, float], float], rate: float, core_price: float, gb_price: float) -> None:
    predicted = {Profile(c, m): (r, 0.9 * r, 1.1 * r) for (c, m), r in rates.items()}
    plan = cheapest_plan(predicted, rate, core_price, gb_price)
    if plan is None:  # only when every profile would need more than 4,096 executors
        assert all(HEADROOM * rate / r > 4096 for r, _, _ in predicted.values())
        return
    assert plan.throughput >= HEADROOM * rate * (1 - 1e-9)
    for profile, (r, _, _) in predicted.items():
        n = math.ceil(HEADROOM * rate / r - 1e-9)
        assert n * profile.price(core_price, gb_price) >= plan.cost - 1e-9


def test_a_rate_no_profile_reaches_gets_no_plan_and_bad_rates_are_refused() -> None:
    assert cheapest_plan({Profile(1, 1.0): (10.0, 9.0, 11.0)}, 1e9, 0.03, 0.004, max_executors=100) is None
    with pytest.raises(ValueError):
        cheapest_plan({Profile(1, 1.0): (10.0, 9.0, 11.0)}, -5.0, 0.03, 0.004)


def test_on_the_job_model_dynamic_sampling_needs_fewer_profiles_and_its_plan_sustains_the_rate() -> None:
    for name, truth in profile_truths().items():
        report = profile_plan(3000.0, "dynamic", seed=2, truth=truth)
        assert len(report["samples"]) < 4 * len(MEMORY), name
        assert report["plan"]["sustains"], name
        assert report["plan"]["cost_per_hour"] <= 1.10 * report["oracle"]["cost_per_hour"], name
        assert report["model_error"]["rmse_pct"] < 10, name


def test_the_profiles_command_writes_a_report_and_a_plot_and_refuses_bad_input(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from capacity.cli import capacity_app

    cli = typer.Typer()
    cli.add_typer(capacity_app, name="capacity")
    out = tmp_path / "profiles.json"
    result = CliRunner().invoke(cli, ["capacity", "profiles", "--rate", "800", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["plan"]["sustains"] and report["plan"]["executors"] >= 1
    assert len(report["surface"]) == 4 * len(MEMORY_GB)
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert "oracle" in result.output and "RMSE" in result.output
    for args, message in ((["--sampling", "fixed:0"], "fixed:N"), (["--truth", "nosuch"], "choose one of"),
                          (["--core-price", "0", "--gb-price", "0"], "not both 0")):
        bad = CliRunner().invoke(cli, ["capacity", "profiles", "--rate", "800", "--out", str(out), *args])
        assert bad.exit_code != 0 and message in bad.output, bad.output
    far = CliRunner().invoke(cli, ["capacity", "profiles", "--rate", "1e9", "--out", str(out)])
    assert far.exit_code == 2 and "out of reach" in far.output
    answered = json.loads(out.read_text())
    assert answered["plan"] is None and answered["best_reachable"]["executors"] == 4096
    assert 0 < answered["best_reachable"]["headroom_rate"] < 1e9


def test_a_profile_that_never_stabilises_is_reported_stepped_over_and_never_fitted() -> None:
    broken = {Profile(1, 0.5), Profile(1, 1.5)}
    measure, asked = counting(f=lambda p: None if p in broken else 100.0 * min(p.memory_gb, 3.0))
    samples = dynamic_sampling(measure, [1], MEMORY)
    unstable = {s.profile for s in samples if not s.stable}
    assert unstable == broken and all(asked.count(p) == 1 for p in broken)
    stable = [s for s in samples if s.stable]
    assert stable[0].profile == Profile(1, 1.0) and Profile(1, 2.0) in {s.profile for s in stable}
    model = ProfileModel().update(samples)
    assert all(s.stable for s in model.samples) and len(model.samples) == len(stable)
    fixed = fixed_sampling(measure, [1], MEMORY, stride=1)
    assert {s.profile for s in fixed if not s.stable} == broken
    nothing = dynamic_sampling(lambda p: None, [2], MEMORY)
    assert nothing and not any(s.stable for s in nothing)


def test_a_testbed_where_nothing_sustains_gets_a_clear_error_not_a_model() -> None:
    from capacity.model_profiles import UnstableTestbed

    # An executor that takes 1e-9 rec/s: the search never finds a sustained rate above its floor.
    with pytest.raises(UnstableTestbed, match="sustained a rate"):
        profile_plan(800.0, "fixed:8", truth=ProfileTruth(core_rate=1e-9))


def test_a_plans_slot_curve_names_whole_executors_and_the_forests_band_as_its_error() -> None:
    plan = ProfilePlan(Profile(2, 4.0), executors=5, throughput=1_000.0, low=900.0, high=1_200.0, cost=1.0)
    curve, error = slot_curve(plan, 9)
    assert curve == {2: 200.0, 4: 400.0, 6: 600.0, 8: 800.0}  # 9 slots run 4 two-core executors
    assert error == pytest.approx(0.15)  # (1,200 - 900) / 2 / 1,000
    narrow = ProfilePlan(Profile(1, 1.0), executors=4, throughput=400.0, low=399.0, high=401.0, cost=1.0)
    assert slot_curve(narrow, 3) == ({1: 100.0, 2: 200.0, 3: 300.0}, 0.05)  # never trusted beyond 5 %
    assert slot_curve(plan, 1)[0] == {}  # a job capped below one executor's cores: nothing to seed
    with pytest.raises(ValueError):
        slot_curve(plan, 0)
