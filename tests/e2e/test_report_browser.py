"""End to end: `autoscaler evaluate --html` on a small case, the page opened in headless Chromium.

One built-in trace in both regimes (two charts), one seed, three policies, one hour of load, one
worker. The page must draw a canvas per chart, hold in its uPlot charts the series its embedded JSON
carries, and show a table row per policy. The screenshot goes to the test's folder and to
AUTOSCALER_SCREENSHOT_DIR when set (docs/images/evaluation-report.png comes from there).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.browser import chromium

pytestmark = pytest.mark.browser
# Where the screenshot also goes when set (docs/images/evaluation-report.png comes from here).
SCREENSHOT_DIR = os.environ.get("AUTOSCALER_SCREENSHOT_DIR")

POLICIES = ["static", "threshold", "default"]


def autoscaler() -> str:
    """The `autoscaler` command installed beside this interpreter, else the one on the PATH."""
    beside = Path(sys.executable).with_name("autoscaler")
    return str(beside) if beside.exists() else shutil.which("autoscaler") or "autoscaler"


def last_value(values: list[Any]) -> Any:
    """The last non-null value of a series (the policies' series are null where only the oracle has a point)."""
    return next((v for v in reversed(values) if v is not None), None)


def test_the_report_page_draws_every_chart_with_the_embedded_data(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    args = ["evaluate", "--trace", "wiki", "--hours", "1", "--seeds", "1", "--workers", "1",
            "--json", str(tmp_path / "evaluate.json"), "--html", str(page)]
    for name in POLICIES:
        args += ["--policy", name]
    done = subprocess.run([autoscaler(), *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"wrote the report page {page}" in " ".join(done.stdout.split())

    embedded = re.search(r'<script type="application/json" id="data">(.*?)</script>', page.read_text(), re.S)
    assert embedded is not None
    data = json.loads(embedded.group(1))

    with chromium(1400, 1800) as driver:
        driver.get(page.as_uri())
        WebDriverWait(driver, 20).until(lambda d: d.execute_script("return window.report !== undefined"))
        report = driver.execute_script("return window.report")
        charts = driver.find_elements(By.CSS_SELECTOR, "div.chart")
        canvases = [[canvas.size["width"] for canvas in chart.find_elements(By.TAG_NAME, "canvas")]
                    for chart in charts]
        tables = driver.find_elements(By.CSS_SELECTOR, "table.policies")
        rows = [[row.get_attribute("data-policy") for row in table.find_elements(By.CSS_SELECTOR, "tbody tr")]
                for table in tables]
        assert driver.save_screenshot(str(tmp_path / "evaluation-report.png"))
        if SCREENSHOT_DIR:  # the docs' screenshot comes from here
            Path(SCREENSHOT_DIR).mkdir(parents=True, exist_ok=True)
            shutil.copy(tmp_path / "evaluation-report.png", Path(SCREENSHOT_DIR) / "evaluation-report.png")

    assert [(c["trace"], c["regime"]) for c in data["charts"]] == [("wiki", "compressed"), ("wiki", "real-time")]
    assert len(charts) == len(data["charts"]) == len(report["charts"])
    assert all(len(widths) == 1 and widths[0] > 0 for widths in canvases)
    for drawn, sent in zip(report["charts"], data["charts"], strict=True):
        assert (drawn["trace"], drawn["regime"], drawn["seed"]) == (sent["trace"], sent["regime"], 0)
        assert list(sent["series"]) == ["arrival rate", *POLICIES, "oracle"]  # the driver's dicts lose key order
        assert drawn["series"] == {name: len(values) for name, values in sent["series"].items()}
        assert drawn["points"] == len(sent["hours"])
        assert drawn["last"] == {name: last_value(values) for name, values in sent["series"].items()}
    assert rows == [POLICIES, POLICIES]
    assert json.loads((tmp_path / "evaluate.json").read_text())["policies"] == POLICIES
