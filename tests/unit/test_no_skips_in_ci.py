"""Under CI a skipped test fails (tests/no_skips_in_ci.py), so a security test cannot pass CI by
skipping where a tool is missing; outside CI a skip stays a skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.no_skips_in_ci import pytest_runtest_makereport

ROOT = Path(__file__).resolve().parents[2]

SKIPPING = '''
import pytest

@pytest.fixture
def tool():
    pytest.skip("openssl is not installed")

def test_in_a_fixture(tool):
    pass

def test_in_the_test():
    pytest.skip("no tool")

@pytest.mark.xfail(reason="known")
def test_expected_to_fail():
    assert False

def test_passes():
    pass
'''


def run(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PYTHONPATH": str(ROOT)}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                           "tests.no_skips_in_ci", "-rA", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_skip_fails_under_ci(tmp_path: Path) -> None:
    result = run(tmp_path, "true")
    assert result.returncode == 1, result.stdout
    assert "1 failed, 1 passed, 1 xfailed, 1 error" in result.stdout, result.stdout
    assert "skipped under CI=true, which allows no skip: Skipped: openssl is not installed" in result.stdout


@pytest.mark.parametrize("ci", [None, "false"])
def test_outside_ci_a_skip_is_a_skip(tmp_path: Path, ci: str | None) -> None:
    result = run(tmp_path, ci)
    assert result.returncode == 0, result.stdout
    assert "1 passed, 2 skipped, 1 xfailed" in result.stdout, result.stdout


def test_the_suite_loads_the_rule(request: pytest.FixtureRequest) -> None:
    hooks = request.config.pluginmanager.hook.pytest_runtest_makereport.get_hookimpls()
    assert any(hook.function is pytest_runtest_makereport for hook in hooks)
