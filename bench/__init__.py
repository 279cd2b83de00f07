"""Benchmarks of ylock against the Python lock libraries and the round-trip floor."""
