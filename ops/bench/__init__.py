"""Benchmarks that compare side by side and print ratios; run each from the repository root
as ``python -m ops.bench.<name>``."""
