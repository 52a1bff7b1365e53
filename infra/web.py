"""Static web assets shipped with the package: the vendored uPlot chart library (infra/static/uplot).

The dashboard serves these files; `autoscaler evaluate --html` inlines them into one self-contained
page. Nothing is fetched from a CDN at run time."""

from __future__ import annotations

from functools import cache
from importlib import resources

UPLOT_VERSION = "1.6.32"


@cache
def asset(name: str) -> str:
    """The text of a vendored file, e.g. `uplot/uPlot.iife.min.js`."""
    return resources.files("infra").joinpath("static", *name.split("/")).read_text(encoding="utf-8")


def uplot_js() -> str:
    return asset("uplot/uPlot.iife.min.js")


def uplot_css() -> str:
    return asset("uplot/uPlot.min.css")
