"""A pytest plugin: under CI (`CI=true`) a skipped test fails.

A test that skips where a tool is missing (openssl for the TLS tests, say) would otherwise pass CI
silently without testing anything; `./dev setup` installs everything the suite needs, so in CI a
skip means a broken setup. Outside CI a skip stays a skip. Loaded by tests/conftest.py."""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.skipped and in_ci() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which allows no skip: {reason}"
