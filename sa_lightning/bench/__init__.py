"""Latency and memory benchmarks; each is a command that prints a table."""
