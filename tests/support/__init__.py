"""Helpers shared by the tests and the benchmarks: the browser, the load driver, the in-place and backend
measures. No product package imports them."""
