"""The browser tests' Chromium: the one launcher, in bench.browser (the benches drive it too)."""

from bench.browser import CHROMEDRIVER, CHROMIUM, chromium

__all__ = ["CHROMEDRIVER", "CHROMIUM", "chromium"]
