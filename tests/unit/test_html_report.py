"""The evaluation's report page (`evaluation.html_report`) on a real result: one hour of one trace, one seed."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from rich.console import Console

from evaluation.html_report import ARRIVAL, ORACLE, chart_data, embed_json, first_seeds, report_page
from evaluation.report import print_table
from evaluation.suite import EvalSettings, evaluate_all, summarize
from infra.web import uplot_css, uplot_js

SETTINGS = EvalSettings(hours=1.0, seeds=1, regimes=("compressed",))
POLICIES = ["static", "threshold"]


@pytest.fixture(scope="module")
def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The suite in this process: wiki, compressed, seed 0, two policies (a few seconds)."""
    cases = evaluate_all(["wiki"], POLICIES, SETTINGS, workers=1)
    return cases, summarize(cases)


def embedded(page: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert found is not None
    return json.loads(found.group(1))


def printed_rows(summaries: list[dict[str, Any]]) -> list[list[str]]:
    """The cells of the table rows `autoscaler evaluate` prints."""
    console = Console(record=True, width=200)
    print_table(console, summaries)
    return [[cell.strip() for cell in line.split("│")[1:-1]]
            for line in console.export_text().splitlines() if line.startswith("│")]


def test_the_page_has_the_printed_table_rows(run: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> None:
    cases, summaries = run
    page = report_page(cases, summaries, SETTINGS)
    rows = printed_rows(summaries)
    assert [row[0].removesuffix(" *") for row in rows] == POLICIES
    for row in rows:
        assert "<td>" + "</td><td>".join(row) + "</td>" in page
    assert len(re.findall(r"<tr\b[^>]*\bdata-policy=", page)) == len(POLICIES)
    for text in ("wiki (compressed)", "1 (0)", "60 s of arrivals", "restart", "peak of 1,400 rec/s"):
        assert text in page


def test_uplot_is_inlined_and_nothing_comes_from_the_network(
        run: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> None:
    page = report_page(*run, SETTINGS)
    assert f"<script>{uplot_js()}</script>" in page
    assert f"<style>{uplot_css()}</style>" in page
    assert not re.search(r"<(script|link|img|iframe)\b[^>]*\b(src|href)\s*=", page, re.I)
    assert not re.search(r"""(src|href)\s*=\s*["']?https?://""", page, re.I)


def test_the_embedded_json_parses_back_to_the_first_seed_timelines(
        run: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> None:
    cases, summaries = run
    data = embedded(report_page(cases, summaries, SETTINGS))
    assert data["policies"] == POLICIES
    [chart] = data["charts"]
    assert chart == chart_data(cases[0])
    assert (chart["trace"], chart["regime"], chart["seed"]) == ("wiki", "compressed", 0)
    assert list(chart["series"]) == [ARRIVAL, *POLICIES, ORACLE]
    timelines = cases[0]["timelines"]
    for name, values in chart["series"].items():
        assert len(values) == len(chart["hours"])
        source = timelines[POLICIES[0]]["arrival"] if name == ARRIVAL else timelines[name]["parallelism"]
        assert [v for v in values if v is not None] == source
    assert chart["hours"] == sorted(chart["hours"])
    assert chart["hours"][-1] == pytest.approx(timelines[ORACLE]["t"][-1] / 3600)


def test_markup_in_the_data_cannot_end_the_script_element(
        run: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> None:
    cases, summaries = run
    case = copy.deepcopy(cases[0])
    case["description"] = "a </script><!-- & <b>"
    summary = copy.deepcopy(summaries[0]) | {"description": case["description"]}
    page = report_page([case], [summary], SETTINGS)
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert found is not None and "<" not in found.group(1)
    assert embedded(page)["charts"][0]["description"] == case["description"]
    assert "a &lt;/script&gt;&lt;!-- &amp; &lt;b&gt;" in page
    assert json.loads(embed_json({"x": "</"})) == {"x": "</"}


def test_each_trace_and_regime_is_charted_from_its_first_seed(
        run: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> None:
    cases, _ = run
    later = copy.deepcopy(cases[0]) | {"seed": 3}
    other = copy.deepcopy(cases[0]) | {"regime": "real-time", "seed": 2}
    firsts = first_seeds([later, cases[0], other])
    assert list(firsts) == [("wiki", "compressed"), ("wiki", "real-time")]
    assert firsts["wiki", "compressed"]["seed"] == 0 and firsts["wiki", "real-time"]["seed"] == 2
