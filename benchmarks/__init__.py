"""Benchmarks: job sets and runnable measurement scripts (results go to benchmarks/RESULTS.md)."""
