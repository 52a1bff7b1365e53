"""The browser tests' Chromium: the one launcher, in tests.support.browser (the benches drive it too)."""

from tests.support.browser import CHROMEDRIVER, CHROMIUM, chromium

__all__ = ["CHROMEDRIVER", "CHROMIUM", "chromium"]
