from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.load_cli import replay_file
from evaluation.traces import read_rates, scale_rates
from pipeline.loadgen import (
    Constant,
    Replay,
    Sine,
    Steps,
    demo_record,
    expected_total,
    parse_shape,
    records_between,
    scaled_shape,
)
from pipeline.workloads import WORKLOADS


def test_parse_shapes() -> None:
    assert parse_shape("constant:250", 10) == Constant(250.0, 10)
    steps = parse_shape("steps:100:5,400:10")
    assert steps == Steps(((100.0, 5.0), (400.0, 10.0)))
    assert steps.duration_s == 15.0
    assert parse_shape("sine:500:200:60", 120) == Sine(500.0, 200.0, 60.0, 120)
    cosine = parse_shape("cosine:500:200:60", 60)
    assert [round(cosine.rate(t)) for t in (0, 15, 30, 45)] == [300, 500, 700, 500]  # from the trough
    for bad in ("square:1", "steps:100", "steps:100:0", "sine:1:2", "cosine:1:2:0", "constant:x"):
        with pytest.raises(ValueError):
            parse_shape(bad)


@settings(max_examples=60, deadline=None)
@given(spec=st.sampled_from(["constant:250", "steps:100:30,400:90", "steps:0:5,1e3:2.5", "sine:240:160:120",
                             "cosine:240:160:120"]),
       factor=st.floats(0.05, 20), t=st.floats(0, 150))
def test_a_scaled_shape_scales_every_rate_and_keeps_its_times(spec: str, factor: float, t: float) -> None:
    scaled = parse_shape(scaled_shape(spec, factor), 150)
    assert scaled.rate(t) == pytest.approx(factor * parse_shape(spec, 150).rate(t), rel=1e-5, abs=1e-6)
    assert scaled.duration_s == parse_shape(spec, 150).duration_s


@settings(max_examples=60, deadline=None)
@given(spec=st.one_of(
    st.floats(0, 1e6).map(lambda r: f"constant:{r}"),
    st.lists(st.tuples(st.floats(0, 1e6), st.floats(0.01, 1e4)), min_size=1, max_size=4).map(
        lambda steps: "steps:" + ",".join(f"{r}:{s}" for r, s in steps)),
    st.tuples(st.sampled_from(["sine", "cosine"]), st.floats(0, 1e6), st.floats(0, 1e6), st.floats(0.01, 1e4)).map(
        lambda k: f"{k[0]}:{k[1]}:{k[2]}:{k[3]}")))
def test_a_parsed_shape_renders_back_to_the_same_shape(spec: str) -> None:
    shape = parse_shape(spec, 60)
    assert parse_shape(shape.spec(), 60) == shape


def test_a_scaled_shape_refuses_a_bad_spec_or_factor() -> None:
    assert scaled_shape("steps:100:30,400:90", 0.5) == "steps:50:30,200:90"
    for spec, factor in (("square:1", 1.0), ("steps:100", 1.0), ("constant:10", 0.0), ("constant:10", -1.0)):
        with pytest.raises(ValueError):
            scaled_shape(spec, factor)


def test_the_joins_read_each_record_once_per_side() -> None:
    assert {name for name, w in WORKLOADS.items() if w.reads == 2} == {"join", "nexmark-q8"}
    assert all(w.reads == 1 for name, w in WORKLOADS.items() if name not in ("join", "nexmark-q8"))


def test_step_rates_and_totals() -> None:
    steps = Steps(((100.0, 5.0), (400.0, 10.0)))
    assert [steps.rate(t) for t in (0, 4.99, 5.0, 14.9, 15.0)] == [100, 100, 400, 400, 0]
    assert expected_total(steps, 15.0) == pytest.approx(4500, abs=1)
    assert records_between(Constant(50.0), 2.0, 4.0) == pytest.approx(100.0)
    assert records_between(Constant(50.0), 4.0, 2.0) == 0.0


def test_sine_never_negative() -> None:
    sine = Sine(100.0, 300.0, 10.0)
    assert min(sine.rate(t / 10) for t in range(100)) == 0.0
    assert expected_total(Sine(100.0, 50.0, 10.0), 10.0) == pytest.approx(1000, rel=0.01)


def test_read_both_trace_formats(tmp_path) -> None:
    daedalus = tmp_path / "sine.csv"
    daedalus.write_text("second|count\n0|5000\n1|6000\n2|7000\n")
    prediction = tmp_path / "iot.csv"
    prediction.write_text("date,messages\n2019-10-06 22:00:00,100.5\n2019-10-06 22:05:00,200.5\n")
    assert read_rates(daedalus) == [5000.0, 6000.0, 7000.0]
    assert read_rates(prediction) == [100.5, 200.5]


def test_rescale_keeps_the_shape() -> None:
    values = [10.0, 20.0, 40.0]
    assert scale_rates(values, peak=100) == [25.0, 50.0, 100.0]
    assert sum(scale_rates(values, mean=70)) / 3 == pytest.approx(70)
    assert scale_rates(values, low=100, high=400) == [100.0, 200.0, 400.0]
    with pytest.raises(ValueError):
        scale_rates(values, peak=1, mean=1)


def test_trace_replay_speed_and_interpolation(tmp_path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("second|count\n0|1000\n1|2000\n2|3000\n3|4000\n")
    trace = replay_file(path, seconds_per_row=5.0, start_row=1, rows=2, peak=300)
    assert trace.rates == (200.0, 300.0)
    assert trace.duration_s == 10.0
    assert trace.rate(2.5) == pytest.approx(250.0)
    assert trace.rate(7.0) == 300.0
    assert trace.rate(10.0) == 0.0
    assert Replay((1.0, 3.0), 1.0, interpolate=False).rate(0.5) == 1.0


def test_demo_record() -> None:
    key, value = demo_record(37, 16, 123.5)
    assert key == b"k5"
    assert json.loads(value) == {"id": 37, "key": "k5", "ts": 123.5}


def test_cli_needs_one_shape() -> None:
    from typer.testing import CliRunner

    from agent.load_cli import loadgen_app

    result = CliRunner().invoke(loadgen_app, ["run"])
    assert result.exit_code != 0
    result = CliRunner().invoke(loadgen_app, ["run", "--shape", "wobble:3"])
    assert result.exit_code != 0


def test_job_cli_pairs() -> None:
    import typer

    from agent.job_cli import parse_pairs

    assert parse_pairs(["cost_ms=4", "input_topic=a=b"], "--option") == {"cost_ms": "4", "input_topic": "a=b"}
    with pytest.raises(typer.BadParameter):
        parse_pairs(["nokey"], "--option")
